//! Reading kubelet's own CPU manager checkpoint, `/var/lib/kubelet/cpu_manager_state`: the way in
//! for a node whose kubelet ran the `static` policy. An operator switching kubelet to `none` can
//! let cpusetd adopt the pins kubelet made instead of moving every pinned container.
//!
//! The file is read as kubelet reads it (reference: kubelet-static-policy.md §7):
//!
//! * **Decoding is Go's `encoding/json` into kubelet's structs**, which cpusetd reproduces: member
//!   names match case-insensitively (Unicode simple folding, so `defaultCPUSet`, `ENTRIES`, and
//!   even `ſ` for `s` and the Kelvin sign for `k` match); a later duplicate member wins, except that
//!   a second `entries` object is merged into the first; `null` leaves a string or the checksum
//!   unchanged, makes `entries` (or a pod's map) a nil map, and makes a map value the empty
//!   string; unknown members are ignored; a value of the wrong type is an error.
//! * **Format**: the legacy v1 shape (`entries: {containerID: cpuset}`) is tried first; if it does
//!   not decode or its checksum does not match, the v2 shape (`entries: {podUID: {container:
//!   cpuset}}`) is tried, and its error is the one reported (kubelet's choice), except that a
//!   file only v1 decodes is reported as corrupted rather than as not decoding as v2.
//! * **Checksum**: FNV-1a 32 of the go-spew `%#v` rendering of the struct with `Checksum` 0, e.g.
//!   `(*state.CPUManagerCheckpoint){PolicyName:(string)static DefaultCPUSet:(string)0-3
//!   Entries:(map[string]map[string]string)map[pod:map[app:1]] Checksum:(checksum.Checksum)0}`:
//!   strings unquoted, map keys sorted by bytes, a nil map `<nil>` and an empty one `map[]`. A v1
//!   file is hashed with the v2 type name and `Entries:(map[string]string)`. A checksum of 0 is
//!   accepted unverified, as kubelet accepts it ([`KubeletState::checksum_verified`] says so).
//! * **CPU lists** are parsed after the checksum matched, strictly: surrounding whitespace,
//!   which kubelet's parser refuses, is refused here too.
//!
//! Differences: strings with invalid UTF-8 or lone UTF-16 surrogates, which Go replaces with
//! U+FFFD, and nesting deeper than 128 levels inside unknown members are refused (kubelet never
//! writes either). kubelet's own refusals that need its configuration (a different policy name,
//! v1 container ids it cannot map to pods) are left to the caller, which has the tree.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;

use super::{read_bounded, Bounded, MAX_FILE_SIZE};
use crate::cpuset::{CpuSet, ParseError};
use crate::state::{Adoption, AssignmentError, AssignmentKey, Assignments, ExclusiveAssignment};

/// kubelet's default checkpoint path (`<root-dir>/cpu_manager_state`).
pub const DEFAULT_PATH: &str = "/var/lib/kubelet/cpu_manager_state";

/// Why kubelet's checkpoint could not be used. Parse errors carry no path: the caller names the
/// file it read.
#[derive(Debug, thiserror::Error)]
pub enum KubeletStateError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is {kind}, not a regular file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path} is larger than {limit} bytes ({size} bytes or more)")]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("not a cpu manager checkpoint")]
    Decode {
        #[source]
        source: serde_json::Error,
    },
    #[error("checkpoint is corrupted: checksum {stored} does not match the content's {computed}")]
    Corrupt { stored: u64, computed: u32 },
    #[error("could not parse the default cpu set")]
    DefaultCpuSet {
        #[source]
        source: ParseError,
    },
    #[error("could not parse the cpuset of container {container:?} in pod {pod_uid:?}")]
    EntryCpuSet {
        pod_uid: String,
        container: String,
        #[source]
        source: ParseError,
    },
    #[error("could not parse the cpuset of container id {container_id:?}")]
    LegacyEntryCpuSet {
        container_id: String,
        #[source]
        source: ParseError,
    },
}

