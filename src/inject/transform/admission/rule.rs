//! What a valid value of one setting is, written once. The policy's CEL checks and
//! `inject`'s own check of the values it writes are both made from a [`Rule`], so that
//! a value the API server refuses for a labelled pod is the value `inject` refuses for
//! a template, and the other way round (`tests/it/admission.rs` runs both on generated
//! values). Each rule is a pattern that RE2 (CEL's `matches`) and the regex crate read
//! alike (ASCII classes only, nothing whose meaning depends on the engine), then bounds
//! on numbers: whatever a pattern admits, trainlet's own parsers accept (property
//! tests below).
//!
//! Cost: every check first bounds the value's size ([`Rule::max_len`]); only then does
//! any per-entry work run, and none of it is worse than linear in the value, so one
//! pod's annotations cannot make the API server spend more than a few milliseconds.

use std::sync::LazyLock;
use std::time::Duration;

use regex::Regex;

use super::cel::cel_string;

/// The longest value of most settings, in characters.
pub const MAX_LEN: usize = 256;
/// The longest `trainlet.io/job`: room for [`MAX_ITEMS`] types with long selectors.
pub const MAX_JOB_LEN: usize = 4096;
/// The longest `trainlet.io/permanent-exit-codes`: every code from 1 to 255 once
/// (911 characters).
pub const MAX_CODES_LEN: usize = 1024;
/// The most `;`-separated entries of `trainlet.io/job` (`--job`), and `,`-separated
/// ones of `trainlet.io/expect`: job types, of which TensorFlow knows five.
pub const MAX_ITEMS: usize = 16;
/// The most digits of a number: a billion fits every integer flag and CEL's int.
const DIGITS: &str = "[0-9]{1,9}";

/// What a valid value of one setting is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// One of these words (`--address`, `--on-stall`).
    Choice(&'static [&'static str]),
    /// These words, comma-separated, without spaces (`--framework`).
    Choices(&'static [&'static str]),
    /// A whole number from `min` to `max` in digits only, or one of `words`
    /// (`--port`, `--nproc-per-node`).
    Count {
        words: &'static [&'static str],
        min: u64,
        max: u64,
    },
    /// A duration from `min` to `max`, as whole numbers with `ms`, `s`, `m`, `h` or `d`
    /// (`90s`, `10m`, `1h30m`, `1h 30m`); a bare `0` where `min` is zero.
    Duration { min: Duration, max: Duration },
    /// Text that matches this pattern whole (`--port-name`, `--cluster-domain`).
    Text(&'static str),
    /// `TYPE=SELECTOR` entries separated by `;` (`--job`), at most [`MAX_ITEMS`].
    Jobs,
    /// `TYPE=N` entries separated by `,`, N at least 1 (`--expect`); that each TYPE is
    /// a job's is checked with the jobs.
    Expect,
    /// `MIN:MAX` with 1 ≤ MIN ≤ MAX (`--nnodes`).
    Span,
    /// Exit codes from 1 to 255, separated by `,` without spaces
    /// (`--permanent-exit-codes`).
    Codes,
    /// A regular expression in the subset that RE2 and the regex crate both compile
    /// (`--progress-pattern`): see [`pattern_grammar`].
    Pattern,
    /// A listen address `IPV4:PORT` or `[::]:PORT`, PORT from 1 to 65535
    /// (`--metrics-addr`): what `SocketAddr` parses, without the forms (IPv6 beyond
    /// `[::]`, octets with leading zeros) that a pattern cannot tell valid in both engines.
    Addr,
}

/// Why a value breaks its rule: the text after `invalid --flag "value": `.
pub type Why = String;

impl Rule {
    /// The longest value, in characters (CEL's `size` of a string).
    pub fn max_len(&self) -> usize {
        match self {
            Rule::Jobs => MAX_JOB_LEN,
            Rule::Codes => MAX_CODES_LEN,
            _ => MAX_LEN,
        }
    }

