//! The CPU framework venv (PyTorch, JAX, TensorFlow) that `.ci/frameworks` builds and
//! caches outside the work tree, for the tests that run the real frameworks: on this
//! machine (tests/it/frameworks.rs) and in pods on the real node, mounted by hostPath
//! (tests/it/node_pods.rs, tests/it/node_quickstart.rs).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::cluster::repo;
use super::skip::{Group, Missing};

/// The python of the CPU framework venv that `.ci/frameworks` builds and caches (PyTorch,
/// JAX, TensorFlow), or what is missing when it cannot be built (group `frameworks`).
pub fn framework_python() -> Result<&'static Path, Missing> {
    static PYTHON: OnceLock<Result<PathBuf, Missing>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let out = std::process::Command::new(repo().join(".ci/frameworks"))
                .output()
                .expect(".ci/frameworks runs");
            let last = String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap_or_default()
                .to_string();
            if !out.status.success() || last.is_empty() {
                return Err(Missing::new(
                    Group::Frameworks,
                    format!(
                        ".ci/frameworks could not build the framework venv: {}",
                        String::from_utf8_lossy(&out.stderr)
                    ),
                ));
            }
            Ok(PathBuf::from(last))
        })
        .as_ref()
        .map(PathBuf::as_path)
        .map_err(Clone::clone)
}

/// What runs the framework venv in a pod on the real node (tests/node/README.md): the
/// host's `/usr` (the glibc and libraries the venv's python links), the venv's base
/// interpreter (`home` in its pyvenv.cfg, without `/bin`) and the venv itself, each
/// mounted read-only by hostPath at its own path. Returns (volumes, volumeMounts).
pub fn venv_hostpath(python: &Path) -> (serde_json::Value, serde_json::Value) {
    let venv = python.parent().unwrap().parent().unwrap();
    let cfg = std::fs::read_to_string(venv.join("pyvenv.cfg")).unwrap();
    let home = cfg
        .lines()
        .find_map(|l| l.strip_prefix("home = "))
        .expect("pyvenv.cfg names its home")
        .trim()
        .strip_suffix("/bin")
        .expect("the home is a bin/ directory")
        .to_string();
    let venv = venv.to_str().unwrap();
    let volumes = serde_json::json!([
        {"name": "usr", "hostPath": {"path": "/usr", "type": "Directory"}},
        {"name": "python", "hostPath": {"path": home, "type": "Directory"}},
        {"name": "venv", "hostPath": {"path": venv, "type": "Directory"}}
    ]);
    let mounts = serde_json::json!([
        {"name": "usr", "mountPath": "/usr", "readOnly": true},
        {"name": "python", "mountPath": home, "readOnly": true},
        {"name": "venv", "mountPath": venv, "readOnly": true}
    ]);
    (volumes, mounts)
}
