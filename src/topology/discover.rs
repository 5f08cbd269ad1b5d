//! Reading a [`Topology`] from a sysfs root and a proc root (DESIGN.md §2).
//!
//! Files read, all relative to the sysfs root: `devices/system/cpu/{online,present,possible,
//! isolated,nohz_full}`,
//! per online CPU `cpuN/topology/{physical_package_id,die_id,core_cpus_list|thread_siblings_list,
//! cluster_cpus_list}` and `cpuN/cache/index*/{level,type,id,shared_cpu_list}`, and
//! `devices/system/node/{has_memory,nodeM/cpulist}`, and for the core types of a hybrid part
//! `devices/{cpu_core,cpu_atom}/cpus` or else `cpuN/cpu_capacity`; from the proc root only
//! `cmdline`.
//! Required files that are missing, and garbage in any file, are errors naming the file.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::{CoreTypes, CpuInfo, Topology, TopologyError};
use crate::bounded;
use crate::cpuset::{CpuSet, ParseError, MAX_CPU_ID};

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

impl DiscoverError {
    /// The file or directory the error is about.
    pub fn path(&self) -> &Path {
        match self {
            DiscoverError::Read { path, .. }
            | DiscoverError::List { path, .. }
            | DiscoverError::Number { path, .. }
            | DiscoverError::Missing { path, .. } => path,
            DiscoverError::Inconsistent { root, .. } => root,
        }
    }
}

/// The isolated CPUs (sysfs' `isolated` plus `isolcpus=` domains on the command line) and the
/// `nohz_full` ones (sysfs plus the command line); `known` (online and offline CPUs) bounds
/// the command line's lists when sysfs has no `possible` list.
fn isolated_cpus(
    cpu_dir: &Path,
    proc: &Path,
    known: CpuSet,
) -> Result<(CpuSet, CpuSet), DiscoverError> {
    let mut isolated =
        read_optional_list(&cpu_dir.join("isolated"), "isolated cpu list")?.unwrap_or_default();
    let cmdline_path = proc.join("cmdline");
    let last_cpu = match read_optional_list(&cpu_dir.join("possible"), "possible cpu list") {
        Ok(Some(possible)) if !possible.is_empty() => possible.last().unwrap_or(0),
        _ => known.last().unwrap_or(0),
    };
    let mut nohz_full = read_optional_list(&cpu_dir.join("nohz_full"), "nohz_full cpu list")
        .ok()
        .flatten()
        .unwrap_or_default();
    match bounded::read_file(&cmdline_path, bounded::KERNEL_FILE_LIMIT) {
        Ok(text) => {
            let parsed = parse_cmdline(&text, last_cpu);
            for why in &parsed.ignored {
                log::warn!(
                    "{}: {why} (the kernel ignores it too); the cpus it names are not treated \
                     as isolated",
                    cmdline_path.display()
                );
            }
            isolated.extend_from(&parsed.domain);
            nohz_full.extend_from(&parsed.nohz_full);
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => log::warn!(
            "cannot read the kernel command line {}: {e}; isolcpus= and nohz_full= are not \
             known",
            cmdline_path.display()
        ),
    }
    Ok((isolated, nohz_full))
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
    number_dies_within_packages(&mut cpus);

    let (isolated, nohz_full) = isolated_cpus(&cpu_dir, proc, online.union(&offline))?;

    let topology = Topology::new(cpus, offline, isolated, memory_nodes).map_err(|source| {
        DiscoverError::Inconsistent {
            root: sysfs.to_path_buf(),
            source,
        }
    })?;
    let core_types = read_core_types(sysfs, &cpu_dir, &online)?;
    Ok(topology
        .with_nohz_full(nohz_full)
        .with_core_types(core_types))
}

/// The core types of a hybrid part. Intel's hybrid PMUs name their CPUs in
/// `devices/cpu_core/cpus` (performance cores) and `devices/cpu_atom/cpus` (efficient cores);
/// where the kernel has no such PMUs but exposes `cpuN/cpu_capacity` (arm64, riscv), the CPUs
/// of the highest capacity are the performance ones and the others efficient. Empty when
/// neither says anything, or every CPU has the same capacity.
fn read_core_types(
    sysfs: &Path,
    cpu_dir: &Path,
    online: &CpuSet,
) -> Result<CoreTypes, DiscoverError> {
    let core = read_optional_list(&sysfs.join("devices/cpu_core/cpus"), "performance cpu list")?;
    let atom = read_optional_list(&sysfs.join("devices/cpu_atom/cpus"), "efficient cpu list")?;
    if let (Some(performance), Some(efficient)) = (core, atom) {
        return Ok(CoreTypes {
            performance,
            efficient,
        });
    }
    let mut capacity: BTreeMap<u32, u32> = BTreeMap::new();
    for cpu in online {
        let path = cpu_dir.join(format!("cpu{cpu}/cpu_capacity"));
        match read_optional_id(&path, "cpu capacity")? {
            Some(value) => capacity.insert(cpu, value),
            // Capacities of some CPUs only: no basis for a comparison.
            None => return Ok(CoreTypes::default()),
        };
    }
    let Some(&highest) = capacity.values().max() else {
        return Ok(CoreTypes::default());
    };
    let of = |top: bool| -> CpuSet {
        capacity
            .iter()
            .filter(|&(_, &c)| (c == highest) == top)
            .map(|(&cpu, _)| cpu)
            .collect()
    };
    Ok(CoreTypes {
        performance: of(true),
        efficient: of(false),
    })
}
/// What the kernel command line says about isolated CPUs, parsed the way the kernel parses it
/// (`kernel/sched/isolation.c`, `lib/bitmap.c`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CmdlineIsolation {
    /// CPUs out of the scheduler's load-balancing domains: `isolcpus=` without flags or with
    /// the `domain` flag. These are what the isolcpus KEP keeps away from pods.
    pub domain: CpuSet,
    /// CPUs with the scheduler tick turned off (`nohz_full=`, `isolcpus=nohz,…`): still
    /// allocatable, and usually the very CPUs meant for pinned pods.
    pub nohz_full: CpuSet,
    /// Parameters the kernel itself would have rejected or ignored, said in a sentence each.
    pub ignored: Vec<String>,
}

