//! The dependency rule of `docs/architecture.md`, checked in the repository: the command
//! line's modules (`cli/`, `cmd/`, `main.rs`) are the only ones that name `crate::cli`,
//! `crate::cmd` or clap; neither the file-level module graph nor the graph of the
//! top-level folders of `src/` has a loop; no source file holds more than 500 lines of
//! non-test code, no function is longer than 80 lines, and no struct has more than 20
//! fields: past those, a reader no longer takes a file or a function in at once. Each
//! of the doc's three routes names files that exist, as many as it says, at most 10.
//!
//! The graph's edges are a file's `crate::…` paths and `super::…` references, each to the
//! longest module path that is a file of the crate; a unit-test module (`tests.rs`,
//! `*_tests.rs`, or an inline `#[cfg(test)] mod tests { … }` at a file's end) may import
//! anything, so its edges do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::support::repo;

/// The crate's source files, by path relative to `src/`, with their test modules cut.
fn sources() -> BTreeMap<String, String> {
    let src = repo().join("src");
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
                if is_test_file(&rel) {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                out.insert(rel, without_tests(&text));
            }
        }
    }
    out
}

fn is_test_file(rel: &str) -> bool {
    let name = Path::new(rel).file_name().unwrap().to_string_lossy();
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// The text before an inline `#[cfg(test)]` test module.
fn without_tests(text: &str) -> String {
    match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => text[..i].to_string(),
        None => text.to_string(),
    }
}

