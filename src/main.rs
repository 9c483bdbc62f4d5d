//! The `trainlet` binary: parse the command line, set up logging, run the subcommand,
//! and turn the outcome into the process's exit status. This is the only place the
//! process ends: with one of trainlet's codes, or with the status of the command that
//! `exec --report` ran.

use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use trainlet::cli::{Cli, lower};
use trainlet::{Code, Failure};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_exit(e),
    };
    match lower::log_filter(&cli.log_level) {
        Ok(filter) => trainlet::logging::init(cli.log_format.into(), filter),
        Err(f) => return fail(f),
    }
    match trainlet::cmd::run(cli.command) {
        Ok(exit) => exit.into(),
        Err(f) => fail(f),
    }
}

/// Help and version go to stdout with exit 0; a usage error becomes one line and exit 2,
/// instead of clap's multi-line usage block, so container logs stay greppable.
fn clap_exit(e: clap::Error) -> ExitCode {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            Code::Usage.into()
        }
        _ => {
            // The first paragraph holds the error and, for enums, the possible values.
            let rendered = e.render().to_string();
            let para: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let msg = para.join(" ");
            let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
            fail(Failure::usage(format!("{msg} (see trainlet --help)")))
        }
    }
}

/// The one line on stderr, and the same line as the container's termination message,
/// so `kubectl describe pod` shows why an init container failed.
fn fail(f: Failure) -> ExitCode {
    eprintln!("trainlet: error: {f}");
    trainlet::termination::record(&format!("trainlet: {f}"));
    f.code.into()
}
