//! `CgroupFs`: reading, writing and listing cgroup interface files below one injected root,
//! without ever following a symlink below that root.
//!
//! Every access opens its path from the root's directory descriptor with one `openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`) or, where the kernel has none or
//! refuses, walks it one component at a time with `openat(O_NOFOLLOW | O_DIRECTORY)`, and opens
//! the interface file with `O_NOFOLLOW | O_NONBLOCK`, then checks with `fstat` that it is a
//! regular file. So a symlink planted in the tree is refused instead of followed out of the
//! root, and a FIFO named like an interface file cannot hang the agent. The scan's read path
//! ([`CgroupFs::open_child_dir`], [`CgroupFs::each_entry`], [`CgroupFs::read_beneath`]) opens
//! one name at a time the same way beneath an open directory that was itself opened so, and
//! leaves out the `fstat` where the answer is known already (kernfs, or the directory's
//! listing): see `docs/DECISIONS.md`, "Reading a cgroup". Writes open without `O_CREAT` (a
//! misspelt name is an error, not a new file) and without `O_TRUNC`, and issue one `write(2)` of
//! the value, as the kernel expects; a plain file (a fake tree) is emptied first only when it
//! holds more than the value (see [`truncate_if_longer`]). The root itself is configuration and is opened normally (on many
//! hosts `/sys/fs/cgroup/cpu` is a symlink to `cpu,cpuacct`).

use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::{open, openat, openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};
use nix::sys::statfs::{fstatfs, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};

use super::path::CgroupPath;

/// Largest interface file read; cgroup interface files the agent reads are a few bytes.
pub const MAX_READ_BYTES: usize = 1 << 20;

/// The cgroup interface files the agent touches: their names live here and nowhere else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InterfaceFile {
    /// `cpuset.cpus` (v1 and v2): the CPUs configured for the cgroup.
    CpusetCpus,
    /// `cpuset.mems` (v1 and v2): the memory nodes configured for the cgroup.
    CpusetMems,
    /// `cpuset.cpus.effective` (v2): the CPUs the cgroup really gets.
    CpusetCpusEffective,
    /// `cpuset.mems.effective` (v2).
    CpusetMemsEffective,
    /// `cpuset.effective_cpus` (v1).
    CpusetEffectiveCpus,
    /// `cpuset.effective_mems` (v1).
    CpusetEffectiveMems,
    /// `cpu.shares` (v1).
    CpuShares,
    /// `cpu.cfs_quota_us` (v1): `-1` or the quota in microseconds per period.
    CpuCfsQuotaUs,
    /// `cpu.cfs_period_us` (v1).
    CpuCfsPeriodUs,
    /// `cpu.max` (v2): `max|QUOTA PERIOD`.
    CpuMax,
    /// `cpu.weight` (v2): 1..=10000.
    CpuWeight,
    /// `cgroup.procs` (v1 and v2).
    CgroupProcs,
    /// `cgroup.controllers` (v2): controllers available to the cgroup.
    CgroupControllers,
    /// `cgroup.subtree_control` (v2): controllers enabled for the children.
    CgroupSubtreeControl,
    /// `cgroup.clone_children` (v1): `1` makes the kernel give a new child its parent's
    /// `cpuset.cpus`/`cpuset.mems` at `mkdir` (and the flag), instead of empty sets.
    CgroupCloneChildren,
    /// `cpuset.sched_load_balance` (v1): `1` makes the kernel build scheduler domains over the
    /// cpuset's CPUs (see [`crate::sched_balance`]).
    CpusetSchedLoadBalance,
    /// `cpuset.cpus.exclusive` (v2, Linux 6.7 or newer): the CPUs a cgroup may hand down to a
    /// partition below it (remote partitions).
    CpusetCpusExclusive,
    /// `cpuset.cpus.partition` (v2): `member`, `root` or `isolated`; the kernel shows an
    /// invalid one as e.g. `isolated invalid (<reason>)`.
    CpusetCpusPartition,
    /// `cpuset.cpus.isolated` (v2, the root only, Linux 6.8 or newer): the CPUs in isolated
    /// partitions, which the kernel takes out of every effective set outside them.
    CpusetCpusIsolated,
}

impl InterfaceFile {
    pub const ALL: [InterfaceFile; 19] = [
        InterfaceFile::CpusetCpus,
        InterfaceFile::CpusetMems,
        InterfaceFile::CpusetCpusEffective,
        InterfaceFile::CpusetMemsEffective,
        InterfaceFile::CpusetEffectiveCpus,
        InterfaceFile::CpusetEffectiveMems,
        InterfaceFile::CpuShares,
        InterfaceFile::CpuCfsQuotaUs,
        InterfaceFile::CpuCfsPeriodUs,
        InterfaceFile::CpuMax,
        InterfaceFile::CpuWeight,
        InterfaceFile::CgroupProcs,
        InterfaceFile::CgroupControllers,
        InterfaceFile::CgroupSubtreeControl,
        InterfaceFile::CgroupCloneChildren,
        InterfaceFile::CpusetSchedLoadBalance,
        InterfaceFile::CpusetCpusExclusive,
        InterfaceFile::CpusetCpusPartition,
        InterfaceFile::CpusetCpusIsolated,
    ];

