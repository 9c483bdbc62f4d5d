//! Shared settings of the property tests: a fixed case budget and a fixed seed, so the
//! README's test command runs each in well under a minute and fails the same way twice.

use proptest::test_runner::{Config, RngSeed};

/// `cases` random inputs from a fixed seed; no files of failures are written into the
/// source tree.
pub fn budget(cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(0x7472_6169_6e6c_6574),
        failure_persistence: None,
        ..Config::default()
    }
}
