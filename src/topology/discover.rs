//! Reading a [`Topology`] from a sysfs root and a proc root (DESIGN.md §2).
//!
//! Files read, all relative to the sysfs root: `devices/system/cpu/{online,present,isolated}`,
//! per online CPU `cpuN/topology/{physical_package_id,die_id,core_cpus_list|thread_siblings_list,
//! cluster_cpus_list}` and `cpuN/cache/index*/{level,type,id,shared_cpu_list}`, and
//! `devices/system/node/{has_memory,nodeM/cpulist}`; from the proc root only `cmdline`.
//! Required files that are missing, and garbage in any file, are errors naming the file.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{CpuInfo, Topology, TopologyError};
use crate::cpuset::{CpuSet, ParseError};

/// Why the topology could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("cannot read {what} from {path}")]
    Read {
        path: PathBuf,
        what: &'static str,
        source: io::Error,
    },
    #[error("invalid {what} in {path}")]
    List {
        path: PathBuf,
        what: &'static str,
        source: ParseError,
    },
    #[error("invalid {what} in {path}: {text:?} is not a number")]
    Number {
        path: PathBuf,
        what: &'static str,
        text: String,
    },
    #[error("invalid {param}= on the kernel command line in {path}")]
    Cmdline {
        path: PathBuf,
        param: &'static str,
        source: ParseError,
    },
    #[error("online cpu {cpu} has no {what} in {path}")]
    Missing {
        path: PathBuf,
        cpu: u32,
        what: &'static str,
    },
    #[error("inconsistent topology under {root}")]
    Inconsistent {
        root: PathBuf,
        source: TopologyError,
    },
}

/// Reads the topology of the machine whose sysfs is mounted at `sysfs` and procfs at `proc`.
pub fn discover(sysfs: &Path, proc: &Path) -> Result<Topology, DiscoverError> {
    let cpu_dir = sysfs.join("devices/system/cpu");
    let online = read_list(&cpu_dir.join("online"), "online cpu list")?;
    // The kernel's `offline` file is `possible` minus `online`, which includes CPUs that do not
    // exist; the CPUs that are really offline are `present` minus `online`.
    let offline = match read_optional_list(&cpu_dir.join("present"), "present cpu list")? {
        Some(present) => present.difference(&online),
        None => {
            read_optional_list(&cpu_dir.join("offline"), "offline cpu list")?.unwrap_or_default()
        }
    };

    let node_dir = sysfs.join("devices/system/node");
    let numa_of = read_numa_nodes(&node_dir)?;
    let memory_nodes = match read_optional_list(&node_dir.join("has_memory"), "memory node list")? {
        Some(nodes) => nodes,
        None if numa_of.is_empty() => CpuSet::range(0, 0),
        None => numa_of.values().copied().collect(),
    };

    let mut cpus = Vec::with_capacity(online.len());
    for id in &online {
        cpus.push(read_cpu(&cpu_dir, id, &online, &numa_of)?);
    }

    let mut isolated =
        read_optional_list(&cpu_dir.join("isolated"), "isolated cpu list")?.unwrap_or_default();
    let cmdline_path = proc.join("cmdline");
    match fs::read_to_string(&cmdline_path) {
        Ok(text) => {
            isolated.extend_from(&parse_cmdline_isolated(&text).map_err(|(param, source)| {
                DiscoverError::Cmdline {
                    path: cmdline_path.clone(),
                    param,
                    source,
                }
            })?)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(DiscoverError::Read {
                path: cmdline_path,
                what: "kernel command line",
                source,
            })
        }
    }

    Topology::new(cpus, offline, isolated, memory_nodes).map_err(|source| {
        DiscoverError::Inconsistent {
            root: sysfs.to_path_buf(),
            source,
        }
    })
}