    /// The file name in the cgroup directory.
    pub const fn name(self) -> &'static str {
        match self {
            InterfaceFile::CpusetCpus => "cpuset.cpus",
            InterfaceFile::CpusetMems => "cpuset.mems",
            InterfaceFile::CpusetCpusEffective => "cpuset.cpus.effective",
            InterfaceFile::CpusetMemsEffective => "cpuset.mems.effective",
            InterfaceFile::CpusetEffectiveCpus => "cpuset.effective_cpus",
            InterfaceFile::CpusetEffectiveMems => "cpuset.effective_mems",
            InterfaceFile::CpuShares => "cpu.shares",
            InterfaceFile::CpuCfsQuotaUs => "cpu.cfs_quota_us",
            InterfaceFile::CpuCfsPeriodUs => "cpu.cfs_period_us",
            InterfaceFile::CpuMax => "cpu.max",
            InterfaceFile::CpuWeight => "cpu.weight",
            InterfaceFile::CgroupProcs => "cgroup.procs",
            InterfaceFile::CgroupControllers => "cgroup.controllers",
            InterfaceFile::CgroupSubtreeControl => "cgroup.subtree_control",
            InterfaceFile::CgroupCloneChildren => "cgroup.clone_children",
            InterfaceFile::CpusetSchedLoadBalance => "cpuset.sched_load_balance",
            InterfaceFile::CpusetCpusExclusive => "cpuset.cpus.exclusive",
            InterfaceFile::CpusetCpusPartition => "cpuset.cpus.partition",
            InterfaceFile::CpusetCpusIsolated => "cpuset.cpus.isolated",
        }
    }

    /// The interface file with this name, if the agent knows it.
    pub fn from_name(name: &str) -> Option<InterfaceFile> {
        InterfaceFile::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl fmt::Display for InterfaceFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why the agent refused to use something it found in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("it is a symlink, which is never followed below the cgroup root")]
    Symlink,
    #[error("it is a {kind}, not a regular file")]
    NotRegularFile { kind: FileKind },
    #[error("it is a {kind}, not a directory")]
    NotADirectory { kind: FileKind },
    #[error("it is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the kernel took {written} of {len} bytes in one write")]
    ShortWrite { written: usize, len: usize },
    #[error("another filesystem is mounted there; mounts below the cgroup root are never crossed")]
    MountPoint,
}

/// The type of a directory entry, as far as the agent cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Directory,
    RegularFile,
    Symlink,
    Fifo,
    Socket,
    Device,
    Unknown,
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileKind::Directory => "directory",
            FileKind::RegularFile => "regular file",
            FileKind::Symlink => "symlink",
            FileKind::Fifo => "fifo",
            FileKind::Socket => "socket",
            FileKind::Device => "device",
            FileKind::Unknown => "file of unknown type",
        })
    }
}

impl FileKind {
    fn of_stat(stat: &FileStat) -> FileKind {
        let fmt = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        if fmt == SFlag::S_IFDIR {
            FileKind::Directory
        } else if fmt == SFlag::S_IFREG {
            FileKind::RegularFile
        } else if fmt == SFlag::S_IFLNK {
            FileKind::Symlink
        } else if fmt == SFlag::S_IFIFO {
            FileKind::Fifo
        } else if fmt == SFlag::S_IFSOCK {
            FileKind::Socket
        } else if fmt == SFlag::S_IFCHR || fmt == SFlag::S_IFBLK {
            FileKind::Device
        } else {
            FileKind::Unknown
        }
    }

    /// The kind a directory listing gives (`d_type`); `None` where the filesystem does not say.
    fn of_dirent(kind: rustix::fs::FileType) -> Option<FileKind> {
        use rustix::fs::FileType;
        Some(match kind {
            FileType::Directory => FileKind::Directory,
            FileType::RegularFile => FileKind::RegularFile,
            FileType::Symlink => FileKind::Symlink,
            FileType::Fifo => FileKind::Fifo,
            FileType::Socket => FileKind::Socket,
            FileType::CharacterDevice | FileType::BlockDevice => FileKind::Device,
            FileType::Unknown => return None,
        })
    }
}

/// A failed cgroupfs operation, with the host path it concerned.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot open the cgroup root {root}")]
    Root {
        root: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {value:?} to {path}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot list {path}")]
    List {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("refusing to use {path}")]
    Refused {
        path: PathBuf,
        /// The value that was to be written, for writes.
        value: Option<String>,
        #[source]
        reason: Refusal,
    },
}

impl CgroupError {
    /// The file or directory no longer exists: the cgroup is gone (a container exited). Not an
    /// error for the agent, which skips it. ENOENT when it went before the file was opened;
    /// ENODEV (cgroupfs) when it was removed between opening the file and reading or writing.
    pub fn is_gone(&self) -> bool {
        matches!(self.errno(), Some(e) if e == Errno::ENOENT as i32 || e == Errno::ENODEV as i32)
    }

    /// The operating system's error number, when the failure came from a system call.
    pub fn errno(&self) -> Option<i32> {
        match self {
            CgroupError::Root { source, .. }
            | CgroupError::Read { source, .. }
            | CgroupError::Write { source, .. }
            | CgroupError::List { source, .. } => source.raw_os_error(),
            CgroupError::Refused { .. } => None,
        }
    }

    /// The host path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            CgroupError::Root { root: path, .. }
            | CgroupError::Read { path, .. }
            | CgroupError::Write { path, .. }
            | CgroupError::List { path, .. }
            | CgroupError::Refused { path, .. } => path,
        }
    }
}

/// One entry of a cgroup directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: OsString,
    pub kind: FileKind,
}

/// Where [`CgroupFs::read_beneath`] opens an interface file of a cgroup from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FileAt<'a> {
    /// The cgroup's own directory, open.
    Dir(&'a OwnedFd),
    /// The directory of the cgroup's parent, open: the file is opened as `<name>/<file>`,
    /// without opening (and closing) the cgroup's directory itself.
    Parent(&'a OwnedFd),
}

/// The buffer directory listings are read into (32 KiB: a cgroup directory of interface files
/// and a few children in one `getdents64`); a scan makes one and reuses it.
pub(crate) struct DirentBuffer(Vec<MaybeUninit<u8>>);

impl DirentBuffer {
    pub(crate) fn new() -> DirentBuffer {
        DirentBuffer(vec![MaybeUninit::uninit(); 32 * 1024])
    }
}

impl fmt::Debug for DirentBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DirentBuffer({} bytes)", self.0.len())
    }
}

/// A cgroup controller hierarchy (a v1 controller mount, or the v2 unified tree) under an
/// injected root. Cheap to clone: clones share the root's directory descriptor.
#[derive(Debug, Clone)]
pub struct CgroupFs {
    root: PathBuf,
    root_fd: Arc<OwnedFd>,
    /// The root is on a kernel cgroup filesystem (kernfs: cgroup v1 or v2), where a directory
    /// holds only directories and regular files (see [`Self::read_beneath`]).
    kernfs: bool,
}

/// What went wrong while walking to a directory, before it is given its operation's context.
enum WalkError {
    Io(io::Error),
    Refused(Refusal),
}

