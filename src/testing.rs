//! What the unit tests share: the property tests' fixed case budget and seed (so the
//! README's test command runs each in well under a minute and fails the same way
//! twice), and a pod's labels from pairs.

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

/// A pod's labels from `(key, value)` pairs.
pub fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
