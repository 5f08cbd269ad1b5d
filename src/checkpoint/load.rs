//! Reading `state.json` into a [`Checkpoint`], or saying exactly why it cannot be used.
//!
//! Checks, in order: the file can be read, is a regular file of at most [`MAX_FILE_SIZE`] bytes,
//! is JSON, has a version this build reads, carries the right checksum, has the version-1 shape,
//! and its options, CPU lists and assignments are valid (no CPU id above the limit, no
//! assignment listed twice, no CPU in two assignments). Whether its CPUs exist on this node is a
//! separate check ([`load_on_node`], [`Checkpoint::cpus_outside`]).

use std::io;
use std::path::{Path, PathBuf};

use serde::de::Error as _;
use serde_json::Value;

use super::{
    checksum_hex, read_bounded, state_path, Bounded, Checkpoint, Document, MAX_FILE_SIZE, VERSION,
};
use crate::allocator::{OptionsError, PolicyOptions};
use crate::cpuset::{self, CpuSet};
use crate::logging::error_chain;
use crate::state::{AssignmentError, AssignmentKey, Assignments, ExclusiveAssignment};

/// What [`load`] found. Never an error: the agent starts whatever the file holds.
#[derive(Debug)]
pub enum LoadOutcome {
    /// No checkpoint (or no state directory): a first start.
    Missing,
    Loaded(Checkpoint),
    /// The file exists but cannot be used. The caller logs once (see
    /// [`UnusableReason::describe`]) and may [`quarantine`](super::quarantine) it.
    Unusable {
        path: PathBuf,
        reason: UnusableReason,
    },
}

