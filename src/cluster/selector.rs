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
        let mut values = BTreeSet::new();
        for v in body.split(',') {
            let v = v.trim();
            validate_value(v)?;
            values.insert(v.to_string());
        }
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
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

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
}
