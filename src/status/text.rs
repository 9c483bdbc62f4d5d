//! Text from the cluster as `trainlet status` shows it: escaped, bounded, and times with
//! their date when it is not today.

use super::CELL_MAX;
pub use crate::text::{bound, escape};

/// A time the agents wrote (RFC 3339, UTC) as the table shows it: `12:03:04Z` on
/// `today` (`2026-11-25`), `2020-01-02 12:03:04Z` on another day; fractions of a second
/// dropped. Anything else is shown as it is.
pub fn clock(time: &str, today: &str) -> String {
    let Some((date, rest)) = time.split_once('T') else {
        return time.to_string();
    };
    let rest = match rest.split_once('.') {
        // `12:03:04.250Z` and `12:03:04.250+02:00`: the zone after the fraction stays.
        Some((whole, frac)) => {
            let zone = frac.trim_start_matches(|c: char| c.is_ascii_digit());
            format!("{whole}{zone}")
        }
        None => rest.to_string(),
    };
    if date == today {
        rest
    } else {
        format!("{date} {rest}")
    }
}

/// Text from the cluster as one cell of the table (and of the JSON): escaped, then
/// bounded to [`CELL_MAX`] characters.
pub fn cell(text: &str) -> String {
    // Escaping only lengthens: what lies past the bound before it is never shown.
    let head = match text.char_indices().nth(CELL_MAX) {
        Some((end, c)) => &text[..end + c.len_utf8()],
        None => text,
    };
    bound(&escape(head), CELL_MAX)
}
