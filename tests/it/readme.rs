//! The user documentation stays honest (README.md and docs/**/*.md; no control plane):
//! - the README is a front door of at most 300 lines; the depth lives in docs/;
//! - every relative link resolves to a file in the repository (and an anchor to a heading
//!   of that file);
//! - no relative path that climbs out of the repository, no issue references (`issue #`,
//!   `#12`) and no commit hashes (7 to 40 hex digits); the measured runs in
//!   docs/bench/*.json are not documentation and keep theirs;
//! - every fenced shell block of the README is followed, on the very next line, by a note
//!   saying what runs it: `Run by `FILE::TEST`` (the test exists in that file, and the
//!   program and subcommand of each command line appear in that file's source),
//!   `Run by `make demo`` (the commands appear in scripts/demo, or are `make demo`
//!   itself), or `kind only` for `kind` commands, which no test can run.
//!   The quickstart's blocks are run by tests/it/node_quickstart.rs on the real node.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use crate::support::repo;

const README_MAX_LINES: usize = 300;

/// Shell blocks: the info strings that mark a fenced block as commands to type.
const SHELL: [&str; 5] = ["sh", "bash", "shell", "console", "zsh"];

/// README.md and every Markdown file under docs/, as (path from the repository, text).
fn user_docs() -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut files = vec![repo().join("README.md")];
    walk(&repo().join("docs"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p.strip_prefix(repo()).unwrap().to_path_buf(), text)
        })
        .collect()
}

/// The lines outside fenced code blocks, with their 1-based numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The targets of inline links and images, `[text](target)`, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(text) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push((n, target.to_string()));
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_`
/// dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a Markdown file's headings give (duplicates as `-1`, `-2`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(&line[hashes..]);
            let mut s = base.clone();
            let mut k = 0;
            while out.contains(&s) {
                k += 1;
                s = format!("{base}-{k}");
            }
            out.insert(s);
        }
    }
    out
}

/// `a/b/../c` as `a/c`; None when it climbs out of the repository.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

#[test]
fn the_readme_is_a_short_front_door() {
    let text = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let n = text.lines().count();
    assert!(
        n <= README_MAX_LINES,
        "README.md has {n} lines, at most {README_MAX_LINES}: move the depth to docs/"
    );
}

#[test]
fn every_relative_link_resolves_to_a_file_in_the_repository() {
    let mut bad = Vec::new();
    let mut checked = 0;
    for (file, text) in user_docs() {
        let dir = file.parent().unwrap().to_path_buf();
        for (line, target) in links(&text) {
            if target.is_empty()
                || target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                Some(file.clone())
            } else {
                normalize(&dir.join(path))
            };
            let Some(resolved) = resolved else {
                bad.push(format!(
                    "{}:{line}: {target} leaves the repository",
                    file.display()
                ));
                continue;
            };
            let abs = repo().join(&resolved);
            if resolved.starts_with("target") || !abs.exists() {
                bad.push(format!(
                    "{}:{line}: {target}: no file {}",
                    file.display(),
                    resolved.display()
                ));
                continue;
            }
            if let Some(anchor) = anchor
                && resolved.extension().is_some_and(|x| x == "md")
            {
                let have = anchors(&std::fs::read_to_string(&abs).unwrap());
                if !have.contains(anchor) {
                    bad.push(format!(
                        "{}:{line}: {target}: no heading #{anchor} in {}",
                        file.display(),
                        resolved.display()
                    ));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} relative links found");
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

/// Tokens of 7 to 40 lower-case hex digits with a digit and a letter in them: what a
/// commit hash looks like (plain numbers and words are not).
fn commit_hashes(line: &str) -> Vec<&str> {
    line.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|t| {
            (7..=40).contains(&t.len())
                && t.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
                && t.chars().any(|c| c.is_ascii_digit())
                && t.chars().any(|c| c.is_ascii_alphabetic())
        })
        .collect()
}

/// `#` followed by a digit: an issue or pull request number.
fn issue_references(line: &str) -> bool {
    let lower = line.to_lowercase();
    lower.contains("issue #")
        || line
            .as_bytes()
            .windows(2)
            .any(|w| w[0] == b'#' && w[1].is_ascii_digit())
}

