//! Host slices confined through systemd itself (`--isolate-host` on a cgroup v2 systemd host).
//!
//! On a node where systemd owns the host's cgroups (`system.slice`, `user.slice`, `init.scope`
//! …), writing their `cpuset.cpus` behind its back lasts only until systemd writes its own idea
//! again; so there the agent asks systemd: `systemctl --no-ask-password set-property --runtime
//! <unit> AllowedCPUs=<cpus>`, a child process with a bounded wait (a stalled systemd must not
//! hold the controller: it is killed after [`DEFAULT_TIMEOUT`] and the change reported as not
//! made). `--runtime` keeps the change in `/run/systemd/system.control`, so it survives
//! `daemon-reload` and service restarts and goes with a reboot, as the confinement should. No
//! D-Bus library: systemctl as root talks to PID 1 over its private socket.
//!
//! A systemd host, as decided here ([`is_systemd_host`]): cgroup v2 (systemd's `AllowedCPUs=`
//! exists only there; on v1 it leaves cpusets alone, so the agent writes them as before),
//! `/run/systemd/system` present (what `sd_booted()` checks: PID 1 is systemd) and the root
//! holds a `system.slice`. Whether `systemctl` answers is known at its first call: an error
//! then names the slice and the fix, and nothing is written behind systemd's back instead.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::cgroupfs::{CgroupFs, CgroupPath, CgroupVersion, FileKind};

/// How long one `systemctl` call may take before it is killed.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `systemctl` (the one on `PATH`, or the program given) with a bounded wait.
#[derive(Debug, Clone)]
pub struct Systemctl {
    program: PathBuf,
    timeout: Duration,
}

impl Default for Systemctl {
    fn default() -> Self {
        Systemctl {
            program: PathBuf::from("systemctl"),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl Systemctl {
    /// `program` instead of `systemctl` from `PATH`, killed after `timeout`.
    pub fn with_program(program: impl Into<PathBuf>, timeout: Duration) -> Systemctl {
        Systemctl {
            program: program.into(),
            timeout,
        }
    }

    /// `systemctl --no-ask-password set-property --runtime UNIT AllowedCPUs=CPUS` (`CPUS`
    /// empty: systemd's own setting removed). `Err` names the unit, what happened and the fix.
    pub fn set_allowed_cpus(&self, unit: &str, cpus: &str) -> Result<(), String> {
        let property = format!("AllowedCPUs={cpus}");
        let args = [
            "--no-ask-password",
            "set-property",
            "--runtime",
            unit,
            property.as_str(),
        ];
        let shown = format!("systemctl set-property --runtime {unit} {property}");
        let fix = format!(
            "{unit} is left as systemd has it; check that systemd answers (`systemctl status {unit}`), or run the agent without --isolate-host"
        );
        match self.run(&args) {
            Ok((status, _)) if status.success() => Ok(()),
            Ok((status, stderr)) => Err(format!(
                "`{shown}` failed ({status}{}): {fix}",
                if stderr.is_empty() {
                    String::new()
                } else {
                    format!(": {stderr}")
                }
            )),
            Err(why) => Err(format!("`{shown}` {why}: {fix}")),
        }
    }

    /// Runs the program with `args` (stdin and stdout closed off, stderr kept): its exit
    /// status and the start of its stderr, or why it did not run to the end in time.
    fn run(&self, args: &[&str]) -> Result<(ExitStatus, String), String> {
        let mut child = Command::new(&self.program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env("SYSTEMD_PAGER", "")
            .spawn()
            .map_err(|e| format!("could not be run ({}: {e})", self.program.display()))?;
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "{STALLED} {:?} (killed; systemd did not answer)",
                        self.timeout
                    ));
                }
                Err(e) => return Err(format!("could not be waited for ({e})")),
            }
        };
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = pipe.by_ref().take(4096).read_to_string(&mut stderr);
        }
        Ok((status, stderr.trim().replace('\n', "; ")))
    }
}

/// What a [`Systemctl`] error says when the call was killed at its timeout.
const STALLED: &str = "did not finish within";

