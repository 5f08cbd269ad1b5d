//! The agent's own state file, `<state-dir>/state.json`, the lock that keeps a second agent out,
//! the reader for kubelet's `cpu_manager_state` (the way in from kubelet's static policy), and
//! [`host`]: `<state-dir>/host.json`, the originals of host changes, written ahead of each.
//!
//! The checkpoint never decides anything on start: the live cgroup tree wins, the checkpoint only
//! fills in what the tree cannot tell (container names, the quota changes to undo, the last
//! reconcile). So a checkpoint that cannot be used is reported and set aside, never a reason to
//! refuse to start ([`load`] cannot fail; it says [`LoadOutcome::Unusable`] and why).
//!
//! # Format (version 3)
//!
//! Pretty-printed JSON, one object:
//!
//! ```json
//! {
//!   "version": 3,
//!   "policy": "static",
//!   "options": "full-pcpus-only=true",
//!   "reserved": "0",
//!   "online": "0-7",
//!   "shared_pool": "0-1,4-7",
//!   "assignments": [{"named": {"pod_uid": "…", "container": "app"}, "cpus": "2-3",
//!                    "pod": "shop/web"},
//!                   {"named": {"pod_uid": "…", "container": "db"}, "cpus": "5", "wanted": 2},
//!                   {"named": {"pod_uid": "…", "container": "big"}, "cpus": "1-2,4,9-10,12",
//!                    "grown": ["4,12"]}],
//!   "rejected_pods": [{"pod_uid": "…", "reason": "SMTAlignmentError", "container": "odd",
//!                      "message": "SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2",
//!                      "permanent": true}],
//!   "quota_lifted": [{"cgroup": "kubepods/pod…/…", "original": "200000 100000"}],
//!   "effects": {"irq": {"banned": "2-3", "in_force": "2-3", "irqs": {"24": "0-7"}},
//!               "sched": {"isolated": "4", "flags": {"": "1"}}},
//!   "refused": [{"named": {"pod_uid": "…", "container": "big"}, "requested": 8, "available": 5,
//!                "reason": "not enough cpus available to satisfy request: requested=8, available=5"}],
//!   "last_reconcile_unix_ms": 1700000000000,
//!   "checksum": "9f1c0a6d3b2e4f58"
//! }
//! ```
//!
//! `options` is [`PolicyOptions`]' display form; CPU sets are list strings; `assignments` is
//! [`Assignments`]' JSON list (an assignment whose cpus went offline with no replacement free
//! has `wanted`, the count it is entitled to, and omits it otherwise; one that in-place resizes
//! grew has `grown`, the cpus they added, oldest first: its original set is `cpus` without
//! them; `pod`, the pod's `namespace/name` when known, names a pod gone while the agent was
//! down in the log); `rejected_pods` are the pods kubelet would reject at admission, with kubelet's reason
//! and message (left out when none); `refused` (left out when empty) names the containers whose
//! exclusive cpus the agent refused, with kubelet's text as the log said it;
//! `last_reconcile_unix_ms` is left out until the first reconcile; `effects` (left out when
//! empty) is each host effect's saved state by effect name ([`crate::effects`]: what it
//! changed, with the originals, and what is in force), as that effect writes it. Unknown
//! members are refused: a file of version 3 has exactly these. Version 2 had one member per
//! effect instead of `effects` (`irq`, `sched`, `power`), read into the map under the same
//! names; version 1 (before `grown`, `rejected_pods` and `refused`) is read as a version 2
//! file without them.
//!
//! # Checksum
//!
//! `checksum` is FNV-1a 64 (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`) over the
//! canonical form of the document without its `checksum` member, written as 16 lower-case hex
//! digits (a string, because JSON tools such as `jq` round integers above 2^53). The canonical
//! form is compact JSON (no whitespace) with the members of every object sorted by the UTF-8
//! bytes of their names, strings escaped as serde_json escapes them (`"`, `\` and control
//! characters only; other characters written as UTF-8) and integers in decimal. It is what
//! Python's `json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)` writes,
//! so an operator can check a file by hand. The checksum covers the values, not the layout:
//! re-indenting the file or reordering its members keeps it valid; changing any value does not.
//!
//! The version is checked before the checksum, so a newer format may hash differently.
//!
//! # Writing and reading
//!
//! [`save`] writes `state.json.tmp`, fsyncs it, renames it over `state.json` and fsyncs the
//! directory, so a crash or a failed write leaves the previous file whole. [`load`] reads at most
//! [`MAX_FILE_SIZE`] bytes without following a symlink or blocking on a FIFO, and [`quarantine`]
//! moves an unusable file aside as `state.json.corrupt-<unix-ms>` for an operator to inspect.

pub(crate) mod adopt;
pub(crate) mod host;
pub mod kubelet_state;
mod load;
mod lock;
mod store;

