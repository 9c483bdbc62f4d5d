//! Text from the cluster as `trainlet status` shows it: escaped, bounded, and times with
//! their date when it is not today.

use super::CELL_MAX;

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

/// Text from the cluster as the terminal may show it: every control character (C0, DEL,
/// C1, and the Unicode controls that reorder or hide text) escaped, as `\e` (ESC),
/// `\r`, `\n`, `\t`, or `\u{9b}`. An annotation or Event can then neither move the
/// cursor, rewrite a line (a `\r` and a healthy-looking verdict), nor send a terminal
/// an OSC sequence.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\x1b' => out.push_str("\\e"),
            '\r' => out.push_str("\\r"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || is_format_control(c) => {
                out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out
}

/// Unicode's invisible controls that reorder or hide text (bidirectional overrides and
/// isolates, zero-width marks): `is_control` covers only C0, DEL and C1.
fn is_format_control(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}')
}

/// `text` cut to at most `max` characters, the last of them `…` where it was cut.
pub fn bound(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some(_) => {
            let keep: String = text.chars().take(max.saturating_sub(1)).collect();
            format!("{keep}…")
        }
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
