//! The pre-flight's exchange over one path of the ring, pure: three lines, each bound to
//! this resolution of the cluster and to the path's two tasks.
//!
//! 1. The connecting pod: `trainlet-preflight/2 hello <from> <to> <nonce> <mac>`.
//! 2. The accepting pod, once the hello checks out: `trainlet-preflight/2 ack <nonce>
//!    <mac>`; otherwise `trainlet-preflight/2 refused <why>`, and it closes.
//! 3. The connecting pod, once the ack checks out: `trainlet-preflight/2 confirm <mac>`.
//!
//! Each mac is an HMAC-SHA256 keyed with the digest of the resolved cluster
//! ([`crate::cluster::published::digest`]), over the line's kind, both tasks and the
//! nonces so far. Why each part:
//!
//! - The key: only pods that resolved this very cluster answer each other. A peer of
//!   another resolution (a replaced pod, a stale rerun) and any other process on the
//!   network get no ack; the version-1 hello was a fixed line that anyone could send
//!   and that got `ok` back. The digest itself never crosses the wire.
//! - Both tasks: a hello counts only on the path it was made for, from the previous
//!   task to this one.
//! - The nonces, fresh on each side: a recorded hello or ack replays nothing.
//! - The confirm: the accepting pod counts the previous task as reached only once that
//!   pod holds the ack, which is when the connecting pod counts the path as proven. A
//!   hello whose sender gave up (it timed out waiting, or was taken from the backlog
//!   after it left) counts for neither end, so both ends reach the same verdict, unless
//!   a deadline falls in the moment the confirm is on the wire.

use ::ring::hmac;
use thiserror::Error;

/// What every line starts with: the protocol and its version.
const PREFIX: &str = "trainlet-preflight/2";
/// The longest line either side reads: a peer that says more is not a peer.
pub const LINE_MAX: usize = 512;
/// Random bytes of each side's nonce.
pub const NONCE_LEN: usize = 16;

pub type Nonce = [u8; NONCE_LEN];

/// The key of the exchange: the resolved cluster's digest.
#[derive(Clone)]
pub struct Key(hmac::Key);

impl Key {
    pub fn new(digest: &[u8; 32]) -> Key {
        Key(hmac::Key::new(hmac::HMAC_SHA256, digest))
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(…)")
    }
}

/// One path of the ring: `from`'s pod connects to `to`'s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path<'a> {
    pub from: &'a str,
    pub to: &'a str,
}

/// Why a line does not count.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Refused {
    #[error("not a pre-flight line of this version: {0}")]
    Format(String),
    #[error("its hello is from {said}, not from {expected}")]
    From { said: String, expected: String },
    #[error("its hello is for {said}, not for {own}")]
    To { said: String, own: String },
    /// The mac does not check out: another resolution of the cluster, or a forgery.
    #[error("it did not resolve the same cluster as this pod (or forged its line)")]
    Resolution,
    /// The accepting pod refused this pod's hello, and said why.
    #[error("its trainlet-init refused this pod's hello: {0}")]
    Answered(String),
}

/// The connecting pod's first line.
pub fn hello(key: &Key, path: Path, nonce: &Nonce) -> String {
    let said = format!("hello {} {} {}", path.from, path.to, hex(nonce));
    line(&said, &mac(key, &said))
}

/// The nonce of a hello that the accepting pod counts: from `expected.from`, for
/// `expected.to` (this pod), made with this resolution's key.
pub fn check_hello(key: &Key, line: &str, expected: Path) -> Result<Nonce, Refused> {
    let [kind, from, to, nonce, mac] = fields(line)?;
    if kind != "hello" {
        return Err(format_error(line));
    }
    if from != expected.from {
        return Err(Refused::From {
            said: shown(from),
            expected: expected.from.into(),
        });
    }
    if to != expected.to {
        return Err(Refused::To {
            said: shown(to),
            own: expected.to.into(),
        });
    }
    let nonce = nonce_of(nonce).ok_or_else(|| format_error(line))?;
    verify(key, &format!("hello {from} {to} {}", hex(&nonce)), mac)?;
    Ok(nonce)
}

/// The accepting pod's answer to a hello that counts: its own nonce, and a mac that
/// only a pod of this resolution can make for this hello.
pub fn ack(key: &Key, path: Path, hello: &Nonce, own: &Nonce) -> String {
    let said = format!("ack {} {}", hex(own), hex(hello));
    let signed = format!("{said} {} {}", path.from, path.to);
    line(&format!("ack {}", hex(own)), &mac(key, &signed))
}