impl CgroupFs {
    /// Opens the root directory. The root is configuration and may itself be a symlink.
    pub fn open(root: impl Into<PathBuf>) -> Result<CgroupFs, CgroupError> {
        let root = root.into();
        let fd = open(
            root.as_path(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| CgroupError::Root {
            root: root.clone(),
            source: io::Error::from(errno),
        })?;
        let kernfs = fstatfs(&fd).is_ok_and(|st| {
            let kind = st.filesystem_type();
            kind == CGROUP_SUPER_MAGIC || kind == CGROUP2_SUPER_MAGIC
        });
        Ok(CgroupFs {
            root,
            root_fd: Arc::new(fd),
            kernfs,
        })
    }

    /// The root directory this handle was opened on.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The host path of a cgroup directory, for messages and inotify.
    pub fn host_path(&self, cgroup: &CgroupPath) -> PathBuf {
        cgroup.under(&self.root)
    }

    /// The host path of an interface file.
    pub fn file_path(&self, cgroup: &CgroupPath, file: InterfaceFile) -> PathBuf {
        self.host_path(cgroup).join(file.name())
    }

    /// Whether the cgroup directory exists (a symlink in its place does not count).
    pub fn exists(&self, cgroup: &CgroupPath) -> bool {
        self.open_dir(cgroup).is_ok()
    }

    /// Whether the cgroup is known to be gone: its directory cannot be opened because it (or
    /// a directory above it) no longer exists. A cgroup that cannot be opened for any other
    /// reason (EACCES, EMFILE, ENFILE, EIO …) is *not* gone: what it holds must stay its own.
    pub fn is_gone(&self, cgroup: &CgroupPath) -> bool {
        match self.open_dir(cgroup) {
            Ok(_) => false,
            Err(e) => e.is_gone() || e.errno() == Some(Errno::ENOTDIR as i32),
        }
    }

    /// Reads an interface file and trims surrounding whitespace (the kernel's trailing newline).
    pub fn read(&self, cgroup: &CgroupPath, file: InterfaceFile) -> Result<String, CgroupError> {
        let dir = self.open_dir(cgroup)?;
        self.read_in(&dir, cgroup, file)
    }

    /// Writes `value` to an interface file: open without create, one `write(2)` (see
    /// [`truncate_if_longer`] for when a plain file is emptied first).
    pub fn write(
        &self,
        cgroup: &CgroupPath,
        file: InterfaceFile,
        value: &str,
    ) -> Result<(), CgroupError> {
        let written = self.write_once(cgroup, file, value);
        #[cfg(debug_assertions)]
        if written.is_ok() {
            crate::faults::written(file.name());
            // What the kernel derives from a partition's files and v2's effective sets (fake
            // trees with the rules on).
            super::fake_kernel::after_write(self, cgroup, file);
        }
        written
    }

    fn write_once(
        &self,
        cgroup: &CgroupPath,
        file: InterfaceFile,
        value: &str,
    ) -> Result<(), CgroupError> {
        let path = self.file_path(cgroup, file);
        #[cfg(debug_assertions)]
        let _cgroup_mutex = super::fake_kernel::lock(self, file);
        #[cfg(debug_assertions)]
        if let Some(done) = self.fake_kernel_write(cgroup, file, value, &path) {
            return done;
        }
        // A fake tree's files are plain files that O_TRUNC empties: an agent killed between the
        // truncation and the write would leave a value no kernel ever shows. With the fake
        // kernel's rules on a fake tree (not a real cgroupfs), the value overwrites in place,
        // padded with newlines (which every reader trims) to the old length.
        #[cfg(debug_assertions)]
        let in_place = super::fake_kernel::fake_tree(self);
        #[cfg(not(debug_assertions))]
        let in_place = false;
        // One openat2 of the file where the kernel has it; anything but a plain success takes
        // the path below, which reports what went wrong (and the fake kernel's in-place write).
        let fast = if in_place {
            None
        } else {
            self.open_file_at_once(cgroup, file, OFlag::O_WRONLY)
        };
        if let Some((fd, size)) = fast {
            truncate_if_longer(&fd, size, &path, value)?;
            return write_value(fd, &path, value);
        }
        self.write_walked(cgroup, file, value, path, in_place)
    }

    /// Debug builds: the fake kernel's verdict on a write before it is made (its refusals,
    /// its no-op for an empty value on a fake tree) and injected faults. `None`: go on.
    #[cfg(debug_assertions)]
    fn fake_kernel_write(
        &self,
        cgroup: &CgroupPath,
        file: InterfaceFile,
        value: &str,
        path: &Path,
    ) -> Option<Result<(), CgroupError>> {
        let write_error = |source| CgroupError::Write {
            path: path.to_path_buf(),
            value: value.to_string(),
            source,
        };
        if let Err(source) = super::fake_kernel::check(self, cgroup, file, value) {
            return Some(Err(write_error(source)));
        }
        // The kernel takes a write of no bytes and changes nothing (Linux 6.12's
        // `cpuset.cpus.exclusive` kept its cpus so): the fake kernel too.
        if value.is_empty() && super::fake_kernel::fake_tree(self) {
            return Some(Ok(()));
        }
        crate::faults::cgroup_write(file.name()).map(|source| Err(write_error(source)))
    }

    /// The write by walking to the cgroup's directory one component at a time, which says
    /// what went wrong where the one-call open did not succeed. `in_place`: overwrite without
    /// truncating, padded with newlines to the old length (the fake kernel's trees).
    fn write_walked(
        &self,
        cgroup: &CgroupPath,
        file: InterfaceFile,
        value: &str,
        path: PathBuf,
        in_place: bool,
    ) -> Result<(), CgroupError> {
        let refused = |path: PathBuf, reason| CgroupError::Refused {
            path,
            value: Some(value.to_string()),
            reason,
        };
        let dir = self.walk(cgroup).map_err(|e| match e {
            WalkError::Io(source) => CgroupError::Write {
                path: self.host_path(cgroup),
                value: value.to_string(),
                source,
            },
            WalkError::Refused(reason) => refused(self.host_path(cgroup), reason),
        })?;
        let mode = if in_place {
            OFlag::O_WRONLY
        } else {
            OFlag::O_WRONLY | OFlag::O_TRUNC
        };
        let fd = open_regular(&dir, file.name(), mode).map_err(|e| match e {
            WalkError::Io(source) => CgroupError::Write {
                path: path.clone(),
                value: value.to_string(),
                source,
            },
            WalkError::Refused(reason) => refused(path.clone(), reason),
        })?;
        let mut bytes = value.as_bytes().to_vec();
        if in_place {
            let old_len = fstat(&fd).map(|st| st.st_size as usize).unwrap_or(0);
            bytes.resize(old_len.max(bytes.len()), b'\n');
        }
        let written = nix::unistd::write(&fd, &bytes).map_err(|errno| CgroupError::Write {
            path: path.clone(),
            value: value.to_string(),
            source: io::Error::from(errno),
        })?;
        if written != bytes.len() {
            return Err(refused(
                path,
                Refusal::ShortWrite {
                    written,
                    len: bytes.len(),
                },
            ));
        }
        Ok(())
    }

    /// The entries of a cgroup directory (interface files and child cgroups), sorted by name,
    /// without `.` and `..`. Types come from `readdir` or, where it does not say, `fstatat`
    /// without following symlinks.
    pub fn list(&self, cgroup: &CgroupPath) -> Result<Vec<DirEntry>, CgroupError> {
        let dir = self.open_dir(cgroup)?;
        self.list_in(dir, cgroup)
    }

    /// How many subdirectories (child cgroups) a cgroup directory has, from its link count:
    /// cgroupfs (kernfs), tmpfs and ext4 keep it at 2 + subdirectories. `None` where the
    /// filesystem does not count them (a link count below 2, as on btrfs) or the directory
    /// cannot be opened. Two system calls instead of listing the directory.
    pub fn subdir_count(&self, cgroup: &CgroupPath) -> Option<usize> {
        let fd = self.walk(cgroup).ok()?;
        let st = fstat(&fd).ok()?;
        (st.st_nlink >= 2).then(|| (st.st_nlink - 2) as usize)
    }

    /// Opens a cgroup directory, refusing symlinks and non-directories on the way.
    pub(crate) fn open_dir(&self, cgroup: &CgroupPath) -> Result<OwnedFd, CgroupError> {
        self.walk(cgroup).map_err(|e| match e {
            WalkError::Io(source) => CgroupError::Read {
                path: self.host_path(cgroup),
                source,
            },
            WalkError::Refused(reason) => CgroupError::Refused {
                path: self.host_path(cgroup),
                value: None,
                reason,
            },
        })
    }

    /// As [`Self::read`], in one `openat2` of the file's path where the kernel has it (the
    /// quiet reconcile reads every cgroup's `cpuset.cpus` this way); errors are those of
    /// [`Self::read`], which it falls back to for anything but a plain success.
    pub fn read_file(
        &self,
        cgroup: &CgroupPath,
        file: InterfaceFile,
    ) -> Result<String, CgroupError> {
        match self.open_file_at_once(cgroup, file, OFlag::O_RDONLY) {
            Some((fd, _)) => self.read_fd(fd, cgroup, file),
            None => self.read(cgroup, file),
        }
    }

    /// An interface file opened in one `openat2` (see [`open_beneath`]) when that plainly works
    /// and it is a regular file, with its size where it was checked; `None` otherwise, for the
    /// caller's component walk, which says what went wrong. On kernfs without the `fstat` that
    /// checks it elsewhere (size `None`): the `openat2` crossed no mount below a kernfs root, so
    /// the name is a kernfs node, and a kernfs node is a directory, a regular file or a symlink
    /// and nothing else (no `mknod`, no FIFO); the open refuses a symlink, `O_WRONLY` a directory
    /// (EISDIR), and [`Self::read_fd`] a directory opened for reading (EISDIR). See
    /// `docs/DECISIONS.md`, "Fewer system calls per cgroup write".
    fn open_file_at_once(
        &self,
        cgroup: &CgroupPath,
        file: InterfaceFile,
        mode: OFlag,
    ) -> Option<(OwnedFd, Option<i64>)> {
        let flags = mode | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let path = cgroup.join(std::ffi::OsStr::new(file.name())).ok()?;
        let fd = open_beneath(&self.root_fd, &path, flags)?.ok()?;
        if self.kernfs {
            return Some((fd, None));
        }
        let st = fstat(&fd).ok()?;
        (FileKind::of_stat(&st) == FileKind::RegularFile).then_some((fd, Some(st.st_size)))
    }

    /// Reads an interface file of the directory `dir` (which is `cgroup`).
    pub(crate) fn read_in(
        &self,
        dir: &OwnedFd,
        cgroup: &CgroupPath,
        file: InterfaceFile,
    ) -> Result<String, CgroupError> {
        let path = self.file_path(cgroup, file);
        let fd = open_regular(dir, file.name(), OFlag::O_RDONLY).map_err(|e| match e {
            WalkError::Io(source) => CgroupError::Read {
                path: path.clone(),
                source,
            },
            WalkError::Refused(reason) => CgroupError::Refused {
                path: path.clone(),
                value: None,
                reason,
            },
        })?;
        self.read_fd(fd, cgroup, file)
    }

    /// Reads an opened interface file, bounded, trimmed. Interface files are small: one
    /// `read(2)` that comes back short of the buffer has read it all (a short read of a regular
    /// file is its end), so a value costs one read, not a second one to see the end.
    fn read_fd(
        &self,
        fd: OwnedFd,
        cgroup: &CgroupPath,
        file: InterfaceFile,
    ) -> Result<String, CgroupError> {
        let read_error = |source| CgroupError::Read {
            path: self.file_path(cgroup, file),
            source,
        };
        let mut buf = [0u8; 4096];
        let n = loop {
            match nix::unistd::read(&fd, &mut buf) {
                Err(Errno::EINTR) => continue,
                // A directory opened where a file was expected (kernfs, see `read_beneath`).
                Err(Errno::EISDIR) => {
                    return Err(CgroupError::Refused {
                        path: self.file_path(cgroup, file),
                        value: None,
                        reason: Refusal::NotRegularFile {
                            kind: FileKind::Directory,
                        },
                    })
                }
                other => break other.map_err(|errno| read_error(io::Error::from(errno)))?,
            }
        };
        let mut bytes = buf[..n].to_vec();
        if n == buf.len() {
            File::from(fd)
                .take((MAX_READ_BYTES + 1 - n) as u64)
                .read_to_end(&mut bytes)
                .map_err(read_error)?;
        }
        if bytes.len() > MAX_READ_BYTES {
            return Err(CgroupError::Refused {
                path: self.file_path(cgroup, file),
                value: None,
                reason: Refusal::TooLarge {
                    limit: MAX_READ_BYTES,
                },
            });
        }
        Ok(String::from_utf8_lossy(&bytes).trim().to_string())
    }

    /// Lists the directory `dir` (which is `cgroup`), consuming the descriptor.
    pub(crate) fn list_in(
        &self,
        dir: OwnedFd,
        cgroup: &CgroupPath,
    ) -> Result<Vec<DirEntry>, CgroupError> {
        let mut entries = Vec::new();
        self.each_entry(&dir, cgroup, &mut DirentBuffer::new(), |name, kind| {
            entries.push(DirEntry {
                name: name.to_os_string(),
                kind,
            })
        })?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    /// Calls `each` with every entry of the open directory `dir` (which is `cgroup`), in the
    /// directory's order, without `.` and `..`: `getdents64` into `buf` until it returns 0 (a
    /// short return is not the end: the kernel stops filling early when a signal is pending),
    /// with no `fdopendir`, `fstat`, `fcntl` or `lseek` around it. Types come from `d_type`
    /// or, where the filesystem does not give it, `fstatat` without following symlinks; an
    /// entry gone before that is left out. The directory is read from its current offset: give
    /// a freshly opened one.
    pub(crate) fn each_entry(
        &self,
        dir: &OwnedFd,
        cgroup: &CgroupPath,
        buf: &mut DirentBuffer,
        mut each: impl FnMut(&std::ffi::OsStr, FileKind),
    ) -> Result<(), CgroupError> {
        let list_error = |errno: Errno| CgroupError::List {
            path: self.host_path(cgroup),
            source: io::Error::from(errno),
        };
        let mut entries = rustix::fs::RawDir::new(dir, &mut buf.0);
        while let Some(entry) = entries.next() {
            let entry = entry.map_err(|e| list_error(Errno::from_raw(e.raw_os_error())))?;
            let name = std::ffi::OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            let kind = match FileKind::of_dirent(entry.file_type()) {
                Some(kind) => kind,
                None => match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(stat) => FileKind::of_stat(&stat),
                    // Vanished between readdir and stat.
                    Err(Errno::ENOENT) => continue,
                    Err(errno) => return Err(list_error(errno)),
                },
            };
            each(name, kind);
        }
        Ok(())
    }

    /// Opens the cgroup directory `cgroup` through the open directory `parent` of its parent
    /// cgroup: one `openat2` of one name, beneath `parent`, refusing a symlink and a mount
    /// point (what [`Self::open_dir`] does from the root in one call over the whole path, here
    /// without resolving the path's other components again). Anything but a success or ENOENT
    /// (gone) is opened again from the root by [`Self::open_dir`], which names what was in the
    /// way; so is everything where the kernel has no `openat2`.
    pub(crate) fn open_child_dir(
        &self,
        parent: &OwnedFd,
        cgroup: &CgroupPath,
    ) -> Result<OwnedFd, CgroupError> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let opened = cgroup
            .name()
            .and_then(|name| open_name_beneath(parent, name, flags));
        match opened {
            Some(Ok(fd)) => Ok(fd),
            Some(Err(Errno::ENOENT)) => Err(CgroupError::Read {
                path: self.host_path(cgroup),
                source: io::Error::from(Errno::ENOENT),
            }),
            _ => self.open_dir(cgroup),
        }
    }