    /// What a valid value is, for a message.
    pub fn hint(&self) -> String {
        match self {
            Rule::Choice(words) => format!("give one of {}", words.join(", ")),
            Rule::Choices(words) => format!(
                "give one or more of {}, separated by ',' without spaces",
                words.join(", ")
            ),
            Rule::Count { words, min, max } => {
                let number = format!("a whole number from {min} to {max}");
                if words.is_empty() {
                    format!("give {number}")
                } else {
                    format!("give {} or {number}", words.join(", "))
                }
            }
            Rule::Duration { min, max } => format!(
                "give a duration from {} to {} in whole ms, s, m, h or d, e.g. 90s, 10m or 1h30m{}",
                human(*min),
                human(*max),
                if min.is_zero() { " (0: none)" } else { "" }
            ),
            Rule::Text(_) => "give a value as the flag takes it (`trainlet inject --help`)".into(),
            Rule::Jobs => format!(
                "give TYPE=SELECTOR (a TYPE of letters, digits, '_' and '-', a label selector), at most {MAX_ITEMS} separated by ';'"
            ),
            Rule::Expect => format!(
                "give TYPE=N with N at least 1, at most {MAX_ITEMS} separated by ',' without spaces"
            ),
            Rule::Span => "give MIN:MAX with 1 <= MIN <= MAX, e.g. 2:4".into(),
            Rule::Codes => "give exit codes from 1 to 255 in digits, separated by ',' without spaces, e.g. 2,126,127".into(),
            Rule::Addr => "give IPV4:PORT or [::]:PORT with a PORT from 1 to 65535, e.g. 0.0.0.0:9464".into(),
            Rule::Pattern => "give a regular expression of literal text, '.', \\d \\D \\s \\S \\w \\W \\b \\B, \\-escaped punctuation, classes such as [0-9a-z_], groups (…) and (?:…) nested at most twice, |, ^, $ and ? * + {n} {n,}".into(),
        }
    }

    /// Checks `value`, as the policy's CEL does.
    pub fn check(&self, value: &str) -> Result<(), Why> {
        let len = value.chars().count();
        if len > self.max_len() {
            return Err(format!(
                "{len} characters, at most {} allowed",
                self.max_len()
            ));
        }
        let ok = match self {
            Rule::Choice(words) => words.contains(&value),
            Rule::Choices(words) => full(&choices(words)).is_match(value),
            Rule::Count { words, min, max } => {
                words.contains(&value)
                    || (full(DIGITS).is_match(value)
                        && value.parse::<u64>().is_ok_and(|n| n >= *min && n <= *max))
            }
            Rule::Duration { min, max } => {
                (min.is_zero() && value == "0")
                    || (DURATION.is_match(value)
                        && millis(value)
                            .is_some_and(|ms| ms >= min.as_millis() && ms <= max.as_millis()))
            }
            Rule::Text(pattern) => full(pattern).is_match(value),
            Rule::Jobs => {
                let items: Vec<&str> = value.split(';').collect();
                items.len() <= MAX_ITEMS
                    && items.iter().all(|i| JOB.is_match(i))
                    && !LONG_PREFIX.is_match(value)
            }
            Rule::Expect => {
                let items: Vec<&str> = value.split(',').collect();
                items.len() <= MAX_ITEMS
                    && EXPECT.is_match(value)
                    && items.iter().all(|i| {
                        i.split_once('=')
                            .and_then(|(_, n)| n.parse::<u64>().ok())
                            .is_some_and(|n| n >= 1)
                    })
            }
            Rule::Span => {
                SPAN.is_match(value) && {
                    let (lo, hi) = value.split_once(':').unwrap_or_default();
                    let (lo, hi) = (lo.parse::<u64>(), hi.parse::<u64>());
                    matches!((lo, hi), (Ok(lo), Ok(hi)) if lo >= 1 && lo <= hi)
                }
            }
            Rule::Codes => CODES.is_match(value),
            Rule::Pattern => PATTERN.is_match(value),
            Rule::Addr => {
                ADDR.is_match(value)
                    && value
                        .rsplit_once(':')
                        .and_then(|(_, p)| p.parse::<u32>().ok())
                        .is_some_and(|p| p <= u16::MAX.into())
            }
        };
        if ok { Ok(()) } else { Err(self.hint()) }
    }

