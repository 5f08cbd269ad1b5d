//! `<state-dir>/lock`: one agent per state directory.
//!
//! [`StateLock::acquire`] takes a non-blocking exclusive `flock(2)` on the lock file and writes
//! the holder's pid into it, so a second agent is refused with a message naming the first; the
//! pid is cleared on release. The lock lives as long as the [`StateLock`] (the kernel also drops
//! it when the process dies, however it dies). `flock` belongs to the open file description: a second `open` of the file,
//! even in the same process, is refused too; the descriptor is close-on-exec, so programs the
//! agent starts do not inherit the lock. The file itself is left in place on release: deleting
//! a lock file races with the next agent opening it.

use std::fs::{DirBuilder, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg, OFlag};

use super::LOCK_FILE;

/// Why the state directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot create state directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open lock file {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("another cpusetd{} holds {path}; stop it first", holder(*.pid))]
    Held { path: PathBuf, pid: Option<u32> },
    #[error("cannot lock {path}")]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot record this process's pid in {path}")]
    WritePid {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn holder(pid: Option<u32>) -> String {
    pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
}

/// The exclusive lock on a state directory, held until dropped.
#[derive(Debug)]
pub struct StateLock {
    path: PathBuf,
    file: Flock<File>,
}

impl StateLock {
    /// Locks `<dir>/lock`, creating the directory (0700) and the file (0600) if needed.
    pub fn acquire(dir: &Path) -> Result<StateLock, LockError> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|source| LockError::CreateDir {
                path: dir.to_path_buf(),
                source,
            })?;
        let path = dir.join(LOCK_FILE);
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
            .open(&path)
            .map_err(|source| LockError::Open {
                path: path.clone(),
                source,
            })?;
        if !file.metadata().map(|m| m.is_file()).unwrap_or(false) {
            return Err(LockError::Open {
                path,
                source: io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
            });
        }
        let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => locked,
            Err((mut file, Errno::EWOULDBLOCK)) => {
                let pid = read_pid(&mut file);
                return Err(LockError::Held { path, pid });
            }
            Err((_, errno)) => {
                return Err(LockError::Lock {
                    path,
                    source: io::Error::from(errno),
                })
            }
        };
        let pid = format!("{}\n", std::process::id());
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)).map(drop))
            .and_then(|()| file.write_all(pid.as_bytes()))
            .map_err(|source| LockError::WritePid {
                path: path.clone(),
                source,
            })?;
        Ok(StateLock { path, file })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Clears the pid before the lock goes, so the file names a holder only while one runs (or
/// after one was killed, until the next agent starts).
impl Drop for StateLock {
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
    }
}

/// The pid the holder wrote, if the file holds one (it may not yet).
fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}
