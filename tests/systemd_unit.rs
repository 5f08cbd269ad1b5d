//! The systemd unit: the agent started the way the unit starts it (the env file's flags), with
//! systemd's notify protocol (READY, STATUS, STOPPING) on a socket of the test's; and
//! `systemd-analyze verify` / `security` on the unit where systemd-analyze exists.

use std::fs;
use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

use cpusetd::cgroupfs::CgroupVersion;
use cpusetd::kubesim::{new_pod_uid, ContainerSpec, PodSpec, Qos};

use crate::agent_process::{cpusetd_command, AgentProcess, TestNode};
use crate::util::repo;

/// `CPUSETD_ARGS` of systemd/cpusetd.env, split like the shell would.
fn env_file_args() -> Vec<String> {
    let text = fs::read_to_string(repo().join("systemd/cpusetd.env")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("CPUSETD_ARGS="))
        .expect("CPUSETD_ARGS in cpusetd.env");
    let value = line["CPUSETD_ARGS=".len()..].trim_matches('"');
    value.split_whitespace().map(String::from).collect()
}

/// Replaces the value of `flag` in `args`.
fn set_flag(args: &mut [String], flag: &str, value: &str) {
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} in the env file"));
    args[at + 1] = value.to_string();
}

#[test]
fn the_unit_starts_the_agent_with_the_env_file_flags() {
    let unit = fs::read_to_string(repo().join("systemd/cpusetd.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/cpusetd run $CPUSETD_ARGS"));
    assert!(unit.contains("Type=notify") && unit.contains("RestartPreventExitStatus=78"));

    let node = TestNode::new(CgroupVersion::V1);
    let mut args = env_file_args();
    set_flag(&mut args, "--state-dir", node.state_dir().to_str().unwrap());
    let metrics = node.metrics_file();
    set_flag(&mut args, "--metrics-file", metrics.to_str().unwrap());
    let notify_path = node.base.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();

    let mut command = cpusetd_command();
    command
        .arg("run")
        .args(&args)
        .args(node.node_args())
        .env("NOTIFY_SOCKET", &notify_path)
        .env("RUST_LOG", "info");
    let mut agent = AgentProcess::spawn(command, &node.base.join("agent.log"), None);
    let mut buf = [0u8; 4096];
    let mut messages = Vec::new();
    while !messages.iter().any(|m: &String| m.contains("READY=1")) {
        let n = notify.recv(&mut buf).expect("READY=1 from the agent");
        messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }

    let pod = PodSpec {
        uid: new_pod_uid(),
        name: "db".into(),
        qos: Qos::Guaranteed,
        containers: vec![ContainerSpec::guaranteed("db", 2000)],
    };
    let ids = node.fake.start_pod(&pod).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    // --reserved-cpus 0 from the env file: the first free whole core of socket 0 is 1,9.
    while node.cpus_of(&pod, &ids[0]) != "1,9" {
        // (The agent is stopped and its log shown when the test fails.)
        assert!(
            Instant::now() < deadline,
            "not pinned: {}",
            node.cpus_of(&pod, &ids[0])
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // STATUS follows the pass.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !messages
        .iter()
        .any(|m| m.contains("STATUS=") && m.contains("1 with exclusive cpus"))
    {
        assert!(Instant::now() < deadline, "{messages:?}");
        if let Ok(n) = notify.recv(&mut buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    assert!(agent.stop().success(), "{}", agent.log());
    while let Ok(n) = notify.recv(&mut buf) {
        messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        if messages.last().is_some_and(|m| m.contains("STOPPING=1")) {
            break;
        }
    }
    assert!(
        messages.iter().any(|m| m.contains("STOPPING=1")),
        "{messages:?}"
    );
    assert!(node.checkpoint().is_file());
}

#[test]
fn systemd_analyze_finds_the_unit_clean_and_tight() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: systemd-analyze is not installed");
        return;
    }
    // A copy whose ExecStart names the binary built for this test run, since verify checks
    // that the command exists.
    let dir = tempfile::tempdir().unwrap();
    let unit = fs::read_to_string(repo().join("systemd/cpusetd.service"))
        .unwrap()
        .replace("/usr/local/bin/cpusetd", env!("CARGO_BIN_EXE_cpusetd"));
    let path = dir.path().join("cpusetd.service");
    fs::write(&path, unit).unwrap();
    let verify = Command::new("systemd-analyze")
        .args(["verify", path.to_str().unwrap()])
        .output()
        .unwrap();
    let complaints = String::from_utf8_lossy(&verify.stderr).into_owned()
        + &String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success() && complaints.trim().is_empty(),
        "{complaints}"
    );

    let security = Command::new("systemd-analyze")
        .args(["security", "--offline=true", path.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&security.stdout);
    let score: f64 = text
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for cpusetd.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{text}"));
    eprintln!("systemd-analyze security: exposure {score}");
    assert!(score <= 2.0, "exposure {score} > 2.0:\n{text}");
}