    /// CEL that holds when `v` (a CEL string expression, not empty) is valid, or too
    /// long (which its own check reports): every check is bounded by the size first.
    pub fn cel(&self, v: &str) -> String {
        format!("(size({v}) > {} || {})", self.max_len(), self.check_cel(v))
    }

    /// CEL that holds when `v` is valid, its size included.
    pub fn cel_valid(&self, v: &str) -> String {
        format!("(size({v}) <= {} && {})", self.max_len(), self.check_cel(v))
    }

    /// The rule past the size, in CEL.
    fn check_cel(&self, v: &str) -> String {
        match self {
            Rule::Choice(words) => format!(
                "{v} in [{}]",
                words
                    .iter()
                    .map(|w| cel_string(w))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Rule::Choices(words) => matches(v, &format!("^{}$", choices(words))),
            Rule::Count { words, min, max } => {
                let number = format!(
                    "({} && int({v}) >= {min} && int({v}) <= {max})",
                    matches(v, &format!("^{DIGITS}$"))
                );
                if words.is_empty() {
                    number
                } else {
                    format!("({} || {number})", Rule::Choice(words).check_cel(v))
                }
            }
            Rule::Duration { min, max } => {
                let ms = duration_millis_cel(v);
                let zero = if min.is_zero() {
                    format!("{v} == '0' || ")
                } else {
                    String::new()
                };
                format!(
                    "({zero}({} && {ms} >= {} && {ms} <= {}))",
                    matches(v, DURATION.as_str()),
                    min.as_millis(),
                    max.as_millis()
                )
            }
            Rule::Text(pattern) => matches(v, &format!("^(?:{pattern})$")),
            Rule::Jobs => format!(
                "(size({v}.split(';')) <= {MAX_ITEMS} && {v}.split(';').all(s, {}) && !{})",
                matches("s", JOB.as_str()),
                matches(v, LONG_PREFIX.as_str())
            ),
            Rule::Expect => format!(
                "(size({v}.split(',')) <= {MAX_ITEMS} && {} && {v}.split(',').all(s, int(s.split('=')[1]) >= 1))",
                matches(v, EXPECT.as_str())
            ),
            Rule::Span => format!(
                "({} && int({v}.split(':')[0]) >= 1 && int({v}.split(':')[0]) <= int({v}.split(':')[1]))",
                matches(v, SPAN.as_str())
            ),
            Rule::Codes => matches(v, CODES.as_str()),
            Rule::Pattern => matches(v, PATTERN.as_str()),
            Rule::Addr => format!(
                "({} && int({v}.substring({v}.lastIndexOf(':') + 1)) <= 65535)",
                matches(v, ADDR.as_str())
            ),
        }
    }
}

/// `v.matches(pattern)` in CEL.
fn matches(v: &str, pattern: &str) -> String {
    format!("{v}.matches({})", cel_string(pattern))
}

fn full(pattern: &str) -> Regex {
    Regex::new(&format!("^(?:{pattern})$")).expect("a rule's pattern compiles")
}

fn choices(words: &[&str]) -> String {
    let one = format!("(?:{})", words.join("|"));
    format!("{one}(?:,{one})*")
}

/// `1h`, `30m`, `1s`, `500ms`: a duration as the hints write it.
fn human(d: Duration) -> String {
    let ms = d.as_millis();
    let (n, unit) = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ]
    .into_iter()
    .find(|(u, _)| ms >= *u && ms.is_multiple_of(*u))
    .unwrap_or((1, "ms"));
    format!("{}{unit}", ms / n)
}

