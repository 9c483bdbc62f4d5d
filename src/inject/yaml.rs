//! The small YAML layer of `inject`: split a stream into documents the way kubectl does,
//! parse each into a tree that remembers how every scalar was written, and write a tree
//! back as block-style YAML.
//!
//! Why not deserialize into `serde_json::Value` and serialize it again? Because kubectl
//! reads YAML with YAML 1.1 rules (sigs.k8s.io/yaml on go-yaml v2), while every
//! maintained Rust YAML crate speaks YAML 1.2. A round trip through a 1.2 value changes
//! what the API server receives: a plain `defaultMode: 0644` (octal 420 for kubectl)
//! comes back as the string `'0644'`, and a quoted `value: "on"` comes back as a plain
//! `on`, which kubectl reads as the boolean true. So the tree keeps the text of every
//! scalar and whether it was plain: a plain scalar is written back exactly as it was
//! read, and means to kubectl what it meant before; a quoted or block scalar is a string
//! in every schema and is written quoted unless it is plainly a string in both.
//!
//! The parser is yaml-rust2 (a maintained, pure-Rust YAML 1.2 parser that passes the
//! YAML test suite), used at the event level only: its events carry the scalar style
//! and the position that error messages need.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A YAML node. Mappings keep their keys in order, so a document comes back in the order
/// it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Scalar(Scalar),
    Seq(Vec<Node>),
    Map(Vec<(Scalar, Node)>),
}

/// A scalar as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scalar {
    /// The scalar's value (for a plain scalar, its text).
    pub text: String,
    /// Written without quotes, so its meaning (string, number, bool, null) is up to the
    /// reader's schema. Quoted scalars that are strings in every schema are normalised to
    /// plain, so that a tree and the tree of its own output compare equal.
    pub plain: bool,
    /// An explicit tag such as `!!str`, kept verbatim.
    pub tag: Option<String>,
}

/// Where and why a document is not valid YAML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntaxError {
    /// 1-based line in the whole input.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    pub message: String,
}

impl Node {
    /// A string; plain when that is unambiguous, quoted otherwise.
    pub fn str(s: impl Into<String>) -> Node {
        Node::Scalar(Scalar::string(s))
    }

    /// An integer, written plain.
    pub fn int(n: i64) -> Node {
        Node::Scalar(Scalar {
            text: n.to_string(),
            plain: true,
            tag: None,
        })
    }

    /// A mapping from string keys.
    pub fn map<K: Into<String>>(entries: impl IntoIterator<Item = (K, Node)>) -> Node {
        Node::Map(
            entries
                .into_iter()
                .map(|(k, v)| (Scalar::string(k), v))
                .collect(),
        )
    }

    pub fn seq(items: impl IntoIterator<Item = Node>) -> Node {
        Node::Seq(items.into_iter().collect())
    }

    /// The value under `key` of a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(entries) => entries.iter().find(|(k, _)| k.text == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Node> {
        match self {
            Node::Map(entries) => entries
                .iter_mut()
                .find(|(k, _)| k.text == key)
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The text of a scalar that is not null.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Node::Scalar(s) if !s.is_null() => Some(&s.text),
            _ => None,
        }
    }

    pub fn as_seq(&self) -> Option<&Vec<Node>> {
        match self {
            Node::Seq(items) => Some(items),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Node::Scalar(s) if s.is_null())
    }

    /// Sets `key` to `value`, in place if the key exists, else appended.
    pub fn set(&mut self, key: &str, value: Node) {
        if let Some(v) = self.get_mut(key) {
            *v = value;
        } else if let Node::Map(entries) = self {
            entries.push((Scalar::string(key), value));
        }
    }

    /// The mapping under `key`, created (or replacing a null) when absent. `None` when
    /// `self` is not a mapping or the value is something else.
    pub fn map_entry(&mut self, key: &str) -> Option<&mut Node> {
        if !matches!(self, Node::Map(_)) {
            return None;
        }
        if self.get(key).is_none_or(Node::is_null) {
            self.set(key, Node::Map(Vec::new()));
        }
        self.get_mut(key).filter(|v| matches!(v, Node::Map(_)))
    }

    /// The sequence under `key`, created (or replacing a null) when absent.
    pub fn seq_entry(&mut self, key: &str) -> Option<&mut Vec<Node>> {
        if !matches!(self, Node::Map(_)) {
            return None;
        }
        if self.get(key).is_none_or(Node::is_null) {
            self.set(key, Node::Seq(Vec::new()));
        }
        match self.get_mut(key) {
            Some(Node::Seq(items)) => Some(items),
            _ => None,
        }
    }
}

