//! Text that people read: what the training container hands over or reports ends up in
//! annotations, Events, metric labels and `trainlet status`, so a character that hides
//! or reorders what is shown has no place in it: it is refused ([`unprintable`]) or
//! escaped ([`escape`]). Pure.

/// Unicode's format characters (general category Cf: bidirectional overrides and
/// isolates, zero-width spaces and joiners, the byte order mark, tags) and its line and
/// paragraph separators (Zl, Zp). None belongs in a GPU name, a process name, an error
/// message or a metric's name; in an annotation or an Event note, they hide or reorder
/// what a person reads (`kubectl describe`, a dashboard). The list is Unicode 15.1's.
pub fn is_invisible(c: char) -> bool {
    matches!(u32::from(c),
        0x00AD | 0x0600..=0x0605 | 0x061C | 0x06DD | 0x070F | 0x0890..=0x0891 | 0x08E2
        | 0x180E | 0x200B..=0x200F | 0x2028..=0x202E | 0x2060..=0x2064 | 0x2066..=0x206F
        | 0xFEFF | 0xFFF9..=0xFFFB | 0x110BD | 0x110CD | 0x13430..=0x1343F
        | 0x1BCA0..=0x1BCA3 | 0x1D173..=0x1D17A | 0xE0001 | 0xE0020..=0xE007F)
}

/// The first character of `s` that is a control character or [`is_invisible`], if any.
pub fn unprintable(s: &str) -> Option<char> {
    s.chars().find(|c| c.is_control() || is_invisible(*c))
}

/// Text from the cluster, a process or the training container as a terminal or a log
/// may show it: every control character (C0, DEL,
/// C1, and the Unicode characters that reorder or hide text, [`is_invisible`]) escaped, as `\e` (ESC),
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
            c if c.is_control() || is_invisible(c) => {
                out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_invisible_characters_are_found_first_one_first() {
        assert_eq!(unprintable("loss"), None);
        assert_eq!(unprintable("Verlust ü 损失"), None);
        assert_eq!(unprintable("lo\u{202E}ss\n"), Some('\u{202E}'));
        assert_eq!(unprintable("loss\u{1b}[2J"), Some('\u{1b}'));
        assert_eq!(unprintable("\u{200B}"), Some('\u{200B}'));
    }
}