pub use load::{load, load_on_node, LoadOutcome, UnusableReason};
pub use lock::{lock_holder, LockError, LockHolder, StateLock};
pub use store::{quarantine, save, CheckpointError, QUARANTINE_KEEP};

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::allocator::PolicyOptions;
use crate::cpuset::CpuSet;
use crate::state::{AssignmentKey, Assignments, Refusal, Refusals};

/// The format version this build writes and the newest it reads.
pub const VERSION: u32 = 3;

/// Each host effect's saved state, by effect name (see [`crate::effects`]): what the
/// checkpoint and the host record keep of them. The checkpoint does not know their shapes.
pub type EffectState = std::collections::BTreeMap<String, Value>;
/// The checkpoint's file name in the state directory.
pub const STATE_FILE: &str = "state.json";
/// The temporary file [`save`] writes before renaming it over [`STATE_FILE`].
pub const TMP_FILE: &str = "state.json.tmp";
/// The lock file in the state directory.
pub const LOCK_FILE: &str = "lock";
/// The agent's last reconcile (Unix milliseconds, one line), rewritten by its persist thread
/// after every reconcile: the checkpoint is written only when something changed, so its
/// `last_reconcile_unix_ms` lags by up to six periods on a quiet node.
pub const LAST_RECONCILE_FILE: &str = "last-reconcile";
/// Files larger than this are refused unread (ours are a few KiB; kubelet's are smaller).
pub const MAX_FILE_SIZE: u64 = 1 << 20;

/// The CPU manager policy the checkpoint was written under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    None,
    Static,
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::None => "none",
            Policy::Static => "static",
        })
    }
}

/// A CFS quota cpusetd lifted from a cgroup, with the value to put back on `reset`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaLift {
    /// The cgroup, relative to the cgroup root.
    pub cgroup: String,
    /// The interface file's content before cpusetd changed it (`cpu.max` or `cpu.cfs_quota_us`).
    pub original: String,
}

/// What the agent remembers across restarts. The file's `version` and `checksum` are not fields:
/// [`save`] writes the current version and the checksum of what it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub policy: Policy,
    pub options: PolicyOptions,
    pub reserved: CpuSet,
    /// The online CPUs when written, to notice a topology change.
    pub online: CpuSet,
    pub shared_pool: CpuSet,
    pub assignments: Assignments,
    pub quota_lifted: Vec<QuotaLift>,
    /// What each host effect changed (with the originals, to restore) and has in force, by
    /// effect name.
    pub effects: EffectState,
    /// The exclusive cpus the agent refused, by container, with kubelet's reason.
    pub refused: Refusals,
    pub last_reconcile_unix_ms: Option<u64>,
}

impl Checkpoint {
    /// The CPUs the checkpoint gives out (reserved, shared pool, assignments) that are not in
    /// `online`. Empty when all of them exist on this node.
    pub fn cpus_outside(&self, online: &CpuSet) -> CpuSet {
        let mut used = self.reserved.union(&self.shared_pool);
        used.extend_from(&self.assignments.exclusive_cpus());
        used.difference(online)
    }

    /// The file content [`save`] writes: pretty JSON with the checksum, and a final newline.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut document = Document::from(self);
        let unsigned = serde_json::to_value(&document)?;
        document.checksum = Some(checksum_hex(&unsigned));
        let mut bytes = serde_json::to_vec_pretty(&document)?;
        bytes.push(b'\n');
        Ok(bytes)
    }
}

/// The file's shape. CPU sets and options stay strings here, so [`load`] can verify the
/// checksum before interpreting anything and name the field that does not parse.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    version: u32,
    policy: Policy,
    options: String,
    reserved: String,
    online: String,
    shared_pool: String,
    assignments: Vec<DocumentAssignment>,
    quota_lifted: Vec<QuotaLift>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    rejected_pods: Vec<DocumentRejection>,
    #[serde(default, skip_serializing_if = "EffectState::is_empty")]
    effects: EffectState,
    /// Version 2's members per effect, read into `effects` (never written).
    #[serde(default, skip_serializing)]
    irq: Option<Value>,
    #[serde(default, skip_serializing)]
    sched: Option<Value>,
    #[serde(default, skip_serializing)]
    power: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    refused: Vec<DocumentRefusal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    last_reconcile_unix_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    checksum: Option<String>,
}

/// One element of `assignments`, in [`Assignments`]' own JSON form (a unit test keeps the two
/// identical).
#[derive(Debug, Serialize, Deserialize)]
struct DocumentAssignment {
    #[serde(flatten)]
    key: AssignmentKey,
    cpus: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    adopted: Option<crate::state::Adoption>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wanted: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    grown: Vec<String>,
    /// The pod's `namespace/name`, to name it in the log should it go while the agent is down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod: Option<String>,
}

/// One element of `rejected_pods`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct DocumentRejection {
    pod_uid: String,
    reason: crate::state::AdmissionReason,
    container: String,
    message: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    permanent: bool,
}

