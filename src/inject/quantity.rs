//! Kubernetes resource quantities (`250m`, `128Mi`, `1.5Gi`, `2`), checked before they
//! go into a manifest: a quantity the API server would refuse is a usage error of
//! `inject`, not a failed `kubectl apply` later.
//!
//! A conservative subset of apimachinery's grammar (`pkg/api/resource/quantity.go`):
//! a non-negative decimal number and one of the binary (`Ki` … `Ei`) or decimal
//! (`m`, `k`, `M` … `E`) suffixes, or none. Exponents (`1e3`) and signs are left out;
//! no one writes them for a container's resources.

const SUFFIXES: [&str; 13] = [
    "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "m", "k", "M", "G", "T", "P", "E",
];

/// Whether `s` is a quantity the API server accepts, in the subset above.
pub fn is_quantity(s: &str) -> bool {
    let number = SUFFIXES
        .iter()
        .find_map(|suffix| s.strip_suffix(suffix))
        .unwrap_or(s);
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let number_ok = match number.split_once('.') {
        None => digits(number),
        Some((whole, fraction)) => digits(whole) && digits(fraction),
    };
    number_ok && s.len() <= MAX_LEN
}

/// [`is_quantity`] as a regular expression (RE2, as CEL's `matches()` takes it), for
/// the admission policy, which checks its parameters' quantities in the API server.
/// Its length limit is apart: [`MAX_LEN`].
pub const PATTERN: &str = "^[0-9]+([.][0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$";

/// The longest quantity taken.
pub const MAX_LEN: usize = 32;

/// The number of a memory size given in millibytes (`128m`, which the API server
/// takes for 0.128 bytes): someone meant `128Mi`.
pub fn millibytes(s: &str) -> Option<&str> {
    s.strip_suffix('m').filter(|_| is_quantity(s))
}

#[cfg(test)]
mod tests {
    use super::is_quantity;
    use crate::testing::budget;
    use proptest::prelude::*;

    #[test]
    fn what_a_container_is_given() {
        for ok in [
            "250m", "128Mi", "1.5Gi", "2", "0", "100k", "1G", "64Mi", "0.5",
        ] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in [
            "", "Mi", "-1", "1.", ".5", "1.5.1Gi", "12MB", "1 Gi", "1e3", "lots", "1gi",
        ] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    /// The admission policy's pattern and this check agree, on quantities and on
    /// near misses.
    #[test]
    fn the_pattern_is_the_check() {
        let re = regex::Regex::new(super::PATTERN).unwrap();
        let agree = |s: &str| {
            assert_eq!(
                re.is_match(s) && s.len() <= super::MAX_LEN,
                is_quantity(s),
                "{s:?}"
            );
        };
        for s in [
            "250m", "128Mi", "1.5Gi", "2", "", "Mi", "-1", "1.", ".5", "1.5.1Gi", "12MB", "1 Gi",
            "1e3", "1gi", "1Mi\n", "\n1Mi",
        ] {
            agree(s);
        }
    }

    proptest! {
        #![proptest_config(budget(256))]

        #[test]
        fn the_pattern_agrees_with_the_check(s in "[0-9.mkKMGTPEi a]{0,6}") {
            let re = regex::Regex::new(super::PATTERN).unwrap();
            prop_assert_eq!(re.is_match(&s) && s.len() <= super::MAX_LEN, is_quantity(&s));
        }

        #[test]
        fn every_number_with_every_suffix_is_one(n in 0u32..1_000_000, frac in proptest::option::of(0u32..1000), i in 0usize..14) {
            let suffix = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "m", "k", "M", "G", "T", "P", "E", ""][i];
            let number = match frac {
                Some(f) => format!("{n}.{f}"),
                None => n.to_string(),
            };
            let q = format!("{number}{suffix}");
            prop_assert!(is_quantity(&q), "{}", q);
        }
    }
}
