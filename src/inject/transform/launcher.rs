//! The frameworks a wrapped command's launcher asks for, where `--framework` (or the
//! annotation `trainlet.io/framework`) is not given: `torchrun train.py` gets PyTorch's
//! variables without anyone remembering `--framework pytorch`.
//!
//! One table ([`LAUNCHERS`]) makes both sides: `inject` matches a container's command
//! with the regex crate, and the admission policy matches the pod's with CEL's
//! `matches` (RE2 syntax), from the same patterns ([`pattern`]). The patterns use only
//! what both engines read alike: explicit ASCII classes (no `\s`, whose meaning differs),
//! `^`, `$`, groups and repetition; and both sides match the same text ([`line`]).
//!
//! The text is the command and its args joined by spaces, past a `trainlet exec … --`
//! in front (inject's, or the user's own), its first [`MAX_LINE`] characters: a
//! `sh -c "…"` script then reads as the words of a shell line. A launcher counts where
//! a shell would run it: first, or after `;`, `&`, `|`, `(` or a line break, past
//! `exec`, `env`, variable assignments, a shell's `-c` and a `trainlet exec … --`. So
//! `mpirun -np 4 python train.py` is MPI's, and `python train.py --launcher torchrun`
//! is nobody's: a plain `python` (which may be anything) infers nothing, and
//! TensorFlow's default stays.

use std::sync::LazyLock;

use regex::Regex;

use super::wrapper::Wrapper;
use crate::render::frameworks::Framework;

/// How much of the command line is read: enough for a launcher behind a long
/// preamble, and a bound on what one pod's command costs the API server to match
/// (CEL's cost of `matches` grows with the text's length).
pub const MAX_LINE: usize = 4096;

/// One launcher: the name a note gives it, the pattern of its words in a command
/// position, and the frameworks whose variables it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launcher {
    pub name: &'static str,
    words: &'static str,
    pub frameworks: &'static [Framework],
}

/// The launchers, in the order a note names them.
///
/// `deepspeed` is PyTorch's only: its launcher starts its processes with
/// torch.distributed's `MASTER_ADDR`, `MASTER_PORT`, `RANK` and `WORLD_SIZE`, and its
/// `--hostfile` is written whatever the frameworks (mpi.env holds only
/// `TRAINLET_HOSTS`, which it does not read). `horovodrun` is MPI's only: it reads its
/// hosts (`-H`, from `TRAINLET_HOSTS`) and runs its own rendezvous, whatever framework
/// the script trains with, and reads none of torch.env's variables.
pub const LAUNCHERS: [Launcher; 7] = [
    Launcher {
        name: "torchrun",
        words: "torchrun",
        frameworks: &[Framework::Pytorch],
    },
    Launcher {
        name: "python -m torch.distributed.run",
        words: r"PYTHONtorch\.distributed\.(?:run|launch)",
        frameworks: &[Framework::Pytorch],
    },
    Launcher {
        name: "accelerate launch",
        words: r"(?:accelerate[ \t\n]+launch|accelerate-launch|PYTHONaccelerate\.commands\.launch)",
        frameworks: &[Framework::Pytorch],
    },
    Launcher {
        name: "deepspeed",
        words: r"(?:deepspeed|PYTHONdeepspeed\.launcher\.runner)",
        frameworks: &[Framework::Pytorch],
    },
    Launcher {
        name: "mpirun",
        words: "mpirun",
        frameworks: &[Framework::Mpi],
    },
    Launcher {
        name: "mpiexec",
        words: "mpiexec",
        frameworks: &[Framework::Mpi],
    },
    Launcher {
        name: "horovodrun",
        words: "horovodrun",
        frameworks: &[Framework::Mpi],
    },
];

/// Blanks between words, and a word's characters: the shell's, spelt out (RE2's `\s`
/// and the regex crate's differ beyond ASCII).
const BLANK: &str = r"[ \t\n]";
const WORD: &str = r"[^ \t\n;&|()]";

/// `python`, `python3`, `/usr/bin/python3.11`, with its options, up to `-m ` (also
/// `-um`, `-mMODULE`).
const PYTHON: &str = r"python(?:[0-9][0-9.]*)?(?:[ \t\n]+-[bBdEiIOPqRsSuvx]+|[ \t\n]+-[WX][ \t\n]*[^ \t\n;&|()]+)*[ \t\n]+-[bBdEiIOPqRsSuvx]*m[ \t\n]*";

