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
//! * **v3 and v4** (kubelet 1.36 with pod-level resource managers, and 1.37). v3 adds
//!   `podEntries` (`{podUID: {"cpuSet": list}}`, kubelet's `state.PodCPUAssignments`) to the v2
//!   fields and hashes the struct with it, rendered `PodEntries:(state.PodCPUAssignments)map[uid:
//!   {CPUSet:(cpuset.CPUSet){elems:(map[int]struct {})map[3:{} 4:{}]}}]` (the parsed set); a file
//!   without `data` whose checksum is not the v2 one is tried as v3, under either type name
//!   kubelet accepts (`CPUManagerCheckpoint`, `CPUManagerCheckpointV3`). v4 keeps the v3 fields
//!   inline with checksum 0 for older kubelets and adds `data` (the same fields as a JSON
//!   string) and `dataChecksum`, kubelet's checksum of that string: FNV-1a 32 of `(string)`
//!   followed by its bytes. A file with a non-empty `data` is read from `data` only, and a
//!   mismatch is corruption (never a fallback to the unverified inline copy).
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
    #[error(
        "checkpoint is corrupted: dataChecksum {stored} does not match the checksum of its data, {computed}"
    )]
    DataCorrupt { stored: u64, computed: u32 },
    #[error("the data of a v4 checkpoint is not a cpu manager checkpoint")]
    DataDecode {
        #[source]
        source: serde_json::Error,
    },
    #[error("could not parse the pod-level cpuset of pod {pod_uid:?}")]
    PodEntryCpuSet {
        pod_uid: String,
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
    /// entries keyed by pod UID, then container name.
    V2,
    /// kubelet 1.36 with pod-level resource managers: v2 plus `podEntries` (pod UID → the
    /// pod's cpu set), checksummed with them.
    V3,
    /// kubelet 1.37: the v3 fields inline (checksum 0) plus `data`, the same fields as a JSON
    /// string, and `dataChecksum` over it; `data` is what counts.
    V4,
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
    /// The v3/v4 `podEntries`: pod-level cpu sets by pod UID (kubelet's pod-level resource
    /// managers). Never adopted: cpusetd keeps pods with pod-level resources shared.
    pub pod_entries: BTreeMap<String, CpuSet>,
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
    let current = serde_json::from_slice::<GoCheckpoint<V2Value>>(bytes);
    // v4 first: its inline fields carry checksum 0, which the older readings accept unchecked.
    if let Ok(v4) = &current {
        if !v4.data.is_empty() {
            return parse_v4(v4);
        }
    }
    // A file with `podEntries` was written by a kubelet that knows v3: no v1 reading.
    let v3 = current.as_ref().is_ok_and(|c| c.pod_entries_seen);
    let v1 = serde_json::from_slice::<GoCheckpoint<V1Value>>(bytes)
        .ok()
        .filter(|_| !v3);
    let v1_corrupt = match v1 {
        Some(v1) => match v1.verify() {
            Ok(()) => return v1.into_state(),
            Err(corrupt) => Some(corrupt),
        },
        None => None,
    };
    let current = match current {
        Ok(current) => current,
        // A v1 file with a wrong checksum: say so, not that it is no v2 file.
        Err(source) => return Err(v1_corrupt.unwrap_or(KubeletStateError::Decode { source })),
    };
    let format = current.verify_current()?;
    current.into_state(format)
}

/// A v4 file: `dataChecksum` is kubelet's checksum of the `data` string (go-spew renders a
/// string as `(string)` and its bytes); only `data` is read, the inline fields are a copy for
/// older kubelets.
fn parse_v4(outer: &GoCheckpoint<V2Value>) -> Result<KubeletState, KubeletStateError> {
    let computed = fnv1a32(format!("(string){}", outer.data).as_bytes());
    if outer.data_checksum != u64::from(computed) {
        return Err(KubeletStateError::DataCorrupt {
            stored: outer.data_checksum,
            computed,
        });
    }
    let data = serde_json::from_str::<GoCheckpoint<V2Value>>(&outer.data)
        .map_err(|source| KubeletStateError::DataDecode { source })?;
    let mut state = data.into_state(KubeletFormat::V4)?;
    state.checksum_verified = true;
    Ok(state)
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
    /// v3 `podEntries`: pod UID → its `cpuSet` text; `None` is a nil map.
    pod_entries: Option<BTreeMap<String, String>>,
    /// Whether the file had a `podEntries` member at all.
    pod_entries_seen: bool,
    /// v4 `data` (empty: none) and `dataChecksum`.
    data: String,
    data_checksum: u64,
}