/// The text without `//` comments (doc comments included), for the clap check.
fn code_only(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Each file's edges to the crate's other files.
fn graph(files: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let mods: BTreeMap<Vec<String>, String> =
        files.keys().map(|f| (module_of(f), f.clone())).collect();
    let resolve = |path: &[String]| {
        (1..=path.len())
            .rev()
            .find_map(|k| mods.get(&path[..k]).cloned())
    };
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut edges = BTreeMap::new();
    for (f, text) in files {
        let here = module_of(f);
        let mut to = BTreeSet::new();
        // crate::a::b
        for (i, _) in text.match_indices("crate::") {
            if text[..i].ends_with(|c: char| ident(c) || c == ':') {
                continue;
            }
            let path: Vec<String> = text[i + 7..]
                .split("::")
                .map(|s| s.chars().take_while(|c| ident(*c)).collect::<String>())
                .take_while(|s| !s.is_empty())
                .collect();
            if let Some(t) = resolve(&path).filter(|t| t != f) {
                to.insert(t);
            }
        }
        // super::super::a::b
        for (i, _) in text.match_indices("super::") {
            if text[..i].ends_with(|c: char| ident(c) || c == ':') {
                continue;
            }
            let mut n = 0;
            let mut tail = &text[i..];
            while let Some(t) = tail.strip_prefix("super::") {
                n += 1;
                tail = t;
            }
            if n > here.len() {
                continue;
            }
            let mut path: Vec<String> = here[..here.len() - n].to_vec();
            path.extend(
                tail.split("::")
                    .map(|s| s.chars().take_while(|c| ident(*c)).collect::<String>())
                    .take_while(|s| !s.is_empty()),
            );
            if let Some(t) = resolve(&path).filter(|t| t != f) {
                to.insert(t);
            }
        }
        edges.insert(f.clone(), to);
    }
    edges
}

/// The import loops: strongly connected groups of more than one file (Tarjan).
fn loops(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    impl<'a> T<'a> {
        fn strong(&mut self, v: &'a str) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on.insert(v);
            for w in &self.edges[v] {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.strong(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                loop {
                    let w = self.stack.pop().unwrap();
                    self.on.remove(w);
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.strong(v);
        }
    }
    t.out
}

/// The graph between the top-level parts of `src/`: a folder, or a file at the top
/// (`time.rs` is `time`).
fn folders(edges: &BTreeMap<String, BTreeSet<String>>) -> BTreeMap<String, BTreeSet<String>> {
    let top = |f: &str| {
        let first = f.split('/').next().unwrap_or(f);
        first.trim_end_matches(".rs").to_string()
    };
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (f, to) in edges {
        let from = top(f);
        let set = out.entry(from.clone()).or_default();
        set.extend(to.iter().map(|t| top(t)).filter(|t| *t != from));
    }
    for to in out.values().flatten().cloned().collect::<Vec<_>>() {
        out.entry(to).or_default();
    }
    out
}

/// The most fields a struct may have: past it, a type holds more than one concept.
const MAX_FIELDS: usize = 20;

/// Each braced struct in `text`, with how many fields it has.
fn struct_fields(text: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim_start();
        let decl = l
            .strip_prefix("pub ")
            .or_else(|| l.strip_prefix("pub(crate) "))
            .or_else(|| l.strip_prefix("pub(super) "))
            .unwrap_or(l);
        if let Some(rest) = decl.strip_prefix("struct ")
            && rest.trim_end().ends_with('{')
        {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let (mut depth, mut n) = (1i32, 0usize);
            i += 1;
            while i < lines.len() && depth > 0 {
                let line = lines[i].trim();
                let field = line
                    .trim_start_matches("pub(crate) ")
                    .trim_start_matches("pub(super) ")
                    .trim_start_matches("pub ");
                if depth == 1
                    && !line.starts_with("//")
                    && !line.starts_with('#')
                    && field.split_once(':').is_some_and(|(id, _)| {
                        !id.is_empty() && id.chars().all(|c| c.is_alphanumeric() || c == '_')
                    })
                {
                    n += 1;
                }
                depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
                i += 1;
            }
            out.push((name, n));
            continue;
        }
        i += 1;
    }
    out
}

fn is_command_line(rel: &str) -> bool {
    rel.starts_with("cli/") || rel.starts_with("cmd/") || rel == "main.rs"
}

#[test]
fn only_the_command_line_names_the_command_line_or_clap() {
    let mut bad = Vec::new();
    for (f, text) in sources() {
        if is_command_line(&f) {
            continue;
        }
        let code = code_only(&text);
        for word in ["crate::cli", "crate::cmd", "clap"] {
            if code.contains(word) {
                bad.push(format!("{f} names {word}"));
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn the_module_graph_has_no_loop() {
    let files = sources();
    let edges = graph(&files);
    assert!(edges.len() > 50, "{} files found", edges.len());
    // The graph is real: the command layer reaches the workflows.
    assert!(edges["cmd/exec.rs"].contains("supervise/lifecycle.rs"));
    let found = loops(&edges);
    assert!(found.is_empty(), "import loops: {found:#?}");
}

#[test]
fn the_top_level_folders_import_each_other_one_way() {
    let edges = graph(&sources());
    let tops = folders(&edges);
    // The graph is real: the agent reaches the supervisor and the reporters.
    assert!(tops["agent"].contains("supervise") && tops["agent"].contains("report"));
    let found = loops(&tops);
    assert!(
        found.is_empty(),
        "loops between folders of src/: {found:#?}"
    );
}

#[test]
fn no_struct_has_more_than_20_fields() {
    let mut all = Vec::new();
    for (f, text) in sources() {
        all.extend(
            struct_fields(&text)
                .into_iter()
                .map(|(s, n)| (f.clone(), s, n)),
        );
    }
    assert!(all.len() > 100, "{} structs found", all.len());
    let over: Vec<_> = all.iter().filter(|(_, _, n)| *n > MAX_FIELDS).collect();
    assert!(over.is_empty(), "{over:#?}");
}

/// The most lines of non-test code a source file may hold.
const MAX_FILE_LINES: usize = 500;
/// The most lines a function may span, from `fn` to its closing brace.
const MAX_FN_LINES: usize = 80;

#[test]
fn no_source_file_holds_more_than_500_lines_of_code() {
    let over: Vec<(String, usize)> = sources()
        .into_iter()
        .map(|(f, text)| (f, text.lines().count()))
        .filter(|(_, n)| *n > MAX_FILE_LINES)
        .collect();
    assert!(over.is_empty(), "{over:?}");
}

#[test]
fn no_function_is_longer_than_80_lines() {
    let mut all = Vec::new();
    for (f, text) in sources() {
        all.extend(
            functions(&text)
                .into_iter()
                .map(|(name, n)| (format!("{f}::{name}"), n)),
        );
    }
    assert!(all.len() > 1000, "{} functions found", all.len());
    let over: Vec<_> = all.iter().filter(|(_, n)| *n > MAX_FN_LINES).collect();
    assert!(over.is_empty(), "{over:#?}");
}

/// The most files a reader opens to follow one behaviour of docs/architecture.md.
const MAX_ROUTE_FILES: usize = 10;

/// docs/architecture.md's routes: each behaviour's title, the number of files it says,
/// and the files its numbered steps name (a bare `name.rs` is in the folder of the
/// path named before it).
fn routes(doc: &str) -> Vec<(String, usize, BTreeSet<String>)> {
    let doc = format!("\n{doc}");
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Three behaviours"))
        .expect("docs/architecture.md has the section of the three behaviours");
    let mut out: Vec<(String, usize, BTreeSet<String>)> = Vec::new();
    let mut in_steps = false;
    let mut folder = String::new();
    for line in section.lines() {
        if let Some(title) = line.strip_prefix("**") {
            let (title, rest) = title.split_once("**").expect("a bold title");
            let n = rest
                .trim()
                .trim_start_matches('(')
                .split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .expect("a route says its number of files: (N files)");
            out.push((title.to_string(), n, BTreeSet::new()));
            continue;
        }
        let numbered = line
            .split_once(". ")
            .is_some_and(|(n, _)| n.parse::<u32>().is_ok());
        in_steps = numbered || (in_steps && line.starts_with("   "));
        let Some(route) = out.last_mut().filter(|_| in_steps) else {
            continue;
        };
        for (i, token) in line.split('`').enumerate() {
            if i % 2 == 0 || !token.ends_with(".rs") || token.contains(' ') {
                continue;
            }
            let file = match token.rsplit_once('/') {
                Some((dir, _)) => {
                    folder = dir.to_string();
                    token.to_string()
                }
                None => format!("{folder}/{token}"),
            };
            route.2.insert(file);
        }
    }
    out
}

#[test]
fn each_route_of_docs_architecture_is_true_and_at_most_10_files() {
    let doc = std::fs::read_to_string(repo().join("docs/architecture.md")).unwrap();
    let routes = routes(&doc);
    assert_eq!(routes.len(), 3, "{routes:#?}");
    for (title, said, files) in &routes {
        let missing: Vec<_> = files
            .iter()
            .filter(|f| !repo().join("src").join(f).is_file())
            .collect();
        assert!(missing.is_empty(), "{title}: no such file {missing:?}");
        assert_eq!(files.len(), *said, "{title}: {files:#?}");
        assert!(*said <= MAX_ROUTE_FILES, "{title}: {files:#?}");
    }
}

/// `text` with its comments, strings and character literals blanked (line breaks
/// kept), so that the braces left are the code's.
fn blank(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank_to = |out: &mut Vec<u8>, from: usize, to: usize| {
        out.extend(
            b[from..to]
                .iter()
                .map(|&c| if c == b'\n' { c } else { b' ' }),
        );
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let end = if rest.starts_with(b"//") {
            i + rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            i + 2 + find(&rest[2..], b"*/").map_or(rest.len() - 2, |k| k + 2)
        } else if rest[0] == b'r' && !ident_before && raw_string_hashes(rest).is_some() {
            let hashes = raw_string_hashes(rest).unwrap();
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let open = 2 + hashes;
            i + open + find(&rest[open..], &close).map_or(rest.len() - open, |k| k + close.len())
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            i + (j + 1).min(rest.len())
        } else if rest[0] == b'\'' && char_literal(rest).is_some() {
            i + char_literal(rest).unwrap()
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        blank_to(&mut out, i, end);
        i = end;
    }
    String::from_utf8(out).unwrap()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The `#`s of a raw string that starts `rest` (`r"`, `r#"`, ...).
fn raw_string_hashes(rest: &[u8]) -> Option<usize> {
    let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
    (rest.get(1 + hashes) == Some(&b'"')).then_some(hashes)
}

/// The length of a character literal that starts `rest` (`'a'`, `'\\n'`, `'\\u{..}'`),
/// or `None` for a lifetime.
fn char_literal(rest: &[u8]) -> Option<usize> {
    if rest.get(1) == Some(&b'\\') {
        return find(&rest[2..], b"'").map(|k| k + 3);
    }
    let s = std::str::from_utf8(&rest[1..rest.len().min(6)])
        .unwrap_or_else(|e| std::str::from_utf8(&rest[1..1 + e.valid_up_to()]).unwrap());
    let c = s.chars().next()?;
    (s[c.len_utf8()..].starts_with('\'')).then_some(2 + c.len_utf8())
}

/// Each function with a body in `text`, with the lines it spans from `fn` to its
/// closing brace.
fn functions(text: &str) -> Vec<(String, usize)> {
    let code = blank(text);
    let b = code.as_bytes();
    let mut out = Vec::new();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    for (i, _) in code.match_indices("fn ") {
        if i > 0 && ident(b[i - 1]) {
            continue;
        }
        let name: String = code[i + 3..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        let (Some(open), semi) = (code[i..].find('{'), code[i..].find(';')) else {
            continue;
        };
        if semi.is_some_and(|s| s < open) {
            continue;
        }
        let mut depth = 0;
        let mut end = b.len();
        for (k, &c) in b.iter().enumerate().skip(i + open) {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push((name, code[i..end].matches('\n').count() + 1));
    }
    out
}

/// The checks can fail: a loop and an upward import in a made-up crate are found.
#[test]
fn the_checks_find_what_they_look_for() {
    let files: BTreeMap<String, String> = [
        ("a.rs", "use crate::b::X;"),
        ("b.rs", "use super::a::Y;"),
        ("c/mod.rs", "pub mod d;"),
        ("c/d.rs", "use super::super::a; use crate::c::e;"),
    ]
    .into_iter()
    .map(|(f, t)| (f.to_string(), t.to_string()))
    .collect();
    let edges = graph(&files);
    assert_eq!(
        edges["c/d.rs"],
        BTreeSet::from(["a.rs".to_string(), "c/mod.rs".to_string()])
    );
    assert_eq!(
        loops(&edges),
        [vec!["a.rs".to_string(), "b.rs".to_string()]]
    );
    // c/ and a.rs import each other, though no two files do.
    let tops: BTreeMap<String, String> = [
        ("a.rs", "use crate::c::e::Z;"),
        ("c/mod.rs", "pub mod d; pub mod e;"),
        ("c/d.rs", "use crate::a::Y;"),
        ("c/e.rs", ""),
    ]
    .into_iter()
    .map(|(f, t)| (f.to_string(), t.to_string()))
    .collect();
    let file_edges = graph(&tops);
    assert!(loops(&file_edges).is_empty());
    assert_eq!(
        loops(&folders(&file_edges)),
        [vec!["a".to_string(), "c".to_string()]]
    );
    assert_eq!(
        struct_fields(
            "pub struct A {\n    /// a: doc\n    pub a: u8,\n    b: Vec<(u8, u8)>,\n    c: std::collections::BTreeMap<u8, u8>,\n}\nstruct B(u8);\nstruct C {\n    #[serde(default)]\n    pub(super) x: Option<u8>,\n}\n"
        ),
        [("A".to_string(), 3), ("C".to_string(), 1)]
    );
    // A route's files: its numbered steps only, a bare name in the folder named before.
    let doc = "## Three behaviours\n\n**Ping** (2 files).\n\n1. `a/b.rs`: x (`c.rs`),\n   `a/b.rs` again;\n\nNot a step: `z/z.rs`.\n\n## Next\n`y/y.rs`\n";
    assert_eq!(
        routes(doc),
        [(
            "Ping".to_string(),
            2,
            BTreeSet::from(["a/b.rs".to_string(), "a/c.rs".to_string()])
        )]
    );
    assert_eq!(
        code_only("let x = 1; // clap\n/// clap\nuse clap;"),
        "let x = 1; \n\nuse clap;"
    );
    assert_eq!(
        without_tests("fn a() {}\n#[cfg(test)]\nmod tests {\n use x;\n}\n"),
        "fn a() {}\n"
    );
    // Braces in strings, raw strings, characters and comments are not the code's; a
    // lifetime is no character; a declaration without a body is no function.
    assert_eq!(
        functions(concat!(
            "fn a<'x>(s: &'x str) -> char {\n",
            "    let _ = \"}\\\"{\"; // }\n",
            "    let _ = r#\"}\"#; /* { */\n",
            "    '}'\n",
            "}\n",
            "trait T { fn b(); }\n",
            "fn c() {\n    if true { }\n}\n",
        )),
        [("a".to_string(), 5), ("c".to_string(), 3)]
    );
}
