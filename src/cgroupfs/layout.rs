//! Where the cgroup hierarchy is and what it looks like: cgroup v1 or v2, the kubelet's cgroup
//! driver, the controller roots and the kubepods cgroup. Detected once at start and handed to
//! everything else as the plain value [`CgroupLayout`].
//!
//! Without an explicit root, the mounts come from `<proc>/self/mountinfo`: cgroup v1 when a
//! `cgroup` mount carries the `cpuset` controller (the `cpu` controller may be its own mount or
//! share one with `cpuacct`), else v2 when a `cgroup2` mount lists `cpuset` in its
//! `cgroup.controllers`. With `--cgroup-root DIR` (fake trees on tmpfs have no mountinfo entry),
//! `DIR/cpuset/` means v1 with the controllers mounted side by side, `DIR/cgroup.controllers`
//! means v2. The kubepods cgroup is `kubepods` (cgroupfs driver) or `kubepods.slice` (systemd
//! driver) under the cpuset root unless `--kubepods-path` names it; the driver follows from its
//! name unless `--cgroup-driver` is given.

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::path::CgroupPath;

/// Directory names of the kubepods cgroup per driver.
pub const KUBEPODS_CGROUPFS: &str = "kubepods";
pub const KUBEPODS_SYSTEMD: &str = "kubepods.slice";

/// v1 directory names under a cgroup root that hold the `cpu` controller, in order of preference.
const V1_CPU_DIRS: [&str; 3] = ["cpu,cpuacct", "cpu", "cpuacct,cpu"];

/// cgroup v1 (one hierarchy per controller) or v2 (one unified hierarchy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupVersion {
    V1,
    V2,
}

impl fmt::Display for CgroupVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupVersion::V1 => "v1",
            CgroupVersion::V2 => "v2",
        })
    }
}

/// The kubelet's `--cgroup-driver`, which decides how pod and container cgroups are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

impl CgroupDriver {
    /// The kubepods directory name kubelet uses with this driver.
    pub const fn kubepods_name(self) -> &'static str {
        match self {
            CgroupDriver::Cgroupfs => KUBEPODS_CGROUPFS,
            CgroupDriver::Systemd => KUBEPODS_SYSTEMD,
        }
    }

    /// The driver a kubepods directory name implies: systemd for `*.slice`.
    pub fn of_kubepods(kubepods: &CgroupPath) -> CgroupDriver {
        let systemd = kubepods
            .name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(".slice"));
        if systemd {
            CgroupDriver::Systemd
        } else {
            CgroupDriver::Cgroupfs
        }
    }
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        })
    }
}

impl FromStr for CgroupDriver {
    type Err = LayoutError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cgroupfs" => Ok(CgroupDriver::Cgroupfs),
            "systemd" => Ok(CgroupDriver::Systemd),
            _ => Err(LayoutError::UnknownDriver {
                text: s.to_string(),
            }),
        }
    }
}

/// The detected (or configured) cgroup layout. Plain data, decided once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLayout {
    pub version: CgroupVersion,
    pub driver: CgroupDriver,
    /// Where `cpuset.*` files live: the v1 cpuset mount or the v2 unified root.
    pub cpuset_root: PathBuf,
    /// Where `cpu.*` files live: the v1 cpu controller mount (maybe `cpu,cpuacct`, maybe the
    /// same as the cpuset mount) or the v2 unified root.
    pub cpu_root: PathBuf,
    /// The kubepods cgroup, relative to each controller root.
    pub kubepods: CgroupPath,
}

/// What the command line fixed; `None` fields are detected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutConfig {
    /// `--proc-root`: where `self/mountinfo` is read when `cgroup_root` is not given.
    pub proc_root: PathBuf,
    /// `--cgroup-root`: v1, the folder holding the controller mounts; v2, the unified root.
    pub cgroup_root: Option<PathBuf>,
    /// `--cgroup-driver`.
    pub driver: Option<CgroupDriver>,
    /// `--kubepods-path`, relative to the root (to each controller's mount on v1).
    pub kubepods: Option<CgroupPath>,
}

