//! Logs go to stderr, so stdout stays clean for the JSON that `resolve`, `master` and
//! `gpus` print. Text for people, JSON for clusters whose log collectors parse lines.

use tracing_subscriber::EnvFilter;

/// The log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber with an already validated filter.
pub fn init(format: LogFormat, filter: EnvFilter) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Through the gate that keeps exec's lines out of CMD's (stderr_gate).
        .with_writer(crate::stderr_gate::LogWriter::default)
        // Colours only for a person at a terminal, never in container logs.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    // A second init (only possible in tests) keeps the first subscriber.
    let _ = result;
}