/// The accepting pod's answer to a hello that does not count: one word, so that a pod
/// of another resolution says why its path is not proven.
pub fn refusal(why: &Refused) -> String {
    let word = match why {
        Refused::Format(_) | Refused::Answered(_) => "format",
        Refused::From { .. } | Refused::To { .. } => "peer",
        Refused::Resolution => "resolution",
    };
    format!("{PREFIX} refused {word}\n")
}

/// The accepting pod's nonce, where its answer is an ack of `hello` on `path`.
pub fn check_answer(key: &Key, line: &str, path: Path, hello: &Nonce) -> Result<Nonce, Refused> {
    if let Some(word) = line
        .strip_suffix('\n')
        .and_then(|l| l.strip_prefix(PREFIX))
        .and_then(|l| l.strip_prefix(" refused "))
    {
        return Err(Refused::Answered(
            match word {
                "resolution" => "it resolved another cluster than this pod",
                "peer" => "it expects another task to connect to it",
                _ => "it did not read a hello of this version",
            }
            .into(),
        ));
    }
    let [kind, nonce, mac] = fields(line)?;
    let own = nonce_of(nonce).filter(|_| kind == "ack");
    let own = own.ok_or_else(|| format_error(line))?;
    let signed = format!("ack {} {} {} {}", hex(&own), hex(hello), path.from, path.to);
    verify(key, &signed, mac)?;
    Ok(own)
}

/// The connecting pod's last line: it holds the ack of its hello.
pub fn confirm(key: &Key, path: Path, hello: &Nonce, ack: &Nonce) -> String {
    line("confirm", &mac(key, &confirmed(path, hello, ack)))
}

/// Whether the confirm is of this path's hello and ack.
pub fn check_confirm(
    key: &Key,
    line: &str,
    path: Path,
    hello: &Nonce,
    ack: &Nonce,
) -> Result<(), Refused> {
    let [kind, mac] = fields(line)?;
    if kind != "confirm" {
        return Err(format_error(line));
    }
    verify(key, &confirmed(path, hello, ack), mac)
}

fn confirmed(path: Path, hello: &Nonce, ack: &Nonce) -> String {
    format!(
        "confirm {} {} {} {}",
        hex(hello),
        hex(ack),
        path.from,
        path.to
    )
}

fn line(said: &str, mac: &str) -> String {
    format!("{PREFIX} {said} {mac}\n")
}

fn mac(key: &Key, said: &str) -> String {
    hex(hmac::sign(&key.0, format!("{PREFIX} {said}").as_bytes()).as_ref())
}

fn verify(key: &Key, said: &str, mac: &str) -> Result<(), Refused> {
    let tag = unhex(mac).ok_or(Refused::Resolution)?;
    hmac::verify(&key.0, format!("{PREFIX} {said}").as_bytes(), &tag)
        .map_err(|_| Refused::Resolution)
}

/// The `N` fields after the prefix of a line that ends with a newline.
fn fields<const N: usize>(line: &str) -> Result<[&str; N], Refused> {
    let rest = line
        .strip_suffix('\n')
        .and_then(|l| l.strip_prefix(PREFIX))
        .and_then(|l| l.strip_prefix(' '))
        .filter(|_| line.len() <= LINE_MAX)
        .ok_or_else(|| format_error(line))?;
    let fields: Vec<&str> = rest.split(' ').collect();
    fields.try_into().map_err(|_| format_error(line))
}

fn format_error(line: &str) -> Refused {
    Refused::Format(shown(line))
}

/// At most 40 characters of what a peer said, escaped: it may be anything.
fn shown(said: &str) -> String {
    let cut: String = said.chars().take(40).collect();
    let more = if cut.len() < said.len() { "…" } else { "" };
    format!("{cut:?}{more}")
}