/// The pattern that finds one of `words` (alternatives of [`Launcher::words`]) where a
/// shell would run it. The same text for the regex crate and for CEL.
pub fn pattern(words: &[&str]) -> String {
    let b = BLANK;
    let w = WORD;
    // What may stand before a launcher in its command position: `exec`, `env`, `nohup`,
    // `time`, a shell keyword, `NAME=value`, a `trainlet exec … --`, a shell's `-c`.
    let prefix = format!(
        r"(?:exec|env|nohup|time|then|do|else|\{{|!|[A-Za-z_][A-Za-z0-9_]*={w}*|(?:{w}*/)?trainlet{b}+exec(?:{b}+[^ \t\n]+)*?{b}+--|(?:{w}*/)?(?:ba|da|z|k|a)?sh(?:{b}+[-+]o{b}+[a-z]+|{b}+[-+]{w}*)*?{b}+-[A-Za-z]*c[A-Za-z]*){b}+"
    );
    let words = words.join("|").replace("PYTHON", PYTHON);
    format!(r"(?:^|[;&|(\n]){b}*(?:{prefix})*(?:{w}*/)?(?:{words})(?:[ \t\n;&|)]|$)")
}

/// The text that [`pattern`] reads of a container: its command (past a `trainlet
/// exec … --` in front of it) and args, joined by spaces, its first [`MAX_LINE`]
/// characters.
pub fn line(command: &[String], args: &[String]) -> String {
    let command = match Wrapper::of(command) {
        Wrapper::Own { original, .. } | Wrapper::Users { original, .. } => original,
        Wrapper::None => command,
    };
    let all: Vec<&str> = command.iter().chain(args).map(String::as_str).collect();
    all.join(" ").chars().take(MAX_LINE).collect()
}

/// The frameworks that can be inferred, in the order `--framework` lists them.
fn inferable() -> Vec<Framework> {
    let mut f: Vec<Framework> = LAUNCHERS
        .iter()
        .flat_map(|l| l.frameworks.iter().copied())
        .collect();
    f.sort();
    f.dedup();
    f
}

/// The pattern of every launcher of `framework`: the one CEL matches.
pub fn framework_pattern(framework: Framework) -> String {
    let words: Vec<&str> = LAUNCHERS
        .iter()
        .filter(|l| l.frameworks.contains(&framework))
        .map(|l| l.words)
        .collect();
    pattern(&words)
}

/// Each inferable framework with its compiled pattern.
static FRAMEWORKS: LazyLock<Vec<(Framework, Regex)>> = LazyLock::new(|| {
    inferable()
        .into_iter()
        .map(|f| (f, compile(&framework_pattern(f))))
        .collect()
});

/// Each launcher with its compiled pattern, for the note.
static NAMED: LazyLock<Vec<(&'static str, Regex)>> = LazyLock::new(|| {
    LAUNCHERS
        .iter()
        .map(|l| (l.name, compile(&pattern(&[l.words]))))
        .collect()
});

fn compile(p: &str) -> Regex {
    // The patterns are constants of this file; the tests compile every one.
    Regex::new(p).unwrap_or_else(|e| panic!("launcher pattern {p:?}: {e}"))
}

/// What a wrapped command's launchers ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inferred {
    /// The frameworks, each once, in `--framework`'s order.
    pub frameworks: Vec<Framework>,
    /// The launchers seen, by name, in [`LAUNCHERS`]' order.
    pub launchers: Vec<&'static str>,
}