/// Which of kubelet's two layouts the file had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KubeletFormat {
    /// Legacy: entries keyed by container id.
    V1,
    /// Current: entries keyed by pod UID, then container name.
    V2,
}

/// kubelet's checkpoint, verified and parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletState {
    pub format: KubeletFormat,
    /// As written; kubelet itself refuses a file whose policy is not its configured one.
    pub policy_name: String,
    pub default_cpu_set: CpuSet,
    /// False when the file's checksum was 0, which kubelet accepts without checking.
    pub checksum_verified: bool,
    /// The v2 entries, keyed [`AssignmentKey::Named`]. They may overlap: kubelet lets an app
    /// container reuse the CPUs of an init container of its pod.
    pub entries: BTreeMap<AssignmentKey, CpuSet>,
    /// The v1 entries, by container id; the caller maps ids to pods through the tree.
    pub legacy_entries: BTreeMap<String, CpuSet>,
}

/// The result of [`KubeletState::assignments`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Adopted {
    pub assignments: Assignments,
    /// Entries that could not be adopted: an empty set, or CPUs already adopted for another.
    pub refused: Vec<AssignmentError>,
}

impl KubeletState {
    /// The v2 entries for which `keep` is true (typically: the container still runs) as
    /// exclusive assignments, in key order; an entry that would overlap one adopted before it
    /// is refused, as is an empty one.
    pub fn assignments(&self, mut keep: impl FnMut(&AssignmentKey) -> bool) -> Adopted {
        let mut adopted = Adopted::default();
        for (key, cpus) in self.entries.iter().filter(|(key, _)| keep(key)) {
            let assignment = ExclusiveAssignment {
                cpus: cpus.clone(),
                container_id: None,
                adopted: Some(Adoption::Kubelet),
                wanted: None,
            };
            if let Err(e) = adopted.assignments.insert(key.clone(), assignment) {
                adopted.refused.push(e);
            }
        }
        adopted
    }
}