/// The milliseconds of a duration that [`DURATION`] matched, summed without overflow
/// (at most four parts of nine digits).
fn millis(value: &str) -> Option<u128> {
    PART.find_iter(value)
        .map(|m| {
            let part = m.as_str();
            let digits = part.trim_end_matches(|c: char| c.is_ascii_alphabetic());
            let unit = match &part[digits.len()..] {
                "ms" => 1,
                "s" => 1000,
                "m" => 60_000,
                "h" => 3_600_000,
                "d" => 86_400_000,
                _ => return None,
            };
            digits.parse::<u128>().ok().map(|n| n * unit)
        })
        .sum()
}

/// The same sum in CEL: integers only (a CEL duration overflows past 292 years, and
/// would make the check an error rather than a refusal).
fn duration_millis_cel(v: &str) -> String {
    let part = |i: usize| {
        format!(
            "(size({v}.findAll({p})) > {i} ? int({v}.findAll({p})[{i}].findAll('[0-9]+')[0]) * ({v}.findAll({p})[{i}].endsWith('ms') ? 1 : {v}.findAll({p})[{i}].endsWith('s') ? 1000 : {v}.findAll({p})[{i}].endsWith('m') ? 60000 : {v}.findAll({p})[{i}].endsWith('h') ? 3600000 : 86400000) : 0)",
            p = cel_string(PART.as_str())
        )
    };
    format!(
        "({})",
        (0..DURATION_PARTS)
            .map(part)
            .collect::<Vec<_>>()
            .join(" + ")
    )
}

/// The most parts of a duration (`1d 2h 3m 4s`).
const DURATION_PARTS: usize = 4;

static PART: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!("{DIGITS}(?:ms|s|m|h|d)")).expect("compiles"));

static DURATION: LazyLock<Regex> = LazyLock::new(|| {
    let part = format!("{DIGITS}(?:ms|s|m|h|d)");
    Regex::new(&format!("^{part}(?: ?{part}){{0,{}}}$", DURATION_PARTS - 1)).expect("compiles")
});

/// One exit code from 1 to 255 in digits, without a sign or a leading zero.
const CODE: &str = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9][0-9]?)";

static CODES: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!("^{CODE}(?:,{CODE})*$")).expect("compiles"));

/// A job type: what `cluster::validate_task_type` accepts.
const TYPE: &str = "[A-Za-z][A-Za-z0-9_-]{0,62}";
/// A label name or value: 1 to 63 of `[A-Za-z0-9_.-]`, alphanumeric at both ends.
const NAME: &str = "[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?";
/// One label of a DNS subdomain, a key's prefix.
const DNS_LABEL: &str = "[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?";
/// Blanks around a selector's parts (its parser trims them).
const BLANK: &str = "[ \\t]*";

/// One `;`-separated entry of `--job`: `TYPE=SELECTOR`, the selector in the syntax of
/// `cluster::selector::parse` except for `in`/`notin` sets with empty values, which a
/// person does not mean to write (`(a,,b)`).
static JOB: LazyLock<Regex> = LazyLock::new(|| {
    let key = format!("(?:{DNS_LABEL}(?:\\.{DNS_LABEL})*/)?{NAME}");
    let b = BLANK;
    let requirement = format!(
        "(?:!{b}{key}|{key}{b}(?:==|=|!=){b}(?:{NAME})?|{key}[ \\t]+(?:in|notin){b}\\({b}{NAME}(?:{b},{b}{NAME})*{b}\\)|{key})"
    );
    let selector = format!("{b}{requirement}{b}(?:,{b}{requirement}{b})*");
    Regex::new(&format!("^{b}{TYPE}{b}={selector}$")).expect("compiles")
});

