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
    /// Whether the pid was written into a lock file of our own (cleared on release).
    pid_written: bool,
}

/// Errors that mean the state directory cannot take a new or changed file (read-only, full,
/// over quota, not writable): the lock is then taken without one.
fn cannot_write_there(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error().map(Errno::from_raw),
        Some(Errno::EROFS | Errno::ENOSPC | Errno::EDQUOT | Errno::EACCES | Errno::EPERM)
    )
}

impl StateLock {
    /// Locks `<dir>/lock`, creating the directory (0700) and the file (0600) if needed.
    ///
    /// The file is opened without following a symlink and used only when it is a regular file
    /// of ours with one link: a hard link planted there (to a file elsewhere that the pid
    /// write would truncate) is unlinked and a fresh file made, as the checkpoint does. When the
    /// directory cannot take the file (read-only, full), the lock is taken on the directory
    /// itself (an `O_RDONLY` descriptor can be locked on a read-only filesystem), so a second
    /// agent is still refused; only the pid in the file is lost, and that is logged.
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
        let (file, locked_path, own_file) = open_lock_target(dir, &path)?;
        let mut file = match lock_exclusive(file) {
            Ok(locked) => locked,
            Err((mut file, Errno::EWOULDBLOCK)) => {
                let pid = if own_file { read_pid(&mut file) } else { None };
                return Err(LockError::Held {
                    path: locked_path,
                    pid,
                });
            }
            Err((_, errno)) => {
                return Err(LockError::Lock {
                    path: locked_path,
                    source: io::Error::from(errno),
                })
            }
        };
        let pid_written = own_file && record_pid(&mut file, &path);
        Ok(StateLock {
            path: locked_path,
            file,
            pid_written,
        })
    }

    /// The lock file (or the state directory, when it could not hold one).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// How long [`StateLock::acquire`] tries again while the lock is held: `status` and `health`
/// take a shared lock for an instant to see whether an agent holds it, and an agent starting
/// in that instant must not take them for another agent.
const PROBE_GRACE: std::time::Duration = std::time::Duration::from_millis(200);

/// The lock file at `path` (in `dir`), or `dir` itself when the directory cannot take the
/// file (read-only, full); with the path locked and whether it is our own lock file.
fn open_lock_target(dir: &Path, path: &Path) -> Result<(File, PathBuf, bool), LockError> {
    match open_lock_file(path) {
        Ok(file) => Ok((file, path.to_path_buf(), true)),
        Err(LockError::Open { source, .. }) if cannot_write_there(&source) => {
            log::warn!(
                "cannot use the lock file {}: {source}; locking the state directory itself \
                 (a second agent is still refused; its pid is not recorded)",
                path.display()
            );
            let dir_file = File::options()
                .read(true)
                .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW).bits())
                .open(dir)
                .map_err(|source| LockError::Open {
                    path: dir.to_path_buf(),
                    source,
                })?;
            Ok((dir_file, dir.to_path_buf(), false))
        }
        Err(e) => Err(e),
    }
}

/// Writes this process's pid into its lock file; whether it was recorded (a failure is logged:
/// the lock is held all the same, and a second agent is told "another cpusetd" without a pid).
fn record_pid(file: &mut File, path: &Path) -> bool {
    let pid = format!("{}\n", std::process::id());
    match file
        .set_len(0)
        .and_then(|()| file.seek(SeekFrom::Start(0)).map(drop))
        .and_then(|()| file.write_all(pid.as_bytes()))
    {
        Ok(()) => true,
        // Held all the same; a second agent is told "another cpusetd" without a pid.
        Err(e) => {
            log::warn!(
                "cannot record this process's pid in {}: {e}; the lock is held all the same",
                path.display()
            );
            false
        }
    }
}

