//! Label selectors in the string syntax that `kubectl -l` and the API server accept:
//! `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x,y)`, `a` and `!a`, joined by commas.
//!
//! Parsing here, rather than passing the string through, lets a typo fail as a usage
//! error (exit 2) before any API call, and lets several selectors be matched locally
//! against pods that one watch delivered. The matching itself is kube-core's.

use std::collections::BTreeSet;

pub use kube::core::{Expression, Selector, SelectorExt};

/// Parses a selector string. The empty string selects everything, as in Kubernetes.
pub fn parse(input: &str) -> Result<Selector, String> {
    let mut exprs = Vec::new();
    for part in split_top_level(input)? {
        let part = part.trim();
        if part.is_empty() {
            if input.trim().is_empty() {
                continue;
            }
            return Err("empty requirement (two commas in a row, or a trailing comma)".into());
        }
        exprs.push(parse_requirement(part)?);
    }
    Ok(exprs.into_iter().collect())
}

/// Splits on commas that are not inside `( … )`.
fn split_top_level(input: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' => {
                depth += 1;
                if depth > 1 {
                    return Err("nested parentheses".into());
                }
            }
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| "')' without '('".to_string())?;
            }
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("'(' without ')'".into());
    }
    parts.push(&input[start..]);
    Ok(parts)
}

fn parse_requirement(req: &str) -> Result<Expression, String> {
    if let Some(key) = req.strip_prefix('!') {
        let key = key.trim();
        validate_key(key)?;
        return Ok(Expression::DoesNotExist(key.to_string()));
    }
    // Set-based: `key in (a,b)` / `key notin (a,b)`.
    if let Some(open) = req.find('(') {
        let head = req[..open].trim_end();
        let (key, op) = head.rsplit_once(char::is_whitespace).ok_or_else(|| {
            format!("{req:?}: expected `key in (values)` or `key notin (values)`")
        })?;
        let key = key.trim();
        validate_key(key)?;
        let body = req[open + 1..]
            .strip_suffix(')')
            .ok_or_else(|| format!("{req:?}: text after ')'"))?;
        if body.trim().is_empty() {
            // Kubernetes reads `in ()` as `in ("")`; written by a person it is a mistake,
            // and `in ()` would then select no pod at all.
            return Err(format!("{req:?}: the value set of {op} must not be empty"));
        }
        let values = value_list(body).map_err(|why| format!("{req:?}: {why}"))?;
        return match op {
            "in" => Ok(Expression::In(key.to_string(), values)),
            "notin" => Ok(Expression::NotIn(key.to_string(), values)),
            other => Err(format!(
                "{req:?}: unknown operator {other:?} (use in or notin)"
            )),
        };
    }
    let (key, value, equal) = if let Some((k, v)) = req.split_once("!=") {
        (k, v, false)
    } else if let Some((k, v)) = req.split_once("==") {
        (k, v, true)
    } else if let Some((k, v)) = req.split_once('=') {
        (k, v, true)
    } else if req.contains('<') || req.contains('>') {
        return Err(format!(
            "{req:?}: the operators < and > are not supported in label selectors of pods"
        ));
    } else {
        let key = req.trim();
        validate_key(key)?;
        return Ok(Expression::Exists(key.to_string()));
    };
    let (key, value) = (key.trim(), value.trim());
    validate_key(key)?;
    validate_value(value)?;
    Ok(if equal {
        Expression::Equal(key.into(), value.into())
    } else {
        Expression::NotEqual(key.into(), value.into())
    })
}

/// The values between the parentheses of `in`/`notin`, read exactly as Kubernetes'
/// parser does (apimachinery `labels.Parser.parseIdentifiersList`), empty values
/// included: `(,a)` and `(a,)` hold `""`, `(a,,b)` too, but `(a,,)` is an error. Any
/// other reading would accept selectors the API server refuses.
fn value_list(body: &str) -> Result<BTreeSet<String>, String> {
    // Tokens: a value, or a comma; the end stands for the closing parenthesis.
    let mut tokens: Vec<Option<&str>> = Vec::new();
    for (i, segment) in body.split(',').enumerate() {
        if i > 0 {
            tokens.push(None);
        }
        tokens.extend(segment.split_whitespace().map(Some));
    }
    let mut values = BTreeSet::new();
    let mut i = 0;
    loop {
        match tokens.get(i) {
            Some(Some(v)) => {
                validate_value(v)?;
                values.insert(v.to_string());
                i += 1;
                match tokens.get(i) {
                    Some(None) => {}
                    None => return Ok(values),
                    Some(Some(next)) => {
                        return Err(format!("found {next:?} after {v:?}, expected ',' or ')'"));
                    }
                }
            }
            Some(None) => {
                i += 1;
                if values.is_empty() {
                    values.insert(String::new());
                }
                match tokens.get(i) {
                    None => {
                        values.insert(String::new());
                        return Ok(values);
                    }
                    Some(None) => {
                        i += 1;
                        values.insert(String::new());
                    }
                    Some(Some(_)) => {}
                }
            }
            None => return Err("found ')' after ',', expected a value".into()),
        }
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters.
fn validate_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if !ok {
            return Err(format!(
                "invalid label key {key:?}: the prefix must be a DNS subdomain"
            ));
        }
    }
    if name.is_empty() {
        return Err(format!("invalid label key {key:?}: empty name"));
    }
    if !is_label_name(name) {
        return Err(format!(
            "invalid label key {key:?}: at most 63 characters of [A-Za-z0-9-_.], beginning and ending alphanumeric"
        ));
    }
    Ok(())
}