/// Reads and parses kubelet's checkpoint at `path`; `None` when there is none. At most
/// [`MAX_FILE_SIZE`] bytes are read, no symlink is followed and a FIFO does not block.
pub fn read(path: &Path) -> Result<Option<KubeletState>, KubeletStateError> {
    match read_bounded(path, MAX_FILE_SIZE) {
        Ok(Bounded::Missing) => Ok(None),
        Ok(Bounded::Data(bytes)) => parse(&bytes).map(Some),
        Ok(Bounded::TooLarge(size)) => Err(KubeletStateError::TooLarge {
            path: path.to_path_buf(),
            size,
            limit: MAX_FILE_SIZE,
        }),
        Ok(Bounded::NotRegular(kind)) => Err(KubeletStateError::NotRegular {
            path: path.to_path_buf(),
            kind,
        }),
        Err(source) => Err(KubeletStateError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Parses the content of a `cpu_manager_state` file as kubelet restores it (see the module docs).
pub fn parse(bytes: &[u8]) -> Result<KubeletState, KubeletStateError> {
    let v1_corrupt = match serde_json::from_slice::<GoCheckpoint<V1Value>>(bytes) {
        Ok(v1) => match v1.verify() {
            Ok(()) => return v1.into_state(),
            Err(corrupt) => Some(corrupt),
        },
        Err(_) => None,
    };
    let v2 = match serde_json::from_slice::<GoCheckpoint<V2Value>>(bytes) {
        Ok(v2) => v2,
        // A v1 file with a wrong checksum: say so, not that it is no v2 file.
        Err(source) => return Err(v1_corrupt.unwrap_or(KubeletStateError::Decode { source })),
    };
    v2.verify()?;
    v2.into_state()
}

/// kubelet's `cpuset.Parse`, which takes no surrounding whitespace.
fn parse_cpus(text: &str) -> Result<CpuSet, ParseError> {
    if text.trim() != text {
        return Err(ParseError::Malformed {
            text: text.to_string(),
            part: text.to_string(),
            reason: "surrounding whitespace",
        });
    }
    CpuSet::parse(text)
}

/// kubelet's checkpoint struct after Go's `json.Unmarshal` into a fresh one (whose `Entries` is
/// an empty, non-nil map). `entries: None` is a nil map.
#[derive(Debug)]
struct GoCheckpoint<E> {
    policy_name: String,
    default_cpu_set: String,
    entries: Option<BTreeMap<String, E>>,
    checksum: u64,
}

impl<E> Default for GoCheckpoint<E> {
    fn default() -> Self {
        GoCheckpoint {
            policy_name: String::new(),
            default_cpu_set: String::new(),
            entries: Some(BTreeMap::new()),
            checksum: 0,
        }
    }
}

/// An `entries` value in one of the two layouts: how Go decodes it and how go-spew prints it.
trait EntryValue: Sized {
    /// The Go type of `Entries`.
    const MAP_TYPE: &'static str;
    fn decode<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Self, A::Error>;
    fn spew(&self, out: &mut String);
}

/// v1: a container id's cpuset.
type V1Value = String;

impl EntryValue for V1Value {
    const MAP_TYPE: &'static str = "map[string]string";
    fn decode<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Self, A::Error> {
        Ok(map.next_value::<Option<String>>()?.unwrap_or_default())
    }
    fn spew(&self, out: &mut String) {
        out.push_str(self);
    }
}

/// v2: a pod's containers and their cpusets; `None` is a nil map.
type V2Value = Option<BTreeMap<String, String>>;

impl EntryValue for V2Value {
    const MAP_TYPE: &'static str = "map[string]map[string]string";
    fn decode<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Self, A::Error> {
        let pod = map.next_value::<Option<BTreeMap<String, Option<String>>>>()?;
        Ok(pod.map(|containers| {
            containers
                .into_iter()
                .map(|(name, cpus)| (name, cpus.unwrap_or_default()))
                .collect()
        }))
    }
    fn spew(&self, out: &mut String) {
        spew_map(self.as_ref(), out, |cpus, out| out.push_str(cpus));
    }
}

/// go-spew's `%#v` of a map value whose type is already printed: `<nil>` or `map[k:v k:v]`.
fn spew_map<V>(
    map: Option<&BTreeMap<String, V>>,
    out: &mut String,
    value: impl Fn(&V, &mut String),
) {
    let Some(map) = map else {
        out.push_str("<nil>");
        return;
    };
    out.push_str("map[");
    for (i, (key, v)) in map.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(key);
        out.push(':');
        value(v, out);
    }
    out.push(']');
}

impl<E: EntryValue> GoCheckpoint<E> {
    /// The string kubelet hashes: go-spew `%#v` of the struct with `Checksum` 0 (v1 under the
    /// v2 type name).
    fn spew(&self) -> String {
        let mut out = format!(
            "(*state.CPUManagerCheckpoint){{PolicyName:(string){} DefaultCPUSet:(string){} Entries:({})",
            self.policy_name,
            self.default_cpu_set,
            E::MAP_TYPE
        );
        spew_map(self.entries.as_ref(), &mut out, E::spew);
        out.push_str(" Checksum:(checksum.Checksum)0}");
        out
    }

    fn verify(&self) -> Result<(), KubeletStateError> {
        if self.checksum == 0 {
            return Ok(());
        }
        let computed = fnv1a32(self.spew().as_bytes());
        if self.checksum == u64::from(computed) {
            Ok(())
        } else {
            Err(KubeletStateError::Corrupt {
                stored: self.checksum,
                computed,
            })
        }
    }

    fn default_cpu_set(&self) -> Result<CpuSet, KubeletStateError> {
        parse_cpus(&self.default_cpu_set)
            .map_err(|source| KubeletStateError::DefaultCpuSet { source })
    }
}

impl GoCheckpoint<V1Value> {
    fn into_state(self) -> Result<KubeletState, KubeletStateError> {
        let default_cpu_set = self.default_cpu_set()?;
        let mut legacy_entries = BTreeMap::new();
        for (container_id, text) in self.entries.unwrap_or_default() {
            let cpus =
                parse_cpus(&text).map_err(|source| KubeletStateError::LegacyEntryCpuSet {
                    container_id: container_id.clone(),
                    source,
                })?;
            legacy_entries.insert(container_id, cpus);
        }
        Ok(KubeletState {
            format: KubeletFormat::V1,
            policy_name: self.policy_name,
            default_cpu_set,
            checksum_verified: self.checksum != 0,
            entries: BTreeMap::new(),
            legacy_entries,
        })
    }
}

impl GoCheckpoint<V2Value> {
    fn into_state(self) -> Result<KubeletState, KubeletStateError> {
        let default_cpu_set = self.default_cpu_set()?;
        let mut entries = BTreeMap::new();
        for (pod_uid, containers) in self.entries.unwrap_or_default() {
            for (container, text) in containers.unwrap_or_default() {
                let cpus = parse_cpus(&text).map_err(|source| KubeletStateError::EntryCpuSet {
                    pod_uid: pod_uid.clone(),
                    container: container.clone(),
                    source,
                })?;
                let key = AssignmentKey::Named {
                    pod_uid: pod_uid.clone(),
                    container,
                };
                entries.insert(key, cpus);
            }
        }
        Ok(KubeletState {
            format: KubeletFormat::V2,
            policy_name: self.policy_name,
            default_cpu_set,
            checksum_verified: self.checksum != 0,
            entries,
            legacy_entries: BTreeMap::new(),
        })
    }
}

/// FNV-1a, 32 bits (Go's `hash/fnv.New32a`).
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// kubelet's struct fields, by JSON name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    PolicyName,
    DefaultCpuSet,
    Entries,
    Checksum,
}

impl Field {
    /// Go's match of a JSON member name to a field: exact, else equal under Unicode simple case
    /// folding. The field names are ASCII; the only non-ASCII runes folding to ASCII letters
    /// are `ſ` (U+017F, to `s`) and the Kelvin sign (U+212A, to `k`).
    fn matching(name: &str) -> Option<Field> {
        let folded: String = name
            .chars()
            .map(|c| match c {
                '\u{017f}' => 'S',
                '\u{212a}' => 'K',
                c => c.to_ascii_uppercase(),
            })
            .collect();
        Some(match folded.as_str() {
            "POLICYNAME" => Field::PolicyName,
            "DEFAULTCPUSET" => Field::DefaultCpuSet,
            "ENTRIES" => Field::Entries,
            "CHECKSUM" => Field::Checksum,
            _ => return None,
        })
    }
}

impl<'de, E: EntryValue> Deserialize<'de> for GoCheckpoint<E> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CheckpointVisitor(PhantomData))
    }
}

