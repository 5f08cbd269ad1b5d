//! The devices a container was given and the NUMA nodes they sit on, for device locality
//! (kubelet's Topology Manager aligns exclusive CPUs with the devices' NUMA node through
//! device-plugin hints; cpusetd has no device plugins, so it reads the devices itself).
//!
//! Two sources, both in the container's OCI `config.json` (parsed by `runtime`):
//! * VFIO groups in `linux.devices`: a path `/dev/vfio/<group>` (not the `/dev/vfio/vfio`
//!   container device), as KubeVirt's and DPDK pods have them;
//! * PCI addresses that device plugins put in `process.env`: `PCIDEVICE_<RESOURCE>=<addr>,…`
//!   (the SR-IOV network device plugin) and `PCI_RESOURCE_<RESOURCE>=<addr>,…` (KubeVirt's
//!   PCI host-device plugin).
//!
//! And from sysfs (the injected `--sysfs-root`): `bus/pci/devices/<addr>/numa_node` (`-1`:
//! unknown) and `kernel/iommu_groups/<group>/devices/*` (a VFIO group's PCI functions).
//!
//! Everything is advisory and bounded: at most [`MAX_DEVICES`] devices per container and
//! [`MAX_GROUP_DEVICES`] functions per IOMMU group; entries that are not what they should be
//! are skipped and said once; a sysfs file that is missing, not a regular file, larger than a
//! few bytes or not a number leaves the node unknown. Paths into sysfs are built only from
//! parsed, re-formatted addresses and group numbers, so a config cannot name another file.
//! The PCI device entries under `bus/pci/devices` are symlinks by nature and are followed; the
//! files read there are opened without blocking and must be regular files.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use nix::fcntl::OFlag;
use serde::Serialize;

use crate::cpuset::CpuSet;

/// Most devices kept per container; more are ignored (and said).
pub const MAX_DEVICES: usize = 32;
/// Most PCI functions read from one IOMMU group.
pub const MAX_GROUP_DEVICES: usize = 32;
/// Largest VFIO group number accepted (the kernel's are small integers).
const MAX_VFIO_GROUP: u32 = 1 << 20;
/// Largest NUMA node id accepted from sysfs (the kernel's `MAX_NUMNODES` is at most 1024).
const MAX_NUMA_NODE: u32 = 1023;
/// Largest `numa_node` file read.
const MAX_SYSFS_VALUE_BYTES: u64 = 64;

/// The environment variable prefixes of device plugins that pass PCI addresses.
pub const PCI_ENV_PREFIXES: [&str; 2] = ["PCIDEVICE_", "PCI_RESOURCE_"];
/// Where VFIO group devices live in a container.
const VFIO_DEVICE_DIR: &str = "/dev/vfio/";

/// A PCI function address, `DDDD:BB:DD.F` (domain, bus, device, function), as sysfs names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    domain: u32,
    bus: u8,
    device: u8,
    function: u8,
}

/// Why a text is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a PCI address (DDDD:BB:DD.F)")]
pub struct PciAddressError {
    text: String,
}

impl FromStr for PciAddress {
    type Err = PciAddressError;