/// Why a checkpoint cannot be used. Messages complete "checkpoint <path> is unusable: …".
#[derive(Debug, thiserror::Error)]
pub enum UnusableReason {
    #[error("cannot read it")]
    Unreadable {
        #[source]
        source: io::Error,
    },
    #[error("it is {kind}, not a regular file")]
    NotRegular { kind: &'static str },
    #[error("it is larger than {limit} bytes ({size} bytes or more)")]
    TooLarge { size: u64, limit: u64 },
    #[error("it is not JSON or is truncated")]
    NotJson {
        #[source]
        source: serde_json::Error,
    },
    #[error("it was written by a newer cpusetd (format version {version}; this one reads up to version {VERSION})")]
    FutureVersion { version: u64 },
    #[error("format version {version} is not one cpusetd writes")]
    UnknownVersion { version: u64 },
    #[error("it has no checksum")]
    MissingChecksum,
    #[error("wrong checksum: the file says {stored:?}, its content hashes to {computed:?}")]
    ChecksumMismatch { stored: String, computed: String },
    #[error("it is not a version {VERSION} checkpoint")]
    Malformed {
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid policy options")]
    BadOptions {
        #[source]
        source: OptionsError,
    },
    #[error("invalid cpu list in {field}")]
    BadCpuList {
        field: String,
        #[source]
        source: cpuset::ParseError,
    },
    #[error("{key} is listed twice")]
    DuplicateAssignment { key: AssignmentKey },
    #[error("invalid assignments")]
    BadAssignment {
        #[source]
        source: AssignmentError,
    },
    #[error("it names cpus {cpus} that are not online on this node (online: {online})")]
    CpusNotOnline { cpus: CpuSet, online: CpuSet },
}

impl UnusableReason {
    /// The one log line for an unusable checkpoint at `path`:
    /// `checkpoint /var/lib/cpusetd/state.json is unusable: wrong checksum: …`.
    pub fn describe(&self, path: &Path) -> String {
        format!(
            "checkpoint {} is unusable: {}",
            path.display(),
            error_chain(self)
        )
    }
}

/// Reads `<dir>/state.json`. A missing directory or file is [`LoadOutcome::Missing`].
pub fn load(dir: &Path) -> LoadOutcome {
    let path = state_path(dir);
    let unusable = |reason| LoadOutcome::Unusable {
        path: path.clone(),
        reason,
    };
    match read_bounded(&path, MAX_FILE_SIZE) {
        Ok(Bounded::Missing) => LoadOutcome::Missing,
        Ok(Bounded::Data(bytes)) => match Checkpoint::from_json(&bytes) {
            Ok(checkpoint) => LoadOutcome::Loaded(checkpoint),
            Err(reason) => unusable(reason),
        },
        Ok(Bounded::TooLarge(size)) => unusable(UnusableReason::TooLarge {
            size,
            limit: MAX_FILE_SIZE,
        }),
        Ok(Bounded::NotRegular(kind)) => unusable(UnusableReason::NotRegular { kind }),
        Err(source) => unusable(UnusableReason::Unreadable { source }),
    }
}

/// [`load`], and a checkpoint that gives out CPUs not in `online` is unusable too
/// ([`UnusableReason::CpusNotOnline`]).
pub fn load_on_node(dir: &Path, online: &CpuSet) -> LoadOutcome {
    match load(dir) {
        LoadOutcome::Loaded(checkpoint) => {
            let outside = checkpoint.cpus_outside(online);
            if outside.is_empty() {
                LoadOutcome::Loaded(checkpoint)
            } else {
                LoadOutcome::Unusable {
                    path: state_path(dir),
                    reason: UnusableReason::CpusNotOnline {
                        cpus: outside,
                        online: online.clone(),
                    },
                }
            }
        }
        other => other,
    }
}

impl Checkpoint {
    /// Parses and verifies a checkpoint file's content (the checks of the module docs, except
    /// the file-level ones).
    pub fn from_json(bytes: &[u8]) -> Result<Checkpoint, UnusableReason> {
        let malformed = |text: &str| UnusableReason::Malformed {
            source: serde_json::Error::custom(text),
        };
        let mut value: Value =
            serde_json::from_slice(bytes).map_err(|source| UnusableReason::NotJson { source })?;
        let object = value
            .as_object_mut()
            .ok_or_else(|| malformed("expected a JSON object"))?;
        let version = match object.get("version") {
            None => return Err(malformed("missing field `version`")),
            Some(v) => v
                .as_u64()
                .ok_or_else(|| malformed("`version` is not a whole number"))?,
        };
        if version > u64::from(VERSION) {
            return Err(UnusableReason::FutureVersion { version });
        }
        if version == 0 {
            return Err(UnusableReason::UnknownVersion { version });
        }
        let stored = match object.remove("checksum") {
            None => return Err(UnusableReason::MissingChecksum),
            Some(Value::String(stored)) => stored,
            Some(_) => return Err(malformed("`checksum` is not a string")),
        };
        let computed = checksum_hex(&value);
        if stored != computed {
            return Err(UnusableReason::ChecksumMismatch { stored, computed });
        }
        let mut document: Document =
            serde_json::from_value(value).map_err(|source| UnusableReason::Malformed { source })?;
        document.fold_legacy_effects();
        document.into_checkpoint()
    }
}

impl Document {
    /// Version 2's members per effect (`irq`, `sched`, `power`, and `quota_lifted`, which
    /// version 3 kept until the quota lift was an effect), moved into `effects` under the
    /// effects' names (a name the map has already keeps the map's).
    fn fold_legacy_effects(&mut self) {
        for (name, legacy) in [
            (crate::effects::quota::NAME, self.quota_lifted.take()),
            ("irq", self.irq.take()),
            ("sched", self.sched.take()),
            ("power", self.power.take()),
        ] {
            let empty = |v: &Value| v.is_null() || v.as_array().is_some_and(Vec::is_empty);
            if let Some(value) = legacy.filter(|v| !empty(v)) {
                self.effects.entry(name.to_string()).or_insert(value);
            }
        }
    }

    fn into_checkpoint(self) -> Result<Checkpoint, UnusableReason> {
        let options = PolicyOptions::parse(&self.options)
            .map_err(|source| UnusableReason::BadOptions { source })?;
        let list = |field: &str, text: &str| {
            CpuSet::parse(text).map_err(|source| UnusableReason::BadCpuList {
                field: field.to_string(),
                source,
            })
        };
        let mut assignments = Assignments::new();
        for entry in self.assignments {
            let cpus = list(&format!("the cpus of {}", entry.key), &entry.cpus)?;
            if assignments.get(&entry.key).is_some() {
                return Err(UnusableReason::DuplicateAssignment { key: entry.key });
            }
            if let Some(pod) = entry.pod {
                assignments.set_pod_name(entry.key.pod_uid(), pod);
            }
            let assignment = ExclusiveAssignment {
                // Only a count above what it holds means it is short.
                wanted: entry.wanted.filter(|&n| n > cpus.len()),
                cpus,
                container_id: entry.container_id,
                adopted: entry.adopted,
            };
            let grown = entry
                .grown
                .iter()
                .map(|step| list(&format!("the grown cpus of {}", entry.key), step))
                .collect::<Result<Vec<_>, _>>()?;
            assignments
                .insert(entry.key.clone(), assignment)
                .map_err(|source| UnusableReason::BadAssignment { source })?;
            // Kept only as far as it holds (within its cpus, leaving an original set).
            assignments.set_grown(&entry.key, grown);
        }
        for rejected in self.rejected_pods {
            let rejection = crate::state::PodRejection {
                reason: rejected.reason,
                container: rejected.container,
                message: rejected.message,
                permanent: rejected.permanent,
            };
            assignments.reject(&rejected.pod_uid, rejection);
        }
        Ok(Checkpoint {
            policy: self.policy,
            options,
            reserved: list("reserved", &self.reserved)?,
            online: list("online", &self.online)?,
            shared_pool: list("shared_pool", &self.shared_pool)?,
            assignments,
            effects: self.effects,
            refused: self
                .refused
                .into_iter()
                .map(|r| (r.key, r.refusal))
                .collect(),
            last_reconcile_unix_ms: self.last_reconcile_unix_ms,
        })
    }
}
