//! `CpuSet`: a set of CPU (or memory node) ids and the Linux list format (`0-3,8,10-11`).
//!
//! This module owns the one representation of a CPU set in the project and its text form, the
//! format of `cpuset.cpus`, `cpuset.mems`, sysfs `*_list` files and kubelet's checkpoint. Parsing
//! is strict (anything malformed is an error naming the text) except that surrounding whitespace,
//! such as the kernel's trailing newline, is ignored. Formatting is canonical: ascending ids,
//! runs merged into `a-b`, the empty set as the empty string.

use std::fmt;
use std::str::FromStr;

/// Largest CPU id accepted. Linux's `NR_CPUS` tops out at 8192 on x86_64 and arm64.
pub const MAX_CPU_ID: u32 = 8191;

/// Why a CPU list could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("invalid cpu list {text:?}: {reason} in {part:?}")]
    Malformed {
        text: String,
        part: String,
        reason: &'static str,
    },
    #[error("invalid cpu list {text:?}: cpu id {id} is larger than {max}")]
    TooLarge { text: String, id: u64, max: u32 },
}

/// A set of CPU ids in `0..=MAX_CPU_ID`, stored as a bitmap.
///
/// Equality, ordering and hashing look at the members only.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet {
    // Invariant: no trailing zero words, so equal sets have equal vectors.
    words: Vec<u64>,
}

impl CpuSet {
    /// The empty set.
    pub const fn new() -> Self {
        CpuSet { words: Vec::new() }
    }

    /// The set `lo..=hi`. Empty when `lo > hi`.
    ///
    /// # Panics
    /// When `hi > MAX_CPU_ID`.
    pub fn range(lo: u32, hi: u32) -> Self {
        let mut set = CpuSet::new();
        set.insert_range(lo, hi);
        set
    }

    /// Parses the Linux list format. Surrounding whitespace (a trailing newline) is ignored.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let trimmed = text.trim();
        let mut set = CpuSet::new();
        if trimmed.is_empty() {
            return Ok(set);
        }
        let malformed = |part: &str, reason| ParseError::Malformed {
            text: text.to_string(),
            part: part.to_string(),
            reason,
        };
        for part in trimmed.split(',') {
            if part.is_empty() {
                return Err(malformed(part, "empty element"));
            }
            let (lo, hi) = match part.split_once('-') {
                Some((lo, hi)) => (lo, hi),
                None => (part, part),
            };
            let lo = parse_id(text, part, lo)?;
            let hi = parse_id(text, part, hi)?;
            if lo > hi {
                return Err(malformed(part, "range start is larger than its end"));
            }
            set.insert_range(lo, hi);
        }
        Ok(set)
    }

    /// Adds one id.
    ///
    /// # Panics
    /// When `id > MAX_CPU_ID`.
    pub fn insert(&mut self, id: u32) {
        assert!(id <= MAX_CPU_ID, "cpu id {id} out of range");
        let (word, bit) = ((id / 64) as usize, id % 64);
        if self.words.len() <= word {
            self.words.resize(word + 1, 0);
        }
        self.words[word] |= 1 << bit;
    }

    /// Adds `lo..=hi`; nothing when `lo > hi`.
    ///
    /// # Panics
    /// When `hi > MAX_CPU_ID`.
    pub fn insert_range(&mut self, lo: u32, hi: u32) {
        if lo > hi {
            return;
        }
        assert!(hi <= MAX_CPU_ID, "cpu id {hi} out of range");
        let last = (hi / 64) as usize;
        if self.words.len() <= last {
            self.words.resize(last + 1, 0);
        }
        let mut id = lo;
        while id <= hi {
            let word = (id / 64) as usize;
            let bit = id % 64;
            let span = (64 - bit).min(hi - id + 1);
            let mask = if span == 64 {
                u64::MAX
            } else {
                ((1u64 << span) - 1) << bit
            };
            self.words[word] |= mask;
            id += span;
        }
    }

    /// Removes one id; nothing if absent.
    pub fn remove(&mut self, id: u32) {
        let word = (id / 64) as usize;
        if let Some(w) = self.words.get_mut(word) {
            *w &= !(1u64 << (id % 64));
            self.trim();
        }
    }

    pub fn contains(&self, id: u32) -> bool {
        self.words
            .get((id / 64) as usize)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }

    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Smallest member.
    pub fn first(&self) -> Option<u32> {
        self.iter().next()
    }

    /// Largest member.
    pub fn last(&self) -> Option<u32> {
        let word = self.words.len().checked_sub(1)?;
        let w = self.words[word];
        Some(word as u32 * 64 + 63 - w.leading_zeros())
    }

    /// Members in ascending order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            words: &self.words,
            index: 0,
            current: self.words.first().copied().unwrap_or(0),
        }
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        let (long, short) = if self.words.len() >= other.words.len() {
            (self, other)
        } else {
            (other, self)
        };
        let mut words = long.words.clone();
        for (w, o) in words.iter_mut().zip(&short.words) {
            *w |= o;
        }
        CpuSet { words }
    }

    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        let words = self
            .words
            .iter()
            .zip(&other.words)
            .map(|(a, b)| a & b)
            .collect();
        let mut set = CpuSet { words };
        set.trim();
        set
    }

    /// Members of `self` not in `other`.
    pub fn difference(&self, other: &CpuSet) -> CpuSet {
        let mut words = self.words.clone();
        for (w, o) in words.iter_mut().zip(&other.words) {
            *w &= !o;
        }
        let mut set = CpuSet { words };
        set.trim();
        set
    }

    pub fn is_subset(&self, other: &CpuSet) -> bool {
        self.words.len() <= other.words.len()
            && self
                .words
                .iter()
                .zip(&other.words)
                .all(|(a, b)| a & !b == 0)
    }

    pub fn is_disjoint(&self, other: &CpuSet) -> bool {
        self.words.iter().zip(&other.words).all(|(a, b)| a & b == 0)
    }

    /// In-place union.
    pub fn extend_from(&mut self, other: &CpuSet) {
        if self.words.len() < other.words.len() {
            self.words.resize(other.words.len(), 0);
        }
        for (w, o) in self.words.iter_mut().zip(&other.words) {
            *w |= o;
        }
    }

    /// In-place difference.
    pub fn remove_all(&mut self, other: &CpuSet) {
        for (w, o) in self.words.iter_mut().zip(&other.words) {
            *w &= !o;
        }
        self.trim();
    }

    fn trim(&mut self) {
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }
}