/// Parses `isolcpus=` and `nohz_full=` (also spelt `nohz-full=`: the kernel treats `-` and `_`
/// in parameter names alike) the way the kernel does. `last_cpu` is the highest possible CPU
/// id (`N` in a list). A parameter the kernel would ignore (an invalid flag, a list it cannot
/// parse, a CPU past the last possible one) is ignored here too and reported in `ignored`,
/// never an error: an optional parameter must not stop the agent.
pub fn parse_cmdline(cmdline: &str, last_cpu: u32) -> CmdlineIsolation {
    let mut out = CmdlineIsolation::default();
    for word in cmdline.split_ascii_whitespace() {
        // Everything after a bare `--` goes to init, not the kernel.
        if word == "--" {
            break;
        }
        let Some((name, value)) = word.split_once('=') else {
            continue;
        };
        let name = name.replace('-', "_");
        match name.as_str() {
            "isolcpus" => match parse_isolcpus(value, last_cpu) {
                Ok((flags, set)) => {
                    if flags.domain {
                        out.domain.extend_from(&set);
                    }
                    if flags.nohz {
                        out.nohz_full.extend_from(&set);
                    }
                }
                Err(why) => out.ignored.push(format!("isolcpus={value} ignored: {why}")),
            },
            "nohz_full" => match parse_kernel_cpulist(value, last_cpu) {
                Ok(set) => out.nohz_full.extend_from(&set),
                Err(why) => out
                    .ignored
                    .push(format!("nohz_full={value} ignored: {why}")),
            },
            _ => {}
        }
    }
    out
}

#[derive(Debug, Default, Clone, Copy)]
struct IsolcpusFlags {
    domain: bool,
    nohz: bool,
}

/// `isolcpus=[flag,…]list`: known flags (`nohz`, `domain`, `managed_irq`) set what is isolated,
/// unknown alphabetic flags are skipped, a flag with another character voids the parameter; no
/// flag at all means `domain` (the kernel's `housekeeping_isolcpus_setup`).
fn parse_isolcpus(value: &str, last_cpu: u32) -> Result<(IsolcpusFlags, CpuSet), String> {
    let mut flags = IsolcpusFlags::default();
    let mut any = false;
    let mut rest = value;
    while rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
        let (word, tail) = rest.split_once(',').unwrap_or((rest, ""));
        match word {
            "nohz" => {
                flags.nohz = true;
                any = true;
            }
            "domain" => {
                flags.domain = true;
                any = true;
            }
            "managed_irq" => any = true,
            // The kernel matches `flag,` only: a flag word with nothing after it is the list,
            // and `N` alone is a list too.
            _ if tail.is_empty() && !rest.contains(',') => break,
            _ if !word.chars().all(|c| c.is_ascii_alphabetic() || c == '_') => {
                return Err(format!("invalid flag {word:?}"));
            }
            _ => {}
        }
        rest = tail;
    }
    if !any {
        flags.domain = true;
    }
    Ok((flags, parse_kernel_cpulist(rest, last_cpu)?))
}

