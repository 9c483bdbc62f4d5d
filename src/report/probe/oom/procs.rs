//! CMD's process tree, for naming the victim of an OOM kill in exec mode: the process
//! that vanished when the counter rose, the largest first. The `/proc/<pid>/stat`
//! parser and the picking are pure; the reads of `/proc` are at the end.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

/// One line of `/proc/<pid>/stat`, the fields trainlet needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcStat {
    pub pid: u32,
    pub comm: String,
    #[serde(skip)]
    pub state: char,
    #[serde(skip)]
    pub ppid: u32,
    pub rss_bytes: u64,
    /// CPU time used, user and system, by the process and by the children it waited
    /// for (fields 14 to 17), in clock ticks: a shell's short-lived commands count.
    #[serde(skip)]
    pub cpu_ticks: u64,
}

/// `4242 (python) S 4200 4242 ... ` — comm may hold spaces and parentheses, so it
/// ends at the *last* `)`. RSS (field 24) is in pages.
pub fn parse_stat(text: &str, page_size: u64) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let state = rest.first()?.chars().next()?;
    let ppid = rest.get(1)?.parse().ok()?;
    let rss_pages: u64 = rest.get(21)?.parse().ok()?;
    let ticks = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok());
    let own = ticks(11)? + ticks(12)?;
    let children = ticks(13).unwrap_or(0) + ticks(14).unwrap_or(0);
    Some(ProcStat {
        pid,
        comm,
        state,
        ppid,
        rss_bytes: rss_pages * page_size,
        cpu_ticks: own + children,
    })
}

/// The descendants of `root` (not `root` itself), by pid.
pub fn descendants(procs: &[ProcStat], root: u32) -> BTreeMap<u32, ProcStat> {
    let mut children: HashMap<u32, Vec<&ProcStat>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p);
    }
    let mut out = BTreeMap::new();
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        for c in children.get(&pid).into_iter().flatten() {
            if c.pid != root && out.insert(c.pid, (*c).clone()).is_none() {
                stack.push(c.pid);
            }
        }
    }
    out
}

/// Whether `pid` descends from `root`, following `parent_of` (a process's parent, or
/// `None` once it is gone). Bounded: a pid namespace nests at most 32 levels, and a
/// chain longer than [`MAX_ANCESTRY`] is not one a training command makes.
pub fn descends_from(pid: u32, root: u32, parent_of: impl Fn(u32) -> Option<u32>) -> bool {
    let mut pid = pid;
    for _ in 0..MAX_ANCESTRY {
        match parent_of(pid) {
            Some(p) if p == root => return true,
            Some(p) if p > 1 && p != pid => pid = p,
            _ => return false,
        }
    }
    false
}

/// How far [`descends_from`] follows a chain of parents.
pub const MAX_ANCESTRY: usize = 64;

/// The likely victims of `n` OOM kills: processes of the snapshot that are gone (or
/// zombies) now, largest RSS first. The OOM killer picks the largest process, so
/// among processes that vanished at the same moment the largest is the best guess.
pub fn victims(before: &BTreeMap<u32, ProcStat>, gone: &BTreeSet<u32>, n: usize) -> Vec<ProcStat> {
    let mut v: Vec<ProcStat> = before
        .values()
        .filter(|p| gone.contains(&p.pid))
        .cloned()
        .collect();
    v.sort_by(|a, b| b.rss_bytes.cmp(&a.rss_bytes).then(a.pid.cmp(&b.pid)));
    v.truncate(n);
    v
}

/// A process of CMD's tree as last seen, and whether a snapshot has missed it since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenProc {
    pub stat: ProcStat,
    pub seen: Instant,
    /// The cgroup's OOM kill count read right after the first snapshot that missed the
    /// process. A count no higher than before a kill means it was gone before that
    /// kill: it ended by itself, whatever its RSS (a `wget` of a readiness loop).
    pub vanished: Option<u64>,
}