impl<E> Default for GoCheckpoint<E> {
    fn default() -> Self {
        GoCheckpoint {
            policy_name: String::new(),
            default_cpu_set: String::new(),
            entries: Some(BTreeMap::new()),
            checksum: 0,
            pod_entries: Some(BTreeMap::new()),
            pod_entries_seen: false,
            data: String::new(),
            data_checksum: 0,
        }
    }
}

/// The Go type names a v2 and a v3 checkpoint are hashed under: kubelet writes both as
/// `CPUManagerCheckpoint` and accepts its versioned name too when reading.
const V2_TYPE_NAMES: [&str; 2] = ["CPUManagerCheckpoint", "CPUManagerCheckpointV2"];
const V3_TYPE_NAMES: [&str; 2] = ["CPUManagerCheckpoint", "CPUManagerCheckpointV3"];

/// go-spew's `%#v` of a `PodEntry` inside `PodCPUAssignments` (a map value: no type prefix):
/// its `cpuset.CPUSet` is a struct over `elems map[int]struct{}`, keys in numeric order.
fn spew_pod_entry(cpus: &CpuSet, out: &mut String) {
    out.push_str("{CPUSet:(cpuset.CPUSet){elems:(map[int]struct {})map[");
    for (i, cpu) in cpus.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&cpu.to_string());
        out.push_str(":{}");
    }
    out.push_str("]}}");
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
        self.spew_as(V2_TYPE_NAMES[0], None)
    }

    /// go-spew `%#v` of the struct named `type_name`, with `PodEntries` (v3: `Some`, holding
    /// `None` for a nil map) or without.
    fn spew_as(
        &self,
        type_name: &str,
        pod_entries: Option<Option<&BTreeMap<String, CpuSet>>>,
    ) -> String {
        let mut out = format!(
            "(*state.{type_name}){{PolicyName:(string){} DefaultCPUSet:(string){} Entries:({})",
            self.policy_name,
            self.default_cpu_set,
            E::MAP_TYPE
        );
        spew_map(self.entries.as_ref(), &mut out, E::spew);
        if let Some(pods) = pod_entries {
            out.push_str(" PodEntries:(state.PodCPUAssignments)");
            spew_map(pods, &mut out, spew_pod_entry);
        }
        out.push_str(" Checksum:(checksum.Checksum)0}");
        out
    }

    /// The `podEntries` cpu sets, parsed as kubelet's `PodEntry.UnmarshalJSON` parses them.
    fn pod_cpu_sets(&self) -> Result<Option<BTreeMap<String, CpuSet>>, KubeletStateError> {
        let Some(pods) = &self.pod_entries else {
            return Ok(None);
        };
        let mut parsed = BTreeMap::new();
        for (pod_uid, text) in pods {
            let cpus = parse_cpus(text).map_err(|source| KubeletStateError::PodEntryCpuSet {
                pod_uid: pod_uid.clone(),
                source,
            })?;
            parsed.insert(pod_uid.clone(), cpus);
        }
        Ok(Some(parsed))
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
            pod_entries: BTreeMap::new(),
        })
    }
}

impl GoCheckpoint<V2Value> {
    /// A file without `data`: v2 if its checksum is the v2 one, v3 if it is the one with
    /// `podEntries`; a checksum of 0 is accepted unverified (v3 when `podEntries` is there).
    fn verify_current(&self) -> Result<KubeletFormat, KubeletStateError> {
        if self.checksum == 0 {
            return Ok(if self.pod_entries_seen {
                KubeletFormat::V3
            } else {
                KubeletFormat::V2
            });
        }
        let hash = |text: String| fnv1a32(text.as_bytes());
        let stored = self.checksum;
        if V2_TYPE_NAMES
            .iter()
            .any(|name| u64::from(hash(self.spew_as(name, None))) == stored)
        {
            return Ok(KubeletFormat::V2);
        }
        let pods = self.pod_cpu_sets()?;
        let v3 = |name: &str| hash(self.spew_as(name, Some(pods.as_ref())));
        if V3_TYPE_NAMES
            .iter()
            .any(|name| u64::from(v3(name)) == stored)
        {
            return Ok(KubeletFormat::V3);
        }
        let computed = if self.pod_entries_seen {
            v3(V3_TYPE_NAMES[0])
        } else {
            hash(self.spew())
        };
        Err(KubeletStateError::Corrupt { stored, computed })
    }

