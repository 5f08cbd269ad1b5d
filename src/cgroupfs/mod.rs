//! cgroupfs: the agent's only door to the cgroup filesystem.
//!
//! It owns typed cgroup paths relative to a controller root ([`CgroupPath`]), the names of the
//! interface files ([`InterfaceFile`]), symlink-proof reads and writes below an injected root
//! ([`CgroupFs`]), the text formats of the CPU interface files ([`values`]), the detection of
//! the cgroup layout at start ([`detect_layout`] → [`CgroupLayout`]), and the read-only scan of
//! the kubepods subtree into plain values ([`Scanner`] → [`Scan`]) and what lies below a cgroup
//! about to be narrowed (`below`). Nothing here decides anything: classification and planning
//! take the scan's values.

mod below;
mod clone_children;
#[cfg(debug_assertions)]
pub(crate) mod fake_kernel;
mod fs;
mod layout;
mod path;
mod scan;
pub(crate) mod values;

pub use below::ChildInTheWay;
#[cfg(debug_assertions)]
pub use fake_kernel::enable_for_test as fake_kernel_rules_for;
pub use fs::{CgroupError, CgroupFs, DirEntry, FileKind, InterfaceFile, Refusal, MAX_READ_BYTES};
pub use layout::{
    detect_layout, parse_mountinfo, CgroupDriver, CgroupLayout, CgroupVersion, LayoutConfig,
    LayoutError, MountEntry, KUBEPODS_CGROUPFS, KUBEPODS_SYSTEMD,
};
pub use path::{CgroupPath, PathError, MAX_NAME_LEN};
pub use scan::{
    CpuSettings, CpusetSnapshot, FileValue, Hierarchy, Scan, ScannedCgroup, Scanner, SkipReason,
    SkippedEntry, MAX_SCAN_CGROUPS, MAX_SCAN_DEPTH,
};
pub use values::{CpuMax, Quota, ValueError};