/// Picks the victims of `n` OOM kills, those that took the cgroup's kill count above
/// `kills_before`, among recently seen processes. First choice: processes that were
/// alive in the latest snapshot and are gone (or zombies) now; second: those that a
/// snapshot missed first once the count had risen (a snapshot taken on the OOM
/// notification may already miss the victim), only with `second_choice`, as the
/// caller gives the first choice a moment to die. A process missed by a snapshot taken
/// before the kill is not a victim. Largest RSS first within each group.
pub fn pick_victims(
    recent: &BTreeMap<u32, SeenProc>,
    gone_now: &BTreeSet<u32>,
    kills_before: u64,
    n: usize,
    second_choice: bool,
) -> Vec<ProcStat> {
    let alive_then: BTreeMap<u32, ProcStat> = recent
        .iter()
        .filter(|(_, p)| p.vanished.is_none())
        .map(|(pid, p)| (*pid, p.stat.clone()))
        .collect();
    let mut out = victims(&alive_then, gone_now, n);
    if out.len() < n && second_choice {
        let vanished: BTreeMap<u32, ProcStat> = recent
            .iter()
            .filter(|(_, p)| p.vanished.is_some_and(|k| k > kills_before))
            .map(|(pid, p)| (*pid, p.stat.clone()))
            .collect();
        let all: BTreeSet<u32> = vanished.keys().copied().collect();
        out.extend(victims(&vanished, &all, n - out.len()));
    }
    out
}

/// The page size, for RSS in `/proc/<pid>/stat`.
pub fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |v| v as u64)
}

/// Every process visible in `/proc`.
pub fn all_processes(proc_root: &Path, page_size: u64) -> Vec<ProcStat> {
    let Ok(rd) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|s| parse_stat(&s, page_size))
        .collect()
}

/// Whether `pid` is under `root` now, from its `/proc` ancestry: a process forked
/// after the last snapshot of the tree is not in it yet.
pub fn is_under(proc_root: &Path, pid: u32, root: u32) -> bool {
    descends_from(pid, root, |p| {
        std::fs::read_to_string(proc_root.join(p.to_string()).join("stat"))
            .ok()
            .and_then(|s| parse_stat(&s, 4096))
            .map(|s| s.ppid)
    })
}

/// Whether a pid is gone or a zombie: both mean the process was killed or exited.
/// Whether `pid` is a zombie that ended by itself: its exit status (`/proc/<pid>/stat`
/// field 52, as `waitpid` gives it) is an exit code, or a signal other than SIGKILL,
/// the only one the OOM killer sends. Such a process is no OOM victim.
pub fn ended_by_itself(proc_root: &Path, pid: u32) -> bool {
    std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat"))
        .ok()
        .and_then(|s| zombie_status(&s))
        .is_some_and(|status| status & 0x7f != 9)
}