    /// The kernel's form: a domain of 4 to 8 hex digits, a 2-digit bus, a 2-digit device below
    /// 0x20 and a function 0-7. Either case; nothing around it.
    fn from_str(text: &str) -> Result<PciAddress, PciAddressError> {
        let bad = || PciAddressError {
            text: text.chars().take(64).collect(),
        };
        let hex = |s: &str, min: usize, max: usize| -> Option<u32> {
            if s.len() < min || s.len() > max || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            u32::from_str_radix(s, 16).ok()
        };
        let mut parts = text.split(':');
        let (Some(domain), Some(bus), Some(rest), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let (device, function) = rest.split_once('.').ok_or_else(bad)?;
        let domain = hex(domain, 4, 8).ok_or_else(bad)?;
        let bus = hex(bus, 2, 2).ok_or_else(bad)?;
        let device = hex(device, 2, 2).filter(|d| *d < 0x20).ok_or_else(bad)?;
        let function = hex(function, 1, 1).filter(|f| *f < 8).ok_or_else(bad)?;
        Ok(PciAddress {
            domain,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl Serialize for PciAddress {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// One device of a container, as its config names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceId {
    /// A VFIO group (`/dev/vfio/<group>`).
    VfioGroup(u32),
    /// A PCI function named by a device plugin's environment variable.
    Pci(PciAddress),
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceId::VfioGroup(group) => write!(f, "vfio/{group}"),
            DeviceId::Pci(address) => write!(f, "{address}"),
        }
    }
}

/// A container's device and where it sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerDevice {
    pub id: DeviceId,
    /// The PCI functions behind it: the address itself, or a VFIO group's members (empty
    /// until located, or when sysfs does not say).
    pub pci: Vec<PciAddress>,
    /// The NUMA nodes of those functions; empty: unknown.
    pub numa: CpuSet,
}

impl ContainerDevice {
    /// A device as the config names it, not located yet.
    pub fn unlocated(id: DeviceId) -> ContainerDevice {
        let pci = match &id {
            DeviceId::Pci(address) => vec![*address],
            DeviceId::VfioGroup(_) => Vec::new(),
        };
        ContainerDevice {
            id,
            pci,
            numa: CpuSet::new(),
        }
    }

    /// `0000:3b:02.0 numa 1`, `vfio/42 (0000:5e:00.0) numa 1`, `numa ?` when unknown.
    pub fn describe(&self) -> String {
        let mut text = self.id.to_string();
        if matches!(self.id, DeviceId::VfioGroup(_)) && !self.pci.is_empty() {
            let members: Vec<String> = self.pci.iter().map(ToString::to_string).collect();
            text = format!("{text} ({})", members.join(" "));
        }
        if self.numa.is_empty() {
            format!("{text} numa ?")
        } else {
            format!("{text} numa {}", self.numa)
        }
    }
}

/// The NUMA nodes of all `devices` whose node is known (empty: none known).
pub fn numa_nodes(devices: &[ContainerDevice]) -> CpuSet {
    let mut nodes = CpuSet::new();
    for device in devices {
        nodes.extend_from(&device.numa);
    }
    nodes
}

/// `describe` of each device, comma-separated.
pub fn describe_all(devices: &[ContainerDevice]) -> String {
    devices
        .iter()
        .map(ContainerDevice::describe)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The VFIO group of a `linux.devices` path: `/dev/vfio/<digits>`; `None` for anything else
/// (including `/dev/vfio/vfio`, the container device every VFIO user also gets).
pub fn vfio_group_of_path(path: &str) -> Option<u32> {
    let group = path.strip_prefix(VFIO_DEVICE_DIR)?;
    if group.is_empty() || group.len() > 7 || !group.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    group.parse().ok().filter(|g| *g <= MAX_VFIO_GROUP)
}

/// What a device plugin's `process.env` entry names: the PCI addresses, and how many of its
/// comma-separated entries are not PCI addresses with the first of them said (a pod author
/// writes the container's environment, so there may be millions: they are counted, never
/// listed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceEnv {
    pub addresses: Vec<PciAddress>,
    pub bad: usize,
    /// The first bad entry, as a sentence naming the variable (both cut for the log).
    pub first_bad: Option<String>,
}

/// The PCI addresses a `process.env` entry names, when it is a device plugin's variable
/// (`PCIDEVICE_*` or `PCI_RESOURCE_*`), with the entries of it that are not PCI addresses
/// counted (the good ones are kept); `None` for any other variable.
pub fn pci_addresses_of_env(entry: &str) -> Option<DeviceEnv> {
    let (name, value) = entry.split_once('=')?;
    if !PCI_ENV_PREFIXES
        .iter()
        .any(|p| name.starts_with(p) && name.len() > p.len())
    {
        return None;
    }
    // `PCIDEVICE_<RESOURCE>_INFO` holds a JSON document about the devices, not a list.
    if name.ends_with("_INFO") {
        return None;
    }
    let mut found = DeviceEnv::default();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<PciAddress>() {
            Ok(address) => found.addresses.push(address),
            Err(err) => {
                found.bad += 1;
                if found.first_bad.is_none() {
                    found.first_bad = Some(format!(
                        "environment variable {}: {err}",
                        crate::logging::excerpt(name)
                    ));
                }
            }
        }
    }
    Some(found)
}

/// Why a sysfs file about a device could not be used (the node stays unknown).
#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a regular file")]
    NotRegularFile { path: PathBuf },
    #[error("{path} holds {text:?}, not a NUMA node")]
    Garbage { path: PathBuf, text: String },
}

/// Reads where devices sit from a sysfs root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLocator {
    sysfs: PathBuf,
}

impl DeviceLocator {
    pub fn new(sysfs: &Path) -> DeviceLocator {
        DeviceLocator {
            sysfs: sysfs.to_path_buf(),
        }
    }

    /// Fills in the PCI functions and NUMA nodes of `devices`. What cannot be read leaves the
    /// node unknown and is returned as a sentence for the log.
    pub fn locate(&self, devices: &mut [ContainerDevice]) -> Vec<String> {
        let mut problems = Vec::new();
        for device in devices.iter_mut() {
            if let DeviceId::VfioGroup(group) = device.id {
                match self.iommu_group_members(group) {
                    Ok(members) => device.pci = members,
                    Err(err) => problems.push(crate::logging::error_chain(&err)),
                }
            }
            let mut numa = CpuSet::new();
            for address in &device.pci {
                match self.pci_numa_node(address) {
                    Ok(Some(node)) => numa.insert(node),
                    Ok(None) => {}
                    Err(err) => problems.push(crate::logging::error_chain(&err)),
                }
            }
            device.numa = numa;
        }
        problems
    }