/// Whether `error` (from [`Systemctl::set_allowed_cpus`]) is a call killed at its timeout:
/// systemd is not answering, so the other units of the same pass are not asked (a pass waits
/// one timeout at most).
pub fn is_stall(error: &str) -> bool {
    error.contains(STALLED)
}

/// Whether systemd owns the host cgroups of this hierarchy (see the module's documentation);
/// `run_systemd` is `/run/systemd/system` on a real host.
pub fn is_systemd_host(fs: &CgroupFs, version: CgroupVersion, run_systemd: &Path) -> bool {
    version == CgroupVersion::V2
        && run_systemd.is_dir()
        && fs.list(&CgroupPath::root()).is_ok_and(|entries| {
            entries
                .iter()
                .any(|e| e.kind == FileKind::Directory && e.name == "system.slice")
        })
}

/// The systemd unit a cgroup directly below the root is (`system.slice`, `init.scope` …);
/// `None` for anything else.
pub fn unit_of(path: &CgroupPath) -> Option<String> {
    if path.depth() != 1 {
        return None;
    }
    let name = path.to_str()?.trim_start_matches('/');
    (name.ends_with(".slice") || name.ends_with(".scope"))
        .then(|| name.to_string())
        .filter(|n| n != "-.slice")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    /// A fake `systemctl`: a shell script that logs its arguments and runs `body`.
    fn fake(dir: &Path, body: &str) -> PathBuf {
        let path = dir.join("systemctl");
        let log = dir.join("calls");
        fs::write(
            &path,
            format!("#!/bin/sh\necho \"$@\" >>{}\n{body}\n", log.display()),
        )
        .unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn set_property_runtime_is_what_systemctl_is_asked() {
        let dir = tempfile::tempdir().unwrap();
        let systemctl = Systemctl::with_program(fake(dir.path(), "exit 0"), DEFAULT_TIMEOUT);
        systemctl.set_allowed_cpus("system.slice", "0-1").unwrap();
        systemctl.set_allowed_cpus("user.slice", "").unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("calls")).unwrap(),
            "--no-ask-password set-property --runtime system.slice AllowedCPUs=0-1\n\
             --no-ask-password set-property --runtime user.slice AllowedCPUs=\n"
        );
    }

    #[test]
    fn a_failing_systemctl_is_a_clear_error_naming_the_slice_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let body = "echo 'Failed to set unit properties: Access denied' >&2; exit 1";
        let systemctl = Systemctl::with_program(fake(dir.path(), body), DEFAULT_TIMEOUT);
        let err = systemctl.set_allowed_cpus("system.slice", "0").unwrap_err();
        assert!(
            err.contains("systemctl set-property --runtime system.slice AllowedCPUs=0")
                && err.contains("exit status: 1")
                && err.contains("Access denied")
                && err.contains("system.slice is left as systemd has it")
                && err.contains("--isolate-host"),
            "{err}"
        );
    }

    #[test]
    fn a_stalled_systemctl_is_killed_after_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let timeout = Duration::from_millis(300);
        let systemctl = Systemctl::with_program(fake(dir.path(), "exec sleep 30"), timeout);
        let started = Instant::now();
        let err = systemctl.set_allowed_cpus("user.slice", "0").unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(
            err.contains("did not finish within") && err.contains("user.slice is left"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_systemctl_says_so() {
        let systemctl = Systemctl::with_program("/nonexistent/systemctl", DEFAULT_TIMEOUT);
        let err = systemctl.set_allowed_cpus("system.slice", "0").unwrap_err();
        assert!(
            err.contains("could not be run (/nonexistent/systemctl")
                && err.contains("system.slice"),
            "{err}"
        );
    }

    #[test]
    fn units_are_the_root_s_slices_and_scopes() {
        let unit = |p: &str| unit_of(&CgroupPath::new(p).unwrap());
        assert_eq!(unit("system.slice").as_deref(), Some("system.slice"));
        assert_eq!(unit("init.scope").as_deref(), Some("init.scope"));
        assert_eq!(unit("system.slice/cron.service"), None);
        assert_eq!(unit("kubepods"), None);
        assert_eq!(unit(""), None);
    }
}