    /// Reads the interface file `file` of `cgroup`, whose directory or whose parent's is open
    /// (`at`): one `openat2` beneath that directory (no symlink, no mount point,
    /// `O_NONBLOCK`) of the file's name or of `<cgroup's name>/<file>`, one `read(2)` (see
    /// [`Self::read_fd`]), `close`. Checked with `fstat` to be a regular file, as
    /// [`Self::read_in`] does, except where that is known already: on kernfs (a directory
    /// opened without crossing a mount below a kernfs root is on kernfs, and there a name is a
    /// directory, a regular file or a symlink and nothing else: no `mknod`, no FIFO; the open
    /// refuses a symlink and `read` a directory, EISDIR), and when `listed_regular` (the
    /// directory's listing, just read, says so). Anything but a success, ENOENT, ENODEV (gone)
    /// or EXDEV (a mount point, refused) is opened again by [`Self::read_in`], which names
    /// what was in the way; so is everything where the kernel has no `openat2`.
    pub(crate) fn read_beneath(
        &self,
        at: FileAt<'_>,
        cgroup: &CgroupPath,
        file: InterfaceFile,
        listed_regular: bool,
    ) -> Result<String, CgroupError> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let opened = match at {
            FileAt::Dir(dir) => open_name_beneath(dir, std::ffi::OsStr::new(file.name()), flags),
            FileAt::Parent(parent) => cgroup.name().and_then(|name| {
                let mut below = name.to_os_string();
                below.push("/");
                below.push(file.name());
                open_name_beneath(parent, &below, flags)
            }),
        };
        let fd = match opened {
            Some(Ok(fd)) => fd,
            Some(Err(errno @ (Errno::ENOENT | Errno::ENODEV))) => {
                return Err(CgroupError::Read {
                    path: self.file_path(cgroup, file),
                    source: io::Error::from(errno),
                })
            }
            Some(Err(Errno::EXDEV)) => {
                return Err(CgroupError::Refused {
                    path: self.file_path(cgroup, file),
                    value: None,
                    reason: Refusal::MountPoint,
                })
            }
            _ => {
                return match at {
                    FileAt::Dir(dir) => self.read_in(dir, cgroup, file),
                    FileAt::Parent(_) => self.read(cgroup, file),
                }
            }
        };
        if !self.kernfs && !listed_regular {
            let stat = fstat(&fd).map_err(|errno| CgroupError::Read {
                path: self.file_path(cgroup, file),
                source: io::Error::from(errno),
            })?;
            match FileKind::of_stat(&stat) {
                FileKind::RegularFile => {}
                kind => {
                    return Err(CgroupError::Refused {
                        path: self.file_path(cgroup, file),
                        value: None,
                        reason: Refusal::NotRegularFile { kind },
                    })
                }
            }
        }
        self.read_fd(fd, cgroup, file)
    }

    /// Opens the directory `cgroup` below the root, never following a symlink: one
    /// `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` where the kernel has it (Linux ≥ 5.6),
    /// else (and to name what was refused) one `openat` per component.
    fn walk(&self, cgroup: &CgroupPath) -> Result<OwnedFd, WalkError> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match open_beneath(&self.root_fd, cgroup, flags) {
            Some(Ok(fd)) => return Ok(fd),
            // ENAMETOOLONG: a path past PATH_MAX (a deep chain of cgroups) is walked a
            // component at a time, which has no such limit.
            Some(Err(errno))
                if !matches!(errno, Errno::ELOOP | Errno::ENOTDIR | Errno::ENAMETOOLONG) =>
            {
                return Err(WalkError::Io(io::Error::from(errno)))
            }
            // Refused, or no openat2: walk, which says what was in the way.
            _ => {}
        }
        self.walk_components(cgroup)
    }

    /// [`Self::walk`] one component at a time.
    fn walk_components(&self, cgroup: &CgroupPath) -> Result<OwnedFd, WalkError> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mut current = reopen_dir(&self.root_fd, flags)
            .map_err(|errno| WalkError::Io(io::Error::from(errno)))?;
        let device = fstat(&current)
            .map_err(|errno| WalkError::Io(io::Error::from(errno)))?
            .st_dev;
        for name in cgroup.components() {
            current = match openat(&current, name, flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(errno @ (Errno::ELOOP | Errno::ENOTDIR)) => {
                    return Err(explain_refusal(&current, name, errno, false))
                }
                Err(errno) => return Err(WalkError::Io(io::Error::from(errno))),
            };
            // What openat2's RESOLVE_NO_XDEV refuses: a bind mount over a cgroup directory.
            let here = fstat(&current).map_err(|errno| WalkError::Io(io::Error::from(errno)))?;
            if here.st_dev != device {
                return Err(WalkError::Refused(Refusal::MountPoint));
            }
        }
        Ok(current)
    }
}

