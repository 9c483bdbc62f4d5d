//! A report's bounds, in one place: what the endpoint accepts from CMD
//! (`request.rs`) and what the sidecar takes from exec's handover
//! (`handover::observation::parse`) are checked by the same [`check`], so the
//! sidecar never publishes what the endpoint would have refused. Pure.
//!
//! The bounds are the TrainJob CRD's (a percentage of 0 to 100, a time remaining of
//! at least 0, metric names and values of 1 to 64 characters), and two of
//! trainlet's own, because what a report says is published where people read it:
//! a time remaining of at most [`MAX_ETA_SECONDS`], and no control or invisible
//! character in a metric's name or value.

use thiserror::Error;

use crate::text::unprintable;

/// The most metrics in one report (the CRD's `maxItems`).
pub const MAX_METRICS: usize = 256;
/// The longest metric name or value, in characters (the CRD's `maxLength`).
pub const MAX_TEXT: usize = 64;
/// Ten years (of 365 days): the longest time remaining taken. No training run has
/// that much left; a larger number is an overflow or a sentinel (`-1` or `u32::MAX`
/// as an unsigned number), which `trainlet status` would show as `136years…` and the
/// metric as a time no alert can use. The CRD takes up to 2^31-1 seconds (68 years).
pub const MAX_ETA_SECONDS: i64 = 10 * 365 * 24 * 3600;

/// How the fields are named where a report is checked: Trainer's JSON or the
/// handover's.
#[derive(Debug, Clone, Copy)]
pub struct Fields {
    pub prefix: &'static str,
    pub percent: &'static str,
    pub eta: &'static str,
    pub metrics: &'static str,
}

/// The names of Trainer's JSON, as the API server spells them in its errors.
pub const WIRE: Fields = Fields {
    prefix: "status.trainerStatus",
    percent: "progressPercentage",
    eta: "estimatedRemainingSeconds",
    metrics: "metrics",
};

/// A report, as either side has it: a metric's missing name or value is empty.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    pub percent: Option<i64>,
    pub eta_seconds: Option<i64>,
    pub metrics: &'a [(&'a str, &'a str)],
}

/// What is out of bounds, in the API server's words where the CRD refuses it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OutOfBounds {
    #[error(
        "{field}: Invalid value: {value}: {field} in body should be greater than or equal to 0"
    )]
    Negative { field: String, value: i64 },
    #[error(
        "{field}: Invalid value: {value}: {field} in body should be less than or equal to {max}"
    )]
    Above { field: String, value: i64, max: i64 },
    #[error("{field}: Too many: {count}: must have at most {max} items")]
    TooMany {
        field: String,
        count: usize,
        max: usize,
    },
    #[error("{field}: Invalid value: \"\": {field} in body should be at least 1 chars long")]
    Empty { field: String },
    #[error("{field}: Too long: may not be more than {MAX_TEXT} bytes")]
    TooLong { field: String },
    #[error(
        "{field}: Invalid value: U+{code:04X}: {field} may hold no control or invisible character"
    )]
    Unprintable { field: String, code: u32 },
}

/// Checks `r` against the bounds, naming its fields by `f`; at most `max_metrics`
/// metrics (the endpoint: the CRD's [`MAX_METRICS`]; the handover: the ones exec
/// keeps). The first field out of bounds is the error.
pub fn check(f: &Fields, r: &Report, max_metrics: usize) -> Result<(), OutOfBounds> {
    let field = |name: &str| format!("{}.{name}", f.prefix);
    if let Some(p) = r.percent {
        within(field(f.percent), p, 100)?;
    }
    if let Some(e) = r.eta_seconds {
        within(field(f.eta), e, MAX_ETA_SECONDS)?;
    }
    if r.metrics.len() > max_metrics {
        return Err(OutOfBounds::TooMany {
            field: field(f.metrics),
            count: r.metrics.len(),
            max: max_metrics,
        });
    }
    for (i, (name, value)) in r.metrics.iter().enumerate() {
        for (key, text) in [("name", name), ("value", value)] {
            let field = field(&format!("{}[{i}].{key}", f.metrics));
            match text.chars().count() {
                0 => return Err(OutOfBounds::Empty { field }),
                n if n > MAX_TEXT => return Err(OutOfBounds::TooLong { field }),
                _ => {}
            }
            if let Some(c) = unprintable(text) {
                let code = u32::from(c);
                return Err(OutOfBounds::Unprintable { field, code });
            }
        }
    }
    Ok(())
}

