//! Memory cgroups: finding the own one and a container's, and reading their OOM
//! counters, limit and usage in both versions' exact formats.
//!
//! cgroup v2 counts kills in `memory.events` (`oom_kill`, plus `oom_group_kill` when
//! `memory.oom.group` kills the whole group); cgroup v1 in the `oom_kill` line of
//! `memory.oom_control`. These counters are the only place where a *child* process
//! killed inside a container that keeps running shows up: kube-state-metrics and
//! `kubectl describe` see only containers. Parsers are pure; the reads are at the end.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::OomError;

/// Which cgroup version a watched cgroup uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

/// The OOM counters of one cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OomCounters {
    /// Processes killed by the OOM killer in this cgroup.
    pub oom_kill: u64,
    /// Times the whole group was killed (v2 `memory.oom.group`).
    pub oom_group_kill: u64,
    /// The cgroup is under OOM right now (v1 `under_oom`).
    pub under_oom: bool,
}

fn key_values(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k, v.trim().parse().ok()?))
        })
        .collect()
}

/// Parses cgroup v1 `memory.oom_control`:
/// `oom_kill_disable 0\nunder_oom 0\noom_kill 3\n`. Kernels before 4.13 lack the
/// `oom_kill` line; then kills cannot be counted, only `under_oom` seen.
pub fn parse_oom_control_v1(text: &str) -> Option<OomCounters> {
    let kv = key_values(text);
    Some(OomCounters {
        oom_kill: *kv.get("oom_kill")?,
        oom_group_kill: 0,
        under_oom: kv.get("under_oom").is_some_and(|v| *v != 0),
    })
}

/// Parses cgroup v2 `memory.events`:
/// `low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n`.
/// `oom_group_kill` exists since Linux 5.17; older kernels count only `oom_kill`.
pub fn parse_memory_events_v2(text: &str) -> Option<OomCounters> {
    let kv = key_values(text);
    Some(OomCounters {
        oom_kill: *kv.get("oom_kill")?,
        oom_group_kill: kv.get("oom_group_kill").copied().unwrap_or(0),
        under_oom: false,
    })
}

/// One line of `/proc/<pid>/cgroup`: `hierarchy-ID:controller-list:cgroup-path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcCgroup {
    pub id: u32,
    pub controllers: Vec<String>,
    pub path: String,
}

pub fn parse_proc_cgroup(text: &str) -> Vec<ProcCgroup> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let id = parts.next()?.parse().ok()?;
            let controllers = parts
                .next()?
                .split(',')
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            let path = parts.next()?.to_string();
            Some(ProcCgroup {
                id,
                controllers,
                path,
            })
        })
        .collect()
}