    /// `bus/pci/devices/<addr>/numa_node`: `None` when missing or `-1` (no node).
    pub fn pci_numa_node(&self, address: &PciAddress) -> Result<Option<u32>, LocateError> {
        let path = self
            .sysfs
            .join("bus/pci/devices")
            .join(address.to_string())
            .join("numa_node");
        let Some(text) = read_small(&path)? else {
            return Ok(None);
        };
        match text.trim().parse::<i64>() {
            Ok(-1) => Ok(None),
            Ok(node) if (0..=i64::from(MAX_NUMA_NODE)).contains(&node) => Ok(Some(node as u32)),
            _ => Err(LocateError::Garbage {
                path,
                text: text.trim().chars().take(32).collect(),
            }),
        }
    }

    /// The PCI functions of an IOMMU group (`kernel/iommu_groups/<group>/devices/*`), sorted;
    /// names that are not PCI addresses are skipped; empty when the group is not there.
    pub fn iommu_group_members(&self, group: u32) -> Result<Vec<PciAddress>, LocateError> {
        let dir = self
            .sysfs
            .join("kernel/iommu_groups")
            .join(group.to_string())
            .join("devices");
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(LocateError::Read { path: dir, source }),
        };
        let mut members = Vec::new();
        // Bounded: a group is a handful of functions; a directory of thousands is not read.
        for entry in entries.take(MAX_GROUP_DEVICES * 4) {
            let entry = entry.map_err(|source| LocateError::Read {
                path: dir.clone(),
                source,
            })?;
            if let Some(address) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<PciAddress>().ok())
            {
                members.push(address);
            }
            if members.len() == MAX_GROUP_DEVICES {
                break;
            }
        }
        members.sort();
        Ok(members)
    }
}