impl Scalar {
    pub fn string(s: impl Into<String>) -> Scalar {
        let text = s.into();
        Scalar {
            plain: is_plain_string(&text),
            text,
            tag: None,
        }
    }

    /// Null in YAML 1.1 and 1.2: an empty plain scalar, `~`, or `null`.
    pub fn is_null(&self) -> bool {
        self.plain
            && self.tag.is_none()
            && matches!(self.text.as_str(), "" | "~" | "null" | "Null" | "NULL")
    }
}

/// One document of a stream, as kubectl splits them, with its raw text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk<'a> {
    pub text: &'a str,
    /// 1-based line of the chunk's first line in the whole input.
    pub first_line: usize,
}

/// Splits a stream at `---` lines, as kubectl's YAML reader does: a line that starts with
/// `---` and has nothing after it but spaces or a comment. (YAML forbids a document marker
/// at the start of a line inside any scalar, so this never cuts a value in two.)
pub fn split_documents(src: &str) -> Vec<Chunk<'_>> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut first_line = 1;
    let mut pos = 0;
    for (line_no, line) in (1..).zip(src.split_inclusive('\n')) {
        let rest = line.strip_prefix("---").map(str::trim);
        if rest.is_some_and(|r| r.is_empty() || r.starts_with('#')) {
            chunks.push(Chunk {
                text: &src[start..pos],
                first_line,
            });
            start = pos + line.len();
            first_line = line_no + 1;
        }
        pos += line.len();
    }
    chunks.push(Chunk {
        text: &src[start..],
        first_line,
    });
    chunks
}

/// At most this many nodes per document, aliases expanded: a guard against
/// "billion laughs" input.
const MAX_NODES: usize = 1_000_000;
/// At most this nesting depth, a guard against stack exhaustion.
const MAX_DEPTH: usize = 200;

/// Parses the documents of one chunk (usually one; none for a chunk of comments).
pub fn parse(chunk: &Chunk<'_>) -> Result<Vec<Node>, SyntaxError> {
    let mut b = Builder {
        parser: Parser::new_from_str(chunk.text),
        anchors: HashMap::new(),
        nodes: 0,
        line_offset: chunk.first_line - 1,
    };
    let mut docs = Vec::new();
    loop {
        let (ev, mark) = b.next()?;
        match ev {
            Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
            Event::StreamEnd => return Ok(docs),
            Event::DocumentStart => {
                b.anchors.clear();
                let (ev, mark) = b.next()?;
                docs.push(b.node(ev, mark, 0)?);
            }
            _ => return Err(b.error(mark, "unexpected content outside a document")),
        }
    }
}

struct Builder<'a> {
    parser: Parser<std::str::Chars<'a>>,
    anchors: HashMap<usize, Node>,
    nodes: usize,
    line_offset: usize,
}

