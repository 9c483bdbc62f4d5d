//! Moving tasks to their replacements' addresses in files already written: what the
//! sidecar does for `trainlet exec --on-peer-change restart` when exec has no API
//! credentials to resolve the cluster again.
//!
//! A replacement holds the same task (the same Job and completion index, or the same
//! StatefulSet name) with the same template, so only its host changed: every file init
//! wrote (TF_CONFIG, trainlet.env, torch.env, the hostfile, …) stays right once each old
//! host is replaced by the new one where it stands as a whole host. Ranks, ports and
//! everything else stay as init resolved them.

pub use crate::cluster::drift::Move;

/// Whether `c` can continue a host: an IPv4 address or a DNS name continues with
/// letters, digits, `.`, `-`; an IPv6 address also with `:`.
fn continues_host(c: char, ipv6: bool) -> bool {
    c.is_ascii_alphanumeric() || c == '.' || c == '-' || (ipv6 && c == ':')
}

/// `text` with every whole occurrence of a move's `from` replaced by its `to`, all at
/// once (a move to an address that another task leaves is not moved again).
/// `10.0.0.1` is not found inside `10.0.0.19` or `110.0.0.1`.
pub fn rehost(text: &str, moves: &[Move]) -> String {
    let mut hits: Vec<(usize, usize, &str)> = Vec::new();
    for m in moves
        .iter()
        .filter(|m| !m.from.is_empty() && m.from != m.to)
    {
        let ipv6 = m.from.contains(':');
        for (i, _) in text.match_indices(m.from.as_str()) {
            let end = i + m.from.len();
            let before = text[..i].chars().next_back();
            let after = text[end..].chars().next();
            if !before.is_some_and(|c| continues_host(c, ipv6))
                && !after.is_some_and(|c| continues_host(c, ipv6))
            {
                hits.push((i, end, m.to.as_str()));
            }
        }
    }
    hits.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end, to) in hits {
        if start < at {
            continue;
        }
        out.push_str(&text[at..start]);
        out.push_str(to);
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mv(from: &str, to: &str) -> Move {
        Move {
            from: from.into(),
            to: to.into(),
        }
    }

    #[test]
    fn only_whole_hosts_move() {
        let tf = r#"{"cluster":{"worker":["10.0.0.1:8470","10.0.0.19:8470","110.0.0.1:8470"]},"task":{"type":"worker","index":1}}"#;
        assert_eq!(
            rehost(tf, &[mv("10.0.0.1", "10.0.0.7")]),
            r#"{"cluster":{"worker":["10.0.0.7:8470","10.0.0.19:8470","110.0.0.1:8470"]},"task":{"type":"worker","index":1}}"#
        );
        let env = "export MASTER_ADDR='10.0.0.1'\nexport WORLD_SIZE='3'\n";
        assert_eq!(
            rehost(env, &[mv("10.0.0.1", "10.0.0.7")]),
            "export MASTER_ADDR='10.0.0.7'\nexport WORLD_SIZE='3'\n"
        );
        let hostfile = "10.0.0.1 slots=1\n10.0.0.12 slots=1\n";
        assert_eq!(
            rehost(hostfile, &[mv("10.0.0.1", "10.0.0.2")]),
            "10.0.0.2 slots=1\n10.0.0.12 slots=1\n"
        );
        // IPv6, bracketed with a port, and not inside a longer address.
        assert_eq!(
            rehost("[fd00::1]:8470 fd00::1:5", &[mv("fd00::1", "fd00::9")]),
            "[fd00::9]:8470 fd00::1:5"
        );
    }

    #[test]
    fn moves_apply_at_once_not_one_after_the_other() {
        // Two tasks swap addresses: neither is moved twice.
        assert_eq!(
            rehost(
                "a=10.0.0.1 b=10.0.0.2",
                &[mv("10.0.0.1", "10.0.0.2"), mv("10.0.0.2", "10.0.0.1")]
            ),
            "a=10.0.0.2 b=10.0.0.1"
        );
        assert_eq!(rehost("x", &[mv("", "y")]), "x");
    }

    proptest! {
        /// Without a match the text comes back as it was; with one, the new host is
        /// there and the old one is gone as a whole host.
        #[test]
        fn a_moved_host_is_gone(a in 1u8..255, b in 1u8..255, pad in "[ =:,\\[\\]\"']{1,3}") {
            prop_assume!(a != b);
            let from = format!("10.1.0.{a}");
            let to = format!("10.1.0.{b}");
            let text = format!("{pad}{from}{pad}10.2.0.{a}");
            let out = rehost(&text, &[mv(&from, &to)]);
            prop_assert_eq!(out, format!("{pad}{to}{pad}10.2.0.{a}"));
            prop_assert_eq!(rehost("no host here", &[mv(&from, &to)]), "no host here");
        }
    }
}