fn within(field: String, value: i64, max: i64) -> Result<(), OutOfBounds> {
    if value < 0 {
        return Err(OutOfBounds::Negative { field, value });
    }
    if value > max {
        return Err(OutOfBounds::Above { field, value, max });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report<'a>(metrics: &'a [(&'a str, &'a str)]) -> Report<'a> {
        Report {
            percent: Some(40),
            eta_seconds: Some(795),
            metrics,
        }
    }

    fn why(r: &Report, max: usize) -> String {
        check(&WIRE, r, max).unwrap_err().to_string()
    }

    #[test]
    fn a_report_within_bounds_passes_at_the_edges() {
        let name = "n".repeat(64);
        let m = [(name.as_str(), "0.25"), ("Verlust", "1e3")];
        let r = Report {
            percent: Some(100),
            eta_seconds: Some(MAX_ETA_SECONDS),
            metrics: &m,
        };
        assert_eq!(check(&WIRE, &r, 2), Ok(()));
        let none = Report {
            percent: Some(0),
            eta_seconds: Some(0),
            metrics: &[],
        };
        assert_eq!(check(&WIRE, &none, 0), Ok(()));
    }

    #[test]
    fn the_time_remaining_is_at_most_ten_years() {
        assert_eq!(MAX_ETA_SECONDS, 315_360_000);
        let r = Report {
            eta_seconds: Some(4_294_967_295),
            ..report(&[])
        };
        assert_eq!(
            why(&r, 16),
            "status.trainerStatus.estimatedRemainingSeconds: Invalid value: 4294967295: status.trainerStatus.estimatedRemainingSeconds in body should be less than or equal to 315360000"
        );
    }

    #[test]
    fn metric_names_and_values_are_one_to_64_printable_characters() {
        let long = "x".repeat(65);
        let cases: [(&[(&str, &str)], &str); 5] = [
            (
                &[("loss", "1"), ("", "1")],
                "status.trainerStatus.metrics[1].name: Invalid value: \"\": status.trainerStatus.metrics[1].name in body should be at least 1 chars long",
            ),
            (
                &[("loss", &long)],
                "status.trainerStatus.metrics[0].value: Too long: may not be more than 64 bytes",
            ),
            (
                &[("loss\u{1b}[2J", "1")],
                "status.trainerStatus.metrics[0].name: Invalid value: U+001B: status.trainerStatus.metrics[0].name may hold no control or invisible character",
            ),
            (
                &[("loss", "0.2\u{202E}")],
                "status.trainerStatus.metrics[0].value: Invalid value: U+202E: status.trainerStatus.metrics[0].value may hold no control or invisible character",
            ),
            (
                &[("a", "1"), ("b", "1"), ("c", "1")],
                "status.trainerStatus.metrics: Too many: 3: must have at most 2 items",
            ),
        ];
        for (m, expected) in cases {
            assert_eq!(why(&report(m), 2), expected, "{m:?}");
        }
    }

    #[test]
    fn the_handovers_names_are_its_own() {
        const HANDOVER: Fields = Fields {
            prefix: "progress.reported",
            percent: "percent",
            eta: "eta_seconds",
            metrics: "metrics",
        };
        let r = Report {
            percent: Some(101),
            ..report(&[])
        };
        assert_eq!(
            check(&HANDOVER, &r, 16).unwrap_err().to_string(),
            "progress.reported.percent: Invalid value: 101: progress.reported.percent in body should be less than or equal to 100"
        );
    }
}