/// The CPUs named by `isolcpus=` and `nohz_full=` on a kernel command line. Flag words before the
/// list (`isolcpus=managed_irq,domain,2-5`) are skipped. Returns the parameter name and the parse
/// error for a list that is not a CPU list.
pub fn parse_cmdline_isolated(cmdline: &str) -> Result<CpuSet, (&'static str, ParseError)> {
    let mut isolated = CpuSet::new();
    for word in cmdline.split_ascii_whitespace() {
        // Everything after a bare `--` goes to init, not the kernel.
        if word == "--" {
            break;
        }
        for param in ["isolcpus", "nohz_full"] {
            let Some(value) = word
                .strip_prefix(param)
                .and_then(|rest| rest.strip_prefix('='))
            else {
                continue;
            };
            let list = strip_flag_words(value);
            let set = CpuSet::parse(list).map_err(|e| (param, e))?;
            isolated.extend_from(&set);
        }
    }
    Ok(isolated)
}

/// `managed_irq,domain,2-5` → `2-5`. Only the kernel's own flag words are skipped, so a typo
/// stays in the list and is reported.
fn strip_flag_words(mut value: &str) -> &str {
    const FLAGS: [&str; 3] = ["nohz", "domain", "managed_irq"];
    loop {
        let (word, rest) = value.split_once(',').unwrap_or((value, ""));
        if !FLAGS.contains(&word) {
            return value;
        }
        value = rest;
    }
}

fn read_cpu(
    cpu_dir: &Path,
    id: u32,
    online: &CpuSet,
    numa_of: &BTreeMap<u32, u32>,
) -> Result<CpuInfo, DiscoverError> {
    let topo = cpu_dir.join(format!("cpu{id}/topology"));
    let socket = read_id(&topo.join("physical_package_id"), "socket id")?;
    let die = read_optional_id(&topo.join("die_id"), "die id")?.unwrap_or(0);

    let siblings = match read_optional_list(&topo.join("core_cpus_list"), "core cpu list")? {
        Some(list) => list,
        None => read_list(&topo.join("thread_siblings_list"), "thread sibling list")?,
    };
    // The kernel lists only online siblings; keep the CPU itself even if the file disagrees.
    let mut siblings = siblings.intersection(online);
    siblings.insert(id);
    let core = siblings.first().unwrap_or(id);

    let cluster = read_optional_list(&topo.join("cluster_cpus_list"), "cluster cpu list")?
        .map(|list| list.intersection(online).first().unwrap_or(core))
        .or(Some(core));

    let numa = numa_of.get(&id).copied().unwrap_or(0);
    let uncore = read_uncore_cache_id(&cpu_dir.join(format!("cpu{id}/cache")))?.unwrap_or(socket);

    Ok(CpuInfo {
        id,
        socket,
        die,
        numa,
        core,
        uncore,
        cluster,
    })
}

/// The id of the deepest unified cache at level 3 or more, kubelet's "uncore" cache. `None` when
/// the CPU has no such cache (kubelet then uses the socket id).
fn read_uncore_cache_id(cache_dir: &Path) -> Result<Option<u32>, DiscoverError> {
    let entries = match fs::read_dir(cache_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(DiscoverError::Read {
                path: cache_dir.to_path_buf(),
                what: "cache directory",
                source,
            })
        }
    };
    let mut best: Option<(u32, u32)> = None;
    for entry in entries {
        let entry = entry.map_err(|source| DiscoverError::Read {
            path: cache_dir.to_path_buf(),
            what: "cache directory",
            source,
        })?;
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with("index") {
            continue;
        }
        let index = entry.path();
        let level = read_id(&index.join("level"), "cache level")?;
        let kind = read_text(&index.join("type"), "cache type")?;
        if level < 3 || kind.trim() != "Unified" {
            continue;
        }
        let id = match read_optional_id(&index.join("id"), "cache id")? {
            Some(id) => id,
            // Older kernels have no `id`: the lowest CPU sharing the cache names it.
            None => read_list(&index.join("shared_cpu_list"), "cache cpu list")?
                .first()
                .unwrap_or(0),
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, id));
        }
    }
    Ok(best.map(|(_, id)| id))
}

