//! The `.env` files: `export NAME='value'` lines, safe to `source` from any POSIX
//! shell, and read back by `trainlet exec`, which puts the same variables into CMD's
//! environment. Only trainlet writes these files, but the reader is still strict: a
//! line it did not write is an error, not a guess.

/// `export` lines, single-quoted, after a header saying how to use `file`.
pub fn render(file: &str, vars: &[(String, String)]) -> String {
    let mut s = format!("# Written by trainlet init. Source it: . {file}\n");
    for (k, v) in vars {
        s.push_str(&format!("export {k}={}\n", quote(v)));
    }
    s
}

/// The kernel refuses to execve a program whose environment holds one `NAME=value`
/// string longer than this (`MAX_ARG_STRLEN`, 32 pages): the whole exec fails with
/// E2BIG. A job of thousands of pods with DNS addresses gets there (`VC_*_HOSTS`,
/// `TF_CONFIG`).
pub const MAX_VAR: usize = 32 * 4096;

/// Splits variables into those that fit one environment string and the names of those
/// that do not (which the caller leaves out, pointing at their files instead).
pub fn fitting(vars: Vec<(String, String)>) -> (Vec<(String, String)>, Vec<String>) {
    let (fit, over): (Vec<_>, Vec<_>) = vars
        .into_iter()
        .partition(|(k, v)| k.len() + 1 + v.len() < MAX_VAR);
    (fit, over.into_iter().map(|(k, _)| k).collect())
}

/// Single-quotes a value for POSIX shells: `'` becomes `'\''`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The variables of a file [`render`] wrote, in order. Comments and blank lines are
/// skipped; any other line that is not `export NAME='…'` is an error naming it.
pub fn parse(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || format!("line {}: not an export line trainlet writes", n + 1);
        let (name, value) = line
            .strip_prefix("export ")
            .and_then(|l| l.split_once('='))
            .ok_or_else(bad)?;
        let valid_name = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            return Err(bad());
        }
        // Earlier versions wrote plain numbers unquoted.
        let plain = !value.is_empty()
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.:/,-".contains(&b));
        let value = if plain {
            Some(value.to_string())
        } else {
            unquote(value)
        };
        out.push((name.to_string(), value.ok_or_else(bad)?));
    }
    Ok(out)
}

/// The inverse of [`quote`]: a sequence of `'…'` pieces joined by `\'`.
fn unquote(s: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = s;
    loop {
        let body = rest.strip_prefix('\'')?;
        let end = body.find('\'')?;
        out.push_str(&body[..end]);
        rest = &body[end + 1..];
        if rest.is_empty() {
            return Some(out);
        }
        rest = rest.strip_prefix("\\'")?;
        out.push('\'');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn renders_and_reads_back() {
        let vars = vec![
            ("TF_CONFIG".to_string(), r#"{"a":"it's"}"#.to_string()),
            ("EMPTY".to_string(), String::new()),
        ];
        let text = render("x.env", &vars);
        assert_eq!(
            text,
            "# Written by trainlet init. Source it: . x.env\nexport TF_CONFIG='{\"a\":\"it'\\''s\"}'\nexport EMPTY=''\n"
        );
        assert_eq!(parse(&text).unwrap(), vars);
    }

    #[test]
    fn refuses_what_it_did_not_write() {
        assert_eq!(
            parse("export A='x'\nrm -rf /\n").unwrap_err(),
            "line 2: not an export line trainlet writes"
        );
        assert_eq!(
            parse("export TRAINLET_TASK_INDEX=1\n").unwrap(),
            [("TRAINLET_TASK_INDEX".to_string(), "1".to_string())]
        );
        assert!(parse("export A=$(id)\n").is_err());
        assert!(parse("export A=x y\n").is_err());
        assert!(parse("export 1A='x'\n").is_err());
        assert!(parse("export A='x'y\n").is_err());
        assert!(parse("export A='x\n").is_err());
    }

    #[test]
    fn variables_over_the_kernels_limit_are_named_and_left_out() {
        let big = "h".repeat(MAX_VAR);
        let (fit, over) = fitting(vec![
            ("A".into(), "1".into()),
            ("VC_WORKER_HOSTS".into(), big),
            ("B".into(), "x".repeat(MAX_VAR - 3)),
        ]);
        assert_eq!(
            fit.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["A", "B"]
        );
        assert_eq!(over, ["VC_WORKER_HOSTS"]);
    }

    proptest! {
        #![proptest_config(crate::testing::budget(256))]
        #[test]
        fn any_value_survives_the_round_trip(v in any::<String>().prop_filter("one line", |s| !s.contains('\n') && !s.contains('\r'))) {
            let vars = vec![("V".to_string(), v)];
            prop_assert_eq!(parse(&render("v.env", &vars)).unwrap(), vars);
        }
    }
}
