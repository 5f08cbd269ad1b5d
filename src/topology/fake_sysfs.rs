//! Writes a sysfs-shaped tree for a [`Topology`]: the files [`super::discover()`] reads, shaped
//! like the kernel's (trailing newlines, lists of online CPUs). What `cpusetd demo` gives the
//! agent as `--sysfs-root`, so the demo needs no files from the source tree.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;

use super::Topology;
use crate::cpuset::CpuSet;

fn write(path: &Path, value: impl std::fmt::Display) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::write(path, format!("{value}\n"))
}

/// Writes `devices/system/cpu` and `devices/system/node` under `sysfs`, and `cmdline` under
/// `proc` (with `isolcpus=` when the topology has isolated CPUs).
pub fn write_fake_sysfs(topo: &Topology, sysfs: &Path, proc: &Path) -> io::Result<()> {
    let cpu_dir = sysfs.join("devices/system/cpu");
    let all = topo.all_cpus();
    let present = all.union(topo.offline());
    write(&cpu_dir.join("online"), all)?;
    write(&cpu_dir.join("present"), &present)?;
    write(&cpu_dir.join("possible"), &present)?;
    write(&cpu_dir.join("offline"), topo.offline())?;
    write(&cpu_dir.join("isolated"), topo.isolated())?;

    write_cpu_dirs(topo, &cpu_dir)?;
    write_nodes(topo, &sysfs.join("devices/system/node"))?;
    // A hybrid part's core types, as Intel's hybrid PMUs name them.
    let types = topo.core_types();
    if !types.is_empty() {
        write(&sysfs.join("devices/cpu_core/cpus"), &types.performance)?;
        write(&sysfs.join("devices/cpu_atom/cpus"), &types.efficient)?;
    }
    let isolcpus = if topo.isolated().is_empty() {
        String::new()
    } else {
        format!(" isolcpus={}", topo.isolated())
    };
    write(
        &proc.join("cmdline"),
        format!("BOOT_IMAGE=/vmlinuz ro quiet{isolcpus}"),
    )
}

/// The CPUs of `topo` grouped by `key` (core, socket, uncore cache, NUMA node).
fn group(topo: &Topology, key: fn(&super::CpuInfo) -> u32) -> BTreeMap<u32, CpuSet> {
    let mut map: BTreeMap<u32, CpuSet> = BTreeMap::new();
    for c in topo.cpus() {
        map.entry(key(c)).or_default().insert(c.id);
    }
    map
}

/// Each CPU's `topology/` and L3 `cache/index3/` files, and `online` for all but CPU 0.
fn write_cpu_dirs(topo: &Topology, cpu_dir: &Path) -> io::Result<()> {
    let cores = group(topo, |c| c.core);
    let sockets = group(topo, |c| c.socket);
    let uncores = group(topo, |c| c.uncore);
    for c in topo.cpus() {
        let t = cpu_dir.join(format!("cpu{}/topology", c.id));
        write(&t.join("physical_package_id"), c.socket)?;
        write(&t.join("die_id"), c.die)?;
        write(&t.join("core_id"), c.core)?;
        write(&t.join("core_cpus_list"), &cores[&c.core])?;
        write(&t.join("thread_siblings_list"), &cores[&c.core])?;
        write(&t.join("package_cpus_list"), &sockets[&c.socket])?;
        let cluster = match c.cluster {
            Some(first) => topo.cpus_where(|x| x.cluster == Some(first)),
            None => cores[&c.core].clone(),
        };
        write(&t.join("cluster_cpus_list"), &cluster)?;
        let l3 = cpu_dir.join(format!("cpu{}/cache/index3", c.id));
        write(&l3.join("level"), 3)?;
        write(&l3.join("type"), "Unified")?;
        write(&l3.join("id"), c.uncore)?;
        write(&l3.join("shared_cpu_list"), &uncores[&c.uncore])?;
        if c.id != 0 {
            write(&cpu_dir.join(format!("cpu{}/online", c.id)), 1)?;
        }
    }
    Ok(())
}

/// `devices/system/node`: each node's CPU list and the online, CPU and memory node lists.
fn write_nodes(topo: &Topology, node_dir: &Path) -> io::Result<()> {
    let numas = group(topo, |c| c.numa);
    for (node, cpus) in &numas {
        write(&node_dir.join(format!("node{node}/cpulist")), cpus)?;
    }
    let nodes: CpuSet = numas.keys().copied().collect();
    write(&node_dir.join("online"), &nodes)?;
    write(&node_dir.join("has_cpu"), &nodes)?;
    write(&node_dir.join("has_memory"), topo.memory_nodes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{discover, RegularShape};

    #[test]
    fn discovery_reads_back_what_was_written() {
        let topo = Topology::regular(RegularShape {
            sockets: 2,
            numa_nodes_per_socket: 1,
            uncore_caches_per_numa_node: 1,
            cores_per_uncore_cache: 4,
            threads_per_core: 2,
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (sysfs, proc) = (dir.path().join("sys"), dir.path().join("proc"));
        write_fake_sysfs(&topo, &sysfs, &proc).unwrap();
        let read = discover(&sysfs, &proc).unwrap();
        // The writer names clusters by their core; discovery reports that explicitly.
        let expected: Vec<_> = topo
            .cpus()
            .iter()
            .map(|c| crate::topology::CpuInfo {
                cluster: Some(c.core),
                ..*c
            })
            .collect();
        assert_eq!(read.cpus(), &expected[..]);
        assert_eq!(read.memory_nodes().to_string(), "0-1");
        assert_eq!(read.all_cpus().to_string(), "0-15");
        assert!(read.core_types().is_empty());
        // Core types are written and read back.
        let hybrid = topo.with_core_types(crate::topology::CoreTypes {
            performance: CpuSet::parse("0-3,8-11").unwrap(),
            efficient: CpuSet::parse("4-7,12-15").unwrap(),
        });
        let dir = tempfile::tempdir().unwrap();
        let (sysfs, proc) = (dir.path().join("sys"), dir.path().join("proc"));
        write_fake_sysfs(&hybrid, &sysfs, &proc).unwrap();
        let read = discover(&sysfs, &proc).unwrap();
        assert_eq!(read.core_types(), hybrid.core_types());
    }
}