/// One `write(2)` of `value` to an opened interface file; a short write is refused.
fn write_value(fd: OwnedFd, path: &Path, value: &str) -> Result<(), CgroupError> {
    let refused = |reason| CgroupError::Refused {
        path: path.to_path_buf(),
        value: Some(value.to_string()),
        reason,
    };
    let written =
        nix::unistd::write(&fd, value.as_bytes()).map_err(|errno| CgroupError::Write {
            path: path.to_path_buf(),
            value: value.to_string(),
            source: io::Error::from(errno),
        })?;
    if written != value.len() {
        return Err(refused(Refusal::ShortWrite {
            written,
            len: value.len(),
        }));
    }
    Ok(())
}

/// Empties an interface file opened for writing (at `size` bytes) when `value` is shorter than
/// what it holds; a write of at least its length replaces all of it, so it is left as it is.
/// The file is opened without `O_TRUNC`: on kernfs (size `None`) the kernel takes the value
/// whole in one write whatever the file showed, and a truncation there does nothing but queue
/// an `IN_MODIFY` of its own, which the watcher would read back as a second echo of the write.
fn truncate_if_longer(
    fd: &OwnedFd,
    size: Option<i64>,
    path: &Path,
    value: &str,
) -> Result<(), CgroupError> {
    if size.is_none_or(|size| size <= value.len() as i64) {
        return Ok(());
    }
    nix::unistd::ftruncate(fd, 0).map_err(|errno| CgroupError::Write {
        path: path.to_path_buf(),
        value: value.to_string(),
        source: io::Error::from(errno),
    })
}