/// One element of `refused`: the container's key and its [`Refusal`].
#[derive(Debug, Serialize, Deserialize)]
struct DocumentRefusal {
    #[serde(flatten)]
    key: AssignmentKey,
    #[serde(flatten)]
    refusal: Refusal,
}

impl From<&Checkpoint> for Document {
    fn from(c: &Checkpoint) -> Self {
        Document {
            version: VERSION,
            policy: c.policy,
            options: c.options.to_string(),
            reserved: c.reserved.to_string(),
            online: c.online.to_string(),
            shared_pool: c.shared_pool.to_string(),
            assignments: c
                .assignments
                .iter()
                .map(|(key, a)| DocumentAssignment {
                    key: key.clone(),
                    cpus: a.cpus.to_string(),
                    container_id: a.container_id.clone(),
                    adopted: a.adopted,
                    wanted: a.wanted,
                    grown: c
                        .assignments
                        .grown(key)
                        .iter()
                        .map(ToString::to_string)
                        .collect(),
                    pod: c.assignments.pod_name(key.pod_uid()).map(str::to_string),
                })
                .collect(),
            quota_lifted: c.quota_lifted.clone(),
            rejected_pods: c
                .assignments
                .rejected()
                .map(|(uid, r)| DocumentRejection {
                    pod_uid: uid.clone(),
                    reason: r.reason,
                    container: r.container.clone(),
                    message: r.message.clone(),
                    permanent: r.permanent,
                })
                .collect(),
            effects: c.effects.clone(),
            irq: None,
            sched: None,
            power: None,
            refused: c
                .refused
                .iter()
                .map(|(key, refusal)| DocumentRefusal {
                    key: key.clone(),
                    refusal: refusal.clone(),
                })
                .collect(),
            last_reconcile_unix_ms: c.last_reconcile_unix_ms,
            checksum: None,
        }
    }
}

/// FNV-1a 64 of the canonical form of `document` (see the module docs), as 16 hex digits.
/// `document` must not contain `checksum`.
fn checksum_hex(document: &Value) -> String {
    let mut canonical = Vec::new();
    write_canonical(document, &mut canonical);
    format!("{:016x}", fnv1a64(&canonical))
}

/// Compact JSON with sorted object members, whatever order `serde_json::Map` keeps.
fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (name, member)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_scalar(&Value::String(name.clone()), out);
                out.push(b':');
                write_canonical(member, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
}

fn write_scalar(value: &Value, out: &mut Vec<u8>) {
    // Writing a scalar `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, value);
}

/// FNV-1a, 64 bits.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What [`read_bounded`] found.
#[derive(Debug)]
enum Bounded {
    Missing,
    Data(Vec<u8>),
    TooLarge(u64),
    /// Not a regular file: "a symlink", "a directory", "a fifo", …
    NotRegular(&'static str),
}

/// Reads a small regular file: no symlink is followed, a FIFO does not block, nothing past
/// `limit` bytes is read.
fn read_bounded(path: &Path, limit: u64) -> io::Result<Bounded> {
    let flags = OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
    let file = match File::options()
        .read(true)
        .custom_flags(flags.bits())
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Bounded::Missing),
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32) => {
            return Ok(Bounded::NotRegular("a symlink"))
        }
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if !kind.is_file() {
        return Ok(Bounded::NotRegular(if kind.is_dir() {
            "a directory"
        } else if kind.is_fifo() {
            "a fifo"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a device"
        }));
    }
    if meta.len() > limit {
        return Ok(Bounded::TooLarge(meta.len()));
    }
    let mut data = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1).read_to_end(&mut data)?;
    if data.len() as u64 > limit {
        return Ok(Bounded::TooLarge(data.len() as u64));
    }
    Ok(Bounded::Data(data))
}

/// The agent's last reconcile from [`LAST_RECONCILE_FILE`] (`None`: missing or unreadable).
/// Read without following a symlink, at most 32 bytes.
pub fn read_last_reconcile(dir: &Path) -> Option<u64> {
    match read_bounded(&dir.join(LAST_RECONCILE_FILE), 32).ok()? {
        Bounded::Data(bytes) => std::str::from_utf8(&bytes).ok()?.trim().parse().ok(),
        _ => None,
    }
}

/// Writes [`LAST_RECONCILE_FILE`]: a fresh temporary file renamed over it (nothing planted
/// there is followed), not synced: a crash loses at most a value the checkpoint also has.
pub fn write_last_reconcile(dir: &Path, unix_ms: u64) -> io::Result<()> {
    let tmp = dir.join(format!(".{LAST_RECONCILE_FILE}.tmp"));
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let written = File::options()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(&tmp)
        .and_then(|mut file| io::Write::write_all(&mut file, format!("{unix_ms}\n").as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, dir.join(LAST_RECONCILE_FILE)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// `<dir>/state.json`.
pub fn state_path(dir: &Path) -> PathBuf {
    dir.join(STATE_FILE)
}

#[allow(clippy::too_many_lines)]
#[cfg(test)]
mod tests;