/// Why the layout could not be determined; each message says what to pass instead.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("cannot read {path} to find the cgroup mounts: pass --cgroup-root")]
    Mountinfo {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no cgroup v1 cpuset mount and no cgroup v2 mount with the cpuset controller in {mountinfo}: pass --cgroup-root")]
    NoCpusetMount { mountinfo: PathBuf },
    #[error("the cgroup v1 cpuset controller is mounted but the cpu controller is not (in {mountinfo}): pass --cgroup-root")]
    NoCpuMount { mountinfo: PathBuf },
    #[error("no cpuset controller found under {root}: expected {root}/cpuset/cpuset.cpus (cgroup v1) or {root}/cgroup.controllers (cgroup v2); pass --cgroup-root")]
    NoCpusetUnderRoot { root: PathBuf },
    #[error("no cpu controller found under {root}: expected one of cpu,cpuacct, cpu or cpuacct,cpu holding cpu.shares; pass --cgroup-root")]
    NoCpuUnderRoot { root: PathBuf },
    #[error("the cgroup v2 tree at {root} lacks the cpuset controller (cgroup.controllers: {controllers:?}): enable it with `echo +cpuset > {root}/cgroup.subtree_control`")]
    V2WithoutCpuset { root: PathBuf, controllers: String },
    #[error("cannot read {path}")]
    Controllers {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no kubepods cgroup under {root} (looked for {looked_for}): is kubelet running? Otherwise pass --kubepods-path")]
    KubepodsNotFound { root: PathBuf, looked_for: String },
    #[error("both kubepods and kubepods.slice exist under {root}: pass --cgroup-driver or --kubepods-path")]
    KubepodsAmbiguous { root: PathBuf },
    #[error("kubepods path {kubepods} is named for the {implied} driver but --cgroup-driver {driver} was given")]
    DriverMismatch {
        kubepods: CgroupPath,
        implied: CgroupDriver,
        driver: CgroupDriver,
    },
    #[error("the kubepods cgroup {kubepods:?} is the cgroup root {root} itself: every cgroup on the host would be taken for a pod's; pass --kubepods-path naming kubelet's kubepods cgroup (kubepods.slice or kubepods)")]
    KubepodsIsRoot { root: PathBuf, kubepods: String },
    #[error("unknown cgroup driver {text:?}: expected cgroupfs or systemd")]
    UnknownDriver { text: String },
}

/// One line of `/proc/<pid>/mountinfo` (see proc(5)); paths unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The directory of the mounted filesystem that is mounted here (`/` for a whole hierarchy).
    pub root: PathBuf,
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub super_options: Vec<String>,
}

impl MountEntry {
    fn has_option(&self, option: &str) -> bool {
        self.super_options.iter().any(|o| o == option)
    }
}

/// Parses mountinfo text; lines that are not in the documented format are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines().filter_map(parse_mountinfo_line).collect()
}

fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    // id parent major:minor root mount-point options [optional fields...] - fstype source super
    let fields: Vec<&str> = line.split(' ').collect();
    let separator = fields.iter().position(|f| *f == "-")?;
    if separator < 6 || fields.len() < separator + 4 {
        return None;
    }
    Some(MountEntry {
        root: PathBuf::from(unescape(fields[3])),
        mount_point: PathBuf::from(unescape(fields[4])),
        fs_type: fields[separator + 1].to_string(),
        super_options: fields[separator + 3]
            .split(',')
            .map(str::to_string)
            .collect(),
    })
}

