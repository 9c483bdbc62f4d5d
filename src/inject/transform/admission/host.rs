//! The policy's part of hostNetwork pods ([`crate::inject::transform::hostnet`]): the
//! job's identity read from the pod, the slot computed in CEL exactly as inject
//! computes it, the ports it gives, and the sidecar whose port they set.

use serde_json::Value;

use super::super::parts::sidecar;
use super::super::{InjectConfig, hostnet};
use super::cel::{cel_string, raw};
use super::settings::{Setting, Settings, annotation};
use super::{shape, with_args};
use crate::flags;
use crate::inject::yaml::to_json;

/// [`hostnet::slot`] in CEL, of the CEL string expression `identity`: the characters
/// by `split('')`, their codes by `indexOf` in the same alphabet (-1, plus 1, for any
/// other), weighed by position with `transformList`, summed with `sum()`.
pub(super) fn slot_cel(identity: &str) -> String {
    let max = hostnet::MAX_IDENTITY;
    format!(
        "(([{identity}].map(s, size(s) > {max} ? s.substring(0, {max}) : s)[0].split('').transformList(i, c, ({alphabet}.indexOf(c) + 1) * (i + 1)).sum() * {mult}) % {slots})",
        alphabet = cel_string(hostnet::ALPHABET),
        mult = hostnet::MULTIPLIER,
        slots = hostnet::SLOTS,
    )
}

/// The variables of a hostNetwork pod's ports, after [`framework_variables`]: the
/// job's identity (the namespace, and the workload's name as inject sees it: a
/// JobSet's, the controller's without a Deployment's ReplicaSet suffix, else the
/// pod's own), its slot ([`hostnet::slot_cel`]), and the ports it gives where no
/// annotation does.
pub(super) fn host_variables(settings: &Settings) -> String {
    let labels = "(has(object.metadata.labels) ? object.metadata.labels : {})";
    let hash = format!("{labels}[?'pod-template-hash'].orValue('')");
    let controller = "object.metadata.ownerReferences.filter(r, has(r.controller) && r.controller)";
    let default_addr = settings
        .all()
        .find_map(|s| match s {
            Setting::Value { flag, default, .. } if *flag == flags::METRICS_ADDR => default.clone(),
            _ => None,
        })
        .unwrap_or_default();
    let task_port = format!(
        "{} == '' && {} == ''",
        annotation(flags::PORT),
        annotation(flags::PORT_NAME)
    );
    format!(
        r#"    - name: hostNetwork
      expression: >-
        has(object.spec.hostNetwork) && object.spec.hostNetwork
    - name: workload
      expression: >-
        {labels}[?'jobset.sigs.k8s.io/jobset-name'].orValue(
        has(object.metadata.ownerReferences) && size({controller}) > 0 ?
        {controller}.map(r, r.kind == 'ReplicaSet' && {hash} != '' && r.name.endsWith('-' + {hash}) ? r.name.substring(0, size(r.name) - size({hash}) - 1) : r.name)[0] :
        has(object.metadata.name) && object.metadata.name != '' ? object.metadata.name :
        has(object.metadata.generateName) ? object.metadata.generateName : '')
    - name: identity
      expression: >-
        request.namespace + '/' + variables.workload
    - name: slot
      expression: >-
        {slot}
    - name: masterPort
      expression: >-
        {master} != '' ? {master} :
        variables.hostNetwork && ({task_port} || variables.framework.split(',').exists(f, f == 'mpi')) ?
        string({master_base} + variables.slot) : ''
    - name: metricsAddr
      expression: >-
        {metrics} != '' ? {metrics} :
        variables.hostNetwork ? '0.0.0.0:' + string({metrics_base} + variables.slot) : {default_addr}
    - name: metricsPort
      expression: >-
        int(variables.metricsAddr.substring(variables.metricsAddr.lastIndexOf(':') + 1))
"#,
        slot = slot_cel("variables.identity"),
        master = annotation(flags::MASTER_PORT),
        metrics = annotation(flags::METRICS_ADDR),
        master_base = hostnet::MASTER_BASE,
        metrics_base = hostnet::METRICS_BASE,
        default_addr = cel_string(&default_addr),
    )
}

/// The sidecar as inject makes it, its port from `variables.metricsPort`: its
/// containerPort on a pod network, its startup probe's on hostNetwork (where it
/// declares none, and the probe names the port by number).
pub(super) fn policy_sidecar(cfg: &InjectConfig, wrapped: bool, host: bool) -> Value {
    let mut c = shape(cfg, wrapped);
    c.host_network = host;
    let mut side = with_args(to_json(&sidecar(&c)), "variables.sidecarArgs");
    let port = raw("variables.metricsPort");
    if let Some(p) = side.pointer_mut("/ports/0/containerPort") {
        *p = port.clone();
    }
    if host && let Some(p) = side.pointer_mut("/startupProbe/tcpSocket/port") {
        *p = port;
    }
    side
}