/// A non-blocking exclusive lock, tried again for [`PROBE_GRACE`] while someone holds it.
fn lock_exclusive(file: File) -> Result<Flock<File>, (File, Errno)> {
    let deadline = std::time::Instant::now() + PROBE_GRACE;
    let mut file = file;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Err((back, Errno::EWOULDBLOCK)) if std::time::Instant::now() < deadline => {
                file = back;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// Opens (creating if needed) the lock file: a regular file, owned by this user, with one
/// link. Anything else planted at its name is unlinked (never written through) and a fresh
/// file made in its place, once.
fn open_lock_file(path: &Path) -> Result<File, LockError> {
    let open_error = |source| LockError::Open {
        path: path.to_path_buf(),
        source,
    };
    for attempt in 0..2 {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
            .open(path);
        let planted = match &file {
            Ok(f) => match f.metadata() {
                Ok(m) => {
                    use std::os::unix::fs::MetadataExt;
                    if !m.is_file() {
                        Some(format!("not a regular file ({:?})", m.file_type()))
                    } else if m.nlink() != 1 {
                        Some(format!("a regular file with {} links", m.nlink()))
                    } else if m.uid() != nix::unistd::geteuid().as_raw() {
                        Some(format!("owned by uid {}", m.uid()))
                    } else {
                        None
                    }
                }
                Err(e) => return Err(open_error(e)),
            },
            // A symlink (O_NOFOLLOW) or a FIFO/other (O_NONBLOCK opens it; checked above).
            Err(e) if e.raw_os_error() == Some(Errno::ELOOP as i32) => {
                Some("a symlink".to_string())
            }
            Err(_) => None,
        };
        match planted {
            None => return file.map_err(open_error),
            Some(what) if attempt == 0 => {
                log::warn!(
                    "{} is {what}, not the agent's lock file: unlinking it (its target is not \
                     touched) and making a fresh one",
                    path.display()
                );
                drop(file);
                if let Err(e) = std::fs::remove_file(path) {
                    if e.kind() != io::ErrorKind::NotFound {
                        return Err(open_error(e));
                    }
                }
            }
            Some(what) => {
                return Err(open_error(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{what}, again after unlinking it"),
                )))
            }
        }
    }
    unreachable!("the loop returns on its second attempt")
}

/// Clears the pid before the lock goes, so the file names a holder only while one runs (or
/// after one was killed, until the next agent starts).
impl Drop for StateLock {
    fn drop(&mut self) {
        if self.pid_written {
            let _ = self.file.set_len(0);
        }
    }
}

/// The pid the holder wrote, if the file holds one (it may not yet).
fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Whether an agent runs on a state directory, as `status` and `health` see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockHolder {
    /// A cpusetd holds the lock: its pid (`None`: none recorded, as when the lock is on the
    /// state directory itself or the agent is between locking and writing its pid).
    Agent(Option<u32>),
    /// No cpusetd holds it: why, for a person.
    NotRunning(String),
}

/// Who holds `<dir>/lock`: the lock is tested (a non-blocking shared `flock`, released at
/// once), not the pid in the file, which outlives a killed agent and may be reused; a held
/// lock counts only when the pid recorded in it is a cpusetd (`/proc/<pid>/exe` is this
/// program or named `cpusetd…`, or its `comm` is). Reads the real `/proc`: pids are the
/// kernel's, whatever `--proc-root` says.
pub fn lock_holder(dir: &Path) -> LockHolder {
    let path = dir.join(LOCK_FILE);
    let file = File::options()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK).bits())
        .open(&path);
    let mut file = match file {
        Ok(file) if file.metadata().is_ok_and(|m| m.is_file()) => file,
        // A read-only state directory: the agent locks the directory itself.
        _ => {
            if directory_locked(dir) {
                return LockHolder::Agent(None);
            }
            return LockHolder::NotRunning(format!(
                "no agent holds {} (not started, or stopped)",
                path.display()
            ));
        }
    };
    let recorded = read_pid(&mut file);
    let identity = file.metadata().ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino())
    });
    let held = match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_probe) => false,
        Err((_, Errno::EWOULDBLOCK)) => true,
        Err((_, errno)) => {
            return LockHolder::NotRunning(format!("cannot test {}: {errno}", path.display()))
        }
    };
    // The holder as the kernel names it, in this process's pid namespace (an agent in a
    // container recorded the pid of its own namespace); the recorded one otherwise.
    let pid = held
        .then(|| identity.and_then(|(dev, ino)| flock_holder(dev, ino)))
        .flatten()
        .or(recorded);
    holder_of(&path, held, pid.map(|pid| (pid, process_kind(pid))))
}

