//! `cpusetd demo`, the README's first command: runs through every step, exits 0, and leaves
//! nothing behind (no temporary tree, no mount, no agent).

use crate::util::{cpusetd, stderr, stdout};

#[test]
fn the_demo_runs_every_step_and_cleans_up() {
    for extra in [&[][..], &["--cgroup-v2"][..]] {
        let mut args = vec!["demo"];
        args.extend_from_slice(extra);
        let out = cpusetd(&args);
        let text = stdout(&out);
        assert!(out.status.success(), "{extra:?}\n{text}\n{}", stderr(&out));
        for needle in [
            "== 1. A BestEffort pod `web` arrives",
            "== 3. A Guaranteed pod `db` arrives",
            "allocated cpus=1,9",
            "== 5. Someone writes 0-15 into `db`'s cpuset.cpus behind the agent's back: repaired to 1,9.",
            "released cpus=1,9 (pod gone)",
            "demo finished",
        ] {
            assert!(text.contains(needle), "{extra:?}: missing {needle:?} in\n{text}");
        }
        let dir = text
            .lines()
            .find_map(|l| l.strip_prefix("cpusetd demo: a fake node in "))
            .expect("the demo names its directory");
        assert!(!std::path::Path::new(dir).exists(), "{dir} left behind");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        assert!(!mounts.contains(dir), "{dir} still mounted");
    }
}
