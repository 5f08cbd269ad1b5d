//! Logging helpers shared by the edges: [`LogOnce`], which remembers which problems were already
//! logged so that a periodic pass (a reconcile scan every few seconds) reports a lasting problem
//! once instead of on every pass, [`error_chain`], which puts an error and its sources on one
//! log line, and [`excerpt`] and [`summary`], which keep values from outside the agent (a
//! pod's annotations and environment, names from runtime configs) and long lists of problems
//! from flooding the log.
//!
//! A problem is identified by a key string. It is reported when it is first seen, stays quiet
//! while it is seen in every following pass, and is forgotten after a pass that did not see it,
//! so if it comes back later it is reported again. Memory is bounded by the problems of two
//! passes.

use std::borrow::Cow;
use std::collections::HashSet;

/// Distinct problems remembered per pass. Past it, new problems are counted, not remembered
/// (nor logged one by one): a tree with 20,000 distinct bad cgroups held 3.4 MB of keys.
pub const LOG_ONCE_CAPACITY: usize = 1024;

/// Deduplicates log lines across passes; see the module docs.
#[derive(Debug, Default, Clone)]
pub struct LogOnce {
    previous: HashSet<String>,
    current: HashSet<String>,
    /// Problems not remembered in this pass because the capacity was reached.
    overflowed: usize,
}

impl LogOnce {
    pub fn new() -> Self {
        LogOnce::default()
    }

    /// Records `key` in this pass and says whether it should be logged now: true the first time
    /// in this pass when the previous pass did not see it. Once [`LOG_ONCE_CAPACITY`] problems
    /// are remembered in a pass, further new ones are not (false; one line says how many were
    /// left out when the pass ends).
    pub fn first_time(&mut self, key: impl Into<String>) -> bool {
        let key = key.into();
        let seen_before = self.previous.contains(&key);
        if self.current.contains(&key) {
            return false;
        }
        if self.current.len() >= LOG_ONCE_CAPACITY {
            if !seen_before {
                self.overflowed += 1;
            }
            return false;
        }
        self.current.insert(key);
        !seen_before
    }

    /// Ends the current pass: problems not seen in it are forgotten.
    pub fn next_pass(&mut self) {
        if self.overflowed > 0 {
            log::warn!(
                "{} more problems of the same kinds were not logged one by one (at most \
                 {LOG_ONCE_CAPACITY} are)",
                self.overflowed
            );
            self.overflowed = 0;
        }
        self.previous = std::mem::take(&mut self.current);
    }

    /// How many problems are remembered (for tests of the bound).
    pub fn len(&self) -> usize {
        self.previous.len() + self.current.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Longest value from outside the agent (an annotation, an environment entry, a name from a
/// runtime config) that a log line quotes whole; past it, [`excerpt`] cuts.
pub const MAX_LOGGED_VALUE: usize = 200;

/// How many problems of one kind [`summary`] spells out before it only counts.
pub const MAX_LOGGED_PROBLEMS: usize = 3;

/// `text`, a value from outside the agent, as a log line may quote it: whole when at most
/// [`MAX_LOGGED_VALUE`] bytes, else its first [`MAX_LOGGED_VALUE`] bytes (cut at a character
/// boundary) followed by `… (N bytes)`, so a pod author's 100 kB annotation makes a short line
/// that still says how long the value was. The one helper every log line quoting such a value
/// goes through.
pub fn excerpt(text: &str) -> Cow<'_, str> {
    if text.len() <= MAX_LOGGED_VALUE {
        return Cow::Borrowed(text);
    }
    let mut end = MAX_LOGGED_VALUE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}… ({} bytes)", &text[..end], text.len()))
}

/// Problems of one source on one line: the first [`MAX_LOGGED_PROBLEMS`], each cut by
/// [`excerpt`], joined by `; `, then `; and N more` when there are more.
pub fn summary(problems: &[String]) -> String {
    let mut text = problems
        .iter()
        .take(MAX_LOGGED_PROBLEMS)
        .map(|p| excerpt(p))
        .collect::<Vec<_>>()
        .join("; ");
    if problems.len() > MAX_LOGGED_PROBLEMS {
        text.push_str(&format!(
            "; and {} more",
            problems.len() - MAX_LOGGED_PROBLEMS
        ));
    }
    text
}

/// An error and its sources on one line: `cannot read X: Permission denied (os error 13)`.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_chain_joins_sources() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot read x")]
        struct Outer(#[source] std::io::Error);
        let err = Outer(std::io::Error::from_raw_os_error(13));
        assert_eq!(
            error_chain(&err),
            "cannot read x: Permission denied (os error 13)"
        );
    }

    #[test]
    fn logs_once_while_present_and_again_after_a_gap() {
        let mut once = LogOnce::new();
        assert!(once.first_time("a"));
        assert!(!once.first_time("a"));
        once.next_pass();
        assert!(!once.first_time("a"));
        assert!(once.first_time("b"));
        once.next_pass();
        // "a" seen in the last pass: still quiet. "b" not seen now.
        assert!(!once.first_time("a"));
        once.next_pass();
        once.next_pass();
        assert!(once.first_time("b"));
        assert!(once.first_time("a"));
    }
}