/// Whether `openat2` is known to be missing (`ENOSYS`: a kernel older than 5.6, or a seccomp
/// filter), so [`open_beneath`] stops trying.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// `openat2(dir, path, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
/// RESOLVE_NO_XDEV)`: `path` opened in one system call, refusing (`ELOOP`) a symlink in any
/// component, a mount point, and anything outside `dir`. `None` when the kernel has no `openat2`; the root itself for an empty path.
fn open_beneath(dir: &OwnedFd, path: &CgroupPath, flags: OFlag) -> Option<nix::Result<OwnedFd>> {
    if NO_OPENAT2.load(Ordering::Relaxed) {
        return None;
    }
    if path.is_root() {
        return Some(reopen_dir(dir, flags));
    }
    match openat2_beneath(dir, std::ffi::OsStr::from_bytes(path.as_bytes()), flags)? {
        // EXDEV: a mount point on the way (or outside `dir`, which a CgroupPath cannot be);
        // walked to say why.
        Err(Errno::EXDEV) => Some(Err(Errno::ELOOP)),
        other => Some(other),
    }
}

/// [`open_beneath`] of one directory entry `name` of `dir`; EXDEV (a mount point) is returned
/// as it is.
fn open_name_beneath(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    flags: OFlag,
) -> Option<nix::Result<OwnedFd>> {
    if NO_OPENAT2.load(Ordering::Relaxed) {
        return None;
    }
    openat2_beneath(dir, name, flags)
}

/// The `openat2` of [`open_beneath`]; `None` (remembered) when the kernel has none.
fn openat2_beneath(
    dir: &OwnedFd,
    path: &std::ffi::OsStr,
    flags: OFlag,
) -> Option<nix::Result<OwnedFd>> {
    let how = OpenHow::new().flags(flags).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS
            | ResolveFlag::RESOLVE_NO_XDEV,
    );
    match openat2(dir, path, how) {
        Err(Errno::ENOSYS) | Err(Errno::EPERM) if !NO_OPENAT2.swap(true, Ordering::Relaxed) => {
            log::debug!("no openat2: cgroup paths are walked one component at a time");
            None
        }
        Err(Errno::ENOSYS) => None,
        other => Some(other),
    }
}

