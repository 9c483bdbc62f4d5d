//! A [`Node`] tree back into block-style YAML: plain scalars as they were read, the
//! rest quoted unless plainly a string in YAML 1.1 and 1.2 alike.

use super::{Node, Scalar, plain_text_ok};

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