impl Builder<'_> {
    fn next(&mut self) -> Result<(Event, Marker), SyntaxError> {
        self.parser.next_token().map_err(|e| SyntaxError {
            line: e.marker().line() + self.line_offset,
            column: e.marker().col() + 1,
            message: e.info().to_string(),
        })
    }

    fn error(&self, mark: Marker, message: &str) -> SyntaxError {
        SyntaxError {
            line: mark.line() + self.line_offset,
            column: mark.col() + 1,
            message: message.to_string(),
        }
    }

    fn node(&mut self, ev: Event, mark: Marker, depth: usize) -> Result<Node, SyntaxError> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(self.error(mark, "too many nodes (aliases expanded)"));
        }
        if depth > MAX_DEPTH {
            return Err(self.error(mark, "nested too deeply"));
        }
        let (node, anchor) = match ev {
            Event::Scalar(text, style, anchor, tag) => {
                (Node::Scalar(scalar(text, style, tag)), anchor)
            }
            Event::SequenceStart(anchor, tag) => {
                self.no_tag(tag, mark, "a sequence")?;
                let mut items = Vec::new();
                loop {
                    let (ev, mark) = self.next()?;
                    if ev == Event::SequenceEnd {
                        break;
                    }
                    items.push(self.node(ev, mark, depth + 1)?);
                }
                (Node::Seq(items), anchor)
            }
            Event::MappingStart(anchor, tag) => {
                self.no_tag(tag, mark, "a mapping")?;
                let mut entries: Vec<(Scalar, Node)> = Vec::new();
                loop {
                    let (ev, kmark) = self.next()?;
                    if ev == Event::MappingEnd {
                        break;
                    }
                    let Node::Scalar(key) = self.node(ev, kmark, depth + 1)? else {
                        return Err(self.error(kmark, "a mapping key must be a scalar"));
                    };
                    if entries.iter().any(|(k, _)| k.text == key.text) {
                        return Err(
                            self.error(kmark, &format!("duplicate mapping key {:?}", key.text))
                        );
                    }
                    let (ev, vmark) = self.next()?;
                    let value = self.node(ev, vmark, depth + 1)?;
                    entries.push((key, value));
                }
                (Node::Map(entries), anchor)
            }
            Event::Alias(id) => {
                let node = self
                    .anchors
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| self.error(mark, "alias to an unknown anchor"))?;
                self.nodes += count(&node);
                return Ok(node);
            }
            _ => return Err(self.error(mark, "unexpected event")),
        };
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        Ok(node)
    }

    fn no_tag(&self, tag: Option<Tag>, mark: Marker, what: &str) -> Result<(), SyntaxError> {
        match tag {
            None => Ok(()),
            Some(t) => Err(self.error(
                mark,
                &format!(
                    "tag {}{} on {what} is not supported; remove it",
                    t.handle, t.suffix
                ),
            )),
        }
    }
}

fn count(node: &Node) -> usize {
    match node {
        Node::Scalar(_) => 1,
        Node::Seq(items) => 1 + items.iter().map(count).sum::<usize>(),
        Node::Map(entries) => 1 + entries.iter().map(|(_, v)| 1 + count(v)).sum::<usize>(),
    }
}

fn scalar(text: String, style: TScalarStyle, tag: Option<Tag>) -> Scalar {
    let tag = tag.map(|t| {
        if t.handle == "!" {
            format!("!{}", t.suffix)
        } else {
            format!("!<{}{}>", t.handle, t.suffix)
        }
    });
    let plain = match style {
        TScalarStyle::Plain => true,
        // A quoted string that reads as the same string in every schema.
        _ => is_plain_string(&text),
    };
    Scalar { text, plain, tag }
}

/// Whether a string can be written plain and still be read back as this string by
/// YAML 1.1 (kubectl) and YAML 1.2 alike. Deliberately conservative: it must start with
/// a letter, `/` or a dash followed by a letter or dash (a flag like `--job=...`), must
/// not be a YAML 1.1 bool or null word, and may contain only characters that never
/// start a comment, a flow collection or a mapping value.
pub fn is_plain_string(s: &str) -> bool {
    let b = s.as_bytes();
    let Some(&first) = b.first() else {
        return false;
    };
    // A Kubernetes quantity such as `10m`, `32Mi` or `4Gi`: digits then letters is no
    // number, bool or timestamp in either schema (a leading 0 could be 0x.., 0o..).
    let quantity = (b'1'..=b'9').contains(&first)
        && b.iter()
            .position(|c| !c.is_ascii_digit())
            .is_some_and(|i| b[i..].iter().all(|c| c.is_ascii_alphabetic()));
    if quantity {
        return true;
    }
    let start_ok = first.is_ascii_alphabetic()
        || first == b'/'
        || (first == b'-'
            && b.get(1)
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'-')
            && !s.starts_with("---"));
    let chars_ok = b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || b"._/:=@+,- ".contains(c));
    let words = ["y", "n", "yes", "no", "true", "false", "on", "off", "null"];
    start_ok
        && chars_ok
        && !s.ends_with(':')
        && !s.ends_with(' ')
        && !s.contains(": ")
        && !s.contains("  ")
        && !words.contains(&s.to_ascii_lowercase().as_str())
}