/// Opens a regular file in `dir` without following symlinks, without crossing a mount (a file
/// bind-mounted over the name: `openat2`'s `RESOLVE_NO_XDEV`, else an `st_dev` check against
/// `dir`) and without blocking on a FIFO.
fn open_regular(dir: &OwnedFd, name: &str, mode: OFlag) -> Result<OwnedFd, WalkError> {
    let flags = mode | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let (opened, beneath) = match open_name_beneath(dir, name.as_ref(), flags) {
        Some(Err(Errno::EXDEV)) => return Err(WalkError::Refused(Refusal::MountPoint)),
        Some(opened) => (opened, true),
        None => (openat(dir, name, flags, Mode::empty()), false),
    };
    let fd = match opened {
        Ok(fd) => fd,
        // ELOOP: a symlink; ENXIO: a FIFO without a reader opened for writing.
        Err(errno @ (Errno::ELOOP | Errno::ENXIO | Errno::EISDIR)) => {
            return Err(explain_refusal(dir, name.as_ref(), errno, true))
        }
        Err(errno) => return Err(WalkError::Io(io::Error::from(errno))),
    };
    let stat = fstat(&fd).map_err(|errno| WalkError::Io(io::Error::from(errno)))?;
    if !beneath {
        let dir_dev = fstat(dir)
            .map_err(|errno| WalkError::Io(io::Error::from(errno)))?
            .st_dev;
        if stat.st_dev != dir_dev {
            return Err(WalkError::Refused(Refusal::MountPoint));
        }
    }
    match FileKind::of_stat(&stat) {
        FileKind::RegularFile => Ok(fd),
        kind => Err(WalkError::Refused(Refusal::NotRegularFile { kind })),
    }
}

/// Turns an `openat` failure into a refusal naming what was really there, when `lstat` can tell.
fn explain_refusal(
    dir: &OwnedFd,
    name: &std::ffi::OsStr,
    errno: Errno,
    want_file: bool,
) -> WalkError {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) => match FileKind::of_stat(&stat) {
            FileKind::Symlink => WalkError::Refused(Refusal::Symlink),
            FileKind::RegularFile if !want_file => WalkError::Refused(Refusal::NotADirectory {
                kind: FileKind::RegularFile,
            }),
            kind if want_file && kind != FileKind::RegularFile => {
                WalkError::Refused(Refusal::NotRegularFile { kind })
            }
            kind if !want_file && kind != FileKind::Directory => {
                WalkError::Refused(Refusal::NotADirectory { kind })
            }
            _ => WalkError::Io(io::Error::from(errno)),
        },
        Err(_) => WalkError::Io(io::Error::from(errno)),
    }
}

