//! `<state-dir>/host.json`: the originals of what the agent changes outside kubepods (the
//! scheduler load-balancing flags, the host cpusets `--isolate-host` confines, interrupt
//! affinities), written **ahead** of each change.
//!
//! `state.json` is written by the persist thread after a pass, so a `kill -9` between a host
//! write and that checkpoint would lose the value from before, for good: a restart or `cpusetd
//! reset` would find nothing to put back. So [`crate::sched_balance::SchedBalance`] and
//! [`crate::irq::IrqAffinity`] record each original here, synced (fresh temporary file, fsync,
//! rename, fsync of the directory), before they write the value that replaces it, and the
//! record once more after each round (what was restored leaves it). A change whose original
//! cannot be recorded is not made. The file is therefore never older than `state.json` for
//! these records: at start and in `reset` its records replace the checkpoint's.
//!
//! Format: `{"version": 1, "sched": <SchedSaved>, "irq": <IrqSaved>}` (the checkpoint's own
//! shapes, without what is only a report: which CPUs are isolated now, why not in force).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::store::{remove_host_record, save_host_record};
use super::{read_bounded, Bounded, CheckpointError, MAX_FILE_SIZE};
use crate::cpu_power::PowerSaved;
use crate::cpuset::CpuSet;
use crate::irq::IrqSaved;
use crate::sched_balance::SchedSaved;

/// The file's name in the state directory.
pub const HOST_FILE: &str = "host.json";
/// The temporary file written before the rename.
pub const HOST_TMP_FILE: &str = "host.json.tmp";
/// The format version written and read.
const HOST_VERSION: u32 = 1;

/// What is to be restored outside kubepods (and of the chain above an isolated container).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostRecord {
    pub version: u32,
    #[serde(default)]
    pub sched: SchedSaved,
    #[serde(default)]
    pub irq: IrqSaved,
    /// The per-cpu power settings' originals (`cpu-c-states.crio.io`,
    /// `cpu-freq-governor.crio.io`).
    #[serde(default, skip_serializing_if = "PowerSaved::is_empty")]
    pub power: PowerSaved,
}

impl HostRecord {
    /// Only what is to be restored (not the report of what is in force).
    fn of(sched: &SchedSaved, irq: &IrqSaved) -> HostRecord {
        HostRecord {
            version: HOST_VERSION,
            sched: SchedSaved {
                isolated: CpuSet::new(),
                not_in_force: None,
                ..sched.clone()
            },
            irq: IrqSaved {
                banned: CpuSet::new(),
                ..irq.clone()
            },
            power: PowerSaved::default(),
        }
    }

    /// Puts this record's power originals in place of the checkpoint's.
    pub fn replace_power_in(&self, power: &mut PowerSaved) {
        power.latency = self.power.latency.clone();
        power.governor = self.power.governor.clone();
    }

    /// Puts this record's originals in place of the checkpoint's (this file is never older).
    pub fn replace_in(&self, sched: &mut SchedSaved, irq: &mut IrqSaved) {
        sched.flags = self.sched.flags.clone();
        sched.host = self.sched.host.clone();
        sched.partitions = self.sched.partitions.clone();
        sched.exclusive = self.sched.exclusive.clone();
        irq.default_affinity = self.irq.default_affinity.clone();
        irq.irqs = self.irq.irqs.clone();
        irq.irqbalance = self.irq.irqbalance.clone();
    }
}

