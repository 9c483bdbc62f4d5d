//! `trainlet inject`: the flags into an `InjectConfig`, then manifests in, manifests out.

use crate::cli::inject_args::InjectArgs;
use crate::cli::lower;
use crate::{Exit, Failure, inject};

pub fn run(args: InjectArgs) -> Result<Exit, Failure> {
    if args.admission_policy {
        let (cfg, settings) = lower::admission_config(&args)?;
        print!(
            "{}",
            inject::transform::admission::policy_yaml(&cfg, &settings)
        );
        return Ok(Exit::OK);
    }
    let cfg = lower::inject_config(&args)?;
    inject::run(&cfg, args.filename.as_deref())?;
    Ok(Exit::OK)
}