    fn into_state(self, format: KubeletFormat) -> Result<KubeletState, KubeletStateError> {
        let pod_entries = match format {
            KubeletFormat::V3 | KubeletFormat::V4 => self.pod_cpu_sets()?.unwrap_or_default(),
            KubeletFormat::V1 | KubeletFormat::V2 => BTreeMap::new(),
        };
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
            format,
            policy_name: self.policy_name,
            default_cpu_set,
            checksum_verified: self.checksum != 0,
            entries,
            legacy_entries: BTreeMap::new(),
            pod_entries,
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
    PodEntries,
    Data,
    DataChecksum,
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
            "PODENTRIES" => Field::PodEntries,
            "DATA" => Field::Data,
            "DATACHECKSUM" => Field::DataChecksum,
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
                Some(Field::PodEntries) => {
                    checkpoint.pod_entries_seen = true;
                    map.next_value_seed(PodEntriesSeed(&mut checkpoint.pod_entries))?;
                }
                Some(Field::Data) => {
                    if let Some(text) = map.next_value::<Option<String>>()? {
                        checkpoint.data = text;
                    }
                }
                Some(Field::DataChecksum) => {
                    if let Some(GoUint64(value)) = map.next_value::<Option<GoUint64>>()? {
                        checkpoint.data_checksum = value;
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

/// Decodes `podEntries` into the map already there, as Go does (see [`EntriesSeed`]); each
/// value is a `PodEntry`, whose `UnmarshalJSON` reads `{"cpuSet": "<list>"}` (`null`: empty).
struct PodEntriesSeed<'a>(&'a mut Option<BTreeMap<String, String>>);

impl<'de> DeserializeSeed<'de> for PodEntriesSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PodEntriesSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of type state.PodCPUAssignments")
    }

    fn visit_unit<Er: de::Error>(self) -> Result<(), Er> {
        *self.0 = None;
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let entries = self.0.get_or_insert_with(BTreeMap::new);
        while let Some(key) = map.next_key::<String>()? {
            let entry = map.next_value::<Option<PodEntryText>>()?;
            entries.insert(key, entry.map(|e| e.0).unwrap_or_default());
        }
        Ok(())
    }
}

/// A `PodEntry`'s `cpuSet` text (member names folded as Go matches them).
struct PodEntryText(String);

impl<'de> Deserialize<'de> for PodEntryText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> Visitor<'de> for Entry {
            type Value = PodEntryText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a pod entry object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PodEntryText, A::Error> {
                let mut text = String::new();
                while let Some(name) = map.next_key::<String>()? {
                    let folded: String = name
                        .chars()
                        .map(|c| match c {
                            '\u{017f}' => 'S',
                            c => c.to_ascii_uppercase(),
                        })
                        .collect();
                    if folded == "CPUSET" {
                        if let Some(value) = map.next_value::<Option<String>>()? {
                            text = value;
                        }
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(PodEntryText(text))
            }
        }
        d.deserialize_any(Entry)
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

    /// `testdata/kubelet-state/` (built by its `build.py` the way kubelet 1.36 and 1.37 write
    /// the file: no kubelet-produced file was at hand).
    fn fixture(name: &str) -> Vec<u8> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/kubelet-state")
            .join(name);
        std::fs::read(path).unwrap()
    }

    const POD_APP: &str = "6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f";
    const POD_LEVEL: &str = "9a8b7c6d-5e4f-4a3b-9c2d-1e0f2a3b4c5d";
    /// go-spew's `%#v` of kubelet 1.36's v3 struct for `v3.json`: `PodEntries` is a
    /// `state.PodCPUAssignments` (`map[string]PodEntry`), a map value prints without its type,
    /// a `PodEntry` is `{CPUSet:…}` and a `cpuset.CPUSet` is a struct over `elems
    /// map[int]struct{}` (keys numeric, each value `{}`).
    const V3_HASHED: &str = "(*state.CPUManagerCheckpoint){PolicyName:(string)static \
        DefaultCPUSet:(string)0,5-7 Entries:(map[string]map[string]string)\
        map[6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f:map[app:1-2]] \
        PodEntries:(state.PodCPUAssignments)map[9a8b7c6d-5e4f-4a3b-9c2d-1e0f2a3b4c5d:\
        {CPUSet:(cpuset.CPUSet){elems:(map[int]struct {})map[3:{} 4:{}]}}] \
        Checksum:(checksum.Checksum)0}";

    fn app_key() -> AssignmentKey {
        AssignmentKey::Named {
            pod_uid: POD_APP.into(),
            container: "app".into(),
        }
    }

