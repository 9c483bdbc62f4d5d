//! trainlet's integration tests, as ONE test binary (`cargo test --test it`) with a
//! module per area, the layout ripgrep's tests/ use: one link instead of one per area,
//! and every test in one process, so the `OnceLock`s in the support code (the control
//! plane's kubeconfig, the C fixtures built with `cc`) are set up once per run.
//!
//! - `support` (tests/it/support/): what every area uses, one concern a file:
//!   `cluster` (the real kube-apiserver, etcd and controllers started by
//!   `tests/control-plane/up`, fresh namespaces, kubectl, RBAC, CRDs, a private control
//!   plane), `identity` (minted ServiceAccount tokens, kubeconfigs), `pods` (pods from
//!   short specs, the kubelet player), `init_container` (a pod's trainlet-init run as the
//!   kubelet would), `binary` (the built `trainlet` as a subprocess: init, sidecar and
//!   exec command lines), `node` (the real node of `tests/node/up` on its own control
//!   plane, Pod Security `restricted` namespaces, kubectl that fails on warnings, the
//!   test trainer's lines).
//! - `report_support` (tests/it/report_support.rs): what the `report_*` areas add on
//!   top of `support`: the fake NVML and memory hog built from tests/fixtures/, a
//!   running reporter with its admin endpoint, annotations, Warning Events, memory
//!   cgroups.
//! - one module per area; each says `use crate::support::*;` (and the `report_*` ones
//!   `use crate::report_support::*;`).
//!
//! Why `report_support` is a sibling of `support` here, not `support::report`: the
//! benchmark (benches/trainlet/main.rs) compiles the same two files into its own crate
//! with `#[path = "../../tests/it/support/mod.rs"] mod support;` and
//! `#[path = "../../tests/it/report_support.rs"] mod report_support;`, both at its
//! crate root, as this file declares them at this crate's root. So in both crates
//! `report_support` reaches `support` as `crate::support`, and the bench's own modules
//! keep their `crate::support` and `crate::report_support` paths. Keep both files free
//! of `super::` paths and of paths relative to their own location (`include_str!`,
//! `#[path]`); `concat!(env!("CARGO_MANIFEST_DIR"), ...)` and `support::repo()` are
//! fine, since both crates share the manifest dir.
//!
//! Fixtures stay in tests/fixtures/ and the control plane in tests/control-plane/;
//! tests reach them through `support::repo()`, not through paths relative to this file.

mod support;

mod report_support;

mod admission;
mod admission_agree;
mod admission_params;
mod architecture;
mod bench_docs;
mod chart;
mod control_plane;
mod coordinated;
mod frameworks;
mod glibc;
mod guard;
mod init;
mod init_faults;
mod inject;
mod kubeflow;
mod launcher;
mod lifecycle;
mod monitoring;
mod node_cgroup2;
mod node_examples;
mod node_launchers;
mod node_pods;
mod node_quickstart;
mod node_stall;
mod node_two;
mod node_where;
mod on_failure;
mod packaging;
mod peer_watch;
mod preflight;
mod preflight_hostile;
mod readme;
mod release;
mod report_gpu;
mod report_handover;
mod report_lifecycle;
mod report_limits;
mod report_nvml;
mod report_oom;
mod report_ports;
mod stall;
mod status;
