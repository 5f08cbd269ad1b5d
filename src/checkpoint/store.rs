//! Writing `state.json` atomically, and moving an unusable one aside.
//!
//! [`save`]: create the state directory (0700) if it is missing, write `state.json.tmp` (a fresh
//! file, mode 0600, never through a symlink), fsync it, rename it over `state.json`, fsync the
//! directory. Until the rename the old file is untouched, so any failure (ENOSPC, EROFS, EACCES,
//! a planted directory) leaves the previous checkpoint whole; the temporary file is removed.
//!
//! [`quarantine`]: rename `state.json` to `state.json.corrupt-<unix-ms>` with a `.reason` note
//! beside it, and keep only the [`QUARANTINE_KEEP`] newest of those.

use std::fs::{self, DirBuilder, File};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

use super::load::UnusableReason;
use super::{state_path, unix_ms_now, Checkpoint, STATE_FILE, TMP_FILE};

/// How many quarantined checkpoints are kept; older ones are deleted.
pub const QUARANTINE_KEEP: usize = 5;

/// Why the checkpoint could not be written or moved aside.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot serialise the checkpoint")]
    Serialize {
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot create state directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write checkpoint file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot rename {from} to {to}")]
    Rename {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot sync directory {path}")]
    SyncDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Writes `checkpoint` to `<dir>/state.json` atomically (see the module docs).
pub fn save(dir: &Path, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
    let bytes = checkpoint
        .to_json()
        .map_err(|source| CheckpointError::Serialize { source })?;
    ensure_dir(dir)?;
    let tmp = dir.join(TMP_FILE);
    let path = state_path(dir);
    #[cfg(debug_assertions)]
    if let Some(source) = crate::faults::checkpoint_save() {
        return Err(CheckpointError::Write { path: tmp, source });
    }
    replace(dir, &tmp, &path, &bytes)
}

/// Writes `<dir>/host.json` (the host originals, [`super::host`]) atomically, as [`save`]
/// writes `state.json`.
pub(super) fn save_host_record(dir: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    ensure_dir(dir)?;
    let tmp = dir.join(super::host::HOST_TMP_FILE);
    #[cfg(debug_assertions)]
    if let Some(source) = crate::faults::host_record_save() {
        return Err(CheckpointError::Write { path: tmp, source });
    }
    replace(dir, &tmp, &dir.join(super::host::HOST_FILE), bytes)
}

/// Removes `<dir>/host.json` (nothing left to restore); missing is fine.
pub(super) fn remove_host_record(dir: &Path) -> io::Result<()> {
    match fs::remove_file(dir.join(super::host::HOST_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// `bytes` into a fresh `tmp` (synced), renamed over `path`, the directory synced.
fn replace(dir: &Path, tmp: &Path, path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let (tmp, path) = (tmp.to_path_buf(), path.to_path_buf());
    write_fresh(&tmp, bytes).map_err(|source| CheckpointError::Write {
        path: tmp.clone(),
        source,
    })?;
    if let Err(source) = fs::rename(&tmp, &path) {
        let _ = fs::remove_file(&tmp);
        return Err(CheckpointError::Rename {
            from: tmp,
            to: path,
            source,
        });
    }
    sync_dir(dir)
}

/// Creates the state directory (mode 0700) if it is missing, and makes its entry durable.
fn ensure_dir(dir: &Path) -> Result<(), CheckpointError> {
    if dir.is_dir() {
        return Ok(());
    }
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| CheckpointError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        _ => Ok(()),
    }
}

/// Replaces whatever is at `path` by a new file holding `bytes`, synced. A symlink, FIFO or hard
/// link planted there is unlinked, never written through; a directory makes it fail.
fn write_fresh(path: &Path, bytes: &[u8]) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(path)?;
    let written = (|| {
        // The mode given to open is filtered by the umask.
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        file.write_all(bytes)?;
        file.sync_all()
    })();
    if written.is_err() {
        let _ = fs::remove_file(path);
    }
    written
}

fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| CheckpointError::SyncDir {
            path: dir.to_path_buf(),
            source,
        })
}

/// Moves `<dir>/state.json` aside to `state.json.corrupt-<unix-ms>`, writes `reason` into a
/// `.reason` file beside it (best effort) and deletes all but the [`QUARANTINE_KEEP`] newest
/// quarantined files. Returns where the file went.
pub fn quarantine(dir: &Path, reason: &UnusableReason) -> Result<PathBuf, CheckpointError> {
    let from = state_path(dir);
    let stamp = unix_ms_now();
    let mut to = dir.join(format!("{STATE_FILE}.corrupt-{stamp}"));
    let mut n = 1;
    while fs::symlink_metadata(&to).is_ok() || fs::symlink_metadata(reason_path(&to)).is_ok() {
        to = dir.join(format!("{STATE_FILE}.corrupt-{stamp}-{n}"));
        n += 1;
    }
    fs::rename(&from, &to).map_err(|source| CheckpointError::Rename {
        from: from.clone(),
        to: to.clone(),
        source,
    })?;
    let note = format!("{}\n", reason.describe(&from));
    let _ = write_fresh(&reason_path(&to), note.as_bytes());
    prune_quarantined(dir);
    sync_dir(dir)?;
    Ok(to)
}

fn reason_path(quarantined: &Path) -> PathBuf {
    let mut name = quarantined.as_os_str().to_owned();
    name.push(".reason");
    PathBuf::from(name)
}

/// Deletes quarantined files beyond the newest [`QUARANTINE_KEEP`] (best effort).
fn prune_quarantined(dir: &Path) {
    let prefix = format!("{STATE_FILE}.corrupt-");
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    // (stamp, suffix, name) of each quarantined checkpoint, not of the notes.
    let mut found: Vec<(u64, u64, String)> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|name| {
            let rest = name.strip_prefix(&prefix)?;
            let (stamp, suffix) = rest.split_once('-').unwrap_or((rest, "0"));
            Some((stamp.parse().ok()?, suffix.parse().ok()?, name))
        })
        .collect();
    found.sort_unstable_by(|a, b| b.cmp(a));
    for (_, _, name) in found.into_iter().skip(QUARANTINE_KEEP) {
        let path = dir.join(name);
        let _ = fs::remove_file(reason_path(&path));
        let _ = fs::remove_file(path);
    }
}
