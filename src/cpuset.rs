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
    // Invariant: no trailing zero words, so equal sets have equal words.
    words: Words,
}

/// Words held in the set itself up to this many (CPU ids below 256), on the heap beyond.
const INLINE_WORDS: usize = 4;

/// A set's bitmap words. Most machines have at most 256 CPUs, and the agent keeps several
/// sets per cgroup: held inline they cost no allocation. Compared, ordered and hashed as the
/// slice of words, whichever way they are held.
#[derive(Clone)]
enum Words {
    Inline { len: u8, words: [u64; INLINE_WORDS] },
    Heap(Vec<u64>),
}

impl Words {
    const fn new() -> Words {
        Words::Inline {
            len: 0,
            words: [0; INLINE_WORDS],
        }
    }

    /// `len` words, the new ones `value`.
    fn resize(&mut self, len: usize, value: u64) {
        match self {
            Words::Inline { len: held, words } if len <= INLINE_WORDS => {
                for word in &mut words[usize::from(*held).min(len)..len] {
                    *word = value;
                }
                *held = len as u8;
            }
            Words::Inline { .. } => {
                let mut heap = self.to_vec();
                heap.resize(len, value);
                *self = Words::Heap(heap);
            }
            Words::Heap(heap) => heap.resize(len, value),
        }
    }

    fn pop(&mut self) -> Option<u64> {
        match self {
            Words::Inline { len: 0, .. } => None,
            Words::Inline { len, words } => {
                *len -= 1;
                Some(words[usize::from(*len)])
            }
            Words::Heap(heap) => heap.pop(),
        }
    }
}

impl Default for Words {
    fn default() -> Words {
        Words::new()
    }
}

impl std::ops::Deref for Words {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        match self {
            Words::Inline { len, words } => &words[..usize::from(*len)],
            Words::Heap(heap) => heap,
        }
    }
}

impl std::ops::DerefMut for Words {
    fn deref_mut(&mut self) -> &mut [u64] {
        match self {
            Words::Inline { len, words } => &mut words[..usize::from(*len)],
            Words::Heap(heap) => heap,
        }
    }
}

impl<'a> IntoIterator for &'a Words {
    type Item = &'a u64;
    type IntoIter = std::slice::Iter<'a, u64>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl FromIterator<u64> for Words {
    fn from_iter<I: IntoIterator<Item = u64>>(iter: I) -> Words {
        let mut words = Words::new();
        for word in iter {
            let len = words.len();
            words.resize(len + 1, word);
        }
        words
    }
}

impl PartialEq for Words {
    fn eq(&self, other: &Words) -> bool {
        **self == **other
    }
}

impl Eq for Words {}

impl std::hash::Hash for Words {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl PartialOrd for Words {
    fn partial_cmp(&self, other: &Words) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Words {
    fn cmp(&self, other: &Words) -> std::cmp::Ordering {
        (**self).cmp(&**other)
    }
}

impl CpuSet {
    /// The empty set.
    pub const fn new() -> Self {
        CpuSet {
            words: Words::new(),
        }
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

    /// `self.intersection(other).len()` without building the intersection.
    pub fn intersection_len(&self, other: &CpuSet) -> usize {
        self.words
            .iter()
            .zip(&other.words)
            .map(|(a, b)| (a & b).count_ones() as usize)
            .sum()
    }

    /// Members of `self` that are also in `other`, ascending, without building the intersection.
    pub fn iter_intersection<'a>(&'a self, other: &'a CpuSet) -> impl Iterator<Item = u32> + 'a {
        self.words
            .iter()
            .zip(&other.words)
            .enumerate()
            .flat_map(|(index, (a, b))| {
                let mut word = a & b;
                std::iter::from_fn(move || {
                    if word == 0 {
                        return None;
                    }
                    let bit = word.trailing_zeros();
                    word &= word - 1;
                    Some(index as u32 * 64 + bit)
                })
            })
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(text: &str) -> CpuSet {
        CpuSet::parse(text).unwrap()
    }

    #[test]
    fn parses_and_formats_the_linux_list_format() {
        assert_eq!(set("0-3,8,10-11").to_string(), "0-3,8,10-11");
        assert_eq!(set("").to_string(), "");
        assert_eq!(set("1-1").to_string(), "1");
        assert_eq!(set("8191").to_string(), "8191");
        assert_eq!(set("0-8191").len(), 8192);
    }

    #[test]
    fn output_is_canonical() {
        assert_eq!(set("11,10,3,2,1,0,8").to_string(), "0-3,8,10-11");
        assert_eq!(set("0-2,1-5,5").to_string(), "0-5");
        assert_eq!(set("63,64").to_string(), "63-64");
    }

    #[test]
    fn surrounding_whitespace_is_tolerated() {
        assert_eq!(set("0-3\n").to_string(), "0-3");
        assert_eq!(set("  2,4 \n").to_string(), "2,4");
        assert!(set("\n").is_empty());
    }

    #[test]
    fn malformed_lists_name_the_offending_text() {
        for (text, part) in [
            ("1-", "1-"),
            ("3-1", "3-1"),
            ("a", "a"),
            ("1,,2", ""),
            ("1 ,2", "1 "),
            ("-1", "-1"),
            ("1-2-3", "1-2-3"),
            ("+1", "+1"),
            ("0x1", "0x1"),
        ] {
            let err = CpuSet::parse(text).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(&format!("{text:?}")), "{text}: {msg}");
            assert!(msg.contains(&format!("{part:?}")), "{text}: {msg}");
        }
    }

    #[test]
    fn ids_beyond_the_limit_are_errors() {
        let err = CpuSet::parse("8192").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid cpu list \"8192\": cpu id 8192 is larger than 8191"
        );
        let huge = "9".repeat(40);
        assert!(matches!(
            CpuSet::parse(&huge),
            Err(ParseError::TooLarge { id: u64::MAX, .. })
        ));
    }