/// cpu → NUMA node from `nodeM/cpulist`. Empty when the kernel has no NUMA support.
fn read_numa_nodes(node_dir: &Path) -> Result<BTreeMap<u32, u32>, DiscoverError> {
    let mut numa_of = BTreeMap::new();
    let entries = match fs::read_dir(node_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(numa_of),
        Err(source) => {
            return Err(DiscoverError::Read {
                path: node_dir.to_path_buf(),
                what: "NUMA node directory",
                source,
            })
        }
    };
    for entry in entries {
        let entry = entry.map_err(|source| DiscoverError::Read {
            path: node_dir.to_path_buf(),
            what: "NUMA node directory",
            source,
        })?;
        let name = entry.file_name();
        let Some(node) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        for cpu in &read_list(&entry.path().join("cpulist"), "NUMA node cpu list")? {
            numa_of.insert(cpu, node);
        }
    }
    Ok(numa_of)
}

fn read_text(path: &Path, what: &'static str) -> Result<String, DiscoverError> {
    fs::read_to_string(path).map_err(|source| DiscoverError::Read {
        path: path.to_path_buf(),
        what,
        source,
    })
}

fn read_optional_text(path: &Path, what: &'static str) -> Result<Option<String>, DiscoverError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(DiscoverError::Read {
            path: path.to_path_buf(),
            what,
            source,
        }),
    }
}

fn parse_list(path: &Path, what: &'static str, text: &str) -> Result<CpuSet, DiscoverError> {
    CpuSet::parse(text).map_err(|source| DiscoverError::List {
        path: path.to_path_buf(),
        what,
        source,
    })
}

fn read_list(path: &Path, what: &'static str) -> Result<CpuSet, DiscoverError> {
    parse_list(path, what, &read_text(path, what)?)
}

fn read_optional_list(path: &Path, what: &'static str) -> Result<Option<CpuSet>, DiscoverError> {
    read_optional_text(path, what)?
        .map(|text| parse_list(path, what, &text))
        .transpose()
}

/// A non-negative id. The kernel writes -1 for "unknown" (e.g. `physical_package_id` on some
/// virtual machines); that reads as 0.
fn parse_id(path: &Path, what: &'static str, text: &str) -> Result<u32, DiscoverError> {
    let trimmed = text.trim();
    if trimmed == "-1" {
        return Ok(0);
    }
    trimmed.parse::<u32>().map_err(|_| DiscoverError::Number {
        path: path.to_path_buf(),
        what,
        text: trimmed.to_string(),
    })
}

fn read_id(path: &Path, what: &'static str) -> Result<u32, DiscoverError> {
    parse_id(path, what, &read_text(path, what)?)
}

fn read_optional_id(path: &Path, what: &'static str) -> Result<Option<u32>, DiscoverError> {
    read_optional_text(path, what)?
        .map(|text| parse_id(path, what, &text))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_flags_before_the_list_are_skipped() {
        let set = parse_cmdline_isolated("ro quiet isolcpus=managed_irq,domain,2-5 nohz_full=7\n")
            .unwrap();
        assert_eq!(set.to_string(), "2-5,7");
        assert_eq!(
            parse_cmdline_isolated("isolcpus=nohz,3")
                .unwrap()
                .to_string(),
            "3"
        );
        assert_eq!(
            parse_cmdline_isolated("isolcpus=1,3-4")
                .unwrap()
                .to_string(),
            "1,3-4"
        );
    }

    #[test]
    fn cmdline_after_double_dash_is_not_the_kernels() {
        let set = parse_cmdline_isolated("quiet -- isolcpus=1").unwrap();
        assert!(set.is_empty());
    }

    #[test]
    fn cmdline_garbage_names_the_parameter() {
        let (param, err) = parse_cmdline_isolated("isolcpus=domain,2-x").unwrap_err();
        assert_eq!(param, "isolcpus");
        assert!(err.to_string().contains("2-x"), "{err}");
        let (_, err) = parse_cmdline_isolated("isolcpus=domian,2").unwrap_err();
        assert!(err.to_string().contains("domian"), "{err}");
        assert!(parse_cmdline_isolated("isolcpus=domain")
            .unwrap()
            .is_empty());
    }

    #[test]
    fn unknown_ids_read_as_zero() {
        assert_eq!(parse_id(Path::new("x"), "socket id", "-1\n").unwrap(), 0);
        let err = parse_id(Path::new("/s/physical_package_id"), "socket id", "abc\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid socket id in /s/physical_package_id: \"abc\" is not a number"
        );
    }
}