/// Whether a plain scalar read from the input can be written back as the same plain text.
fn plain_text_ok(s: &str) -> bool {
    let mut chars = s.chars();
    let (Some(first), second) = (chars.next(), chars.next()) else {
        return false;
    };
    // `-`, `?` and `:` may start a plain scalar when a non-space follows (`-1`, `-x`).
    let start_ok = match first {
        '-' | '?' | ':' => second.is_some_and(|c| !c.is_whitespace()) && !s.starts_with("---"),
        ',' | '[' | ']' | '{' | '}' | '&' | '*' | '!' | '|' | '>' | '\'' | '"' | '%' | '@'
        | '`' | '#' => false,
        _ => true,
    };
    start_ok
        && !s.contains(['\n', '\r', '\t', '#'])
        && !s.contains(": ")
        && !s.ends_with(':')
        && s.trim() == s
}

/// Writes a document as block-style YAML, ending with a newline.
pub fn emit(node: &Node) -> String {
    let mut out = String::new();
    match node {
        Node::Map(entries) if !entries.is_empty() => write_map(&mut out, entries, 0, false),
        Node::Seq(items) if !items.is_empty() => write_seq(&mut out, items, 0, false),
        _ => {
            write_inline(&mut out, node);
            out.push('\n');
        }
    }
    out
}

fn indent(out: &mut String, n: usize) {
    out.extend(std::iter::repeat_n(' ', n));
}

/// `key: value` lines at `ind`; with `inline_first` the first key follows a `- ` that is
/// already written.
fn write_map(out: &mut String, entries: &[(Scalar, Node)], ind: usize, inline_first: bool) {
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 || !inline_first {
            indent(out, ind);
        }
        write_scalar_inline(out, k);
        out.push(':');
        write_value(out, v, ind + 2);
    }
}

/// `- item` lines at `ind` (sequences are indented under their key).
fn write_seq(out: &mut String, items: &[Node], ind: usize, inline_first: bool) {
    for (i, item) in items.iter().enumerate() {
        if i > 0 || !inline_first {
            indent(out, ind);
        }
        out.push('-');
        match item {
            Node::Map(e) if !e.is_empty() => {
                out.push(' ');
                write_map(out, e, ind + 2, true);
            }
            Node::Seq(s) if !s.is_empty() => {
                out.push(' ');
                write_seq(out, s, ind + 2, true);
            }
            _ => write_value(out, item, ind + 2),
        }
    }
}

/// The value after `key:` or `-`: inline scalars and empty collections on the same line,
/// nested collections on the next lines at `ind`.
fn write_value(out: &mut String, v: &Node, ind: usize) {
    match v {
        Node::Map(e) if !e.is_empty() => {
            out.push('\n');
            write_map(out, e, ind, false);
        }
        Node::Seq(s) if !s.is_empty() => {
            out.push('\n');
            write_seq(out, s, ind, false);
        }
        Node::Scalar(s) if literal_ok(s) => {
            if let Some(t) = &s.tag {
                out.push(' ');
                out.push_str(t);
            }
            let trailing = s.text.len() - s.text.trim_end_matches('\n').len();
            out.push_str(match trailing {
                0 => " |-",
                1 => " |",
                _ => " |+",
            });
            out.push('\n');
            let body = s.text.trim_end_matches('\n');
            for line in body.split('\n') {
                if !line.is_empty() {
                    indent(out, ind);
                    out.push_str(line);
                }
                out.push('\n');
            }
            for _ in 1..trailing {
                out.push('\n');
            }
        }
        _ => {
            out.push(' ');
            write_inline(out, v);
            out.push('\n');
        }
    }
}

/// A multi-line string reads best as a literal block (scripts in `args`), when its
/// lines allow one without an indentation indicator.
fn literal_ok(s: &Scalar) -> bool {
    let t = &s.text;
    !s.plain
        && t.contains('\n')
        && !t.trim_end_matches('\n').is_empty()
        && !t.chars().any(|c| {
            (c.is_control() && c != '\n' && c != '\t')
                || matches!(c, '\u{85}' | '\u{2028}' | '\u{2029}' | '\u{feff}')
        })
        && t.trim_end_matches('\n')
            .split('\n')
            .all(|l| l.is_empty() || l.trim() != "" && !l.ends_with([' ', '\t']))
        && t.trim_start_matches('\n')
            .chars()
            .next()
            .is_some_and(|c| c != ' ' && c != '\t')
}

