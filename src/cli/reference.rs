//! docs/flags.md, made from the clap definitions themselves, so the reference cannot
//! drift from `--help`: a unit test fails when the file differs from what this renders,
//! and `make docs` writes it again.

use clap::{Arg, Command, CommandFactory};

use super::Cli;

/// The whole reference: the global flags, then each subcommand's.
pub fn markdown() -> String {
    let cli = Cli::command();
    let mut out = String::from(
        "# Flags\n\n\
         Every flag of every subcommand, as `trainlet <command> --help` prints it. Every \
         flag can also be set through its environment variable; a flag given on the \
         command line wins.\n\n\
         This file is generated from the command-line definitions (`make docs`); a test \
         fails when it is out of date.\n\n",
    );
    out.push_str("## Global flags\n\n");
    out.push_str(&table(cli.get_arguments().filter(|a| a.is_global_set())));
    out.push_str(&format!(
        "\n{}\n",
        one_paragraph(
            &cli.get_after_help()
                .map(ToString::to_string)
                .unwrap_or_default()
        )
    ));
    for sub in cli.get_subcommands() {
        section(&mut out, sub, "trainlet");
    }
    out
}

fn section(out: &mut String, cmd: &Command, parent: &str) {
    let path = format!("{parent} {}", cmd.get_name());
    out.push_str(&format!("\n## `{path}`\n\n"));
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        out.push_str(&one_paragraph(&about.to_string()));
        out.push_str("\n\n");
    }
    let positional: Vec<&Arg> = cmd.get_positionals().collect();
    if !positional.is_empty() {
        for p in positional {
            let name = p
                .get_value_names()
                .and_then(|v| v.first())
                .map_or_else(|| p.get_id().to_string(), ToString::to_string);
            out.push_str(&format!("`{name}`: {}\n\n", one_paragraph(&help(p))));
        }
    }
    out.push_str(&table(cmd.get_arguments().filter(|a| {
        !a.is_positional() && !a.is_global_set() && !is_builtin(a)
    })));
}

fn is_builtin(a: &Arg) -> bool {
    matches!(a.get_id().as_str(), "help" | "version")
}

fn table<'a>(args: impl Iterator<Item = &'a Arg>) -> String {
    let mut out = String::from(
        "| Flag | Environment variable | Default | Description |\n|---|---|---|---|\n",
    );
    for a in args.filter(|a| !is_builtin(a)) {
        let long = a.get_long().unwrap_or_default();
        let flag = match a.get_short() {
            Some(s) => format!("`-{s}`, `--{long}`"),
            None => format!("`--{long}`"),
        };
        let value = a
            .get_value_names()
            .and_then(|v| v.first())
            .map(|v| format!(" `{v}`"))
            .filter(|_| a.get_action().takes_values());
        let values: Vec<String> = a
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set() && a.get_action().takes_values())
            .map(|v| format!("`{}`", v.get_name()))
            .collect();
        let values = match values.as_slice() {
            [] => String::new(),
            v => format!(" Values: {}.", v.join(", ")),
        };
        let env = a
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let default: Vec<String> = a
            .get_default_values()
            .iter()
            .map(|v| format!("`{}`", v.to_string_lossy()))
            .collect();
        out.push_str(&format!(
            "| {flag}{} | {env} | {} | {}{values} |\n",
            value.unwrap_or_default(),
            default.join(", "),
            sentence(&help(a)).replace('|', "\\|")
        ));
    }
    out
}

fn help(a: &Arg) -> String {
    a.get_long_help()
        .or(a.get_help())
        .map(ToString::to_string)
        .unwrap_or_default()
}

/// Help text on one line: table cells hold no newline, and `<` would open an HTML tag.
fn one_paragraph(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('<', "&lt;")
}

/// One line that ends as a sentence (clap drops the period of a one-line help).
fn sentence(text: &str) -> String {
    let mut s = one_paragraph(text);
    if !s.is_empty() && !s.ends_with('.') {
        s.push('.');
    }
    s
}

#[cfg(test)]
mod tests {
    use crate::exit::{CMD_RETRYABLE, Code};

    /// The numbers in column `col` of the table rows of `doc`'s section `heading` (up to
    /// the next heading of that level): `| 126, 127 |` gives 126 and 127.
    fn codes_in(doc: &str, heading: &str, col: usize) -> Vec<i32> {
        let path = format!("{}/{doc}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap();
        let level = heading.split(' ').next().unwrap();
        let section = text
            .split_once(&format!("\n{heading}\n"))
            .unwrap_or_else(|| panic!("{doc} has no {heading:?}"))
            .1;
        let section = section
            .split_once(&format!("\n{level} "))
            .map_or(section, |(s, _)| s);
        section
            .lines()
            .filter_map(|l| l.strip_prefix('|'))
            .filter_map(|l| l.split('|').nth(col))
            .flat_map(|cell| cell.split(',').map(|n| n.trim().parse::<i32>()))
            .filter_map(Result::ok)
            .collect()
    }

    /// The exit-code tables of the README and docs/failure-handling.md have a row for
    /// every code of src/exit.rs (they missed 1, 8, 126 and 127 once), and the retry
    /// table one for each of exec's own codes.
    #[test]
    fn every_exit_code_has_a_row_in_the_docs() {
        let all: Vec<i32> = Code::ALL.iter().map(|c| *c as i32).collect();
        for doc in ["README.md", "docs/failure-handling.md"] {
            assert_eq!(codes_in(doc, "## Exit codes", 0), all, "{doc}");
        }
        let retry = codes_in(
            "docs/failure-handling.md",
            "## Which failures a retry can fix",
            1,
        );
        for c in CMD_RETRYABLE
            .iter()
            .chain(&[Code::CannotExecute as i32, Code::CommandNotFound as i32])
        {
            assert!(retry.contains(c), "the retry table has no row for {c}");
        }
    }

    /// docs/flags.md is what the definitions render; `make docs` rewrites it.
    #[test]
    fn docs_flags_md_is_current() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/flags.md");
        let want = super::markdown();
        if std::env::var_os("TRAINLET_WRITE_DOCS").is_some() {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "docs/flags.md is out of date with the flags: run `make docs`"
        );
    }
}