struct CheckpointVisitor<E>(PhantomData<E>);

impl<'de, E: EntryValue> Visitor<'de> for CheckpointVisitor<E> {
    type Value = GoCheckpoint<E>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a cpu manager checkpoint object")
    }

    /// `null` unmarshals into nothing: the fresh struct stays as it is.
    fn visit_unit<Er: de::Error>(self) -> Result<Self::Value, Er> {
        Ok(GoCheckpoint::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut checkpoint = GoCheckpoint::<E>::default();
        while let Some(name) = map.next_key::<String>()? {
            match Field::matching(&name) {
                Some(Field::PolicyName) => {
                    if let Some(text) = map.next_value::<Option<String>>()? {
                        checkpoint.policy_name = text;
                    }
                }
                Some(Field::DefaultCpuSet) => {
                    if let Some(text) = map.next_value::<Option<String>>()? {
                        checkpoint.default_cpu_set = text;
                    }
                }
                Some(Field::Entries) => {
                    map.next_value_seed(EntriesSeed(&mut checkpoint.entries))?;
                }
                Some(Field::Checksum) => {
                    if let Some(GoUint64(value)) = map.next_value::<Option<GoUint64>>()? {
                        checkpoint.checksum = value;
                    }
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(checkpoint)
    }
}

/// Decodes `entries` into the map already there, as Go does: `null` makes it nil, an object adds
/// its members to it (allocating it if nil).
struct EntriesSeed<'a, E>(&'a mut Option<BTreeMap<String, E>>);

impl<'de, E: EntryValue> DeserializeSeed<'de> for EntriesSeed<'_, E> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, E: EntryValue> Visitor<'de> for EntriesSeed<'_, E> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an object of type {}", E::MAP_TYPE)
    }

    fn visit_unit<Er: de::Error>(self) -> Result<(), Er> {
        *self.0 = None;
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let entries = self.0.get_or_insert_with(BTreeMap::new);
        while let Some(key) = map.next_key::<String>()? {
            let value = E::decode(&mut map)?;
            entries.insert(key, value);
        }
        Ok(())
    }
}