/// One line of `/proc/self/mountinfo`, the fields trainlet needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub root: String,
    pub mount_point: String,
    pub fstype: String,
    pub super_options: Vec<String>,
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let mut post = post.split(' ');
            let fstype = post.next()?.to_string();
            let _source = post.next()?;
            let super_options = post
                .next()
                .unwrap_or("")
                .split(',')
                .map(String::from)
                .collect();
            Some(Mount {
                root: unescape_mount(pre.get(3)?),
                mount_point: unescape_mount(pre.get(4)?),
                fstype,
                super_options,
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape_mount(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v as char);
            i += 4;
            continue;
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// The directory of this process's memory cgroup: the v1 `memory` hierarchy when one
/// is mounted (hybrid hosts mount v2 too, but without the memory controller), else the
/// v2 unified hierarchy.
pub fn own_memory_cgroup(proc_cgroup: &str, mountinfo: &str) -> Option<(CgroupVersion, PathBuf)> {
    let groups = parse_proc_cgroup(proc_cgroup);
    let mounts = parse_mountinfo(mountinfo);
    let join = |mount: &Mount, path: &str| -> PathBuf {
        // Inside a cgroup namespace the mount root is the namespace root, and paths
        // are relative to it; outside, the mount root is `/`.
        let rel = path
            .strip_prefix(mount.root.trim_end_matches('/'))
            .unwrap_or(path)
            .trim_start_matches('/');
        Path::new(&mount.mount_point).join(rel)
    };
    if let Some(g) = groups
        .iter()
        .find(|g| g.controllers.iter().any(|c| c == "memory"))
        && let Some(m) = mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.super_options.iter().any(|o| o == "memory"))
    {
        return Some((CgroupVersion::V1, join(m, &g.path)));
    }
    let g = groups
        .iter()
        .find(|g| g.id == 0 && g.controllers.is_empty())?;
    let m = mounts.iter().find(|m| m.fstype == "cgroup2")?;
    Some((CgroupVersion::V2, join(m, &g.path)))
}

/// Whether a cgroup directory name belongs to the pod with this UID: `pod<uid>` with
/// the cgroupfs driver, `kubepods-burstable-pod<uid_with_underscores>.slice` with the
/// systemd driver.
pub fn is_pod_dir(name: &str, pod_uid: &str) -> bool {
    !pod_uid.is_empty()
        && (name.contains(&format!("pod{pod_uid}"))
            || name.contains(&format!("pod{}", pod_uid.replace('-', "_"))))
}

/// Whether a cgroup directory name belongs to this container: the bare ID (cgroupfs
/// driver) or `cri-containerd-<id>.scope`, `crio-<id>.scope`, `docker-<id>.scope`.
pub fn is_container_dir(name: &str, container_id: &str) -> bool {
    let id = container_id
        .split_once("://")
        .map_or(container_id, |(_, id)| id);
    !id.is_empty() && (name == id || name.strip_suffix(".scope").is_some_and(|n| n.ends_with(id)))
}

/// Finds a container's cgroup under the node's cgroup mount (`--cgroup-root`): the v1
/// `memory` hierarchy when present, else v2. A breadth-first walk, bounded in depth,
/// that runs only when a container ID changes.
pub fn find_container_cgroup(
    root: &Path,
    pod_uid: &str,
    container_id: &str,
) -> Option<(CgroupVersion, PathBuf)> {
    let (version, top) = if root.join("memory").join("memory.oom_control").exists()
        || root.join("memory").join("cgroup.procs").exists()
    {
        (CgroupVersion::V1, root.join("memory"))
    } else {
        (CgroupVersion::V2, root.to_path_buf())
    };
    let mut level = vec![(top, false)];
    for _depth in 0..8 {
        let mut next = Vec::new();
        for (dir, in_pod) in level {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let name = e.file_name().to_string_lossy().into_owned();
                if in_pod && is_container_dir(&name, container_id) {
                    return Some((version, e.path()));
                }
                next.push((e.path(), in_pod || is_pod_dir(&name, pod_uid)));
            }
        }
        if next.is_empty() {
            break;
        }
        level = next;
    }
    None
}

/// A byte count as a Kubernetes quantity, as people write limits: `2Gi`, `1536Mi`,
/// `64Ki`, or plain bytes when nothing divides.
pub fn quantity(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "Ti"),
        (1 << 30, "Gi"),
        (1 << 20, "Mi"),
        (1 << 10, "Ki"),
    ];
    for (size, unit) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

/// A v1 limit of `PAGE_COUNTER_MAX` pages (9223372036854771712 on x86-64) or v2 `max`
/// means no limit.
pub fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    let v: u64 = t.parse().ok()?;
    (v < (1 << 62)).then_some(v)
}

/// The PIDs of a `cgroup.procs` file, one a line; 0 stands for a process outside this
/// PID namespace and is left out.
pub fn parse_pids(text: &str) -> BTreeSet<u32> {
    text.lines()
        .filter_map(|l| l.trim().parse().ok())
        .filter(|pid| *pid != 0)
        .collect()
}

/// A watched memory cgroup.
#[derive(Debug, Clone)]
pub struct Cgroup {
    pub version: CgroupVersion,
    pub path: PathBuf,
}

impl Cgroup {
    fn counters_file(&self) -> PathBuf {
        match self.version {
            CgroupVersion::V1 => self.path.join("memory.oom_control"),
            CgroupVersion::V2 => self.path.join("memory.events"),
        }
    }