/// The kernel's cpu-list grammar (`bitmap_parselist`): comma-separated regions `a`, `a-b` or
/// `a-b:used/group`, where `N` is the last CPU; empty regions (`2-3,`) are allowed. A CPU past
/// `last_cpu` makes the whole list invalid, as it does for the kernel.
pub fn parse_kernel_cpulist(text: &str, last_cpu: u32) -> Result<CpuSet, String> {
    let number = |t: &str| -> Result<u32, String> {
        if t == "N" {
            return Ok(last_cpu);
        }
        let n: u32 = t
            .parse()
            .map_err(|_| format!("{t:?} is not a cpu number"))?;
        if n > last_cpu {
            return Err(format!("cpu {n} is past the last cpu {last_cpu}"));
        }
        Ok(n)
    };
    let mut set = CpuSet::new();
    for region in text.split(',').map(str::trim).filter(|r| !r.is_empty()) {
        let (range, group) = match region.split_once(':') {
            Some((range, group)) => (range, Some(group)),
            None => (region, None),
        };
        let (start, end) = match range.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => {
                let n = number(range)?;
                (n, n)
            }
        };
        if start > end {
            return Err(format!("{region:?}: the range runs backwards"));
        }
        let (used, size) = match group {
            None => (1, 1),
            Some(g) => {
                let (u, s) = g
                    .split_once('/')
                    .ok_or_else(|| format!("{region:?}: a group is used/size"))?;
                let used: u32 = u.parse().map_err(|_| format!("{region:?}: bad group"))?;
                let size: u32 = s.parse().map_err(|_| format!("{region:?}: bad group"))?;
                if used == 0 || size == 0 || used > size {
                    return Err(format!("{region:?}: bad group {used}/{size}"));
                }
                (used, size)
            }
        };
        for cpu in start..=end {
            if (cpu - start) % size < used {
                set.insert(cpu);
            }
        }
    }
    Ok(set)
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

/// Renumbers `die` as the die's index within its package (0, 1, … in the order of the kernel's
/// `die_id`s). Linux up to 6.8 numbers `die_id` within the package; from 6.9 (the x86 topology
/// rework) across the machine, so the second socket's only die reads 1 on 6.12 where 6.1 said 0.
/// A die is the pair (package, `die_id`) either way; the number is kernel-independent.
fn number_dies_within_packages(cpus: &mut [CpuInfo]) {
    let mut ids: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for cpu in cpus.iter() {
        ids.entry(cpu.socket).or_default().push(cpu.die);
    }
    for list in ids.values_mut() {
        list.sort_unstable();
        list.dedup();
    }
    for cpu in cpus.iter_mut() {
        let list = &ids[&cpu.socket];
        cpu.die = list.binary_search(&cpu.die).unwrap_or(0) as u32;
    }
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
        if node > MAX_CPU_ID {
            return Err(DiscoverError::Inconsistent {
                root: node_dir.to_path_buf(),
                source: TopologyError::NumaIdTooLarge {
                    id: node,
                    max: MAX_CPU_ID,
                },
            });
        }
        for cpu in &read_list(&entry.path().join("cpulist"), "NUMA node cpu list")? {
            numa_of.insert(cpu, node);
        }
    }
    Ok(numa_of)
}

fn read_text(path: &Path, what: &'static str) -> Result<String, DiscoverError> {
    bounded::read_file(path, bounded::KERNEL_FILE_LIMIT).map_err(|source| DiscoverError::Read {
        path: path.to_path_buf(),
        what,
        source,
    })
}

