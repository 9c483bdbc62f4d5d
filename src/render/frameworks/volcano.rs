//! Volcano-compatible host lists, for users moving off Volcano's job plugins
//! (volcano-sh/volcano, `pkg/controllers/job/plugins/svc` and `env`):
//! - `VC_<TYPE>_HOSTS` (comma-separated) and `VC_<TYPE>_NUM` for every type, where
//!   `<TYPE>` is the type with `-` turned into `_`, upper-cased (`svc.go`,
//!   `GenerateHosts`);
//! - `VC_TASK_INDEX` and `VK_TASK_INDEX`, the pod's index within its type (`env.go`);
//! - `<type>.host` files, `-` turned into `_` but not upper-cased, one host per line and
//!   no newline after the last, as Volcano's ConfigMap holds them.
//!
//! Volcano's hosts are DNS names (`<job>-<task>-<i>.<job>`); these are the hosts of the
//! resolved addresses, so they follow `--address`. Every type is listed, the evaluator
//! too: these are lists per type, not ranks.

use super::File;
use crate::cluster::address;
use crate::cluster::{Cluster, Task};

fn key(task_type: &str) -> String {
    task_type.replace('-', "_")
}

/// Two job types whose Volcano names are the same: `a-b` and `a_b` both write `a_b.host`
/// and `VC_A_B_HOSTS`, `a_b` and `A_B` both `VC_A_B_HOSTS`; one would overwrite the
/// other's hosts without a word.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("job types {first:?} and {second:?} both become {name}")]
pub struct NameClash {
    pub first: String,
    pub second: String,
    pub name: String,
}

/// Checks that every job type has Volcano names of its own.
pub fn distinct_names(types: &[&str]) -> Result<(), NameClash> {
    for (i, a) in types.iter().enumerate() {
        for b in &types[i + 1..] {
            let (ka, kb) = (key(a), key(b));
            let name = if ka == kb {
                format!("{ka}.host and VC_{}_HOSTS", ka.to_uppercase())
            } else if ka.to_uppercase() == kb.to_uppercase() {
                format!("VC_{}_HOSTS", ka.to_uppercase())
            } else {
                continue;
            };
            return Err(NameClash {
                first: a.to_string(),
                second: b.to_string(),
                name,
            });
        }
    }
    Ok(())
}

fn hosts<'c>(cluster: &'c Cluster, task_type: &str) -> Vec<&'c str> {
    cluster
        .tasks
        .get(task_type)
        .into_iter()
        .flatten()
        .map(|p| address::host(&p.address))
        .collect()
}

/// The variables, types in their defined order.
pub fn vars(cluster: &Cluster, order: &[&str], own: &Task) -> Vec<(String, String)> {
    let mut v = Vec::new();
    for t in order {
        let hosts = hosts(cluster, t);
        let k = key(t).to_uppercase();
        v.push((format!("VC_{k}_HOSTS"), hosts.join(",")));
        v.push((format!("VC_{k}_NUM"), hosts.len().to_string()));
    }
    v.push(("VC_TASK_INDEX".into(), own.index.to_string()));
    v.push(("VK_TASK_INDEX".into(), own.index.to_string()));
    v
}

/// The `<type>.host` files.
pub fn host_files(cluster: &Cluster, order: &[&str]) -> Vec<File> {
    order
        .iter()
        .map(|t| File {
            name: format!("{}.host", key(t)),
            contents: hosts(cluster, t).join("\n"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_that_share_a_volcano_name_are_refused() {
        assert_eq!(distinct_names(&["ps", "worker", "data-worker"]), Ok(()));
        assert_eq!(
            distinct_names(&["ps", "a-b", "a_b"])
                .unwrap_err()
                .to_string(),
            "job types \"a-b\" and \"a_b\" both become a_b.host and VC_A_B_HOSTS"
        );
        assert_eq!(
            distinct_names(&["a_b", "A_B"]).unwrap_err().to_string(),
            "job types \"a_b\" and \"A_B\" both become VC_A_B_HOSTS"
        );
    }
}
