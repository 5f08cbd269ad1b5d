//! System calls per cgroup of one full scan (`Scanner::scan`), for issue 13's full-rescan
//! figure. Builds the reconcile benchmark's tree (`PODS` pods of a sandbox and three
//! containers, default 250: 1,253 cgroups) on tmpfs, or with `REAL=1` the same tree on the
//! real cgroup v1 hierarchy (root; `cpusetd-bench-<pid>` under `/sys/fs/cgroup/cpuset` and
//! `/sys/fs/cgroup/cpu`, removed at the end), scans it once to warm it, then scans it once more
//! between two marker calls (`access("/cpusetd-scan-begin")`, `access("/cpusetd-scan-end")`)
//! and prints the cgroup count (`WARM=n` scans n times first, for a profiler; `ROUNDS=n` times
//! n scans against the reconcile benchmark's floor). Count what lies between the markers:
//!
//! ```text
//! cargo bench --bench scan_syscalls --no-run   # prints the binary's path: BIN below
//! strace -f -o /tmp/scan.strace BIN
//! awk '/cpusetd-scan-begin/{on=1;next} /cpusetd-scan-end/{on=0} on{sub(/^[0-9]+ +/,"");
//!   sub(/\(.*/,""); n[$0]++} END{for(s in n) print s, n[s]}' /tmp/scan.strace
//! ```

mod common;

use std::path::Path;

use common::*;

fn marker(name: &str) {
    let _ = nix::unistd::access(Path::new(name), nix::unistd::AccessFlags::F_OK);
}

fn main() {
    let pods = env_usize("PODS", 250);
    let real = std::env::var("REAL").is_ok_and(|v| v == "1");
    let machine = fake_machine(TOPOLOGY_256);
    let kernel = real.then(KernelMachine::new);
    let node = kernel.as_ref().map_or(&machine.fake, |k| &k.fake);
    let mut files = Vec::new();
    for pod in large_node_pods(pods, 25) {
        let sandbox = node.add_pod(&pod).unwrap();
        let dir = node.pod_dir(&pod);
        files.push(node.file(&format!("{dir}/{sandbox}"), "cpuset.cpus"));
        for c in &pod.containers {
            let id = node.add_container(&pod, c).unwrap();
            files.push(node.file(&format!("{dir}/{id}"), "cpuset.cpus"));
        }
    }
    let mut scanner = match &kernel {
        None => scanner_of(&machine),
        Some(kernel) => {
            use cpusetd::cgroupfs::{
                CgroupDriver, CgroupLayout, CgroupPath, CgroupVersion, Hierarchy, Scanner,
            };
            let layout = CgroupLayout {
                version: CgroupVersion::V1,
                driver: CgroupDriver::Cgroupfs,
                cpuset_root: Path::new(CGROUP_ROOT).join("cpuset"),
                cpu_root: Path::new(CGROUP_ROOT).join("cpu"),
                kubepods: CgroupPath::new(&format!("{}/kubepods", kernel.name)).unwrap(),
            };
            Scanner::new(Hierarchy::open(&layout).unwrap(), layout.kubepods)
        }
    };
    let mut warm = scanner.scan().unwrap();
    for _ in 1..env_usize("WARM", 1) {
        warm = scanner.scan().unwrap();
    }
    marker("/cpusetd-scan-begin");
    let scan = scanner.scan().unwrap();
    marker("/cpusetd-scan-end");
    assert_eq!(scan.cgroups.len(), warm.cgroups.len());
    println!("{} cgroups scanned", scan.cgroups.len());
    // `ROUNDS=n`: n rounds of the reconcile benchmark's floor and a scan, one after the other,
    // and the median of each round's ratio (steadier than two medians on a shared machine).
    // The same against every file the scan reads, each read with `read_to_string` (what the
    // floor does for one file per container): the scan's cost per file.
    let rounds = env_usize("ROUNDS", 0);
    if rounds > 0 {
        use cpusetd::cgroupfs::InterfaceFile as F;
        let hierarchy = scanner.hierarchy();
        let every_file: Vec<_> = scan
            .cgroups
            .iter()
            .flat_map(|c| {
                let cpuset = [F::CpusetCpus, F::CpusetMems, F::CpusetEffectiveCpus]
                    .map(|f| hierarchy.cpuset.file_path(&c.path, f));
                let cpu = [F::CpuShares, F::CpuCfsQuotaUs, F::CpuCfsPeriodUs]
                    .map(|f| hierarchy.cpu.file_path(&c.path, f));
                cpuset.into_iter().chain(cpu)
            })
            .collect();
        let read_all = |files: &[std::path::PathBuf]| {
            let started = std::time::Instant::now();
            for file in files {
                std::hint::black_box(std::fs::read_to_string(file).unwrap());
            }
            started.elapsed().as_secs_f64()
        };
        let (mut ratios, mut per_file, mut scans) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let floor = read_all(&files);
            let all = read_all(&every_file);
            let started = std::time::Instant::now();
            std::hint::black_box(scanner.scan().unwrap());
            let took = started.elapsed().as_secs_f64();
            ratios.push(took / floor);
            per_file.push(took / all);
            scans.push(took * 1e3);
        }
        for v in [&mut ratios, &mut per_file, &mut scans] {
            v.sort_by(f64::total_cmp);
        }
        let m = rounds / 2;
        println!(
            "scan {:.1} ms, {:.2} x floor ({:.2}..{:.2}); {:.2} x read_to_string of the {} files \
             it reads (medians of {rounds} rounds)",
            scans[m],
            ratios[m],
            ratios[0],
            ratios[rounds - 1],
            per_file[m],
            every_file.len()
        );
    }
}
