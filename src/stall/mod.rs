//! The stall watch, as pure logic: what counts as CMD's progress (a line matching
//! `--progress-pattern`, a heartbeat), when silence becomes a stall and of whom
//! ([`progress`]); the shape exec hands over ([`observation`]); and the job's view of
//! its peers' stalls — what `trainlet.io/progress` says, and which peer's stall a
//! restart answers ([`peers`]); and the same for a failed CMD's group restart, its
//! barrier included ([`group`]). The agent (`src/agent`) feeds it the clock and
//! CMD's output; the supervisor (`src/supervise`) acts on what it decides.

pub mod group;
pub mod observation;
pub mod peers;
pub mod progress;
pub mod rule;
pub mod watch;
pub mod watching;

#[cfg(test)]
mod scope_tests;
#[cfg(test)]
mod tests;