    #[test]
    fn a_v3_file_is_hashed_with_its_pod_entries() {
        let bytes = fixture("v3.json");
        let go: GoCheckpoint<V2Value> = serde_json::from_slice(&bytes).unwrap();
        let pods = go.pod_cpu_sets().unwrap();
        assert_eq!(
            go.spew_as("CPUManagerCheckpoint", Some(pods.as_ref())),
            V3_HASHED
        );
        assert_eq!(fnv1a32(V3_HASHED.as_bytes()), 3017012022);
        assert_eq!(go.checksum, 3017012022);
        let state = parse(&bytes).unwrap();
        assert_eq!(state.format, KubeletFormat::V3);
        assert!(state.checksum_verified);
        assert_eq!(state.entries[&app_key()].to_string(), "1-2");
        assert_eq!(state.pod_entries[POD_LEVEL].to_string(), "3-4");
        // The pod-level set is hashed parsed: "3,4" is the same set, the same checksum.
        let same = String::from_utf8(bytes.clone())
            .unwrap()
            .replace("3-4", "3,4");
        assert_eq!(parse(same.as_bytes()).unwrap().format, KubeletFormat::V3);
        // kubelet 1.37 also accepts the v3 struct hashed under its own name.
        let text = String::from_utf8(bytes).unwrap();
        let renamed = V3_HASHED.replace("CPUManagerCheckpoint)", "CPUManagerCheckpointV3)");
        let signed = text.replace("3017012022", &fnv1a32(renamed.as_bytes()).to_string());
        assert_eq!(parse(signed.as_bytes()).unwrap().format, KubeletFormat::V3);
        // Another pod-level set: corrupted, with the v3 content's checksum named.
        let edited = text.replace("3-4", "3-5");
        let err = parse(edited.as_bytes()).unwrap_err();
        assert!(
            matches!(
                err,
                KubeletStateError::Corrupt {
                    stored: 3017012022,
                    ..
                }
            ),
            "{err}"
        );
        // A nil podEntries map is `<nil>`; checksum 0 with podEntries reads as v3, unverified.
        let nil = r#"{"policyName":"static","defaultCpuSet":"0-3","podEntries":null}"#;
        let go: GoCheckpoint<V2Value> = serde_json::from_str(nil).unwrap();
        assert!(go
            .spew_as("CPUManagerCheckpoint", Some(None))
            .contains("PodEntries:(state.PodCPUAssignments)<nil> "));
        let state = parse(nil.as_bytes()).unwrap();
        assert_eq!(state.format, KubeletFormat::V3);
        assert!(!state.checksum_verified);
        // A pod-level set kubelet's cpuset.Parse refuses.
        let bad =
            r#"{"policyName":"static","defaultCpuSet":"0","podEntries":{"p":{"cpuSet":"x"}}}"#;
        assert!(matches!(
            parse(bad.as_bytes()),
            Err(KubeletStateError::PodEntryCpuSet { .. })
        ));
    }

    #[test]
    fn a_v4_file_is_read_from_its_data_and_data_checksum() {
        let bytes = fixture("v4.json");
        let state = parse(&bytes).unwrap();
        assert_eq!(state.format, KubeletFormat::V4);
        assert!(state.checksum_verified);
        assert_eq!(state.policy_name, "static");
        assert_eq!(state.default_cpu_set.to_string(), "0,5-7");
        assert_eq!(state.entries[&app_key()].to_string(), "1-2");
        assert_eq!(state.pod_entries[POD_LEVEL].to_string(), "3-4");
        // dataChecksum is over go-spew's `%#v` of the data string: "(string)" and its bytes.
        let go: GoCheckpoint<V2Value> = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(go.checksum, 0);
        assert_eq!(
            u64::from(fnv1a32(format!("(string){}", go.data).as_bytes())),
            go.data_checksum
        );
        assert_eq!(go.data_checksum, 790922181);
        // The inline fields are a copy for older kubelets: data is what counts.
        let text = String::from_utf8(bytes).unwrap();
        let inline_edited = text.replacen("\"app\":\"1-2\"", "\"app\":\"6\"", 1);
        assert_ne!(inline_edited, text);
        let state = parse(inline_edited.as_bytes()).unwrap();
        assert_eq!(state.entries[&app_key()].to_string(), "1-2");
        // Data that does not match its checksum: nothing read, the numbers said.
        let err = parse(&fixture("v4-corrupt-data.json")).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "checkpoint is corrupted: dataChecksum 790922181 does not match the checksum \
                 of its data, {}",
                fnv1a32(
                    format!(
                        "(string){}",
                        go.data.replace("\"app\":\"1-2\"", "\"app\":\"1-3\"")
                    )
                    .as_bytes()
                )
            )
        );
        let zero = text.replace("790922181", "0");
        assert!(matches!(
            parse(zero.as_bytes()),
            Err(KubeletStateError::DataCorrupt { stored: 0, .. })
        ));
        // Signed data that is no checkpoint.
        let junk = "not json";
        let sum = fnv1a32(format!("(string){junk}").as_bytes());
        let file = format!(r#"{{"data":"{junk}","dataChecksum":{sum}}}"#);
        assert!(matches!(
            parse(file.as_bytes()),
            Err(KubeletStateError::DataDecode { .. })
        ));
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