/// A small sysfs file's text: `None` when missing; refused when not a regular file; at most
/// [`MAX_SYSFS_VALUE_BYTES`] read.
fn read_small(path: &Path) -> Result<Option<String>, LocateError> {
    let read_error = |source| LocateError::Read {
        path: path.to_path_buf(),
        source,
    };
    // O_NONBLOCK: a FIFO in the file's place must not hang the agent.
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
        .open(path)
    {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(read_error(err)),
    };
    if !file.metadata().map_err(read_error)?.is_file() {
        return Err(LocateError::NotRegularFile {
            path: path.to_path_buf(),
        });
    }
    let mut bytes = Vec::new();
    File::take(file, MAX_SYSFS_VALUE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> PciAddress {
        text.parse().unwrap()
    }

    #[test]
    fn pci_addresses_parse_the_kernels_form_only() {
        assert_eq!(addr("0000:3b:02.1").to_string(), "0000:3b:02.1");
        assert_eq!(addr("0000:AF:1F.7").to_string(), "0000:af:1f.7");
        assert_eq!(addr("10000:00:02.0").to_string(), "10000:00:02.0");
        for bad in [
            "",
            "3b:02.1",
            "0000:3b:02",
            "0000:3b:20.0",
            "0000:3b:02.8",
            "0000:3b:2.0",
            "000:3b:02.0",
            "0000:3b:02.0 ",
            "0000:3b:02.0:1",
            "../../etc:00:00.0",
            "0000:+b:02.0",
            "123456789:00:00.0",
        ] {
            assert!(bad.parse::<PciAddress>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn vfio_groups_are_numbered_paths_under_dev_vfio() {
        assert_eq!(vfio_group_of_path("/dev/vfio/42"), Some(42));
        assert_eq!(vfio_group_of_path("/dev/vfio/0"), Some(0));
        for other in [
            "/dev/vfio/vfio",
            "/dev/vfio/",
            "/dev/vfio/42/../1",
            "/dev/vfio/-1",
            "/dev/vfio/99999999",
            "/dev/kvm",
            "dev/vfio/1",
        ] {
            assert_eq!(vfio_group_of_path(other), None, "{other:?}");
        }
    }

    #[test]
    fn device_plugin_variables_give_addresses_and_garbage_is_counted() {
        let found =
            pci_addresses_of_env("PCIDEVICE_INTEL_COM_SRIOV_NETDEVICE=0000:3b:02.0,0000:3b:02.1")
                .unwrap();
        assert_eq!(
            found.addresses,
            [addr("0000:3b:02.0"), addr("0000:3b:02.1")]
        );
        assert_eq!((found.bad, found.first_bad), (0, None));
        let found =
            pci_addresses_of_env("PCI_RESOURCE_NVIDIA_COM_GPU=0000:5e:00.0,gpu-7,gpu-8").unwrap();
        assert_eq!(found.addresses, [addr("0000:5e:00.0")]);
        assert_eq!(found.bad, 2);
        let first = found.first_bad.unwrap();
        assert!(
            first.contains("gpu-7") && !first.contains("gpu-8"),
            "{first}"
        );
        assert!(pci_addresses_of_env("PATH=/usr/bin").is_none());
        assert!(pci_addresses_of_env("PCIDEVICE_=0000:3b:02.0").is_none());
        assert!(pci_addresses_of_env("MDEV_PCI_RESOURCE_X=0000:3b:02.0").is_none());
        assert!(pci_addresses_of_env("PCIDEVICE_X").is_none());
        assert!(pci_addresses_of_env(r#"PCIDEVICE_X_INFO={"0000:3b:02.0":{}}"#).is_none());
    }

    /// A sysfs with PCI functions (entries under `bus/pci/devices` are symlinks into
    /// `devices/`, as the kernel has them) and IOMMU groups.
    fn sysfs(devices: &[(&str, &str)], groups: &[(u32, &[&str])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let bus = dir.path().join("bus/pci/devices");
        fs::create_dir_all(&bus).unwrap();
        for (address, numa) in devices {
            let real = dir.path().join("devices/pci0000:00").join(address);
            fs::create_dir_all(&real).unwrap();
            fs::write(real.join("numa_node"), format!("{numa}\n")).unwrap();
            std::os::unix::fs::symlink(
                format!("../../../devices/pci0000:00/{address}"),
                bus.join(address),
            )
            .unwrap();
        }
        for (group, members) in groups {
            let dir = dir
                .path()
                .join(format!("kernel/iommu_groups/{group}/devices"));
            fs::create_dir_all(&dir).unwrap();
            for member in *members {
                fs::create_dir_all(dir.join(member)).unwrap();
            }
        }
        dir
    }

    #[test]
    fn devices_are_located_through_sysfs() {
        let root = sysfs(
            &[
                ("0000:3b:02.0", "1"),
                ("0000:3b:02.1", "1"),
                ("0000:5e:00.0", "0"),
                ("0000:5e:00.1", "-1"),
                ("0000:d8:00.0", "banana"),
            ],
            &[
                (42, &["0000:5e:00.0", "0000:3b:02.0", "not-a-device"]),
                (7, &[]),
            ],
        );
        let locator = DeviceLocator::new(root.path());
        let mut devices: Vec<ContainerDevice> = [
            DeviceId::Pci(addr("0000:3b:02.1")),
            DeviceId::VfioGroup(42),
            DeviceId::Pci(addr("0000:5e:00.1")),
            DeviceId::Pci(addr("0000:d8:00.0")),
            DeviceId::Pci(addr("0000:00:1f.0")),
            DeviceId::VfioGroup(7),
            DeviceId::VfioGroup(8),
        ]
        .into_iter()
        .map(ContainerDevice::unlocated)
        .collect();
        let problems = locator.locate(&mut devices);
        let numa: Vec<String> = devices.iter().map(|d| d.numa.to_string()).collect();
        assert_eq!(numa, ["1", "0-1", "", "", "", "", ""]);
        assert_eq!(devices[1].pci, [addr("0000:3b:02.0"), addr("0000:5e:00.0")]);
        assert_eq!(
            devices[1].describe(),
            "vfio/42 (0000:3b:02.0 0000:5e:00.0) numa 0-1"
        );
        assert_eq!(devices[2].describe(), "0000:5e:00.1 numa ?");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("banana"), "{problems:?}");
        assert_eq!(numa_nodes(&devices).to_string(), "0-1");
    }

    #[test]
    fn a_fifo_or_a_huge_file_is_not_read_as_a_node() {
        let root = sysfs(&[("0000:3b:02.0", "1")], &[]);
        let file = root
            .path()
            .join("devices/pci0000:00/0000:3b:02.0/numa_node");
        fs::remove_file(&file).unwrap();
        nix::unistd::mkfifo(&file, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let locator = DeviceLocator::new(root.path());
        let err = locator.pci_numa_node(&addr("0000:3b:02.0")).unwrap_err();
        assert!(matches!(err, LocateError::NotRegularFile { .. }), "{err}");

        fs::remove_file(&file).unwrap();
        fs::write(&file, "1".repeat(10_000)).unwrap();
        let err = locator.pci_numa_node(&addr("0000:3b:02.0")).unwrap_err();
        assert!(matches!(err, LocateError::Garbage { .. }), "{err}");
    }
}