/// A Go `uint64` from JSON: a non-negative integer literal only (`1.0`, `-0` and `1e3` are
/// refused, as `strconv.ParseUint` refuses them).
struct GoUint64(u64);

impl<'de> Deserialize<'de> for GoUint64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Uint;
        impl Visitor<'_> for Uint {
            type Value = GoUint64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an unsigned 64-bit integer")
            }
            fn visit_u64<Er: de::Error>(self, v: u64) -> Result<GoUint64, Er> {
                Ok(GoUint64(v))
            }
        }
        d.deserialize_any(Uint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::{json, Value};

    const VECTORS: &str = include_str!("../../testdata/kubelet_vectors.json");

    /// Reference §7 (a): a v2 file written by kubelet.
    const EXAMPLE_A: &str = r#"{"policyName":"static","defaultCpuSet":"0,2-12,14-23","entries":{"235148fe-393f-47a8-a17d-bd55bc1a836b":{"cgroup1-0":"1,13"}},"checksum":1552716370}"#;
    const EXAMPLE_A_HASHED: &str = "(*state.CPUManagerCheckpoint){PolicyName:(string)static DefaultCPUSet:(string)0,2-12,14-23 Entries:(map[string]map[string]string)map[235148fe-393f-47a8-a17d-bd55bc1a836b:map[cgroup1-0:1,13]] Checksum:(checksum.Checksum)0}";
    /// Reference §7 (b): a v1 file written by an older kubelet.
    const EXAMPLE_B: &str = r#"{"policyName":"none","defaultCpuSet":"","checksum":3242152201}"#;

    fn v1(text: &str) -> GoCheckpoint<V1Value> {
        serde_json::from_str(text).unwrap()
    }

    fn v2(text: &str) -> GoCheckpoint<V2Value> {
        serde_json::from_str(text).unwrap()
    }

    fn hash_of<E: EntryValue>(c: &GoCheckpoint<E>) -> u64 {
        u64::from(fnv1a32(c.spew().as_bytes()))
    }

    #[test]
    fn every_vector_hashes_to_its_string_and_checksum() {
        let vectors: Value = serde_json::from_str(VECTORS).unwrap();
        let list = vectors["checkpoint_checksums"]["vectors"]
            .as_array()
            .unwrap();
        assert_eq!(list.len(), 7);
        for vector in list {
            let file = json!({
                "policyName": vector["policyName"],
                "defaultCPUSet": vector["defaultCpuSet"],
                "entries": vector["entries"],
                "checksum": vector["checksum"],
            })
            .to_string();
            let (spewed, hash) = match vector["format"].as_str().unwrap() {
                "v1" => (v1(&file).spew(), hash_of(&v1(&file))),
                _ => (v2(&file).spew(), hash_of(&v2(&file))),
            };
            if let Some(expected) = vector["hashed_string"].as_str() {
                assert_eq!(spewed, expected);
            }
            assert_eq!(Some(hash), vector["checksum"].as_u64(), "{file}");
        }
    }

    #[test]
    fn reference_example_a_is_a_verified_v2_file() {
        assert_eq!(v2(EXAMPLE_A).spew(), EXAMPLE_A_HASHED);
        let state = parse(EXAMPLE_A.as_bytes()).unwrap();
        assert_eq!(state.format, KubeletFormat::V2);
        assert!(state.checksum_verified);
        assert_eq!(state.policy_name, "static");
        assert_eq!(state.default_cpu_set.to_string(), "0,2-12,14-23");
        let key = AssignmentKey::Named {
            pod_uid: "235148fe-393f-47a8-a17d-bd55bc1a836b".into(),
            container: "cgroup1-0".into(),
        };
        assert_eq!(state.entries[&key].to_string(), "1,13");
        let adopted = state.assignments(|_| true);
        assert!(adopted.refused.is_empty());
        assert_eq!(
            adopted.assignments.get(&key).unwrap().cpus.to_string(),
            "1,13"
        );
    }

    #[test]
    fn reference_example_b_is_a_v1_file_hashed_with_an_empty_map() {
        let file = v1(EXAMPLE_B);
        assert!(file.spew().contains("Entries:(map[string]string)map[] "));
        assert_eq!(hash_of(&file), 3242152201);
        // The same content as v2 hashes differently, so only the v1 reading verifies.
        assert_eq!(hash_of(&v2(EXAMPLE_B)), 1353318690);
        let state = parse(EXAMPLE_B.as_bytes()).unwrap();
        assert_eq!(state.format, KubeletFormat::V1);
        assert!(state.checksum_verified);
        assert!(state.entries.is_empty() && state.legacy_entries.is_empty());
        // With the v2 checksum it is read as v2.
        let as_v2 = EXAMPLE_B.replace("3242152201", "1353318690");
        assert_eq!(parse(as_v2.as_bytes()).unwrap().format, KubeletFormat::V2);
    }

    #[test]
    fn a_nil_entries_map_hashes_unlike_an_empty_one() {
        let nil = r#"{"policyName":"none","defaultCpuSet":"","entries":null,"checksum":0}"#;
        assert!(v2(nil)
            .spew()
            .contains("Entries:(map[string]map[string]string)<nil> "));
        let nil_hash = hash_of(&v2(nil));
        let empty_hash = hash_of(&v2(&nil.replace("null", "{}")));
        assert_ne!(nil_hash, empty_hash);
        let file = nil.replace("\"checksum\":0", &format!("\"checksum\":{nil_hash}"));
        let state = parse(file.as_bytes()).unwrap();
        assert_eq!(state.format, KubeletFormat::V2);
        assert!(state.checksum_verified);
        let wrong = nil.replace("\"checksum\":0", &format!("\"checksum\":{empty_hash}"));
        assert!(matches!(
            parse(wrong.as_bytes()),
            Err(KubeletStateError::Corrupt { .. })
        ));
        // A pod whose map is null: `<nil>` inside, no containers.
        let pod_nil = r#"{"policyName":"static","defaultCpuSet":"0-3","entries":{"pod":null}}"#;
        assert!(v2(pod_nil).spew().contains("map[pod:<nil>]"));
        assert!(parse(pod_nil.as_bytes()).unwrap().entries.is_empty());
    }

    #[test]
    fn corrupted_files_are_refused() {
        let bumped = EXAMPLE_A.replace("1552716370", "1552716371");
        let err = parse(bumped.as_bytes()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "checkpoint is corrupted: checksum 1552716371 does not match the content's 1552716370"
        );
        let edited = EXAMPLE_A.replace("\"1,13\"", "\"1,14\"");
        assert!(matches!(
            parse(edited.as_bytes()),
            Err(KubeletStateError::Corrupt { .. })
        ));
        let too_big = EXAMPLE_A.replace(
            "1552716370",
            &(u64::from(u32::MAX) + 1 + 1552716370).to_string(),
        );
        assert!(matches!(
            parse(too_big.as_bytes()),
            Err(KubeletStateError::Corrupt { .. })
        ));
        for truncated in [&EXAMPLE_A[..EXAMPLE_A.len() - 1], &EXAMPLE_A[..40], ""] {
            let err = parse(truncated.as_bytes()).unwrap_err();
            assert!(
                matches!(err, KubeletStateError::Decode { .. }),
                "{truncated}: {err}"
            );
        }
        for not_a_checkpoint in ["[]", "\"static\"", "7", "true", "{} {}"] {
            assert!(
                matches!(
                    parse(not_a_checkpoint.as_bytes()),
                    Err(KubeletStateError::Decode { .. })
                ),
                "{not_a_checkpoint}"
            );
        }
    }

    #[test]
    fn checksum_zero_is_accepted_unverified() {
        let unsigned = EXAMPLE_A.replace("1552716370", "0");
        let state = parse(unsigned.as_bytes()).unwrap();
        assert!(!state.checksum_verified);
        assert_eq!(state.format, KubeletFormat::V2);
        assert_eq!(state.entries.len(), 1);
        // `null` content decodes into the fresh struct, as in Go.
        let state = parse(b"null").unwrap();
        assert_eq!(state.format, KubeletFormat::V1);
        assert_eq!(state.policy_name, "");
        assert!(!state.checksum_verified);
    }

    #[test]
    fn checksums_are_go_uint64_literals() {
        for bad in [
            "1.0",
            "-1",
            "-0",
            "1e3",
            "\"1552716370\"",
            "18446744073709551616",
        ] {
            let file = EXAMPLE_A.replace("1552716370", bad);
            assert!(
                matches!(
                    parse(file.as_bytes()),
                    Err(KubeletStateError::Decode { .. })
                ),
                "{bad}"
            );
        }
        let null = EXAMPLE_A.replace("1552716370", "null");
        assert!(!parse(null.as_bytes()).unwrap().checksum_verified);
    }

    #[test]
    fn member_names_match_as_go_matches_them() {
        let folded = EXAMPLE_A
            .replace("policyName", "POLICYNAME")
            .replace("defaultCpuSet", "defaultCpu\u{017f}et")
            .replace("checksum", "chec\u{212a}sum")
            .replace("entries", "Entries");
        let state = parse(folded.as_bytes()).unwrap();
        assert!(state.checksum_verified);
        assert_eq!(state.entries.len(), 1);
        // Not a fold: an unknown member, ignored; with no checksum the file is unverified.
        let unknown = EXAMPLE_A.replace("checksum", "check_sum");
        assert!(!parse(unknown.as_bytes()).unwrap().checksum_verified);
    }

    #[test]
    fn duplicates_nulls_and_unknown_members_follow_go() {
        // A later policyName wins; null leaves it; a second entries object is merged; a
        // repeated pod is replaced; a null cpuset is the empty string.
        let file = r#"{"policyName":"none","policyName":"static","policyName":null,
            "defaultCpuSet":"0-3","extra":{"deep":[1,2,{"x":null}]},
            "entries":{"p1":{"a":"1"},"p2":{"b":"2"}},
            "entries":{"p2":{"c":"3","d":null},"p3":{"e":"0"}}}"#;
        let go = v2(file);
        assert_eq!(go.policy_name, "static");
        assert_eq!(
            go.spew(),
            "(*state.CPUManagerCheckpoint){PolicyName:(string)static DefaultCPUSet:(string)0-3 \
             Entries:(map[string]map[string]string)map[p1:map[a:1] p2:map[c:3 d:] p3:map[e:0]] \
             Checksum:(checksum.Checksum)0}"
        );
        let state = parse(file.as_bytes()).unwrap();
        let keys: Vec<String> = state.entries.keys().map(|k| k.to_string()).collect();
        assert_eq!(keys, ["podp1/a", "podp2/c", "podp2/d", "podp3/e"]);
        assert!(state.entries.values().any(|cpus| cpus.is_empty()));
        // entries: null after an object drops it.
        let dropped = r#"{"entries":{"p1":{"a":"1"}},"entries":null}"#;
        assert!(v2(dropped).entries.is_none());
        // Wrong types are errors, as Go's UnmarshalTypeError.
        for bad in [
            r#"{"policyName":1}"#,
            r#"{"defaultCpuSet":["0"]}"#,
            r#"{"entries":[]}"#,
            r#"{"entries":{"p":{"c":1}}}"#,
            r#"{"entries":{"p":"1"},"entries":{"q":{}}}"#,
        ] {
            assert!(
                matches!(parse(bad.as_bytes()), Err(KubeletStateError::Decode { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn v1_entries_are_returned_by_container_id() {
        let file =
            r#"{"policyName":"static","defaultCpuSet":"0,3","entries":{"abc":"1-2"},"checksum":0}"#;
        let state = parse(file.as_bytes()).unwrap();
        assert_eq!(state.format, KubeletFormat::V1);
        assert_eq!(state.legacy_entries["abc"].to_string(), "1-2");
        assert!(state.entries.is_empty());
        let signed = file.replace(
            "\"checksum\":0",
            &format!("\"checksum\":{}", hash_of(&v1(file))),
        );
        assert!(parse(signed.as_bytes()).unwrap().checksum_verified);
    }

    #[test]
    fn cpu_lists_are_parsed_after_the_checksum_and_strictly() {
        let file = |default: &str, cpus: &str| {
            let unsigned = format!(
                r#"{{"policyName":"static","defaultCpuSet":"{default}","entries":{{"pod":{{"app":"{cpus}"}}}},"checksum":0}}"#
            );
            let sum = hash_of(&v2(&unsigned));
            unsigned.replace("\"checksum\":0", &format!("\"checksum\":{sum}"))
        };
        let err = parse(file("1.3", "2").as_bytes()).unwrap_err();
        assert!(
            matches!(err, KubeletStateError::DefaultCpuSet { .. }),
            "{err}"
        );
        assert_eq!(
            crate::logging::error_chain(&err),
            "could not parse the default cpu set: invalid cpu list \"1.3\": expected a decimal \
             cpu id or a range a-b in \"1.3\""
        );
        let err = parse(file("0-1", "asd").as_bytes()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "could not parse the cpuset of container \"app\" in pod \"pod\""
        );
        let err = parse(file(" 0-1", "2").as_bytes()).unwrap_err();
        assert!(
            matches!(err, KubeletStateError::DefaultCpuSet { .. }),
            "{err}"
        );
        let err = parse(file("0-1", "9000").as_bytes()).unwrap_err();
        assert!(
            matches!(err, KubeletStateError::EntryCpuSet { .. }),
            "{err}"
        );
    }

    #[test]
    fn overlapping_entries_are_adopted_first_come() {
        // kubelet lets an app container reuse its init container's CPUs.
        let file = r#"{"policyName":"static","defaultCpuSet":"0","entries":{"pod":{"app":"1-2","init":"1-2","side":"3"},"other":{"x":""}}}"#;
        let state = parse(file.as_bytes()).unwrap();
        assert_eq!(state.entries.len(), 4);
        let adopted = state.assignments(|_| true);
        assert_eq!(adopted.assignments.len(), 2);
        let refused: Vec<String> = adopted.refused.iter().map(|e| e.to_string()).collect();
        assert_eq!(
            refused,
            [
                "podother/x has an empty cpu set",
                "cpus 1-2 of podpod/init overlap cpus held by podpod/app",
            ]
        );
        // Keeping only the running containers leaves no conflict.
        let adopted = state.assignments(|k| k.to_string() != "podpod/app");
        assert_eq!(adopted.assignments.exclusive_cpus().to_string(), "1-3");
    }
}