fn validate_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(format!(
            "invalid label value {value:?}: at most 63 characters of [A-Za-z0-9-_.], beginning and ending alphanumeric"
        ))
    }
}

fn is_label_name(s: &str) -> bool {
    super::is_short_name(s, |c| {
        c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::labels;

    #[test]
    fn equality_and_sets_round_trip() {
        let s =
            parse("app=mnist, role==worker,tier!=canary,env in (a, b),!legacy,zone notin (x),gpu")
                .unwrap();
        assert_eq!(
            s.to_string(),
            "app=mnist,role=worker,tier!=canary,env in (a,b),!legacy,zone notin (x),gpu"
        );
        let l = labels(&[
            ("app", "mnist"),
            ("role", "worker"),
            ("env", "b"),
            ("gpu", ""),
        ]);
        assert!(s.matches(&l));
        let mut l2 = l.clone();
        l2.insert("legacy".into(), "1".into());
        assert!(!s.matches(&l2));
    }

    #[test]
    fn prefixed_keys() {
        let s = parse("batch.kubernetes.io/job-name=w").unwrap();
        assert!(s.matches(&labels(&[("batch.kubernetes.io/job-name", "w")])));
    }

    #[test]
    fn empty_selects_all() {
        assert!(parse("").unwrap().selects_all());
    }

    #[test]
    fn errors_name_the_problem() {
        assert_eq!(
            parse("a=b,,c=d").unwrap_err(),
            "empty requirement (two commas in a row, or a trailing comma)"
        );
        assert_eq!(parse("a in (b").unwrap_err(), "'(' without ')'");
        assert!(
            parse("a=b c")
                .unwrap_err()
                .starts_with("invalid label value \"b c\"")
        );
        assert!(
            parse("-a=b")
                .unwrap_err()
                .starts_with("invalid label key \"-a\"")
        );
        assert!(parse("a>3").unwrap_err().contains("not supported"));
        assert!(
            parse("a within (b)")
                .unwrap_err()
                .contains("unknown operator \"within\"")
        );
        assert!(
            parse("Bad_Prefix/a=b")
                .unwrap_err()
                .contains("DNS subdomain")
        );
    }

    #[test]
    fn value_lists_read_as_kubernetes_reads_them() {
        let set = |s: &str| value_list(s).map(|v| v.into_iter().collect::<Vec<_>>());
        assert_eq!(set("a, b"), Ok(vec!["a".into(), "b".into()]));
        assert_eq!(set(",a"), Ok(vec!["".into(), "a".into()]));
        assert_eq!(set("a,"), Ok(vec!["".into(), "a".into()]));
        assert_eq!(set("a,,b"), Ok(vec!["".into(), "a".into(), "b".into()]));
        assert_eq!(set(" , "), Ok(vec!["".into()]));
        assert_eq!(
            set("a,,"),
            Err("found ')' after ',', expected a value".into())
        );
        assert_eq!(
            set("a b"),
            Err("found \"b\" after \"a\", expected ',' or ')'".into())
        );
    }

    mod properties {
        use super::*;
        use crate::testing::budget;
        use proptest::prelude::*;

        fn name() -> impl Strategy<Value = String> {
            "[a-z0-9]([a-z0-9._-]{0,20}[a-z0-9])?"
        }

        fn key() -> impl Strategy<Value = String> {
            let dns_label = "[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?";
            let prefix = proptest::collection::vec(dns_label, 1..4).prop_map(|l| l.join("."));
            (proptest::option::of(prefix), name()).prop_map(|(prefix, n)| match prefix {
                Some(p) => format!("{p}/{n}"),
                None => n,
            })
        }

        /// One requirement in any of the Kubernetes selector forms.
        pub fn requirement() -> impl Strategy<Value = String> {
            prop_oneof![
                (key(), name()).prop_map(|(k, v)| format!("{k}={v}")),
                (key(), name()).prop_map(|(k, v)| format!("{k}=={v}")),
                (key(), name()).prop_map(|(k, v)| format!("{k}!={v}")),
                key(),
                key().prop_map(|k| format!("!{k}")),
                (key(), proptest::collection::vec(name(), 1..4))
                    .prop_map(|(k, vs)| format!("{k} in ({})", vs.join(","))),
                (key(), proptest::collection::vec(name(), 1..4))
                    .prop_map(|(k, vs)| format!("{k} notin ({})", vs.join(", "))),
            ]
        }

        /// A selector of one to four requirements.
        pub fn selector() -> impl Strategy<Value = String> {
            proptest::collection::vec(requirement(), 1..5).prop_map(|r| r.join(","))
        }

        proptest! {
            #![proptest_config(budget(512))]

            #[test]
            fn never_panics(input in "\\PC{0,80}") {
                let _ = parse(&input);
            }

            #[test]
            fn never_panics_on_selector_like_text(input in "[a-z!=(), ./-]{0,40}") {
                let _ = parse(&input);
            }

            #[test]
            fn well_formed_selectors_parse_and_round_trip(s in selector()) {
                let parsed = parse(&s).unwrap();
                let again = parse(&parsed.to_string()).unwrap();
                prop_assert_eq!(parsed.to_string(), again.to_string());
            }
        }
    }
}
