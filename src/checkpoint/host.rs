//! `<state-dir>/host.json`: the originals of what the agent changes outside kubepods (the host
//! effects of [`crate::effects`]: interrupt affinities, scheduler load-balancing flags, the
//! host cpusets `--isolate-host` confines, per-cpu power settings), written **ahead** of each
//! change.
//!
//! `state.json` is written by the persist thread after a pass, so a `kill -9` between a host
//! write and that checkpoint would lose the value from before, for good: a restart or `cpusetd
//! reset` would find nothing to put back. So each effect records its originals here, synced
//! (fresh temporary file, fsync, rename, fsync of the directory), before it writes the value
//! that replaces them, and the record once more after each round (what was restored leaves
//! it). A change whose original cannot be recorded is not made. The file is therefore never
//! older than `state.json` for these records: at start and in `reset` its records replace the
//! checkpoint's.
//!
//! Format (version 2): `{"version": 2, "effects": {"<effect name>": <its originals>, …}}`,
//! each effect's originals in its own shape (without what is only a report: which CPUs are
//! isolated now, why not in force); an effect with nothing to restore is left out. Version 1
//! had a member per effect (`{"version": 1, "sched": …, "irq": …, "power": …}`), read into the
//! map under the same names, so an upgrade never loses a recorded original.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::store::{remove_host_record, save_host_record};
use super::{read_bounded, Bounded, CheckpointError, EffectState, MAX_FILE_SIZE};

/// The file's name in the state directory.
pub const HOST_FILE: &str = "host.json";
/// The temporary file written before the rename.
pub const HOST_TMP_FILE: &str = "host.json.tmp";
/// The format version written (and the newest read).
const HOST_VERSION: u32 = 2;

/// What is to be restored outside kubepods (and of the chain above an isolated container):
/// each effect's originals, by effect name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HostRecord {
    pub version: u32,
    #[serde(default)]
    pub effects: EffectState,
}

/// The file's shape as read: version 2's map, or version 1's members per effect.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostFile {
    version: u32,
    #[serde(default)]
    effects: EffectState,
    #[serde(default)]
    sched: Option<Value>,
    #[serde(default)]
    irq: Option<Value>,
    #[serde(default)]
    power: Option<Value>,
}

impl HostFile {
    fn into_record(self) -> HostRecord {
        let mut effects = self.effects;
        for (name, legacy) in [
            ("sched", self.sched),
            ("irq", self.irq),
            ("power", self.power),
        ] {
            if let Some(value) = legacy.filter(|v| !v.is_null()) {
                effects.entry(name.to_string()).or_insert(value);
            }
        }
        HostRecord {
            version: HOST_VERSION,
            effects,
        }
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
    let file: HostFile = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a host record: {e}", path.display()))?;
    if file.version == 0 || file.version > HOST_VERSION {
        return Err(format!(
            "{}: format version {} (this cpusetd reads 1 to {HOST_VERSION})",
            path.display(),
            file.version
        ));
    }
    Ok(Some(file.into_record()))
}

/// Removes `<dir>/host.json` once everything in it is restored.
pub fn remove_host_record_file(dir: &Path) -> std::io::Result<()> {
    remove_host_record(dir)
}

/// The writer of `<dir>/host.json`, shared by the effects (on the controller thread). Writes only when what is to be restored changed.
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

    /// Records effect `name`'s originals (synced) when they changed; `Value::Null`: nothing
    /// of it to restore (it leaves the record).
    pub fn record(&self, name: &str, originals: Value) -> Result<(), CheckpointError> {
        self.change(|record| {
            if originals.is_null() {
                record.effects.remove(name);
            } else {
                record.effects.insert(name.to_string(), originals);
            }
        })
    }

    fn change(&self, change: impl FnOnce(&mut HostRecord)) -> Result<(), CheckpointError> {
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
    use serde_json::json;

    #[test]
    fn records_are_written_when_they_change_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        assert_eq!(load_host_record(&state), Ok(None));
        let journal = HostJournal::new(&state, None);
        journal
            .record("sched", json!({"host": {"system.slice": "0-15"}}))
            .unwrap();
        journal
            .record("irq", json!({"default_affinity": "ffff"}))
            .unwrap();
        let read = load_host_record(&state).unwrap().unwrap();
        assert_eq!(read.version, HOST_VERSION);
        assert_eq!(read.effects["sched"]["host"]["system.slice"], "0-15");
        assert_eq!(read.effects["irq"]["default_affinity"], "ffff");
        // Unchanged: not written again (a removed file stays removed).
        remove_host_record_file(&state).unwrap();
        journal
            .record("irq", json!({"default_affinity": "ffff"}))
            .unwrap();
        assert_eq!(load_host_record(&state), Ok(None));
        // Nothing left to restore: the effect leaves the record.
        journal.record("irq", Value::Null).unwrap();
        let read = load_host_record(&state).unwrap().unwrap();
        assert!(!read.effects.contains_key("irq"), "{read:?}");
        assert!(read.effects.contains_key("sched"), "{read:?}");
        std::fs::write(state.join(HOST_FILE), "{\"version\": 7}").unwrap();
        assert!(load_host_record(&state).unwrap_err().contains("version 7"));
    }

    /// `host.json` as the agent wrote it before the effects had one map (version 1, a member
    /// per effect, exactly as that code serialized it): every original is read into the map
    /// under the effect's name, so an upgrade never loses one.
    pub(crate) const VERSION_1_RECORD: &str = r#"{
  "version": 1,
  "sched": {
    "isolated": "",
    "flags": {
      "": "1"
    },
    "host": {
      "system.slice": "0-7"
    }
  },
  "irq": {
    "banned": "",
    "default_affinity": "ff",
    "irqs": {
      "24": "0-7"
    }
  },
  "power": {
    "latency": {
      "3": "0"
    }
  }
}
"#;

    #[test]
    fn a_version_1_host_record_loads_into_the_map() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(HOST_FILE), VERSION_1_RECORD).unwrap();
        let read = load_host_record(dir.path()).unwrap().unwrap();
        assert_eq!(read.effects["sched"]["flags"][""], "1");
        assert_eq!(read.effects["sched"]["host"]["system.slice"], "0-7");
        assert_eq!(read.effects["irq"]["default_affinity"], "ff");
        assert_eq!(read.effects["irq"]["irqs"]["24"], "0-7");
        assert_eq!(read.effects["power"]["latency"]["3"], "0");
        // Written again in version 2, it reads back the same.
        let journal = HostJournal::new(dir.path(), None);
        for (name, value) in &read.effects {
            journal.record(name, value.clone()).unwrap();
        }
        let text = std::fs::read_to_string(dir.path().join(HOST_FILE)).unwrap();
        assert!(text.contains("\"version\": 2"), "{text}");
        assert_eq!(load_host_record(dir.path()).unwrap().unwrap(), read);
    }
}