/// A key's prefix of more than 253 characters, which a DNS subdomain cannot be.
static LONG_PREFIX: LazyLock<Regex> =
    LazyLock::new(|| Regex::new("[a-z0-9.-]{254}/").expect("compiles"));

static EXPECT: LazyLock<Regex> = LazyLock::new(|| {
    let item = format!("{TYPE}={DIGITS}");
    Regex::new(&format!("^{item}(?:,{item})*$")).expect("compiles")
});

static SPAN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!("^{DIGITS}:{DIGITS}$")).expect("compiles"));

/// An IPv4 octet without leading zeros.
const OCTET: &str = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";

/// `IPV4:PORT` or `[::]:PORT`, the port's digits without a leading zero (its bound is
/// checked apart).
static ADDR: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        "^(?:(?:{OCTET}\\.){{3}}{OCTET}|\\[::\\]):[1-9][0-9]{{0,4}}$"
    ))
    .expect("compiles")
});

static PATTERN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&pattern_grammar()).expect("compiles"));

/// The progress patterns both engines compile alike: literal text, `.`, the escapes
/// `\d \D \s \S \w \W \b \B`, escaped punctuation, classes of literals, those escapes
/// and the ranges `0-9`, `a-z`, `A-Z`, groups `(…)` and `(?:…)` nested at most twice,
/// `|`, `^` and `$`, and one quantifier (`?`, `*`, `+`, `{n}`, `{n,}` with n < 10,
/// each maybe lazy) after an atom. What it leaves out is what the engines disagree on
/// (Unicode classes, set operations in classes, look-around, back-references) or what
/// cannot be told valid by a pattern (the order of a range's ends, `{n,m}` with
/// n > m, sizes past the compiled limit).
pub fn pattern_grammar() -> String {
    grammar("*", "+")
}