/// Who holds the lock at `path`, from whether it is `held` and `what` the pid it names is.
fn holder_of(path: &Path, held: bool, what: Option<(u32, ProcessKind)>) -> LockHolder {
    match (held, what) {
        (true, None) => LockHolder::Agent(None),
        (true, Some((pid, ProcessKind::Cpusetd))) => LockHolder::Agent(Some(pid)),
        (true, Some((pid, ProcessKind::Gone))) => LockHolder::NotRunning(format!(
            "{} is held by a process other than the one it names (pid {pid}, gone): not a cpusetd",
            path.display()
        )),
        (true, Some((pid, ProcessKind::Other(name)))) => LockHolder::NotRunning(format!(
            "{} is held, and the pid it names ({pid}) is {name}, not cpusetd",
            path.display()
        )),
        (false, None) => LockHolder::NotRunning(format!(
            "no agent holds {} (not started, or stopped)",
            path.display()
        )),
        (false, Some((pid, ProcessKind::Gone))) => LockHolder::NotRunning(format!(
            "no agent holds {}: the agent recorded in it (pid {pid}) is gone",
            path.display()
        )),
        (false, Some((pid, ProcessKind::Other(name)))) => LockHolder::NotRunning(format!(
            "no agent holds {}: the pid it names ({pid}) is now {name}, not cpusetd",
            path.display()
        )),
        (false, Some((pid, ProcessKind::Cpusetd))) => LockHolder::NotRunning(format!(
            "no agent holds {}: the cpusetd it names (pid {pid}) does not hold it",
            path.display()
        )),
    }
}

/// The pid holding an exclusive `flock` on the file `(dev, ino)`, from `/proc/locks` (pids as
/// this process's pid namespace sees them; 0 or missing where it cannot). The device must match
/// too unless the inode alone names exactly one such lock (a filesystem whose `stat` device is
/// not its superblock's, as btrfs subvolumes).
fn flock_holder(dev: u64, ino: u64) -> Option<u32> {
    use std::io::BufRead;
    let file = File::open("/proc/locks").ok()?;
    let wanted_dev = format!(
        "{:02x}:{:02x}",
        nix::sys::stat::major(dev),
        nix::sys::stat::minor(dev)
    );
    let mut same_dev = None;
    let mut by_inode = Vec::new();
    // The kernel's own text; bounded all the same (one line per lock on the node).
    for line in io::BufReader::new(file.take(16 << 20)).lines() {
        let line = line.ok()?;
        let fields: Vec<&str> = line.split_whitespace().collect();
        // `1: FLOCK  ADVISORY  WRITE 1234 fe:00:5744915 0 EOF`; blocked waiters have `->`.
        if fields.len() < 6 || fields[1] != "FLOCK" || fields[3] != "WRITE" {
            continue;
        }
        let Some((device, inode)) = fields[5].rsplit_once(':') else {
            continue;
        };
        if inode.parse::<u64>().ok() != Some(ino) {
            continue;
        }
        let Some(pid) = fields[4].parse::<u32>().ok().filter(|p| *p > 0) else {
            continue;
        };
        if device == wanted_dev {
            same_dev = Some(pid);
        }
        by_inode.push(pid);
    }
    same_dev.or_else(|| (by_inode.len() == 1).then(|| by_inode[0]))
}

/// Whether the state directory itself is locked (the agent's fallback when it cannot make
/// its lock file).
fn directory_locked(dir: &Path) -> bool {
    let Ok(file) = File::options()
        .read(true)
        .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW).bits())
        .open(dir)
    else {
        return false;
    };
    matches!(
        Flock::lock(file, FlockArg::LockSharedNonblock),
        Err((_, Errno::EWOULDBLOCK))
    )
}

/// What a pid is now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ProcessKind {
    Cpusetd,
    /// No such process, or a zombie.
    Gone,
    /// Another program: its name, quoted.
    Other(String),
}

fn process_kind(pid: u32) -> ProcessKind {
    if pid == std::process::id() {
        return ProcessKind::Cpusetd;
    }
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let zombie = std::fs::read_to_string(proc_dir.join("stat"))
        .ok()
        .and_then(|stat| Some(stat.rsplit_once(')')?.1.trim_start().starts_with('Z')));
    match zombie {
        None | Some(true) => return ProcessKind::Gone,
        Some(false) => {}
    }
    let exe = proc_dir.join("exe");
    let same_program = || {
        use std::os::unix::fs::MetadataExt;
        let (Ok(theirs), Ok(ours)) = (std::fs::metadata(&exe), std::fs::metadata("/proc/self/exe"))
        else {
            return false;
        };
        (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino())
    };
    let named = |name: &str| name.starts_with("cpusetd");
    let exe_name = std::fs::read_link(&exe)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let comm = std::fs::read_to_string(proc_dir.join("comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_default();
    if same_program() || exe_name.as_deref().is_some_and(named) || named(&comm) {
        ProcessKind::Cpusetd
    } else {
        ProcessKind::Other(format!("{:?}", crate::logging::printable(&comm)))
    }
}