/// A new open of the directory `dir` itself (`.`), with its own offset: a listing reads from
/// its descriptor's offset, which a `dup` would share with `dir` (and with every listing of it).
fn reopen_dir(dir: &OwnedFd, flags: OFlag) -> nix::Result<OwnedFd> {
    openat(dir, ".", flags, Mode::empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn tree() -> (tempfile::TempDir, CgroupFs) {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("kubepods/pod1")).unwrap();
        fs::write(dir.path().join("kubepods/cpuset.cpus"), "0-3\n").unwrap();
        fs::write(dir.path().join("kubepods/pod1/cpuset.cpus"), "\n").unwrap();
        let fs = CgroupFs::open(dir.path()).unwrap();
        (dir, fs)
    }

    fn path(text: &str) -> CgroupPath {
        CgroupPath::new(text).unwrap()
    }

    #[test]
    fn interface_file_names_are_unique_and_round_trip() {
        for file in InterfaceFile::ALL {
            assert_eq!(InterfaceFile::from_name(file.name()), Some(file));
        }
        assert_eq!(InterfaceFile::from_name("cpuset.cpu"), None);
    }

    #[test]
    fn read_trims_the_trailing_newline() {
        let (_dir, fs) = tree();
        let value = fs
            .read(&path("kubepods"), InterfaceFile::CpusetCpus)
            .unwrap();
        assert_eq!(value, "0-3");
        let empty = fs
            .read(&path("kubepods/pod1"), InterfaceFile::CpusetCpus)
            .unwrap();
        assert_eq!(empty, "");
    }

    #[test]
    fn write_truncates_and_never_creates() {
        let (dir, fs) = tree();
        fs.write(&path("kubepods"), InterfaceFile::CpusetCpus, "1")
            .unwrap();
        let on_disk = fs::read_to_string(dir.path().join("kubepods/cpuset.cpus")).unwrap();
        assert_eq!(on_disk, "1");

        let err = fs
            .write(&path("kubepods"), InterfaceFile::CpusetMems, "0")
            .unwrap_err();
        assert!(err.is_gone(), "{err}");
        assert!(!dir.path().join("kubepods/cpuset.mems").exists());
        assert!(err.to_string().contains("cannot write \"0\""), "{err}");
        assert!(err.to_string().contains("kubepods/cpuset.mems"), "{err}");
    }

    #[test]
    fn a_cgroup_removed_after_its_file_was_opened_is_gone() {
        // What cgroupfs answers a write to an open file of a removed cgroup.
        let err = CgroupError::Write {
            path: "/sys/fs/cgroup/cpuset/kubepods/pod1/cpuset.cpus".into(),
            value: "1".into(),
            source: io::Error::from_raw_os_error(Errno::ENODEV as i32),
        };
        assert!(err.is_gone());
        let err = CgroupError::Write {
            path: "/sys/fs/cgroup/cpuset/kubepods/pod1/cpuset.cpus".into(),
            value: "1".into(),
            source: io::Error::from_raw_os_error(Errno::EBUSY as i32),
        };
        assert!(!err.is_gone());
    }

    #[test]
    fn a_missing_cgroup_is_gone() {
        let (_dir, fs) = tree();
        let err = fs
            .read(&path("kubepods/pod2"), InterfaceFile::CpusetCpus)
            .unwrap_err();
        assert!(err.is_gone(), "{err:?}");
        assert_eq!(err.errno(), Some(Errno::ENOENT as i32));
        assert!(!fs.exists(&path("kubepods/pod2")));
        assert!(fs.exists(&path("kubepods/pod1")));
    }

    #[test]
    fn symlinked_directories_and_files_are_refused() {
        let (dir, fs) = tree();
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("cpuset.cpus"), "7\n").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("kubepods/evil")).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("cpuset.cpus"),
            dir.path().join("kubepods/pod1/cpuset.mems"),
        )
        .unwrap();

        let err = fs
            .read(&path("kubepods/evil"), InterfaceFile::CpusetCpus)
            .unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::Refused {
                    reason: Refusal::Symlink,
                    ..
                }
            ),
            "{err:?}"
        );
        let err = fs
            .write(&path("kubepods/evil"), InterfaceFile::CpusetCpus, "0")
            .unwrap_err();
        assert!(
            matches!(&err, CgroupError::Refused { reason: Refusal::Symlink, value: Some(v), .. } if v == "0"),
            "{err:?}"
        );
        let err = fs
            .write(&path("kubepods/pod1"), InterfaceFile::CpusetMems, "0")
            .unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::Refused {
                    reason: Refusal::Symlink,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            fs::read_to_string(outside.path().join("cpuset.cpus")).unwrap(),
            "7\n"
        );
    }

    #[test]
    fn a_file_in_place_of_a_directory_is_refused() {
        let (dir, fs) = tree();
        fs::write(dir.path().join("kubepods/notdir"), "").unwrap();
        let err = fs
            .read(&path("kubepods/notdir"), InterfaceFile::CpusetCpus)
            .unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::Refused {
                    reason: Refusal::NotADirectory { .. },
                    ..
                }
            ),
            "{err:?}"
        );
        let err = fs
            .read(&path("kubepods"), InterfaceFile::CgroupProcs)
            .unwrap_err();
        assert!(err.is_gone());
        fs::create_dir(dir.path().join("kubepods/cgroup.procs")).unwrap();
        let err = fs
            .read(&path("kubepods"), InterfaceFile::CgroupProcs)
            .unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::Refused {
                    reason: Refusal::NotRegularFile {
                        kind: FileKind::Directory
                    },
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_write_leaves_a_plain_file_holding_exactly_the_value() {
        // No O_TRUNC: a value at least as long overwrites all of it, a shorter one empties the
        // file first.
        let (dir, fs) = tree();
        let file = dir.path().join("kubepods/cpuset.cpus");
        for value in ["0-3,5-9", "0-3,5-8", "1", "", "2-255"] {
            fs.write(&path("kubepods"), InterfaceFile::CpusetCpus, value)
                .unwrap();
            assert_eq!(fs::read_to_string(&file).unwrap(), value);
        }
    }

    /// A file bind-mounted over an interface file is never read nor written, by the one-call
    /// open, the walk (`read`, and the write's fallback) or the scan's open beneath a
    /// directory. The walk's open of the file once crossed it (`openat` of the name).
    #[test]
    fn a_bind_mount_over_an_interface_file_is_never_crossed() {
        if !nix::unistd::Uid::effective().is_root() {
            println!("skipped: mounting needs root");
            return;
        }
        let (dir, fs) = tree();
        let outside = tempfile::tempdir().unwrap();
        let decoy = outside.path().join("cpuset.cpus");
        fs::write(&decoy, "7\n").unwrap();
        let target = dir.path().join("kubepods/pod1/cpuset.cpus");
        let mounted = std::process::Command::new("mount")
            .arg("--bind")
            .arg(&decoy)
            .arg(&target)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            println!("skipped: cannot bind-mount here");
            return;
        }
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&self.0)
                    .status();
            }
        }
        let _unmount = Unmount(target);
        let pod = path("kubepods/pod1");
        let refused = |err: &CgroupError| {
            matches!(
                err,
                CgroupError::Refused {
                    reason: Refusal::MountPoint,
                    ..
                }
            )
        };
        let dir_fd = fs.open_dir(&pod).unwrap();
        let parent_fd = fs.open_dir(&path("kubepods")).unwrap();
        for read in [
            fs.read(&pod, InterfaceFile::CpusetCpus),
            fs.read_file(&pod, InterfaceFile::CpusetCpus),
            fs.read_beneath(FileAt::Dir(&dir_fd), &pod, InterfaceFile::CpusetCpus, true),
            fs.read_beneath(
                FileAt::Parent(&parent_fd),
                &pod,
                InterfaceFile::CpusetCpus,
                false,
            ),
        ] {
            let err = read.expect_err("read across a mount");
            assert!(refused(&err), "{err:?}");
        }
        let err = fs
            .write(&pod, InterfaceFile::CpusetCpus, "0")
            .expect_err("wrote across a mount");
        assert!(refused(&err), "{err:?}");
        assert_eq!(fs::read_to_string(&decoy).unwrap(), "7\n");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let (dir, fs) = tree();
        let fifo = dir.path().join("kubepods/pod1/cpuset.mems");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
        let err = fs
            .read(&path("kubepods/pod1"), InterfaceFile::CpusetMems)
            .unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::Refused {
                    reason: Refusal::NotRegularFile {
                        kind: FileKind::Fifo
                    },
                    ..
                }
            ),
            "{err:?}"
        );
        let err = fs
            .write(&path("kubepods/pod1"), InterfaceFile::CpusetMems, "0")
            .unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::Refused {
                    reason: Refusal::NotRegularFile {
                        kind: FileKind::Fifo
                    },
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn oversized_files_are_refused() {
        let (dir, fs) = tree();
        fs::write(
            dir.path().join("kubepods/cgroup.procs"),
            vec![b'1'; MAX_READ_BYTES + 1],
        )
        .unwrap();
        let err = fs
            .read(&path("kubepods"), InterfaceFile::CgroupProcs)
            .unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::Refused {
                    reason: Refusal::TooLarge { .. },
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn list_reports_kinds_sorted_and_without_dots() {
        let (dir, fs) = tree();
        std::os::unix::fs::symlink("/", dir.path().join("kubepods/link")).unwrap();
        let entries = fs.list(&path("kubepods")).unwrap();
        let shown: Vec<_> = entries
            .iter()
            .map(|e| (e.name.to_str().unwrap(), e.kind))
            .collect();
        assert_eq!(
            shown,
            [
                ("cpuset.cpus", FileKind::RegularFile),
                ("link", FileKind::Symlink),
                ("pod1", FileKind::Directory),
            ]
        );
    }

    #[test]
    fn the_root_lists_the_same_every_time() {
        // A listing reads from its descriptor's offset: the root's must not be shared.
        let (_dir, fs) = tree();
        let first = fs.list(&CgroupPath::root()).unwrap();
        assert_eq!(first.len(), 1, "{first:?}");
        assert_eq!(fs.list(&CgroupPath::root()).unwrap(), first);
        assert_eq!(fs.list(&path("kubepods")).unwrap().len(), 2);
        assert_eq!(fs.list(&path("kubepods")).unwrap().len(), 2);
    }

    #[test]
    fn a_missing_root_names_the_root() {
        let err = CgroupFs::open("/nonexistent/cgroup/root").unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/cgroup/root"),
            "{err}"
        );
        assert!(err.is_gone());
    }
}
