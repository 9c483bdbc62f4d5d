//! Time, in the one place the crate spells it: wall-clock times as people and peers read them: RFC 3339 text and milliseconds since
//! the Unix epoch. Every function here is total: a time comes from clocks and files
//! that anyone may set (a heartbeat's mtime, a node's clock, an observation file), and
//! RFC 3339 has four digits for the year, so a time before 1970 is shown as 1970 and
//! one past year 9999 as the last millisecond of 9999. Nothing here panics.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `9999-12-31T23:59:59.999Z`, in ms since the epoch: the last time RFC 3339 can write.
pub const MAX_MS: u64 = 253_402_300_799_999;

/// The latest time RFC 3339 can write.
pub fn max() -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(MAX_MS)
}

/// `t` within what RFC 3339 can write: 1970 to the end of 9999.
pub fn clamp(t: SystemTime) -> SystemTime {
    if t < UNIX_EPOCH {
        UNIX_EPOCH
    } else {
        t.min(max())
    }
}

/// Milliseconds since the epoch, within [`clamp`]'s range.
pub fn to_ms(t: SystemTime) -> u64 {
    clamp(t)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(MAX_MS))
}

/// Now, in milliseconds since the epoch.
pub fn now_ms() -> u64 {
    to_ms(SystemTime::now())
}

/// The time `ms` after the epoch, at most [`MAX_MS`].
pub fn from_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.min(MAX_MS))
}

/// `2026-11-23T12:04:00Z`.
pub fn rfc3339_seconds(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(clamp(t)).to_string()
}

/// `2026-11-23T12:04:00.250Z`.
pub fn rfc3339_millis(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(clamp(t)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_past_9999_and_before_1970_are_clamped_not_a_panic() {
        let year_10000 = UNIX_EPOCH + Duration::from_secs(253_402_300_800);
        assert_eq!(rfc3339_seconds(year_10000), "9999-12-31T23:59:59Z");
        assert_eq!(rfc3339_millis(year_10000), "9999-12-31T23:59:59.999Z");
        let far = UNIX_EPOCH + Duration::from_secs(i64::MAX as u64 / 2);
        assert_eq!(to_ms(far), MAX_MS);
        assert_eq!(rfc3339_millis(far), "9999-12-31T23:59:59.999Z");
        let before = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(rfc3339_seconds(before), "1970-01-01T00:00:00Z");
        assert_eq!(to_ms(before), 0);
        assert_eq!(
            rfc3339_millis(from_ms(u64::MAX)),
            "9999-12-31T23:59:59.999Z"
        );
    }

    #[test]
    fn ordinary_times_are_exact() {
        let t = UNIX_EPOCH + Duration::from_millis(1_795_435_440_250);
        assert_eq!(to_ms(t), 1_795_435_440_250);
        assert_eq!(from_ms(1_795_435_440_250), t);
        assert_eq!(rfc3339_seconds(t), "2026-11-23T12:04:00Z");
        assert_eq!(rfc3339_millis(t), "2026-11-23T12:04:00.250Z");
    }
}