impl Inferred {
    /// `pytorch,mpi`: the value of `--framework`.
    pub fn value(&self) -> String {
        self.frameworks
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The frameworks of the launchers in a container's `command` and `args`; `None`
/// where it names none (a plain `python`).
pub fn infer(command: &[String], args: &[String]) -> Option<Inferred> {
    let text = line(command, args);
    let frameworks: Vec<Framework> = FRAMEWORKS
        .iter()
        .filter(|(_, re)| re.is_match(&text))
        .map(|(f, _)| *f)
        .collect();
    if frameworks.is_empty() {
        return None;
    }
    let launchers = NAMED
        .iter()
        .filter(|(_, re)| re.is_match(&text))
        .map(|(name, _)| *name)
        .collect();
    Some(Inferred {
        frameworks,
        launchers,
    })
}

/// CEL of the value `infer` gives `--framework` for the text `line` (a CEL string,
/// made as [`line`] makes it): `'pytorch'`, `'pytorch,mpi'`, or `''` for none.
pub fn cel_value(line: &str, quote: impl Fn(&str) -> String) -> String {
    let parts: Vec<String> = inferable()
        .into_iter()
        .map(|f| {
            format!(
                "({line}.matches({}) ? [{}] : [])",
                quote(&framework_pattern(f)),
                quote(&f.name())
            )
        })
        .collect();
    format!("({}).join(',')", parts.join(" + "))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    /// `(frameworks, launchers)` of a command given as space-separated words, with
    /// `args` given apart.
    fn of(command: &[&str], args: &[&str]) -> Option<(String, Vec<&'static str>)> {
        let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        infer(&s(command), &s(args)).map(|i| (i.value(), i.launchers))
    }

    /// A command, its args, the frameworks and the launchers seen.
    type Case<'a> = (&'a [&'a str], &'a [&'a str], &'a str, &'a [&'a str]);

    #[test]
    fn each_launcher_gives_its_frameworks() {
        let cases: &[Case] = &[
            (&["torchrun", "train.py"], &[], "pytorch", &["torchrun"]),
            (
                &["/usr/local/bin/torchrun"],
                &["--nproc-per-node=2", "train.py"],
                "pytorch",
                &["torchrun"],
            ),
            (
                &["python", "-m", "torch.distributed.run", "train.py"],
                &[],
                "pytorch",
                &["python -m torch.distributed.run"],
            ),
            (
                &["/opt/conda/bin/python3.11", "-u", "-X", "dev"],
                &["-m", "torch.distributed.launch", "train.py"],
                "pytorch",
                &["python -m torch.distributed.run"],
            ),
            (
                &["python3", "-um", "torch.distributed.run"],
                &[],
                "pytorch",
                &["python -m torch.distributed.run"],
            ),
            (
                &["python", "-mtorch.distributed.run"],
                &[],
                "pytorch",
                &["python -m torch.distributed.run"],
            ),
            (
                &["accelerate", "launch", "train.py"],
                &[],
                "pytorch",
                &["accelerate launch"],
            ),
            (
                &["accelerate-launch", "train.py"],
                &[],
                "pytorch",
                &["accelerate launch"],
            ),
            (
                &["deepspeed"],
                &["--hostfile", "/etc/trainlet/hostfile", "train.py"],
                "pytorch",
                &["deepspeed"],
            ),
            (
                &["mpirun", "-np", "4", "python", "train.py"],
                &[],
                "mpi",
                &["mpirun"],
            ),
            (
                &["/usr/bin/mpiexec", "-n", "2", "a.out"],
                &[],
                "mpi",
                &["mpiexec"],
            ),
            (
                &[
                    "horovodrun",
                    "-np",
                    "4",
                    "-H",
                    "$(TRAINLET_HOSTS)",
                    "python",
                    "train.py",
                ],
                &[],
                "mpi",
                &["horovodrun"],
            ),
        ];
        for (command, args, frameworks, launchers) in cases {
            assert_eq!(
                of(command, args),
                Some((frameworks.to_string(), launchers.to_vec())),
                "{command:?} {args:?}"
            );
        }
    }

    #[test]
    fn shells_exec_and_trainlet_exec_are_looked_through() {
        let cases: &[(&[&str], &[&str], &str)] = &[
            (&["sh", "-c", "torchrun train.py"], &[], "pytorch"),
            (
                &["/bin/bash", "-lc"],
                &["pip install -r req.txt && exec torchrun train.py"],
                "pytorch",
            ),
            (
                &[
                    "bash",
                    "-e",
                    "-o",
                    "pipefail",
                    "-c",
                    "cd /w; NCCL_DEBUG=INFO env A=1 mpirun -np 2 x",
                ],
                &[],
                "mpi",
            ),
            (
                &[
                    "sh",
                    "-c",
                    "set -e\nsource /etc/trainlet/trainlet.env\ntorchrun t.py",
                ],
                &[],
                "pytorch",
            ),
            (
                &["sh", "-c", "mpirun -np 2 hostname && (deepspeed train.py)"],
                &[],
                "pytorch,mpi",
            ),
            (
                &[
                    "/etc/trainlet/bin/trainlet",
                    "exec",
                    "--report",
                    "--max-restarts=5",
                    "--",
                    "torchrun",
                    "t.py",
                ],
                &[],
                "pytorch",
            ),
            // The user's own, with a flag of spaces and parentheses.
            (
                &[
                    "trainlet",
                    "exec",
                    "--progress-pattern=step (\\d+)",
                    "--",
                    "horovodrun",
                ],
                &["python", "train.py"],
                "mpi",
            ),
            // Its `--` in args.
            (
                &["trainlet", "exec", "--report", "--"],
                &["python", "-m", "torch.distributed.run", "t.py"],
                "pytorch",
            ),
        ];
        for (command, args, frameworks) in cases {
            assert_eq!(
                of(command, args).map(|(f, _)| f).as_deref(),
                Some(*frameworks),
                "{command:?} {args:?}"
            );
        }
    }

    #[test]
    fn a_launcher_where_no_shell_runs_it_is_no_launcher() {
        for command in [
            "python train.py",
            "python3 -m train",
            "python -c import torch.distributed.run",
            "python train.py --launcher torchrun",
            "python train.py torchrun",
            "echo torchrun",
            "sh run-torchrun.sh",
            "sh -c echo mpirun",
            "torchrunner train.py",
            "mytorchrun train.py",
            "accelerate config",
            "/opt/torchrun-1/python train.py",
            "python -m torch.distributed.runner",
            "",
        ] {
            let command: Vec<&str> = command.split(' ').collect();
            assert_eq!(of(&command, &[]), None, "{command:?}");
        }
    }

    /// Only the first MAX_LINE characters are read, by both sides alike.
    #[test]
    fn the_line_is_bounded() {
        let preamble = "x".repeat(MAX_LINE);
        let script = format!("{preamble}; torchrun t.py");
        assert_eq!(of(&["sh", "-c", &script], &[]), None);
        let script = format!("{}; torchrun t.py", "x".repeat(MAX_LINE - 30));
        assert!(of(&["sh", "-c", &script], &[]).is_some());
        assert_eq!(line(&words("a b"), &words("c")), "a b c");
        assert_eq!(
            line(&words("/x/trainlet exec --report -- a"), &words("b")),
            "a b"
        );
        assert_eq!(
            line(&words("é"), &["é".repeat(MAX_LINE)]).chars().count(),
            MAX_LINE
        );
    }

    /// The policy's CEL, one `matches` per framework, in `--framework`'s order.
    #[test]
    fn cel_matches_each_frameworks_pattern() {
        let q = |s: &str| format!("<{s}>");
        assert_eq!(
            cel_value("L", q),
            format!(
                "((L.matches(<{}>) ? [<pytorch>] : []) + (L.matches(<{}>) ? [<mpi>] : [])).join(',')",
                framework_pattern(Framework::Pytorch),
                framework_pattern(Framework::Mpi)
            )
        );
    }

    /// Nothing whose meaning differs between Go's regexp (CEL) and the regex crate: no
    /// `&&`, `--` or `~~` inside a class (set operations to the regex crate), no `\s`,
    /// `\S`, `\w` or `\d` (Unicode classes to the regex crate, ASCII ones to Go), no
    /// flags.
    #[test]
    fn the_patterns_mean_the_same_to_both_engines() {
        let classes = Regex::new(r"\[(?:\\.|[^\]])*\]").unwrap();
        for f in inferable() {
            let p = framework_pattern(f);
            for bad in [r"\s", r"\S", r"\w", r"\d", "(?i", "(?m", "(?s", "(?u"] {
                assert!(!p.contains(bad), "{bad} in {p}");
            }
            for class in classes.find_iter(&p) {
                for bad in ["&&", "--", "~~", "["] {
                    assert!(
                        !class.as_str()[1..].contains(bad),
                        "{bad} in {}",
                        class.as_str()
                    );
                }
            }
        }
    }

    proptest! {
        #![proptest_config(crate::testing::budget(256))]

        /// Whatever the words, inference ends, and agrees with the launchers' own
        /// patterns: a framework is inferred exactly when one of its launchers is seen.
        #[test]
        fn never_panics_and_the_frameworks_follow_the_launchers(
            command in prop::collection::vec(
                "(torchrun|mpirun|sh|-c|-m|python3?|accelerate|launch|exec|--|trainlet|[ ;&|()\n]|[a-z./=-]{0,6}|\\PC{0,4})",
                0..8,
            ),
            args in prop::collection::vec("(torchrun|deepspeed|horovodrun|; |\\PC{0,6})", 0..4),
        ) {
            let got = infer(&command, &args);
            let text = line(&command, &args);
            for f in inferable() {
                let by_launchers = LAUNCHERS
                    .iter()
                    .filter(|l| l.frameworks.contains(&f))
                    .any(|l| compile(&pattern(&[l.words])).is_match(&text));
                let inferred = got.as_ref().is_some_and(|i| i.frameworks.contains(&f));
                prop_assert_eq!(by_launchers, inferred);
            }
        }
    }
}