fn read_optional_text(path: &Path, what: &'static str) -> Result<Option<String>, DiscoverError> {
    match bounded::read_file(path, bounded::KERNEL_FILE_LIMIT) {
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

    fn isolated(cmdline: &str) -> (String, String, usize) {
        let parsed = parse_cmdline(cmdline, 15);
        (
            parsed.domain.to_string(),
            parsed.nohz_full.to_string(),
            parsed.ignored.len(),
        )
    }

    #[test]
    fn cmdline_flags_say_what_is_isolated() {
        let (domain, nohz, _) = isolated("ro quiet isolcpus=managed_irq,domain,2-5 nohz_full=7\n");
        assert_eq!((domain.as_str(), nohz.as_str()), ("2-5", "7"));
        // Flags without `domain`: tick isolation only.
        assert_eq!(isolated("isolcpus=nohz,3"), ("".into(), "3".into(), 0));
        assert_eq!(
            isolated("isolcpus=managed_irq,3"),
            ("".into(), "".into(), 0)
        );
        // No flag: domain isolation.
        assert_eq!(isolated("isolcpus=1,3-4"), ("1,3-4".into(), "".into(), 0));
    }

    #[test]
    fn cmdline_after_double_dash_is_not_the_kernels() {
        assert_eq!(isolated("quiet -- isolcpus=1"), ("".into(), "".into(), 0));
    }

    /// Command lines the kernel accepts (issue 17, item 9): none of them is an error.
    #[test]
    fn cmdline_grammar_is_the_kernels() {
        assert_eq!(isolated("nohz_full=2-N"), ("".into(), "2-15".into(), 0));
        assert_eq!(
            isolated("isolcpus=0-15:2/4"),
            ("0-1,4-5,8-9,12-13".into(), "".into(), 0)
        );
        // An unknown alphabetic flag is skipped.
        assert_eq!(isolated("isolcpus=foo,2-3"), ("2-3".into(), "".into(), 0));
        assert_eq!(isolated("nohz_full=2-3,"), ("".into(), "2-3".into(), 0));
        assert_eq!(isolated("nohz-full=4"), ("".into(), "4".into(), 0));
        // Past the last cpu: the kernel ignores the whole parameter, and so do we (said).
        assert_eq!(isolated("isolcpus=2-9999"), ("".into(), "".into(), 1));
    }

    #[test]
    fn cmdline_garbage_is_ignored_and_said() {
        let parsed = parse_cmdline("isolcpus=domain,2-x nohz_full=1-0 isolcpus=do-main,2", 7);
        assert!(parsed.domain.is_empty() && parsed.nohz_full.is_empty());
        assert_eq!(parsed.ignored.len(), 3, "{:?}", parsed.ignored);
        assert!(parsed.ignored[0].contains("2-x"), "{:?}", parsed.ignored);
        assert!(parse_cmdline("isolcpus=domain", 7).domain.is_empty());
    }

    /// Linux 6.9+ numbers `die_id` across the machine (the second socket's only die reads 1 on
    /// 6.12 where 6.1 said 0): dies are numbered within their package either way (issue 25).
    #[test]
    fn dies_are_numbered_within_their_package() {
        let cpus: Vec<String> = (0..8)
            .map(|id| {
                format!(
                    r#"{{"id":{id},"socket":{},"die":0,"numa":0,"core":{id},"uncore":0}}"#,
                    id / 4
                )
            })
            .collect();
        let text = format!(r#"{{"cpus":[{}],"memory_nodes":"0"}}"#, cpus.join(","));
        let topo = Topology::from_json(&text).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (sysfs, proc) = (dir.path().join("sys"), dir.path().join("proc"));
        crate::topology::fake_sysfs::write_fake_sysfs(&topo, &sysfs, &proc).unwrap();
        let dies_read = |die_ids: [u32; 8]| {
            for (cpu, die_id) in die_ids.iter().enumerate() {
                let file = format!("devices/system/cpu/cpu{cpu}/topology/die_id");
                fs::write(sysfs.join(file), format!("{die_id}\n")).unwrap();
            }
            let read = discover(&sysfs, &proc).unwrap();
            read.cpus().iter().map(|c| c.die).collect::<Vec<_>>()
        };
        // 6.1: per package; 6.12: across the machine. Same answer.
        assert_eq!(dies_read([0, 0, 0, 0, 0, 0, 0, 0]), [0; 8]);
        assert_eq!(dies_read([0, 0, 0, 0, 1, 1, 1, 1]), [0; 8]);
        // Two dies per package, numbered either way, and ids with gaps.
        let two = [0, 0, 1, 1, 0, 0, 1, 1];
        assert_eq!(dies_read([0, 0, 1, 1, 0, 0, 1, 1]), two);
        assert_eq!(dies_read([0, 0, 1, 1, 2, 2, 3, 3]), two);
        assert_eq!(
            dies_read([4, 4, 9, 9, 7, 7, 2, 2]),
            [0, 0, 1, 1, 1, 1, 0, 0]
        );
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