/// A zombie's exit status from the text of its `/proc/<pid>/stat`; `None` for a live
/// process or a kernel without the field (before 3.5).
fn zombie_status(text: &str) -> Option<i32> {
    let rest: Vec<&str> = text
        .get(text.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    if rest.first()? != &"Z" {
        return None;
    }
    // Field 52; `rest` starts at field 3 (the state).
    rest.get(49)?.parse().ok()
}

pub fn is_gone(proc_root: &Path, pid: u32, page_size: u64) -> bool {
    match std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) {
        Ok(s) => parse_stat(&s, page_size).is_none_or(|p| p.state == 'Z' || p.state == 'X'),
        Err(_) => true,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_zombies_status_says_whether_it_ended_by_itself() {
        // 52 fields; the state is field 3, the exit status field 52.
        let stat = |state: &str, status: i32| {
            let mut f: Vec<String> = (3..=52).map(|_| "0".to_string()).collect();
            f[0] = state.to_string();
            f[49] = status.to_string();
            format!("42 (sh) {}", f.join(" "))
        };
        assert_eq!(zombie_status(&stat("Z", 3 << 8)), Some(768));
        assert_eq!(zombie_status(&stat("Z", 9)), Some(9));
        assert_eq!(zombie_status(&stat("S", 0)), None);
        assert_eq!(zombie_status("42 (sh) Z 1 2"), None);
    }

    #[test]
    fn ancestry_reaches_the_root_through_any_depth_and_stops_at_init() {
        let parents: HashMap<u32, u32> = [(9, 7), (7, 1), (12, 9), (20, 1), (30, 30)].into();
        let parent_of = |p: u32| parents.get(&p).copied();
        assert!(descends_from(12, 7, parent_of));
        assert!(descends_from(9, 7, parent_of));
        assert!(!descends_from(7, 7, parent_of));
        assert!(!descends_from(20, 7, parent_of));
        // Gone, or its own parent: not under the root, and no endless walk.
        assert!(!descends_from(99, 7, parent_of));
        assert!(!descends_from(30, 7, parent_of));
        // Under init itself (exec as pid 1 of its container).
        assert!(descends_from(7, 1, parent_of));
        let chain = |p: u32| Some(p + 1);
        assert!(!descends_from(0, u32::MAX, chain));
    }

    #[test]
    fn this_process_is_under_its_parent() {
        let me = std::process::id();
        let parent = std::os::unix::process::parent_id();
        assert!(is_under(Path::new("/proc"), me, parent));
        assert!(!is_under(Path::new("/proc"), parent, me));
    }

    #[test]
    fn stat_lines_with_awkward_comms() {
        let line = "4242 (python) S 4200 4242 4200 0 -1 4194560 2400 0 0 0 12 3 0 0 20 0 4 0 9001 1234567 2048 18446744073709551615 1 1 0 0 0 0 0 16781312 17642 0 0 0 17 1 0 0 0 0 0\n";
        let p = parse_stat(line, 4096).unwrap();
        assert_eq!(
            (p.pid, p.comm.as_str(), p.state, p.ppid, p.rss_bytes),
            (4242, "python", 'S', 4200, 2048 * 4096)
        );
        // utime 12 + stime 3 ticks, and none of waited-for children.
        assert_eq!(p.cpu_ticks, 15);
        let odd = "77 (pt_data (1) w) R 1 77 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 100 10 0";
        let p = parse_stat(odd, 4096).unwrap();
        assert_eq!(
            (p.comm.as_str(), p.ppid, p.rss_bytes),
            ("pt_data (1) w", 1, 40960)
        );
        assert_eq!(parse_stat("garbage", 4096), None);
    }

    pub(crate) fn ps(pid: u32, ppid: u32, comm: &str, rss: u64) -> ProcStat {
        ProcStat {
            pid,
            comm: comm.into(),
            state: 'S',
            ppid,
            rss_bytes: rss,
            cpu_ticks: 0,
        }
    }

    #[test]
    fn tree_and_victims() {
        let procs = vec![
            ps(1, 0, "trainlet", 10),
            ps(10, 1, "sh", 1),
            ps(11, 10, "python", 500),
            ps(12, 11, "pt_data_worker", 900),
            ps(13, 11, "pt_data_worker", 800),
            ps(99, 0, "other", 5000),
        ];
        let tree = descendants(&procs, 1);
        assert_eq!(
            tree.keys().copied().collect::<Vec<_>>(),
            vec![10, 11, 12, 13]
        );
        let gone = BTreeSet::from([12, 13, 99]);
        let v = victims(&tree, &gone, 1);
        assert_eq!((v[0].pid, v[0].comm.as_str()), (12, "pt_data_worker"));
        assert_eq!(victims(&tree, &gone, 5).len(), 2);
        assert!(victims(&tree, &BTreeSet::new(), 1).is_empty());
    }

    #[test]
    fn a_process_that_exited_before_the_oom_is_not_its_victim() {
        let t0 = std::time::Instant::now();
        let seen = |p: ProcStat, vanished: Option<u64>| SeenProc {
            stat: p,
            seen: t0,
            vanished,
        };
        let mut recent = BTreeMap::from([
            // `sleep 1` exited normally, and a snapshot missed it before the kill
            // (the count was still 3 then).
            (20, seen(ps(20, 10, "sleep", 900 << 10), Some(3))),
            // The hog was alive in the latest snapshot, with less RSS than it has now.
            (21, seen(ps(21, 10, "memhog", 800 << 10), None)),
            (10, seen(ps(10, 1, "sh", 700 << 10), None)),
        ]);
        // The count rose from 3 to 4; both are gone now.
        let gone = BTreeSet::from([20, 21]);
        let v = pick_victims(&recent, &gone, 3, 1, true);
        assert_eq!(v[0].comm, "memhog");
        // The hog is still dying: no first choice yet, and the sleep is no answer.
        let only_sleep = BTreeSet::from([20]);
        assert!(pick_victims(&recent, &only_sleep, 3, 1, false).is_empty());
        assert!(pick_victims(&recent, &only_sleep, 3, 1, true).is_empty());
        // The notification's snapshot already missed the hog (reaped at once): it was
        // missed once the count was 4, the sleep before.
        recent.get_mut(&21).unwrap().vanished = Some(4);
        let v = pick_victims(&recent, &BTreeSet::new(), 3, 1, true);
        assert_eq!(v[0].comm, "memhog");
        // A later kill (4 to 5) is neither's.
        assert!(pick_victims(&recent, &BTreeSet::new(), 4, 1, true).is_empty());
    }
}