#[test]
fn user_docs_name_no_paths_outside_the_repository_no_issues_and_no_commits() {
    // The checks can fail.
    assert_eq!(
        commit_hashes("make bench at commit 4db8d9f, 85899345920 B"),
        ["4db8d9f"]
    );
    assert!(issue_references("as jax-ml/jax#12415 says"));
    assert!(!issue_references("see [x](a.md#exit-codes)"));
    assert!(escapes_repository(0, "see ../notes/a.md"));
    assert!(escapes_repository(1, "see ../../notes/a.md"));
    assert!(!escapes_repository(1, "see [README](../README.md)"));

    let mut bad = Vec::new();
    for (file, text) in user_docs() {
        for (i, line) in text.lines().enumerate() {
            let at = format!("{}:{}", file.display(), i + 1);
            let depth = file
                .strip_prefix(repo())
                .unwrap_or(&file)
                .components()
                .count()
                - 1;
            if escapes_repository(depth, line) {
                bad.push(format!("{at}: a path outside the repository: {line}"));
            }
            if issue_references(line) {
                bad.push(format!("{at}: an issue reference: {line}"));
            }
            for h in commit_hashes(line) {
                bad.push(format!("{at}: a commit hash {h}: {line}"));
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// A fenced shell block of the README: its first line number, its command lines
/// (continuations joined) and the line right after its closing fence.
struct Block {
    line: usize,
    commands: Vec<String>,
    note: String,
}

fn shell_blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].starts_with("```") {
            body.push(lines[i]);
            i += 1;
        }
        let note = lines.get(i + 1).copied().unwrap_or("").to_string();
        i += 1;
        if !SHELL.contains(&info.trim()) {
            continue;
        }
        let mut commands = Vec::new();
        let mut current = String::new();
        for l in body {
            let l = l.trim();
            if current.is_empty() && (l.is_empty() || l.starts_with('#')) {
                continue;
            }
            match l.strip_suffix('\\') {
                Some(head) => {
                    current.push_str(head);
                    current.push(' ');
                }
                None => {
                    current.push_str(l);
                    commands.push(std::mem::take(&mut current));
                }
            }
        }
        out.push(Block {
            line: start + 1,
            commands,
            note,
        });
    }
    out
}

/// Each command of a line (split at `|`, `&&`, `||`, `;`) as (program, subcommand):
/// leading `VAR=value` words skipped; the subcommand is the next word when it is one
/// (`kubectl apply`, `make image`), not a flag or a path.
fn programs(command: &str) -> Vec<(String, Option<String>)> {
    command
        .split(['|', ';', '&'])
        .filter_map(|segment| {
            let mut words = segment
                .split_whitespace()
                .skip_while(|w| w.contains('=') && !w.starts_with('-'));
            let program = words.next()?.to_string();
            let sub = words.next().filter(|w| {
                w.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                    && w.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            });
            Some((program, sub.map(str::to_string)))
        })
        .collect()
}

/// What a note says runs the block: `Run by `X`` references and whether it says
/// `kind only`.
fn runners(note: &str) -> (Vec<String>, bool) {
    let mut refs = Vec::new();
    let mut rest = note;
    while let Some(i) = rest.find("Run by `") {
        let after = &rest[i + "Run by `".len()..];
        let Some(end) = after.find('`') else { break };
        refs.push(after[..end].to_string());
        rest = &after[end..];
    }
    (refs, note.contains("kind only"))
}

/// Whether `source` has `name` at a word's start (`kubectl` in `kubectl(`,
/// `kubectl_on(` or `"kubectl"`).
fn has_word_start(source: &str, name: &str) -> bool {
    source.match_indices(name).any(|(i, _)| {
        source[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    })
}

/// Whether `source` has `word` as a whole word.
fn has_word(source: &str, word: &str) -> bool {
    let w = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-');
    source.match_indices(word).any(|(i, _)| {
        !w(source[..i].chars().next_back()) && !w(source[i + word.len()..].chars().next())
    })
}

/// Whether `fn name(` in `source` is a test (`#[test]`, `#[tokio::test]`, ... right
/// above it).
fn is_test_fn(source: &str, name: &str) -> bool {
    let lines: Vec<&str> = source.lines().collect();
    lines.iter().enumerate().any(|(i, l)| {
        l.contains(&format!("fn {name}("))
            && lines[..i]
                .iter()
                .rev()
                .take_while(|a| a.trim_start().starts_with("#[") || a.trim().is_empty())
                .any(|a| a.contains("test]") || a.contains("test("))
    })
}

#[test]
fn every_shell_block_of_the_readme_says_what_runs_it() {
    // The parsers can fail.
    assert_eq!(
        programs("trainlet inject -f x.yaml --wrap t | kubectl apply -n ml -f -"),
        [
            ("trainlet".to_string(), Some("inject".to_string())),
            ("kubectl".to_string(), Some("apply".to_string()))
        ]
    );
    assert_eq!(
        programs("A=1 make image"),
        [("make".to_string(), Some("image".to_string()))]
    );
    assert!(has_word_start("kubectl_on(&kc, &[\"apply\"])", "kubectl"));
    assert!(!has_word_start("my_kubectl()", "kubectl"));

    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let demo = std::fs::read_to_string(repo().join("scripts/demo")).unwrap();
    let makefile = std::fs::read_to_string(repo().join("Makefile")).unwrap();
    assert!(
        makefile.contains("\ndemo: ") && makefile.contains("@scripts/demo"),
        "make demo runs scripts/demo"
    );
    let blocks = shell_blocks(&readme);
    assert!(blocks.len() >= 5, "{} shell blocks", blocks.len());

    let mut bad = Vec::new();
    for b in &blocks {
        let at = format!("README.md:{}", b.line);
        let (refs, kind_only) = runners(&b.note);
        if refs.is_empty() && !kind_only {
            bad.push(format!(
                "{at}: the line after the block says nothing runs it (`Run by `FILE::TEST``, `Run by `make demo``, or `kind only`): {:?}",
                b.note
            ));
            continue;
        }
        // Each reference's source: the named test's file (Rust: a subcommand is a string
        // literal, `"apply"`), or scripts/demo (shell: a word).
        let mut sources: Vec<(String, String, bool)> = Vec::new();
        for r in &refs {
            if r == "make demo" {
                sources.push((r.clone(), demo.clone(), false));
                continue;
            }
            let Some((file, test)) = r.split_once("::") else {
                bad.push(format!("{at}: `{r}` is neither FILE::TEST nor make demo"));
                continue;
            };
            let path = repo().join(file);
            if !path.is_file() {
                bad.push(format!("{at}: {file} does not exist"));
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            if !is_test_fn(&source, test) {
                bad.push(format!("{at}: no test fn {test} in {file}"));
                continue;
            }
            sources.push((r.clone(), source, true));
        }
        if sources.is_empty() {
            continue;
        }
        for command in &b.commands {
            for (program, sub) in programs(command) {
                if program == "kind" {
                    if !kind_only {
                        bad.push(format!("{at}: `{command}` is kind's: say `kind only`"));
                    }
                    continue;
                }
                if program == "make"
                    && sub.as_deref() == Some("demo")
                    && refs.iter().any(|r| r == "make demo")
                {
                    continue;
                }
                let found = sources.iter().any(|(_, src, rust)| {
                    has_word_start(src, &program)
                        && sub.as_ref().is_none_or(|s| {
                            if *rust {
                                src.contains(&format!("\"{s}\""))
                            } else {
                                has_word(src, s)
                            }
                        })
                });
                if !found {
                    let names: Vec<&str> = sources.iter().map(|(r, _, _)| r.as_str()).collect();
                    bad.push(format!(
                        "{at}: `{program}{}` of `{command}` is not in {}",
                        sub.as_ref().map(|s| format!(" {s}")).unwrap_or_default(),
                        names.join(", ")
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// Whether `line`, in a file `depth` folders below the repository's root, names a
/// relative path that climbs above the root (more `../` in a row than `depth`).
fn escapes_repository(depth: usize, line: &str) -> bool {
    line.match_indices("../")
        .filter(|(i, _)| !line[..*i].ends_with('.'))
        .any(|(i, _)| {
            let ups = line.as_bytes()[i..]
                .chunks(3)
                .take_while(|c| *c == b"../")
                .count();
            ups > depth
        })
}