/// `text` safe to print on a terminal or in a line-oriented log: control characters (newline,
/// escape, DEL, C1) and the invisible Unicode format characters (bidi overrides, zero-width
/// spaces) are written as `\u{..}` escapes, so a container or pod name read from a runtime
/// config can neither forge a log line or a table row nor drive the terminal. Plain text is
/// returned as it is.
pub fn printable(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        c.is_control()
            || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
    };
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod log_once_tests {
    use super::{LogOnce, LOG_ONCE_CAPACITY};

    /// Issue 17, item 25: memory stays bounded however many distinct problems a tree has.
    #[test]
    fn log_once_is_bounded() {
        let mut once = LogOnce::new();
        let logged = (0..20_000)
            .filter(|i| once.first_time(format!("cg=kubepods/pod{i}: bad value")))
            .count();
        assert_eq!(logged, LOG_ONCE_CAPACITY);
        assert!(once.len() <= LOG_ONCE_CAPACITY);
        once.next_pass();
        // Still bounded over passes, and a remembered problem stays quiet.
        assert!(!once.first_time("cg=kubepods/pod0: bad value"));
        assert!(once.len() <= 2 * LOG_ONCE_CAPACITY);
    }
}

/// Things the log said, each said once: the first time a key comes up ([`SaidOnce::first`]),
/// not again until it is forgotten ([`SaidOnce::forget`]: its cgroup went) or, for conditions
/// said while they last, until it stops being true ([`SaidOnce::only`]). The one way the agent
/// says a thing once (an unreadable cgroup, an IRQ it cannot move, a power setting refused,
/// what classification noticed about a cgroup …). Kept in a vector: the sets are small, and an
/// empty one costs no allocation (each cgroup's record holds one).
#[derive(Debug, Clone)]
pub(crate) struct SaidOnce<K> {
    said: Vec<K>,
}

impl<K> Default for SaidOnce<K> {
    fn default() -> Self {
        SaidOnce { said: Vec::new() }
    }
}

impl<K: PartialEq> SaidOnce<K> {
    /// Whether to say `key` now: it was not said before (from now on it was).
    pub(crate) fn first(&mut self, key: K) -> bool {
        if self.said.contains(&key) {
            return false;
        }
        self.said.push(key);
        true
    }

    /// `key` is said again the next time it comes up.
    pub(crate) fn forget(&mut self, key: &K) {
        self.said.retain(|k| k != key);
    }

    /// `now` is what holds now: those of it not said yet are returned, to be said; those said
    /// before that no longer hold are forgotten (said again if they come back).
    pub(crate) fn only(&mut self, now: impl IntoIterator<Item = K>) -> Vec<K>
    where
        K: Clone,
    {
        let now: Vec<K> = now.into_iter().collect();
        let new = now
            .iter()
            .filter(|k| !self.said.contains(k))
            .cloned()
            .collect();
        self.said = now;
        new
    }
}

/// A thing said at most once per period, with how many times it was not said in between (a
/// watcher overflow that recurs, said once a minute).
#[derive(Debug, Default)]
pub(crate) struct SaidEvery {
    at: Option<std::time::Instant>,
    unsaid: u64,
}

impl SaidEvery {
    /// Whether to say it now (`Some`: how many times it was not said since the last time),
    /// at most once per `period`.
    pub(crate) fn due(
        &mut self,
        now: std::time::Instant,
        period: std::time::Duration,
    ) -> Option<u64> {
        let due = self
            .at
            .is_none_or(|at| now.saturating_duration_since(at) >= period);
        if !due {
            self.unsaid += 1;
            return None;
        }
        self.at = Some(now);
        Some(std::mem::take(&mut self.unsaid))
    }
}

#[cfg(test)]
mod said_tests {
    use super::{SaidEvery, SaidOnce};
    use std::time::{Duration, Instant};

    #[test]
    fn a_thing_is_said_once_until_forgotten_or_gone() {
        let mut said = SaidOnce::default();
        assert!(said.first("a"));
        assert!(!said.first("a"));
        said.forget(&"a");
        assert!(said.first("a"));
        assert_eq!(said.only(["a", "b"]), vec!["b"]);
        assert_eq!(said.only(["b"]), Vec::<&str>::new());
        assert_eq!(
            said.only(["a", "b"]),
            vec!["a"],
            "a stopped holding: said again"
        );
    }

    #[test]
    fn a_recurring_thing_is_said_once_per_period_with_the_count_unsaid() {
        let (mut said, t0, minute) = (
            SaidEvery::default(),
            Instant::now(),
            Duration::from_secs(60),
        );
        assert_eq!(said.due(t0, minute), Some(0));
        assert_eq!(said.due(t0 + Duration::from_secs(1), minute), None);
        assert_eq!(said.due(t0 + Duration::from_secs(2), minute), None);
        assert_eq!(said.due(t0 + minute, minute), Some(2));
    }
}

#[cfg(test)]
mod excerpt_tests {
    use super::{excerpt, summary, MAX_LOGGED_VALUE};

    #[test]
    fn long_outside_values_are_cut_with_their_length() {
        assert_eq!(excerpt("short"), "short");
        let long = "é".repeat(60_000);
        let cut = excerpt(&long);
        assert!(cut.len() <= MAX_LOGGED_VALUE + 32, "{}", cut.len());
        assert!(cut.ends_with("… (120000 bytes)"), "{cut}");
        let problems: Vec<String> = (0..10).map(|i| format!("p{i}")).collect();
        assert_eq!(summary(&problems[..2]), "p0; p1");
        assert_eq!(summary(&problems), "p0; p1; p2; and 7 more");
    }
}

#[cfg(test)]
mod printable_tests {
    use super::printable;

    #[test]
    fn control_and_format_characters_are_escaped() {
        assert_eq!(printable("db-0"), "db-0");
        assert_eq!(printable("a\nb"), "a\\u{a}b");
        assert_eq!(printable("\u{1b}[31mred"), "\\u{1b}[31mred");
        assert_eq!(printable("x\u{202e}y"), "x\\u{202e}y");
        assert_eq!(printable("naïve ✓"), "naïve ✓");
    }
}