/// Undoes the kernel's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` `\`).
fn unescape(field: &str) -> OsString {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let digits = &bytes[i + 1..i + 4];
            if digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                if let Ok(byte) = u8::try_from(value) {
                    out.push(byte);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    OsString::from_vec(out)
}

/// Determines the layout from the configuration, the filesystem and mountinfo.
pub fn detect_layout(config: &LayoutConfig) -> Result<CgroupLayout, LayoutError> {
    let (version, cpuset_root, cpu_root) = match &config.cgroup_root {
        Some(root) => probe_root(root)?,
        None => from_mountinfo(&config.proc_root)?,
    };
    let kubepods = match &config.kubepods {
        Some(path) => path.clone(),
        None => find_kubepods(&cpuset_root, config.driver)?,
    };
    // The root itself (an empty path, or a directory that resolves to the root) would make
    // every cgroup on the host a pod's and `reset` widen the host's cpusets.
    let resolved = |p: &Path| fs::canonicalize(p).ok();
    if kubepods.is_root()
        || resolved(&kubepods.under(&cpuset_root))
            .is_some_and(|k| Some(k) == resolved(&cpuset_root))
    {
        return Err(LayoutError::KubepodsIsRoot {
            root: cpuset_root,
            kubepods: kubepods.to_string(),
        });
    }
    let implied = CgroupDriver::of_kubepods(&kubepods);
    let driver = match config.driver {
        Some(driver) if driver != implied && config.kubepods.is_some() => {
            return Err(LayoutError::DriverMismatch {
                kubepods,
                implied,
                driver,
            })
        }
        Some(driver) => driver,
        None => implied,
    };
    if version == CgroupVersion::V1 && !kubepods.under(&cpu_root).is_dir() {
        log::warn!(
            "kubepods cgroup {} is missing under the cpu controller root {}: cpu settings cannot be read",
            kubepods,
            cpu_root.display()
        );
    }
    let layout = CgroupLayout {
        version,
        driver,
        cpuset_root,
        cpu_root,
        kubepods,
    };
    log::info!(
        "cgroup layout: {} driver={} cpuset={} cpu={} kubepods={}",
        layout.version,
        layout.driver,
        layout.cpuset_root.display(),
        layout.cpu_root.display(),
        layout.kubepods
    );
    Ok(layout)
}

/// v1 or v2 below an explicitly given root.
fn probe_root(root: &Path) -> Result<(CgroupVersion, PathBuf, PathBuf), LayoutError> {
    let cpuset = root.join("cpuset");
    if cpuset.join("cpuset.cpus").is_file() {
        let cpu = V1_CPU_DIRS
            .iter()
            .map(|name| root.join(name))
            .chain([cpuset.clone()])
            .find(|dir| dir.join("cpu.shares").is_file())
            .ok_or_else(|| LayoutError::NoCpuUnderRoot {
                root: root.to_path_buf(),
            })?;
        return Ok((CgroupVersion::V1, cpuset, cpu));
    }
    let controllers_file = root.join("cgroup.controllers");
    if controllers_file.is_file() {
        let controllers =
            crate::bounded::read_file(&controllers_file, crate::bounded::KERNEL_FILE_LIMIT)
                .map_err(|source| LayoutError::Controllers {
                    path: controllers_file.clone(),
                    source,
                })?;
        if !controllers.split_ascii_whitespace().any(|c| c == "cpuset") {
            return Err(LayoutError::V2WithoutCpuset {
                root: root.to_path_buf(),
                controllers: controllers.trim().to_string(),
            });
        }
        return Ok((CgroupVersion::V2, root.to_path_buf(), root.to_path_buf()));
    }
    Err(LayoutError::NoCpusetUnderRoot {
        root: root.to_path_buf(),
    })
}

/// v1 or v2 from `<proc>/self/mountinfo`.
fn from_mountinfo(proc_root: &Path) -> Result<(CgroupVersion, PathBuf, PathBuf), LayoutError> {
    let path = proc_root.join("self/mountinfo");
    // Thousands of mounts (a container host) are some 150 bytes each.
    let text =
        crate::bounded::read_file(&path, 16 << 20).map_err(|source| LayoutError::Mountinfo {
            path: path.clone(),
            source,
        })?;
    let mounts = parse_mountinfo(&text);
    // A whole hierarchy (root "/") is preferred over a bind mount of part of one.
    let best = |wanted: &dyn Fn(&MountEntry) -> bool| -> Option<PathBuf> {
        let mut candidates: Vec<&MountEntry> = mounts.iter().filter(|m| wanted(m)).collect();
        candidates.sort_by_key(|m| m.root != Path::new("/"));
        candidates.first().map(|m| m.mount_point.clone())
    };
    if let Some(cpuset) = best(&|m| m.fs_type == "cgroup" && m.has_option("cpuset")) {
        let cpu = best(&|m| m.fs_type == "cgroup" && m.has_option("cpu")).ok_or_else(|| {
            LayoutError::NoCpuMount {
                mountinfo: path.clone(),
            }
        })?;
        return Ok((CgroupVersion::V1, cpuset, cpu));
    }
    let unified = best(&|m| {
        m.fs_type == "cgroup2"
            && crate::bounded::read_file(
                &m.mount_point.join("cgroup.controllers"),
                crate::bounded::KERNEL_FILE_LIMIT,
            )
            .is_ok_and(|c| c.split_ascii_whitespace().any(|c| c == "cpuset"))
    });
    match unified {
        Some(root) => Ok((CgroupVersion::V2, root.clone(), root)),
        None => Err(LayoutError::NoCpusetMount { mountinfo: path }),
    }
}

/// `kubepods` or `kubepods.slice` directly under the cpuset root.
fn find_kubepods(
    cpuset_root: &Path,
    driver: Option<CgroupDriver>,
) -> Result<CgroupPath, LayoutError> {
    let candidates: Vec<CgroupDriver> = match driver {
        Some(driver) => vec![driver],
        None => vec![CgroupDriver::Systemd, CgroupDriver::Cgroupfs],
    };
    let found: Vec<&CgroupDriver> = candidates
        .iter()
        .filter(|d| {
            fs::symlink_metadata(cpuset_root.join(d.kubepods_name())).is_ok_and(|m| m.is_dir())
        })
        .collect();
    match found.as_slice() {
        [one] => Ok(CgroupPath::new(one.kubepods_name()).expect("constant names are valid")),
        [] => Err(LayoutError::KubepodsNotFound {
            root: cpuset_root.to_path_buf(),
            looked_for: candidates
                .iter()
                .map(|d| d.kubepods_name())
                .collect::<Vec<_>>()
                .join(" and "),
        }),
        _ => Err(LayoutError::KubepodsAmbiguous {
            root: cpuset_root.to_path_buf(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_V1: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const COMOUNTED_V1: &str = "\
25 24 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,cpu,cpuacct
31 25 0:28 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,cpuset
";

    fn fake_proc(mountinfo: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("self")).unwrap();
        fs::write(dir.path().join("self/mountinfo"), mountinfo).unwrap();
        dir
    }

    #[test]
    fn parses_mountinfo_with_optional_fields_and_escapes() {
        let mounts = parse_mountinfo(COMOUNTED_V1);
        assert_eq!(mounts.len(), 3);
        assert_eq!(
            mounts[1].mount_point,
            Path::new("/sys/fs/cgroup/cpu,cpuacct")
        );
        assert_eq!(mounts[1].fs_type, "cgroup");
        assert_eq!(mounts[1].super_options, ["rw", "cpu", "cpuacct"]);

        let escaped = "36 35 98:0 /a\\134b /mnt/with\\040space\\012nl rw - cgroup2 none rw\n\
                       garbage line\n\
                       1 2 3:4 / /x rw -\n";
        let mounts = parse_mountinfo(escaped);
        assert_eq!(mounts.len(), 1);
        assert_eq!(mounts[0].root, Path::new("/a\\b"));
        assert_eq!(mounts[0].mount_point, Path::new("/mnt/with space\nnl"));
        assert_eq!(unescape("\\777x"), OsString::from("\\777x"));
        assert_eq!(unescape("end\\04"), OsString::from("end\\04"));
    }

    #[test]
    fn finds_separate_cpu_and_cpuset_mounts() {
        let proc = fake_proc(HYBRID_V1);
        let (version, cpuset, cpu) = from_mountinfo(proc.path()).unwrap();
        assert_eq!(version, CgroupVersion::V1);
        assert_eq!(cpuset, Path::new("/sys/fs/cgroup/cpuset"));
        assert_eq!(cpu, Path::new("/sys/fs/cgroup/cpu"));
    }

    #[test]
    fn finds_a_comounted_cpu_cpuacct() {
        let proc = fake_proc(COMOUNTED_V1);
        let (_, _, cpu) = from_mountinfo(proc.path()).unwrap();
        assert_eq!(cpu, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
    }

    #[test]
    fn finds_v2_by_its_controllers() {
        let tree = tempfile::tempdir().unwrap();
        let without = tree.path().join("unified");
        let with = tree.path().join("cg2");
        fs::create_dir_all(&without).unwrap();
        fs::create_dir_all(&with).unwrap();
        fs::write(without.join("cgroup.controllers"), "\n").unwrap();
        fs::write(
            with.join("cgroup.controllers"),
            "cpuset cpu io memory pids\n",
        )
        .unwrap();
        let mountinfo = format!(
            "1 0 0:1 / {} rw - cgroup2 cgroup2 rw\n2 0 0:2 / {} rw - cgroup2 cgroup2 rw\n",
            without.display(),
            with.display()
        );
        let proc = fake_proc(&mountinfo);
        let (version, cpuset, cpu) = from_mountinfo(proc.path()).unwrap();
        assert_eq!(version, CgroupVersion::V2);
        assert_eq!(cpuset, with);
        assert_eq!(cpu, with);
    }

    #[test]
    fn mountinfo_without_cpuset_asks_for_the_root() {
        let proc = fake_proc("1 0 0:1 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
        let err = from_mountinfo(proc.path()).unwrap_err();
        assert!(err.to_string().contains("pass --cgroup-root"), "{err}");
        let err = from_mountinfo(Path::new("/nonexistent")).unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/self/mountinfo"),
            "{err}"
        );
        let proc = fake_proc("34 31 0:31 / /cg/cpuset rw - cgroup cgroup rw,cpuset\n");
        let err = from_mountinfo(proc.path()).unwrap_err();
        assert!(matches!(err, LayoutError::NoCpuMount { .. }), "{err}");
    }

    #[test]
    fn probes_an_explicit_v1_root() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("cpuset/kubepods")).unwrap();
        fs::write(root.path().join("cpuset/cpuset.cpus"), "0-3\n").unwrap();
        let err = probe_root(root.path()).unwrap_err();
        assert!(matches!(err, LayoutError::NoCpuUnderRoot { .. }), "{err}");
        fs::create_dir_all(root.path().join("cpu")).unwrap();
        fs::write(root.path().join("cpu/cpu.shares"), "1024\n").unwrap();
        let (version, cpuset, cpu) = probe_root(root.path()).unwrap();
        assert_eq!(version, CgroupVersion::V1);
        assert_eq!(cpuset, root.path().join("cpuset"));
        assert_eq!(cpu, root.path().join("cpu"));
        fs::create_dir_all(root.path().join("cpu,cpuacct")).unwrap();
        fs::write(root.path().join("cpu,cpuacct/cpu.shares"), "1024\n").unwrap();
        let (_, _, cpu) = probe_root(root.path()).unwrap();
        assert_eq!(cpu, root.path().join("cpu,cpuacct"));
    }

    #[test]
    fn probes_an_explicit_v2_root() {
        let root = tempfile::tempdir().unwrap();
        let err = probe_root(root.path()).unwrap_err();
        assert!(
            err.to_string().contains("no cpuset controller found under"),
            "{err}"
        );
        fs::write(root.path().join("cgroup.controllers"), "cpu io memory\n").unwrap();
        let err = probe_root(root.path()).unwrap_err();
        assert!(err.to_string().contains("echo +cpuset"), "{err}");
        fs::write(root.path().join("cgroup.controllers"), "cpuset cpu\n").unwrap();
        let (version, cpuset, _) = probe_root(root.path()).unwrap();
        assert_eq!(version, CgroupVersion::V2);
        assert_eq!(cpuset, root.path());
    }

    #[test]
    fn kubepods_and_driver_are_found_or_overridden() {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("cgroup.controllers"), "cpuset cpu\n").unwrap();
        let config = LayoutConfig {
            proc_root: PathBuf::from("/nonexistent"),
            cgroup_root: Some(root.path().to_path_buf()),
            driver: None,
            kubepods: None,
        };
        let err = detect_layout(&config).unwrap_err();
        assert!(err.to_string().contains("--kubepods-path"), "{err}");

        fs::create_dir(root.path().join("kubepods.slice")).unwrap();
        let layout = detect_layout(&config).unwrap();
        assert_eq!(layout.driver, CgroupDriver::Systemd);
        assert_eq!(layout.kubepods.to_str(), Some("kubepods.slice"));

        fs::create_dir(root.path().join("kubepods")).unwrap();
        let err = detect_layout(&config).unwrap_err();
        assert!(
            matches!(err, LayoutError::KubepodsAmbiguous { .. }),
            "{err}"
        );

        let by_driver = LayoutConfig {
            driver: Some(CgroupDriver::Cgroupfs),
            ..config.clone()
        };
        let layout = detect_layout(&by_driver).unwrap();
        assert_eq!(layout.kubepods.to_str(), Some("kubepods"));

        let explicit = LayoutConfig {
            kubepods: Some(CgroupPath::new("kubelet.slice/kubelet-kubepods.slice").unwrap()),
            ..config.clone()
        };
        let layout = detect_layout(&explicit).unwrap();
        assert_eq!(layout.driver, CgroupDriver::Systemd);

        let mismatch = LayoutConfig {
            kubepods: Some(CgroupPath::new("kubepods").unwrap()),
            driver: Some(CgroupDriver::Systemd),
            ..config
        };
        let err = detect_layout(&mismatch).unwrap_err();
        assert!(matches!(err, LayoutError::DriverMismatch { .. }), "{err}");
    }

    /// Issue 23, item 9: a kubepods cgroup that is the root itself, named empty or through a
    /// symlink back to the root, is refused.
    #[test]
    fn a_kubepods_cgroup_that_is_the_root_is_refused() {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("cgroup.controllers"), "cpuset cpu\n").unwrap();
        std::os::unix::fs::symlink(".", root.path().join("loop")).unwrap();
        for kubepods in ["", "loop"] {
            let config = LayoutConfig {
                proc_root: PathBuf::from("/nonexistent"),
                cgroup_root: Some(root.path().to_path_buf()),
                driver: None,
                kubepods: Some(CgroupPath::new(kubepods).unwrap()),
            };
            let err = detect_layout(&config).unwrap_err();
            assert!(
                matches!(err, LayoutError::KubepodsIsRoot { .. }),
                "{kubepods:?}: {err}"
            );
            assert!(err.to_string().contains("--kubepods-path"), "{err}");
        }
    }

    #[test]
    fn a_symlinked_kubepods_is_not_taken() {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("cgroup.controllers"), "cpuset\n").unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), root.path().join("kubepods")).unwrap();
        assert!(find_kubepods(root.path(), None).is_err());
    }

    #[test]
    fn driver_parses_from_flags() {
        assert_eq!(
            "systemd".parse::<CgroupDriver>().unwrap(),
            CgroupDriver::Systemd
        );
        assert_eq!(
            "cgroupfs".parse::<CgroupDriver>().unwrap(),
            CgroupDriver::Cgroupfs
        );
        let err = "docker".parse::<CgroupDriver>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown cgroup driver \"docker\": expected cgroupfs or systemd"
        );
    }
}
