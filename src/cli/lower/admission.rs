//! `inject --admission-policy`'s config: the policy reads each pod's settings from its
//! annotations, so only what it adds to every pod alike comes from flags.

use super::super::defaults;
use super::super::inject_args::InjectArgs;
use super::inject::{metrics, resources, wrap_env};
use super::settings::settings;
use crate::Failure;
use crate::flags;
use crate::inject::InjectConfig;
use crate::inject::transform::admission::Settings;

/// `inject --admission-policy`: what the policy adds (image, resources, ServiceAccount;
/// the rest at its defaults) and the settings it reads from each pod's annotations:
/// the flags `inject` writes into `trainlet init` and `trainlet exec`, in its order
/// (`inject`'s `init_flags` and `exec_flags`), each with its default, which is not written.
pub fn admission_config(a: &InjectArgs) -> Result<(InjectConfig, Settings), Failure> {
    let c = &a.cluster;
    let given = [
        (
            !c.jobs.is_empty() || c.job_to_label_mapping.is_some(),
            flags::JOB,
        ),
        (!c.expect.is_empty(), flags::EXPECT),
        (a.wrap.is_some(), flags::WRAP),
        (a.stall.stall_after.is_some(), flags::STALL_AFTER),
        (a.failure_policy, flags::FAILURE_POLICY),
        (a.classic_sidecar, flags::CLASSIC_SIDECAR),
        (a.shm_size.is_some(), flags::SHM_SIZE),
        (a.metrics_addr.is_some(), flags::METRICS_ADDR),
        (a.filename.is_some(), flags::FILENAME),
    ];
    if let Some((_, flag)) = given.iter().find(|(g, _)| *g) {
        return Err(Failure::usage(format!(
            "--{flag} is not for --{}: the policy reads each pod's settings from its annotations (trainlet.io/<flag>); it takes --image, --resources and --service-account",
            flags::ADMISSION_POLICY
        )));
    }
    if a.image.trim().is_empty() {
        return Err(Failure::usage(
            "invalid --image \"\": give an image reference",
        ));
    }
    let output_dir = defaults::OUTPUT_DIR.to_string();
    let install_to = format!("{output_dir}/bin");
    let cfg = InjectConfig {
        image: a.image.trim().to_string(),
        init_args: Vec::new(),
        sidecar_args: Vec::new(),
        wrap_env: wrap_env(&output_dir),
        metrics: metrics(None),
        host_network: false,
        output_dir,
        observations_dir: defaults::OBSERVATIONS_DIR.to_string(),
        install_to: install_to.clone(),
        classic_sidecar: false,
        failure_policy: false,
        permanent_exit_codes: None,
        wrap: None,
        service_account: a.service_account.clone(),
        exec_args: Vec::new(),
        resources: resources(&a.resources)?,
        shm_size: None,
        infer: None,
    };
    Ok((cfg, settings(&install_to)))
}
