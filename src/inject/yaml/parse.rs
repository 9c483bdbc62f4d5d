//! YAML text into a [`Node`] tree, through yaml-rust2's events, bounded in nodes and
//! depth, with merge keys resolved as kubectl reads them.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use super::{Chunk, Node, Scalar, SyntaxError, is_plain_string};

/// Resolves YAML merge keys (`<<: *defaults`, or `<<: [*a, *b]`) as kubectl reads them
/// (go-yaml, YAML 1.1): the merged mappings' keys join this one, where the `<<` stood,
/// unless this mapping has them itself; of several merged mappings, the earlier wins.
/// So inject edits what kubectl would send: a pod template whose containers come from
/// a merge gets trainlet's containers beside them, not instead of them. A quoted `"<<"`
/// is an ordinary key.
fn merge_keys(entries: Vec<(Scalar, Node)>) -> Result<Vec<(Scalar, Node)>, &'static str> {
    let is_merge = |k: &Scalar| k.plain && k.tag.is_none() && k.text == "<<";
    if !entries.iter().any(|(k, _)| is_merge(k)) {
        return Ok(entries);
    }
    let own: Vec<String> = entries
        .iter()
        .filter(|(k, _)| !is_merge(k))
        .map(|(k, _)| k.text.clone())
        .collect();
    let mut out: Vec<(Scalar, Node)> = Vec::new();
    for (k, v) in entries {
        if !is_merge(&k) {
            out.push((k, v));
            continue;
        }
        let sources = match v {
            Node::Map(m) => vec![m],
            Node::Seq(items) => items
                .into_iter()
                .map(|i| match i {
                    Node::Map(m) => Ok(m),
                    _ => Err("a merge key (<<) takes a mapping or a list of mappings"),
                })
                .collect::<Result<_, _>>()?,
            Node::Scalar(_) => {
                return Err("a merge key (<<) takes a mapping or a list of mappings");
            }
        };
        for m in sources {
            for (mk, mv) in m {
                let taken = own.contains(&mk.text) || out.iter().any(|(k, _)| k.text == mk.text);
                if !taken {
                    out.push((mk, mv));
                }
            }
        }
    }
    Ok(out)
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
                let entries = merge_keys(entries).map_err(|why| self.error(mark, why))?;
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
