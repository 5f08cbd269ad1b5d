//! Configuration errors given by flags (issue 23, items 9 and 23): `run` exits 78 (systemd's
//! `RestartPreventExitStatus=78` stops restarting it), the one-shot commands 2, each with a
//! message naming the flag and the fix, and nothing written.

use std::fs;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use cpusetd::cgroupfs::CgroupVersion;

use crate::agent_process::{cpusetd_command, TestNode};

/// `cpusetd <command> <args> <extra>`, killed when still running after 20 s (an agent that
/// took a bad flag for a good one runs on).
fn cpusetd(command: &str, args: &[String], extra: &[&str]) -> Output {
    let mut child = cpusetd_command()
        .arg(command)
        .args(args)
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "cpusetd {command} {extra:?} still running after 20 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn code_and_stderr(out: &Output) -> (Option<i32>, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `--kubepods-path` naming the cgroup root (`""`, `/`, `.`, `./`): refused before anything is
/// read or written: the host's cgroups beside kubepods keep their cpus.
#[test]
fn a_kubepods_path_naming_the_cgroup_root_is_refused() {
    let node = TestNode::new(CgroupVersion::V1);
    let host = node.fake.cgroup_root().join("cpuset/system.slice");
    fs::create_dir(&host).unwrap();
    fs::write(host.join("cpuset.cpus"), "0-1\n").unwrap();
    fs::write(host.join("cpuset.mems"), "0\n").unwrap();
    let args = node.tree_args();
    for path in ["", "/", "//", ".", "./", "/./"] {
        for (command, expected) in [("run", 78), ("reset", 2), ("plan", 2), ("status", 2)] {
            let extra = ["--reserved-cpus", "0", "--kubepods-path", path];
            let (code, stderr) = code_and_stderr(&cpusetd(command, &args, &extra));
            assert_eq!(code, Some(expected), "{command} {path:?}: {stderr}");
            assert!(
                stderr.contains("--kubepods-path") && stderr.contains("kubepods.slice"),
                "{command} {path:?}: the flag and the fix: {stderr}"
            );
        }
    }
    assert_eq!(
        fs::read_to_string(host.join("cpuset.cpus")).unwrap(),
        "0-1\n"
    );
    assert!(!node.checkpoint().exists());
}

/// A state directory that cannot be one (`/dev/null`, a file, `/proc/self`) is a
/// configuration error of `run` (78, not 1: systemd would restart it for ever).
#[test]
fn run_with_an_unusable_state_dir_exits_78() {
    let node = TestNode::new(CgroupVersion::V1);
    let file = node.base.join("a-file");
    fs::write(&file, "").unwrap();
    let file = file.display().to_string();
    for state_dir in ["/dev/null", "/proc/self", file.as_str()] {
        let mut args = node.node_args();
        args.extend(["--state-dir".to_string(), state_dir.to_string()]);
        let extra = ["--reserved-cpus", "0", "--kubelet-state", "none"];
        let (code, stderr) = code_and_stderr(&cpusetd("run", &args, &extra));
        assert_eq!(code, Some(78), "{state_dir}: {stderr}");
        assert!(
            stderr.contains("--state-dir") && stderr.contains(state_dir),
            "{state_dir}: {stderr}"
        );
    }
}

/// `reset` with a state directory that cannot be one: a usage error naming the flag, not
/// "stop cpusetd" (no agent runs there).
#[test]
fn reset_with_an_unusable_state_dir_names_the_flag() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut args = node.node_args();
    args.extend(["--state-dir".to_string(), "/dev/null".to_string()]);
    let (code, stderr) = code_and_stderr(&cpusetd("reset", &args, &[]));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--state-dir /dev/null") && !stderr.contains("stop cpusetd"),
        "{stderr}"
    );
}

/// A bad `--sysfs-root` is a usage error of every one-shot command (2), as `plan` already
/// said, and a configuration error of `run` (78).
#[test]
fn a_bad_sysfs_root_is_a_configuration_error_everywhere() {
    let node = TestNode::new(CgroupVersion::V1);
    let mut args = node.tree_args();
    let at = args.iter().position(|a| a == "--sysfs-root").unwrap();
    args[at + 1] = "/proc".into();
    let extra = ["--reserved-cpus", "0", "--kubelet-state", "none"];
    for (command, args, extra, expected) in [
        (
            "topology",
            &vec!["--sysfs-root".to_string(), "/proc".into()],
            &[][..],
            2,
        ),
        ("plan", &args, &extra[..2], 2),
        ("run", &args, &extra[..], 78),
    ] {
        let (code, stderr) = code_and_stderr(&cpusetd(command, args, extra));
        assert_eq!(code, Some(expected), "{command}: {stderr}");
        assert!(
            stderr.contains("--sysfs-root /proc"),
            "{command}: the flag: {stderr}"
        );
    }
}