/// The grammar with `many` and `some` for its unbounded repetitions (bounded ones
/// generate test patterns of a sensible size).
fn grammar(many: &str, some: &str) -> String {
    let literal = "[^\\\\^$.|?*+()\\[\\]{}\\x00-\\x1f\\x7f]";
    let escape = "\\\\[\\\\^$.|?*+()\\[\\]{}/-]|\\\\[dDsSwWbB]";
    let class_item = "[^\\\\\\[\\]&~\\x00-\\x1f\\x7f-]|\\\\[\\\\\\[\\]^dDsSwW-]|0-9|a-z|A-Z";
    let class = format!("\\[\\^?(?:{class_item}){some}\\]");
    let quantifier = "(?:(?:[?*+]|\\{[0-9],?\\})\\??)";
    let atom = format!("(?:{literal}|{escape}|\\.|{class})");
    // Innermost first: an alternation of pieces, then groups of it, twice.
    let mut group_inside = format!(
        "(?:{atom}{quantifier}?|[\\^$]){many}(?:\\|(?:{atom}{quantifier}?|[\\^$]){many}){many}"
    );
    for _ in 0..2 {
        let group = format!("\\((?:\\?:)?{group_inside}\\)");
        let piece = format!("(?:(?:{atom}|{group}){quantifier}?|[\\^$])");
        group_inside = format!("{piece}{many}(?:\\|{piece}{many}){many}");
    }
    format!("^(?:{group_inside})$")
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALL: Rule = Rule::Duration {
        min: Duration::from_secs(1),
        max: Duration::from_secs(365 * 24 * 3600),
    };

    #[test]
    fn durations_are_whole_parts_within_their_bounds() {
        for ok in [
            "1s",
            "10m",
            "1h30m",
            "1h 30m",
            "365d",
            "1d 2h 3m 4s",
            "999ms 1s",
        ] {
            assert_eq!(STALL.check(ok), Ok(()), "{ok}");
        }
        for bad in [
            "500ms",
            "0s",
            "0",
            "366d",
            "1.5h",
            "1min",
            "10",
            " 10m",
            "10m ",
            "1h  30m",
            "1d 2h 3m 4s 5ms",
            "1000000000s",
        ] {
            assert!(STALL.check(bad).is_err(), "{bad}");
        }
        let timeout = Rule::Duration {
            min: Duration::ZERO,
            max: Duration::from_secs(365 * 24 * 3600),
        };
        assert_eq!(timeout.check("0"), Ok(()));
        assert_eq!(timeout.check("0s"), Ok(()));
        assert_eq!(
            STALL.check("500ms").unwrap_err(),
            "give a duration from 1s to 365d in whole ms, s, m, h or d, e.g. 90s, 10m or 1h30m"
        );
    }

    #[test]
    fn jobs_are_types_and_selectors_separated_by_semicolons() {
        for ok in [
            "worker=app=x",
            "chief=app=trainer,role=chief; worker=app=trainer,role=worker",
            "ps=job-name in (ps),tier!=canary",
            "w=!a, b, c==d, e=, example.com/f notin(x,y)",
            "w = batch.kubernetes.io/job-name=my-job",
        ] {
            assert_eq!(Rule::Jobs.check(ok), Ok(()), "{ok}");
        }
        for bad in [
            "worker",
            "worker=",
            "worker=app=x;",
            "worker=app=x;;ps=app=y",
            "worker=app=x;--kubeconfig=/x",
            "1worker=app=x",
            "w=a in (x,,y)",
            "w=a in ()",
            "w=a=b=c",
            "w=app=x\n",
            "w=app=x,",
            "w=a<3",
            &format!("w={}/x=y", "a".repeat(254)),
            &"w=a=b;"
                .repeat(16)
                .trim_end_matches(';')
                .replace("w=a=b", "w=a=b;w=a=b"),
        ] {
            assert!(Rule::Jobs.check(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Rule::Jobs.check(&"x".repeat(4097)).unwrap_err(),
            "4097 characters, at most 4096 allowed"
        );
    }

    #[test]
    fn expect_spans_and_counts() {
        assert_eq!(Rule::Expect.check("chief=1,worker=3"), Ok(()));
        for bad in [
            "worker=0",
            "worker=two",
            "worker=1,",
            "worker = 1",
            "w=1,,p=2",
        ] {
            assert!(Rule::Expect.check(bad).is_err(), "{bad}");
        }
        for ok in ["1", "255", "2,126,127", "42,3,42"] {
            assert_eq!(Rule::Codes.check(ok), Ok(()), "{ok}");
        }
        for bad in [
            "0", "256", "01", "+1", "1, 2", "1,,2", "1,", "", "1;2", "-1",
        ] {
            assert!(Rule::Codes.check(bad).is_err(), "{bad}");
        }
        assert_eq!(Rule::Span.check("2:4"), Ok(()));
        assert_eq!(Rule::Span.check("3:3"), Ok(()));
        for bad in ["5:2", "0:2", "4", " 2:4", "2:"] {
            assert!(Rule::Span.check(bad).is_err(), "{bad}");
        }
        let port = Rule::Count {
            words: &[],
            min: 1,
            max: 65535,
        };
        for (v, ok) in [
            ("1", true),
            ("65535", true),
            ("0", false),
            ("99999", false),
            ("+80", false),
            ("080", true),
        ] {
            assert_eq!(port.check(v).is_ok(), ok, "{v}");
        }
        assert_eq!(
            port.check("0").unwrap_err(),
            "give a whole number from 1 to 65535"
        );
    }

    #[test]
    fn listen_addresses_are_ipv4_or_any_ipv6_with_a_port() {
        for ok in [
            "0.0.0.0:9464",
            "[::]:9464",
            "10.1.2.3:1",
            "255.255.255.255:65535",
        ] {
            assert_eq!(Rule::Addr.check(ok), Ok(()), "{ok}");
            assert!(ok.parse::<std::net::SocketAddr>().is_ok(), "{ok}");
        }
        for bad in [
            "off",
            "9464",
            ":9464",
            "0.0.0.0:0",
            "0.0.0.0:65536",
            "0.0.0.0:09464",
            "256.0.0.1:80",
            "01.2.3.4:80",
            "[::1]:80",
            "localhost:9464",
            " 0.0.0.0:9464",
            "0.0.0.0:9464\n",
        ] {
            assert!(Rule::Addr.check(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Rule::Addr.check("off").unwrap_err(),
            "give IPV4:PORT or [::]:PORT with a PORT from 1 to 65535, e.g. 0.0.0.0:9464"
        );
    }

    #[test]
    fn progress_patterns_in_the_portable_subset() {
        for ok in [
            r"step (\d+)",
            r"^Epoch \d+/\d+",
            r"loss=[0-9.]+",
            r"(?:it|step)s? (\d{1,}) of",
            r"((a|b)c)+",
            r"\[train\] \w+",
            "a|",
            "()",
        ] {
            assert_eq!(Rule::Pattern.check(ok), Ok(()), "{ok}");
            assert!(Regex::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "step (", "a)", "[a", "a{", "*a", "a**", r"\1", "(?=a)", r"\p{L}", "[z-a]", "[a&&b]",
            "(((a)))", "a{2,1}", "^*", "(?P<n>a)", "a\nb",
        ] {
            assert!(Rule::Pattern.check(bad).is_err(), "{bad}");
        }
    }

    mod props {
        use proptest::prelude::*;

        use super::*;
        use crate::testing::budget;

        /// A strategy of the strings a rule's pattern matches (proptest generates
        /// from a pattern without its anchors).
        fn of(pattern: &str) -> proptest::string::RegexGeneratorStrategy<String> {
            let body = pattern.strip_prefix('^').unwrap_or(pattern);
            let body = body.strip_suffix('$').unwrap_or(body);
            proptest::string::string_regex(body).unwrap()
        }

        proptest! {
            #![proptest_config(budget(64))]

            /// Whatever the subset admits, the regex crate compiles: the rule never
            /// lets through a pattern `trainlet exec` would refuse.
            #[test]
            fn every_pattern_of_the_subset_compiles(p in of(&grammar("{0,3}", "{1,3}"))) {
                if Rule::Pattern.check(&p).is_ok() {
                    prop_assert!(Regex::new(&p).is_ok(), "{p:?}");
                }
            }

            /// Every job entry of the grammar is one that init's parsers accept.
            #[test]
            fn every_job_entry_parses(j in of(JOB.as_str())) {
                // The rule's other pattern refuses these.
                prop_assume!(!LONG_PREFIX.is_match(&j));
                let (ty, sel) = j.split_once('=').unwrap();
                prop_assert!(crate::cluster::validate_task_type(ty.trim()).is_ok(), "{j:?}");
                prop_assert!(crate::cluster::selector::parse(sel).is_ok(), "{j:?}");
            }

            /// Durations of the grammar parse to what the rule summed.
            #[test]
            fn every_duration_parses_to_its_sum(d in of(DURATION.as_str())) {
                let parsed = humantime::parse_duration(&d).map(|d| d.as_millis());
                prop_assert_eq!(parsed.ok(), millis(&d), "{:?}", d);
            }

            /// Every address the rule admits is a socket address the sidecar parses.
            #[test]
            fn every_admitted_address_parses(a in of(ADDR.as_str())) {
                if Rule::Addr.check(&a).is_ok() {
                    prop_assert!(a.parse::<std::net::SocketAddr>().is_ok(), "{a:?}");
                }
            }

            /// Never a panic, whatever the text.
            #[test]
            fn any_text_is_checked_without_panic(v in "\\PC{0,64}") {
                for rule in [Rule::Jobs, Rule::Expect, Rule::Span, Rule::Codes, Rule::Pattern, Rule::Addr, STALL] {
                    let _ = rule.check(&v);
                }
            }
        }
    }
}
