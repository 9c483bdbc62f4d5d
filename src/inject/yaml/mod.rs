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

mod emit;
mod parse;
#[cfg(test)]
mod tests;

pub use emit::emit;
pub use parse::parse;

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
    // from_str_radix takes a sign of its own: the digits must be digits only, or
    // `0-2` (a list of indexes) would read as the octal number -2.
    let all = |d: &str, ok: fn(&u8) -> bool| !d.is_empty() && d.bytes().all(|c| ok(&c));
    let octal = |c: &u8| (b'0'..=b'7').contains(c);
    let int = if let Some(h) = body.strip_prefix("0x") {
        all(h, u8::is_ascii_hexdigit)
            .then(|| i64::from_str_radix(h, 16).ok())
            .flatten()
    } else if let Some(o) = body.strip_prefix("0o") {
        all(o, octal)
            .then(|| i64::from_str_radix(o, 8).ok())
            .flatten()
    } else if body.len() > 1 && body.starts_with('0') {
        all(&body[1..], octal)
            .then(|| i64::from_str_radix(&body[1..], 8).ok())
            .flatten()
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
