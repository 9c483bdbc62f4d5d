use super::*;
use crate::stacks::{Capture, Frame, Process, Thread};

fn f(function: &str, file: &str, line: u32) -> Frame {
    Frame {
        function: function.into(),
        file: file.into(),
        line,
    }
}

const SITE: &str = "/usr/local/lib/python3.12/site-packages";

fn rank(pid: u32, r: Option<u32>, frames: Vec<Frame>) -> Capture {
    Capture::Read(Process {
        pid,
        command: "python train.py".into(),
        rank: r,
        cwd: Some("/workspace".into()),
        threads: vec![
            Thread {
                id: 0x7f00,
                name: Some("pt_autograd_0".into()),
                main: false,
                active: false,
                frames: vec![f("wait", "/usr/lib/python3.12/threading.py", 355)],
            },
            Thread {
                id: 0x7f01,
                name: Some("MainThread".into()),
                main: true,
                active: true,
                frames,
            },
        ],
    })
}

fn reducing() -> Vec<Frame> {
    vec![
        f(
            "all_reduce",
            &format!("{SITE}/torch/distributed/distributed_c10d.py"),
            2501,
        ),
        f(
            "wrapper",
            &format!("{SITE}/torch/distributed/c10d_logger.py"),
            81,
        ),
        f("train_step", "/workspace/train.py", 88),
        f("<module>", "/workspace/train.py", 120),
    ]
}

#[test]
fn paths_are_shown_from_the_package_the_standard_library_or_the_working_directory() {
    let cwd = Some("/workspace");
    assert_eq!(
        short_path(
            &format!("{SITE}/torch/distributed/distributed_c10d.py"),
            cwd
        ),
        "torch/distributed/distributed_c10d.py"
    );
    assert_eq!(
        short_path("/usr/lib/python3/dist-packages/numpy/core.py", cwd),
        "numpy/core.py"
    );
    assert_eq!(
        short_path("/usr/lib/python3.12/threading.py", cwd),
        "threading.py"
    );
    assert_eq!(short_path("/workspace/src/data.py", cwd), "src/data.py");
    assert_eq!(short_path("/opt/other/data.py", cwd), "data.py");
    assert_eq!(short_path("/workspace/train.py", None), "train.py");
    assert_eq!(short_path("<frozen runpy>", cwd), "<frozen runpy>");
}

#[test]
fn the_users_own_code_is_what_is_no_package_no_standard_library_and_not_frozen() {
    assert!(is_user(&f("step", "/workspace/train.py", 1)));
    assert!(is_user(&f("step", "/home/me/lib/pythonic/x.py", 1)));
    assert!(!is_user(&f("x", &format!("{SITE}/torch/nn/module.py"), 1)));
    assert!(!is_user(&f("x", "/usr/lib/python3.12/threading.py", 1)));
    assert!(!is_user(&f("x", "<frozen importlib._bootstrap>", 1)));
}

#[test]
fn each_ranks_main_thread_is_said_innermost_first_then_its_own_code() {
    let captures = vec![
        rank(12, Some(1), reducing()),
        rank(
            11,
            Some(0),
            vec![
                f("load_batch", "/workspace/data.py", 41),
                f("train_step", "/workspace/train.py", 80),
            ],
        ),
        rank(
            10,
            None,
            vec![f(
                "_poll",
                &format!("{SITE}/torch/distributed/elastic/agent/server/api.py"),
                900,
            )],
        ),
        Capture::Unreadable {
            pid: 9,
            command: "sleep 1000".into(),
            why: "not a Python process".into(),
        },
    ];
    assert_eq!(
        summary(&captures),
        "rank 0: load_batch (data.py:41); rank 1: all_reduce (torch/distributed/distributed_c10d.py:2501) ← train_step (train.py:88)"
    );
    assert_eq!(
        places(&captures),
        [
            "load_batch (data.py:41)",
            "all_reduce (torch/distributed/distributed_c10d.py:2501) ← train_step (train.py:88)"
        ]
    );
}

#[test]
fn without_ranks_every_python_process_is_said_and_without_python_so_is_that() {
    let captures = vec![rank(
        7,
        None,
        vec![f("sleep_forever", "/workspace/hang.py", 3)],
    )];
    assert_eq!(summary(&captures), "pid 7: sleep_forever (hang.py:3)");
    let none = vec![Capture::Unreadable {
        pid: 5,
        command: "sleep 1000".into(),
        why: "not a Python process".into(),
    }];
    assert_eq!(summary(&none), "no Python process");
    assert!(places(&none).is_empty());
    // A Python process exec may not read is told with why, not taken for none.
    let denied = vec![
        none[0].clone(),
        Capture::Unreadable {
            pid: 6,
            command: "python train.py".into(),
            why: "Permission denied (os error 13)".into(),
        },
    ];
    assert_eq!(
        summary(&denied),
        "no stack read: pid 6: Permission denied (os error 13)"
    );
    assert!(places(&denied).is_empty());
}

#[test]
fn the_dump_has_every_thread_and_is_cut_with_a_note_past_its_bounds() {
    let deep: Vec<Frame> = (0..10_000)
        .map(|i| f("recurse", "/workspace/deep.py", i))
        .collect();
    let mut captures = vec![rank(3, Some(0), deep)];
    captures.push(Capture::Unreadable {
        pid: 4,
        command: "sleep".into(),
        why: "not a Python process".into(),
    });
    let text = dump(&captures, 936);
    assert!(text.starts_with("process 3 (python train.py), rank 0:\n  thread 0x7f00 \"pt_autograd_0\" (idle):\n    wait (threading.py:355)\n  thread 0x7f01 \"MainThread\" (active):\n    recurse (deep.py)\n    recurse (deep.py:1)\n"));
    assert_eq!(text.matches("    recurse").count(), MAX_FRAMES);
    assert!(text.ends_with("    … 9872 more frames\nprocess 4 (sleep): not read: not a Python process\n… 936 more processes not read (at most 64)\n"));
}

#[test]
fn hostile_frame_text_is_escaped_and_bounded() {
    let long = "x".repeat(10_000);
    let t = Thread {
        id: 1,
        name: None,
        main: true,
        active: true,
        frames: vec![f(
            "evil\x1b]0;pwned\x07\r\u{202e}",
            &format!("/w/{long}.py"),
            1,
        )],
    };
    let at = place(&t, Some("/w")).unwrap();
    assert!(
        at.starts_with("evil\\e]0;pwned\\u{7}\\r\\u{202e} (xxx"),
        "{at}"
    );
    assert_eq!(
        at.chars().count(),
        "evil\\e]0;pwned\\u{7}\\r\\u{202e}".chars().count() + 3 + MAX_NAME + ":1".len()
    );
    assert!(!at.chars().any(|c| c.is_control()));
}