    #[test]
    fn set_operations() {
        let a = set("0-7");
        let b = set("4-11");
        assert_eq!(a.union(&b).to_string(), "0-11");
        assert_eq!(a.intersection(&b).to_string(), "4-7");
        assert_eq!(a.difference(&b).to_string(), "0-3");
        assert!(set("2-3").is_subset(&a));
        assert!(!b.is_subset(&a));
        assert!(set("0-1").is_disjoint(&set("2,200")));
        assert_eq!(a.iter().collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
        assert_eq!(set("5,700").last(), Some(700));
        assert_eq!(set("5,700").first(), Some(5));
        let mut c = set("0-200");
        c.remove_all(&set("64-200"));
        assert_eq!(c, set("0-63"));
        c.remove(63);
        assert_eq!(c.to_string(), "0-62");
    }

    #[test]
    fn equality_ignores_how_the_set_was_built() {
        let mut a = set("0,500");
        a.remove(500);
        assert_eq!(a, set("0"));
        assert_eq!(set("500").difference(&set("500")), CpuSet::new());
    }

    #[test]
    fn serde_uses_the_list_format() {
        let json = serde_json::to_string(&set("0-3,9")).unwrap();
        assert_eq!(json, "\"0-3,9\"");
        let back: CpuSet = serde_json::from_str(&json).unwrap();
        assert_eq!(back, set("0-3,9"));
        assert!(serde_json::from_str::<CpuSet>("\"3-1\"").is_err());
    }

    fn arb_set() -> impl Strategy<Value = CpuSet> {
        prop_oneof![
            proptest::collection::vec(0u32..256, 0..40),
            proptest::collection::vec(0u32..=MAX_CPU_ID, 0..40),
        ]
        .prop_map(|ids| ids.into_iter().collect())
    }

    proptest! {
        #[test]
        fn format_then_parse_is_identity(s in arb_set()) {
            let text = s.to_string();
            let back = CpuSet::parse(&text).unwrap();
            prop_assert_eq!(&back, &s);
            prop_assert_eq!(back.to_string(), text);
        }

        #[test]
        fn canonical_strings_round_trip(ranges in proptest::collection::vec((0u32..100, 0u32..4), 0..10)) {
            // Build a canonical string by hand: ascending, non-adjacent runs.
            let mut parts = Vec::new();
            let mut next = 0u32;
            for (gap, width) in ranges {
                let lo = next + gap + 1;
                let hi = lo + width;
                parts.push(if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") });
                next = hi + 1;
            }
            let text = parts.join(",");
            prop_assert_eq!(CpuSet::parse(&text).unwrap().to_string(), text);
        }

        #[test]
        fn set_algebra_laws(a in arb_set(), b in arb_set(), c in arb_set()) {
            prop_assert_eq!(a.union(&b), b.union(&a));
            prop_assert_eq!(a.intersection(&b), b.intersection(&a));
            prop_assert_eq!(a.union(&b).union(&c), a.union(&b.union(&c)));
            prop_assert_eq!(a.intersection(&b.union(&c)), a.intersection(&b).union(&a.intersection(&c)));
            prop_assert!(a.difference(&b).is_disjoint(&b));
            prop_assert_eq!(a.difference(&b).union(&a.intersection(&b)), a.clone());
            prop_assert!(a.intersection(&b).is_subset(&a));
            prop_assert!(a.is_subset(&a.union(&b)));
            prop_assert_eq!(a.union(&b).len() + a.intersection(&b).len(), a.len() + b.len());
            let ids: Vec<u32> = a.iter().collect();
            prop_assert!(ids.windows(2).all(|w| w[0] < w[1]));
            prop_assert_eq!(ids.len(), a.len());
            let mut d = a.clone();
            d.extend_from(&b);
            prop_assert_eq!(&d, &a.union(&b));
            d.remove_all(&b);
            prop_assert_eq!(d, a.difference(&b));
        }

        #[test]
        fn parse_never_panics(text in "[0-9,\\- \\na]{0,24}") {
            let _ = CpuSet::parse(&text);
        }
    }

    #[test]
    fn a_set_is_the_same_whether_its_words_are_inline_or_on_the_heap() {
        use std::collections::hash_map::RandomState;
        use std::hash::BuildHasher;
        let mut shrunk = set("3,255,300");
        assert!(matches!(shrunk.words, Words::Heap(_)));
        shrunk.remove_all(&set("300"));
        let small = set("3,255");
        assert!(matches!(small.words, Words::Inline { .. }));
        assert_eq!(shrunk, small);
        let hasher = RandomState::new();
        assert_eq!(hasher.hash_one(&shrunk), hasher.hash_one(&small));
        assert_eq!(shrunk.cmp(&small), std::cmp::Ordering::Equal);
        assert!(set("3") < small && small < set("4"));
        assert_eq!(shrunk.to_string(), "3,255");
        let mut grown = small.clone();
        grown.insert(8191);
        assert_eq!(grown.to_string(), "3,255,8191");
        assert_eq!(grown.intersection(&set("0-300")), small);
    }

    #[test]
    fn intersection_helpers_match_the_built_intersection() {
        let a = CpuSet::parse("0-5,64-70,200").unwrap();
        let b = CpuSet::parse("3-66,200-201").unwrap();
        let built = a.intersection(&b);
        assert_eq!(a.intersection_len(&b), built.len());
        assert_eq!(
            a.iter_intersection(&b).collect::<Vec<_>>(),
            built.iter().collect::<Vec<_>>()
        );
        assert_eq!(a.intersection_len(&CpuSet::new()), 0);
    }
}