/// Reads `<dir>/host.json`: `None` when there is none; `Err` says why it cannot be used.
pub fn load_host_record(dir: &Path) -> Result<Option<HostRecord>, String> {
    let path = dir.join(HOST_FILE);
    let bytes = match read_bounded(&path, MAX_FILE_SIZE) {
        Ok(Bounded::Missing) => return Ok(None),
        Ok(Bounded::Data(bytes)) => bytes,
        Ok(Bounded::TooLarge(size)) => {
            return Err(format!(
                "{}: larger than {MAX_FILE_SIZE} bytes ({size})",
                path.display()
            ))
        }
        Ok(Bounded::NotRegular(kind)) => {
            return Err(format!("{}: {kind}, not a regular file", path.display()))
        }
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let record: HostRecord = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a host record: {e}", path.display()))?;
    if record.version != HOST_VERSION {
        return Err(format!(
            "{}: format version {} (this cpusetd reads {HOST_VERSION})",
            path.display(),
            record.version
        ));
    }
    Ok(Some(record))
}

/// Removes `<dir>/host.json` once everything in it is restored.
pub fn remove_host_record_file(dir: &Path) -> std::io::Result<()> {
    remove_host_record(dir)
}

/// The writer of `<dir>/host.json`, shared by the scheduler and the interrupt parts (both on
/// the controller thread). Writes only when what is to be restored changed.
#[derive(Debug, Clone)]
pub struct HostJournal {
    dir: PathBuf,
    written: Arc<Mutex<HostRecord>>,
}

impl HostJournal {
    /// `start`: what is recorded already (the file as loaded, or the checkpoint's records).
    pub fn new(dir: &Path, start: Option<&HostRecord>) -> HostJournal {
        HostJournal {
            dir: dir.to_path_buf(),
            written: Arc::new(Mutex::new(start.cloned().unwrap_or_default())),
        }
    }

    /// Records the scheduler's originals (synced) when they changed.
    pub fn record_sched(&self, sched: &SchedSaved) -> Result<(), CheckpointError> {
        self.record(|record| record.sched = HostRecord::of(sched, &IrqSaved::default()).sched)
    }

    /// Records the interrupt originals (synced) when they changed.
    pub fn record_irq(&self, irq: &IrqSaved) -> Result<(), CheckpointError> {
        self.record(|record| record.irq = HostRecord::of(&SchedSaved::default(), irq).irq)
    }

    /// Records the per-cpu power originals (synced) when they changed.
    pub fn record_power(&self, power: &PowerSaved) -> Result<(), CheckpointError> {
        self.record(|record| record.power = power.originals())
    }

    fn record(&self, change: impl FnOnce(&mut HostRecord)) -> Result<(), CheckpointError> {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = written.clone();
        next.version = HOST_VERSION;
        change(&mut next);
        if next == *written {
            return Ok(());
        }
        let mut bytes = serde_json::to_vec_pretty(&next)
            .map_err(|source| CheckpointError::Serialize { source })?;
        bytes.push(b'\n');
        save_host_record(&self.dir, &bytes)?;
        *written = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_written_when_they_change_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        assert_eq!(load_host_record(&state), Ok(None));
        let journal = HostJournal::new(&state, None);
        let mut sched = SchedSaved::default();
        sched.host.insert("system.slice".into(), "0-15".into());
        sched.isolated = CpuSet::parse("2-3").unwrap();
        journal.record_sched(&sched).unwrap();
        let irq = IrqSaved {
            default_affinity: Some("ffff".into()),
            ..Default::default()
        };
        journal.record_irq(&irq).unwrap();
        let mut power = PowerSaved::default();
        power.latency.insert(3, "0".into());
        power.latency_in_force.insert(3);
        journal.record_power(&power).unwrap();
        let read = load_host_record(&state).unwrap().unwrap();
        assert_eq!(read.power.latency[&3], "0");
        assert!(read.power.latency_in_force.is_empty(), "only originals");
        let mut from_cp = PowerSaved::default();
        read.replace_power_in(&mut from_cp);
        assert_eq!(from_cp.latency[&3], "0");
        assert_eq!(read.sched.host["system.slice"], "0-15");
        assert!(
            read.sched.isolated.is_empty(),
            "only what is to be restored"
        );
        assert_eq!(read.irq.default_affinity.as_deref(), Some("ffff"));
        // Unchanged: not written again (a removed file stays removed).
        remove_host_record_file(&state).unwrap();
        sched.isolated = CpuSet::parse("2").unwrap();
        journal.record_sched(&sched).unwrap();
        assert_eq!(load_host_record(&state), Ok(None));
        // What it holds replaces a checkpoint's records.
        let (mut from_checkpoint, mut irq_cp) = (SchedSaved::default(), IrqSaved::default());
        from_checkpoint.flags.insert("".into(), "1".into());
        read.replace_in(&mut from_checkpoint, &mut irq_cp);
        assert!(from_checkpoint.flags.is_empty());
        assert_eq!(from_checkpoint.host.len(), 1);
        assert_eq!(irq_cp.default_affinity.as_deref(), Some("ffff"));
        std::fs::write(state.join(HOST_FILE), "{\"version\": 7}").unwrap();
        assert!(load_host_record(&state).unwrap_err().contains("version 7"));
    }
}