    pub fn counters(&self) -> Result<OomCounters, OomError> {
        let path = self.counters_file();
        let text = std::fs::read_to_string(&path).map_err(|source| OomError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let parsed = match self.version {
            CgroupVersion::V1 => parse_oom_control_v1(&text),
            CgroupVersion::V2 => parse_memory_events_v2(&text),
        };
        parsed.ok_or(OomError::Format {
            path: path.display().to_string(),
            field: "oom_kill",
        })
    }

    fn read_u64(&self, name: &str) -> Option<u64> {
        parse_limit(&std::fs::read_to_string(self.path.join(name)).ok()?)
    }

    /// The memory limit in bytes, `None` when unlimited or unreadable.
    pub fn limit(&self) -> Option<u64> {
        match self.version {
            CgroupVersion::V1 => self.read_u64("memory.limit_in_bytes"),
            CgroupVersion::V2 => self.read_u64("memory.max"),
        }
    }

    /// The processes in the cgroup (`cgroup.procs`, in both versions), as this process's
    /// PID namespace numbers them.
    pub fn pids(&self) -> Option<BTreeSet<u32>> {
        let text = std::fs::read_to_string(self.path.join("cgroup.procs")).ok()?;
        Some(parse_pids(&text))
    }

    /// Current and peak usage in bytes.
    pub fn usage(&self) -> (Option<u64>, Option<u64>) {
        match self.version {
            CgroupVersion::V1 => (
                self.read_u64("memory.usage_in_bytes"),
                self.read_u64("memory.max_usage_in_bytes"),
            ),
            CgroupVersion::V2 => (
                self.read_u64("memory.current"),
                self.read_u64("memory.peak"),
            ),
        }
    }
}

/// The memory cgroup of this process (exec mode).
pub fn own_cgroup() -> Result<Cgroup, OomError> {
    let read = |p: &str| {
        std::fs::read_to_string(p).map_err(|source| OomError::Read {
            path: p.into(),
            source,
        })
    };
    let (version, path) =
        own_memory_cgroup(&read("/proc/self/cgroup")?, &read("/proc/self/mountinfo")?)
            .ok_or(OomError::NoOwnCgroup)?;
    let cg = Cgroup { version, path };
    cg.counters()?;
    Ok(cg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_procs_lists_pids_and_zero_for_outsiders() {
        assert_eq!(parse_pids("1\n20\n0\n7\n\n"), BTreeSet::from([1, 7, 20]));
        assert!(parse_pids("").is_empty());
    }

    const HYBRID_CGROUP: &str =
        "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/45c2\n1:cpu:/\n0::/\n";
    const HYBRID_MOUNTINFO: &str =
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn v1_oom_control_in_the_kernels_format() {
        // Linux 4.13+ (memcontrol.c mem_cgroup_oom_control_read).
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(
            parse_oom_control_v1(text),
            Some(OomCounters {
                oom_kill: 3,
                oom_group_kill: 0,
                under_oom: false
            })
        );
        let under = "oom_kill_disable 1\nunder_oom 1\noom_kill 0\n";
        assert!(parse_oom_control_v1(under).unwrap().under_oom);
        // Before 4.13 there is no oom_kill line: nothing can be counted.
        assert_eq!(
            parse_oom_control_v1("oom_kill_disable 0\nunder_oom 0\n"),
            None
        );
    }

    #[test]
    fn v2_memory_events_in_the_kernels_format() {
        // Linux 5.17+ (memory_events_show), with oom_group_kill.
        let text = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 1\n";
        assert_eq!(
            parse_memory_events_v2(text),
            Some(OomCounters {
                oom_kill: 2,
                oom_group_kill: 1,
                under_oom: false
            })
        );
        // Older kernels: no oom_group_kill.
        let old = "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n";
        assert_eq!(parse_memory_events_v2(old).unwrap().oom_kill, 0);
        // memory.events.local and garbage.
        assert_eq!(parse_memory_events_v2("low 0\nhigh 0\n"), None);
        assert_eq!(parse_memory_events_v2(""), None);
    }

    #[test]
    fn own_cgroup_on_a_hybrid_host_is_the_v1_memory_hierarchy() {
        assert_eq!(
            own_memory_cgroup(HYBRID_CGROUP, HYBRID_MOUNTINFO),
            Some((
                CgroupVersion::V1,
                PathBuf::from("/sys/fs/cgroup/memory/process_api/45c2")
            ))
        );
    }

    #[test]
    fn own_cgroup_on_a_v2_host_and_in_a_cgroup_namespace() {
        let mountinfo = "25 1 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        assert_eq!(
            own_memory_cgroup(
                "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope\n",
                mountinfo
            ),
            Some((
                CgroupVersion::V2,
                PathBuf::from(
                    "/sys/fs/cgroup/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope"
                )
            ))
        );
        // In a container's cgroup namespace, the own cgroup is the mount's root.
        let ns =
            "1310 1301 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw\n";
        assert_eq!(
            own_memory_cgroup("0::/\n", ns),
            Some((CgroupVersion::V2, PathBuf::from("/sys/fs/cgroup")))
        );
        assert_eq!(own_memory_cgroup("", ""), None);
    }

    #[test]
    fn mountinfo_unescapes_octal() {
        let m = parse_mountinfo("36 35 98:0 /a\\040b /mnt/x\\040y rw - ext4 /dev/sda1 rw\n");
        assert_eq!(m[0].root, "/a b");
        assert_eq!(m[0].mount_point, "/mnt/x y");
    }

    #[test]
    fn pod_and_container_dirs_of_both_cgroup_drivers() {
        let uid = "7d3a1f0e-2b4c-4d5e-8f90-a1b2c3d4e5f6";
        assert!(is_pod_dir(&format!("pod{uid}"), uid));
        assert!(is_pod_dir(
            "kubepods-burstable-pod7d3a1f0e_2b4c_4d5e_8f90_a1b2c3d4e5f6.slice",
            uid
        ));
        assert!(!is_pod_dir("kubepods-burstable.slice", uid));
        assert!(!is_pod_dir("anything", ""));
        let id = "containerd://0123abcd";
        assert!(is_container_dir("0123abcd", id));
        assert!(is_container_dir("cri-containerd-0123abcd.scope", id));
        assert!(is_container_dir("crio-0123abcd.scope", "cri-o://0123abcd"));
        assert!(!is_container_dir("0123abcde", id));
        assert!(!is_container_dir("x", ""));
    }

    #[test]
    fn quantities_and_limits() {
        assert_eq!(quantity(2 << 30), "2Gi");
        assert_eq!(quantity(1536 << 20), "1536Mi");
        assert_eq!(quantity(64 << 20), "64Mi");
        assert_eq!(quantity(1000), "1000");
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("67108864\n"), Some(64 << 20));
    }