fn parse_id(text: &str, part: &str, digits: &str) -> Result<u32, ParseError> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::Malformed {
            text: text.to_string(),
            part: part.to_string(),
            reason: "expected a decimal cpu id or a range a-b",
        });
    }
    // Saturate so absurdly long digit strings still report as too large.
    let value = digits.bytes().fold(0u64, |acc, b| {
        acc.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    });
    if value > u64::from(MAX_CPU_ID) {
        return Err(ParseError::TooLarge {
            text: text.to_string(),
            id: value,
            max: MAX_CPU_ID,
        });
    }
    Ok(value as u32)
}

impl FromStr for CpuSet {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuSet::parse(s)
    }
}

impl fmt::Display for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids = self.iter().peekable();
        let mut first = true;
        while let Some(lo) = ids.next() {
            let mut hi = lo;
            while ids.peek() == Some(&(hi + 1)) {
                hi = ids.next().unwrap_or(hi);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuSet({self})")
    }
}

impl FromIterator<u32> for CpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut set = CpuSet::new();
        for id in iter {
            set.insert(id);
        }
        set
    }
}

impl Extend<u32> for CpuSet {
    fn extend<I: IntoIterator<Item = u32>>(&mut self, iter: I) {
        for id in iter {
            self.insert(id);
        }
    }
}

impl<'a> IntoIterator for &'a CpuSet {
    type Item = u32;
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl serde::Serialize for CpuSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for CpuSet {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        CpuSet::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Ascending iterator over a [`CpuSet`].
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    words: &'a [u64],
    index: usize,
    current: u64,
}

impl Iterator for Iter<'_> {
    type Item = u32;
    fn next(&mut self) -> Option<u32> {
        loop {
            if self.current != 0 {
                let bit = self.current.trailing_zeros();
                self.current &= self.current - 1;
                return Some(self.index as u32 * 64 + bit);
            }
            self.index += 1;
            self.current = *self.words.get(self.index)?;
        }
    }
}