fn nonce_of(text: &str) -> Option<Nonce> {
    unhex(text)?.try_into().ok()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: Path = Path {
        from: "worker/0",
        to: "worker/1",
    };
    const HELLO: Nonce = [1; NONCE_LEN];
    const ACK: Nonce = [2; NONCE_LEN];

    fn key(seed: u8) -> Key {
        Key::new(&[seed; 32])
    }

    #[test]
    fn the_exchange_checks_out_between_pods_of_one_resolution() {
        let k = key(7);
        let h = hello(&k, PATH, &HELLO);
        assert!(h.starts_with(
            "trainlet-preflight/2 hello worker/0 worker/1 01010101010101010101010101010101 "
        ));
        assert!(h.len() <= LINE_MAX && h.ends_with('\n'), "{h}");
        assert_eq!(check_hello(&k, &h, PATH), Ok(HELLO));
        let a = ack(&k, PATH, &HELLO, &ACK);
        assert_eq!(check_answer(&k, &a, PATH, &HELLO), Ok(ACK));
        let c = confirm(&k, PATH, &HELLO, &ACK);
        assert_eq!(check_confirm(&k, &c, PATH, &HELLO, &ACK), Ok(()));
    }

    #[test]
    fn a_forged_or_foreign_hello_does_not_count() {
        let (k, other) = (key(7), key(8));
        // Version 1's hello, which anyone could send.
        assert_eq!(
            check_hello(&k, "trainlet-preflight worker/0\n", PATH),
            Err(Refused::Format("\"trainlet-preflight worker/0\\n\"".into()))
        );
        // A pod of another resolution.
        let foreign = hello(&other, PATH, &HELLO);
        assert_eq!(check_hello(&k, &foreign, PATH), Err(Refused::Resolution));
        // Another path of the ring, or another task claiming to be the previous one.
        let elsewhere = hello(
            &k,
            Path {
                from: "worker/0",
                to: "worker/2",
            },
            &HELLO,
        );
        assert_eq!(
            check_hello(&k, &elsewhere, PATH),
            Err(Refused::To {
                said: "\"worker/2\"".into(),
                own: "worker/1".into()
            })
        );
        let impostor = hello(
            &k,
            Path {
                from: "worker/3",
                to: "worker/1",
            },
            &HELLO,
        );
        assert_eq!(
            check_hello(&k, &impostor, PATH),
            Err(Refused::From {
                said: "\"worker/3\"".into(),
                expected: "worker/0".into()
            })
        );
        // A valid hello with a nonce swapped in: its mac no longer checks out.
        let swapped = h_with_nonce(&hello(&k, PATH, &HELLO), &[9; NONCE_LEN]);
        assert_eq!(check_hello(&k, &swapped, PATH), Err(Refused::Resolution));
        // Cut short, or too long.
        let h = hello(&k, PATH, &HELLO);
        assert!(matches!(
            check_hello(&k, h.trim_end(), PATH),
            Err(Refused::Format(_))
        ));
        let long = format!("{}{}\n", h.trim_end(), " ".repeat(LINE_MAX));
        assert!(matches!(
            check_hello(&k, &long, PATH),
            Err(Refused::Format(_))
        ));
    }

    fn h_with_nonce(h: &str, nonce: &Nonce) -> String {
        let mut f: Vec<String> = h.trim_end().split(' ').map(String::from).collect();
        f[4] = hex(nonce);
        format!("{}\n", f.join(" "))
    }

    #[test]
    fn an_ack_or_confirm_counts_only_for_its_own_hello() {
        let (k, other) = (key(7), key(8));
        // An ack of another resolution, or replayed from an earlier hello.
        let foreign = ack(&other, PATH, &HELLO, &ACK);
        assert_eq!(
            check_answer(&k, &foreign, PATH, &HELLO),
            Err(Refused::Resolution)
        );
        let earlier = ack(&k, PATH, &[3; NONCE_LEN], &ACK);
        assert_eq!(
            check_answer(&k, &earlier, PATH, &HELLO),
            Err(Refused::Resolution)
        );
        // Version 1's `ok`.
        assert!(matches!(
            check_answer(&k, "trainlet-preflight ok\n", PATH, &HELLO),
            Err(Refused::Format(_))
        ));
        // A confirm replayed from another exchange of the path.
        let replayed = confirm(&k, PATH, &HELLO, &[4; NONCE_LEN]);
        assert_eq!(
            check_confirm(&k, &replayed, PATH, &HELLO, &ACK),
            Err(Refused::Resolution)
        );
        // A hello does not confirm.
        assert!(matches!(
            check_confirm(&k, &hello(&k, PATH, &HELLO), PATH, &HELLO, &ACK),
            Err(Refused::Format(_))
        ));
    }

    #[test]
    fn a_refusal_says_why_in_one_word() {
        let k = key(7);
        let said = |why: Refused| {
            let line = refusal(&why);
            (line.clone(), check_answer(&k, &line, PATH, &HELLO))
        };
        assert_eq!(
            said(Refused::Resolution),
            (
                "trainlet-preflight/2 refused resolution\n".to_string(),
                Err(Refused::Answered(
                    "it resolved another cluster than this pod".into()
                ))
            )
        );
        let peer = Refused::From {
            said: "x".into(),
            expected: "y".into(),
        };
        assert_eq!(
            said(peer).1,
            Err(Refused::Answered(
                "it expects another task to connect to it".into()
            ))
        );
        assert_eq!(
            Refused::Answered("it resolved another cluster than this pod".into()).to_string(),
            "its trainlet-init refused this pod's hello: it resolved another cluster than this pod"
        );
    }
}