    #[test]
    fn find_container_cgroup_walks_both_drivers() {
        let root = tempfile::tempdir().unwrap();
        let uid = "7d3a1f0e-2b4c";
        let v2 = root
            .path()
            .join("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7d3a1f0e_2b4c.slice/cri-containerd-abc.scope");
        std::fs::create_dir_all(&v2).unwrap();
        assert_eq!(
            find_container_cgroup(root.path(), uid, "containerd://abc"),
            Some((CgroupVersion::V2, v2))
        );
        assert_eq!(
            find_container_cgroup(root.path(), uid, "containerd://zzz"),
            None
        );
        // A container ID outside the pod's directory is not this pod's.
        let stray = root.path().join("kubepods.slice/abc2");
        std::fs::create_dir_all(&stray).unwrap();
        assert_eq!(
            find_container_cgroup(root.path(), "other", "containerd://abc2"),
            None
        );
    }

    mod properties {
        use super::*;
        use crate::testing::budget;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(budget(512))]

            #[test]
            fn never_panics(text in "\\PC{0,300}") {
                let _ = parse_oom_control_v1(&text);
                let _ = parse_memory_events_v2(&text);
                let _ = parse_proc_cgroup(&text);
                let _ = parse_mountinfo(&text);
                let _ = parse_limit(&text);
            }

            #[test]
            fn never_panics_on_near_misses(text in "([a-z_]{0,12} [0-9]{0,20}\n){0,8}|([0-9]{0,3}:[a-z,=]{0,12}:[/a-z0-9]{0,20}\n){0,6}|([0-9 :/a-z-]{0,40}\n){0,6}") {
                let _ = parse_oom_control_v1(&text);
                let _ = parse_memory_events_v2(&text);
                let _ = parse_proc_cgroup(&text);
                let _ = parse_mountinfo(&text);
            }

            #[test]
            fn v2_counters_are_read_exactly(low in any::<u64>(), high in any::<u64>(), kill in any::<u64>(), group in any::<u64>()) {
                let text = format!("low {low}\nhigh {high}\nmax 0\noom 1\noom_kill {kill}\noom_group_kill {group}\n");
                let c = parse_memory_events_v2(&text).unwrap();
                prop_assert_eq!((c.oom_kill, c.oom_group_kill), (kill, group));
            }

            #[test]
            fn v1_counters_are_read_exactly(under in 0u64..2, kill in any::<u64>()) {
                let text = format!("oom_kill_disable 0\nunder_oom {under}\noom_kill {kill}\n");
                let c = parse_oom_control_v1(&text).unwrap();
                prop_assert_eq!((c.under_oom, c.oom_kill), (under == 1, kill));
            }

            #[test]
            fn limits_parse_to_themselves(v in 0u64..(1 << 62)) {
                prop_assert_eq!(parse_limit(&format!("{v}\n")), Some(v));
            }
        }
    }
}
