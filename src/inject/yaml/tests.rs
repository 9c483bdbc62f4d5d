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
/// As go-yaml reads plain scalars (kubectl): a range of indexes is a string; `08`,
/// not octal, is the float 8.
fn a_range_of_indexes_is_a_string_not_a_number() {
    let n = one("a: 0-2\nb: 0644\nc: 0x1F\nd: -0-1\ne: 08\n");
    assert_eq!(
        to_json(&n),
        json!({"a": "0-2", "b": 420, "c": 31, "d": "-0-1", "e": 8.0})
    );
}

#[test]
fn merge_keys_are_resolved_as_kubectl_reads_them() {
    let n = one("base: &b {image: x, name: train}\nc:\n  <<: *b\n  name: mine\n  args: [a]\n");
    assert_eq!(
        emit(&n),
        "base:\n  image: x\n  name: train\nc:\n  image: x\n  name: mine\n  args:\n    - a\n"
    );
    // Of several merged mappings the earlier wins; a quoted "<<" is a plain key.
    let n = one("a: &a {k: 1}\nb: &b {k: 2, j: 3}\nc: {<<: [*a, *b]}\nd: {\"<<\": 1}\n");
    assert_eq!(
        emit(&n),
        "a:\n  k: 1\nb:\n  k: 2\n  j: 3\nc:\n  k: 1\n  j: 3\nd:\n  \"<<\": 1\n"
    );
    let bad = split_documents("a: {<<: 5}\n");
    assert_eq!(
        parse(&bad[0]).unwrap_err().message,
        "a merge key (<<) takes a mapping or a list of mappings"
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