fn write_inline(out: &mut String, v: &Node) {
    match v {
        Node::Scalar(s) => write_scalar_inline(out, s),
        Node::Map(_) => out.push_str("{}"),
        Node::Seq(_) => out.push_str("[]"),
    }
}

fn write_scalar_inline(out: &mut String, s: &Scalar) {
    if let Some(t) = &s.tag {
        out.push_str(t);
        out.push(' ');
    }
    if s.plain && s.text.is_empty() {
        out.push_str("null");
    } else if s.plain && plain_text_ok(&s.text) {
        out.push_str(&s.text);
    } else {
        double_quoted(out, &s.text);
    }
}

fn double_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}' | '\u{feff}') => {
                out.push_str(&format!("\\u{:04X}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The JSON that kubectl would send for a tree, resolving plain scalars with the YAML 1.1
/// rules of go-yaml v2 for the cases that matter in manifests (bools, nulls, decimal,
/// octal and hex integers, floats). Used by tests to compare documents by meaning.
pub fn to_json(node: &Node) -> serde_json::Value {
    use serde_json::Value;
    match node {
        Node::Scalar(s) if s.plain && s.tag.is_none() => resolve_plain(&s.text),
        Node::Scalar(s) => Value::String(s.text.clone()),
        Node::Seq(items) => Value::Array(items.iter().map(to_json).collect()),
        Node::Map(entries) => Value::Object(
            entries
                .iter()
                .map(|(k, v)| (k.text.clone(), to_json(v)))
                .collect(),
        ),
    }
}

fn resolve_plain(t: &str) -> serde_json::Value {
    use serde_json::Value;
    match t {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Value::Bool(true);
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Value::Bool(false);
        }
        _ => {}
    }
    let digits = t.replace('_', "");
    let (neg, body) = match digits.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, digits.strip_prefix('+').unwrap_or(&digits)),
    };
    let int = if let Some(h) = body.strip_prefix("0x") {
        i64::from_str_radix(h, 16).ok()
    } else if let Some(o) = body.strip_prefix("0o") {
        i64::from_str_radix(o, 8).ok()
    } else if body.len() > 1 && body.starts_with('0') {
        i64::from_str_radix(&body[1..], 8).ok()
    } else if !body.is_empty() && body.bytes().all(|c| c.is_ascii_digit()) {
        body.parse().ok()
    } else {
        None
    };
    if let Some(n) = int {
        return Value::from(if neg { -n } else { n });
    }
    let float_like = !body.is_empty()
        && body.bytes().any(|c| c.is_ascii_digit())
        && body
            .bytes()
            .all(|c| c.is_ascii_digit() || b".eE+-".contains(&c));
    if float_like && let Ok(f) = t.parse::<f64>() {
        return serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number);
    }
    Value::String(t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(src: &str) -> Node {
        let chunks = split_documents(src);
        assert_eq!(chunks.len(), 1);
        let mut docs = parse(&chunks[0]).unwrap();
        assert_eq!(docs.len(), 1);
        docs.remove(0)
    }

    #[test]
    fn splits_like_kubectl() {
        let src = "a: 1\n---\nb: 2\n--- # two\nc: |\n  ---x\n---foo: 3\n";
        let chunks = split_documents(src);
        let texts: Vec<&str> = chunks.iter().map(|c| c.text).collect();
        assert_eq!(texts, ["a: 1\n", "b: 2\n", "c: |\n  ---x\n---foo: 3\n"]);
        let lines: Vec<usize> = chunks.iter().map(|c| c.first_line).collect();
        assert_eq!(lines, [1, 3, 5]);
    }

    #[test]
    fn yaml_1_1_scalars_keep_their_meaning_for_kubectl() {
        // Plain scalars come back as written; quoted strings that YAML 1.1 would read as
        // something else stay quoted.
        let src = "mode: 0644\nb: yes\nc: 'yes'\nd: \"on\"\ne: '1.0'\nf: 1.0\ng: ~\nh: \"0644\"\ni: 'plain'\nj: -1\nk: -.5\nl: -x\n";
        let out = emit(&one(src));
        assert_eq!(
            out,
            "mode: 0644\nb: yes\nc: \"yes\"\nd: \"on\"\ne: \"1.0\"\nf: 1.0\ng: ~\nh: \"0644\"\ni: plain\nj: -1\nk: -.5\nl: -x\n"
        );
        assert_eq!(
            to_json(&one(&out)),
            json!({"mode": 420, "b": true, "c": "yes", "d": "on", "e": "1.0", "f": 1.0, "g": null, "h": "0644", "i": "plain", "j": -1, "k": -0.5, "l": "-x"})
        );
    }

    #[test]
    fn block_style_round_trip_is_stable() {
        let src = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  labels: {}\nspec:\n  containers:\n  - name: c\n    args: [\"sh\", \"-c\", \"echo a\\necho b\\n\"]\n    env:\n    - {name: X, value: \"a: b # c\"}\n  volumes: []\n  nested:\n  - - 1\n    - 2\n  - []\n";
        let once = emit(&one(src));
        assert_eq!(
            once,
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  labels: {}\nspec:\n  containers:\n    - name: c\n      args:\n        - sh\n        - -c\n        - |\n          echo a\n          echo b\n      env:\n        - name: X\n          value: \"a: b # c\"\n  volumes: []\n  nested:\n    - - 1\n      - 2\n    - []\n"
        );
        assert_eq!(emit(&one(&once)), once);
        assert_eq!(to_json(&one(&once)), to_json(&one(src)));
    }

    #[test]
    fn literal_blocks_keep_trailing_newlines_exactly() {
        for text in ["a\nb", "a\nb\n", "a\nb\n\n\n", "\na\n", "x\n\ny\n"] {
            let node = Node::map([("k", Node::str(text))]);
            let out = emit(&node);
            let back = one(&out);
            assert_eq!(back.get("k").unwrap().as_str(), Some(text), "{out}");
        }
        // Leading spaces need an indentation indicator: written double-quoted instead.
        let out = emit(&Node::map([("k", Node::str("  a\nb\n"))]));
        assert_eq!(out, "k: \"  a\\nb\\n\"\n");
    }

    #[test]
    fn aliases_are_expanded_and_tags_kept() {
        let n = one("a: &x {p: 1}\nb: *x\nc: !!str 5\n");
        assert_eq!(
            emit(&n),
            "a:\n  p: 1\nb:\n  p: 1\nc: !<tag:yaml.org,2002:str> 5\n"
        );
    }

    #[test]
    fn errors_name_the_line_and_column_of_the_whole_input() {
        let src = "a: 1\n---\nb: [1, 2\nc: 3\n";
        let chunks = split_documents(src);
        let e = parse(&chunks[1]).unwrap_err();
        assert_eq!((e.line, e.column), (4, 2), "{e:?}");
        let dup = split_documents("a: 1\nb: 2\na: 3\n");
        let e = parse(&dup[0]).unwrap_err();
        assert_eq!(
            (e.line, e.message.as_str()),
            (3, "duplicate mapping key \"a\"")
        );
    }

    #[test]
    fn plain_strings_are_conservative() {
        for s in [
            "trainlet",
            "/etc/trainlet",
            "10m",
            "32Mi",
            "4Gi",
            "--job=ps=app=x,role=ps",
            "ghcr.io/a/b:0.1.0",
            "metadata.name",
            "python train.py",
        ] {
            assert!(is_plain_string(s), "{s}");
        }
        for s in [
            "",
            "yes",
            "On",
            "NULL",
            "10",
            "1e3",
            "0x1F",
            "0644",
            "1:30",
            "2024-01-01",
            "1.0",
            "-1",
            ".inf",
            "a: b",
            "a #b",
            "- x",
            "---",
            "x:",
            "{a}",
            "*a",
            "a\nb",
            " a",
        ] {
            assert!(!is_plain_string(s), "{s}");
        }
    }
}
