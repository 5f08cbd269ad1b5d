//! Confinement: the agent writes only below its cgroup root, its state directory and the
//! metrics file's directory (and, for irq-load-balancing pods, `/proc/irq` and irqbalance's
//! socket). Proven two ways: the running agent is traced with strace through
//! pod churn and every successful open for writing, rename, unlink and mkdir is checked; and
//! every write call site in `src/` is listed here, so a new one fails this test until it is
//! reviewed and added.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cpusetd::kubesim::{new_pod_uid, ContainerSpec, PodSpec, Qos};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::agent_process::TestNode;
use crate::harness::now_ms;
use crate::util::repo;

/// Every file of `src/` (outside its unit tests) that can create, write, rename or remove a
/// file, with what it writes. Review a new entry before adding it here.
const WRITE_SITES: &[(&str, &str)] = &[
    (
        "src/cgroupfs/fs.rs",
        "cgroup interface files below the cgroup root (no O_CREAT)",
    ),
    (
        "src/cgroupfs/fake_kernel.rs",
        "debug builds, test seam: appends to CPUSETD_FAKE_KERNEL_LOG",
    ),
    (
        "src/checkpoint/store.rs",
        "state.json, host.json (the host originals, written ahead), their temporary files, quarantined files (state dir)",
    ),
    ("src/checkpoint/lock.rs", "<state-dir>/lock"),
    (
        "src/checkpoint/mod.rs",
        "none: opens the checkpoint read-only with O_NOFOLLOW",
    ),
    (
        "src/runtime.rs",
        "none: opens config.json read-only with O_NOFOLLOW",
    ),
    (
        "src/devices.rs",
        "none: opens sysfs numa_node files read-only, non-blocking, regular files only",
    ),
    (
        "src/bounded.rs",
        "none: opens files under /proc and /sys read-only, O_NOFOLLOW|O_NONBLOCK",
    ),
    ("src/watcher.rs", "its own stop pipe"),
    (
        "src/systemd_slices.rs",
        "none itself: runs `systemctl set-property --runtime <host unit> AllowedCPUs=` (systemd writes /run/systemd/system.control and the unit's cpuset), only with --isolate-host on a cgroup v2 systemd host, and to give back what it recorded",
    ),
    (
        "src/agent/metrics.rs",
        "the --metrics-file and its temporary file",
    ),
    (
        "src/cli/reset.rs",
        "reset: removes state.json and host.json from the state dir",
    ),
    (
        "src/cli/demo.rs",
        "demo: its own temporary workspace (and tmpfs mount)",
    ),
    (
        "src/kubesim.rs",
        "the scripted kubelet's fake tree (demo and tests); in the benchmarks a unique real cgroup v1 subtree and, in the vm-e2e guest, kubepods on its real cgroup v2 mount",
    ),
    ("src/topology/fake_sysfs.rs", "the demo's fake sysfs tree"),
    (
        "src/projection.rs",
        "<projection-dir>/<pod uid>/<container>.json and their temporary files (O_EXCL|O_NOFOLLOW, renamed), the pod directories (0755), their removal (files only, never followed, then rmdir); only for pods that ask or --project-all, and by reset",
    ),
    (
        "src/irq.rs",
        "existing kernel files (no O_CREAT, O_NOFOLLOW): <proc-root>/irq affinity files, only for irq-load-balancing pods; through irq::write_existing, src/cpu_power.rs's <sysfs-root>/devices/system/cpu/cpu<N>/power/pm_qos_resume_latency_us and cpufreq/scaling_governor, only for cpu-c-states and cpu-freq-governor pods' exclusive cpus",
    ),
    (
        "src/podresources/server.rs",
        "the PodResources socket (--pod-resources-socket, default <state-dir>/pod-resources.sock): \
         binds it, removes it at stop and an old socket there at start (only a socket); \
         connects to kubelet's PodResources socket (--kubelet-pod-resources-socket) to read it",
    ),
    (
        "src/podresources/client.rs",
        "`cpusetd pod-resources`: connects to the PodResources socket it is told (--socket, \
         default <state-dir>/pod-resources.sock) to ask it; writes nothing",
    ),
    (
        "src/irqbalance.rs",
        "connects to a running irqbalance's socket (<proc-root>/../run/irqbalance): setup, settings cpus; only for irq-load-balancing pods",
    ),
];

/// What counts as a write call site.
const WRITE_PATTERNS: &[&str] = &[
    "OpenOptions",
    "File::options(",
    "fs::write(",
    "File::create(",
    "rename(",
    "remove_file(",
    "remove_dir",
    "create_dir",
    "DirBuilder",
    "unistd::write(",
    "mkfifo",
    "symlink(",
    "O_WRONLY",
    "O_RDWR",
    "Command::new(",
    "O_CREAT",
    "set_permissions",
    "mount(",
    // Not a file write, but it changes another daemon's state.
    "UnixStream::connect(",
    // Makes a socket file.
    "UnixListener::bind(",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `…/name/tests.rs` declared by `…/name.rs` (or `…/name/mod.rs`) as `#[cfg(test)] mod tests;`.
fn is_unit_test_file(file: &Path) -> bool {
    if file.file_name().is_none_or(|n| n != "tests.rs") {
        return false;
    }
    let dir = file.parent().unwrap();
    let parents = [dir.with_extension("rs"), dir.join("mod.rs")];
    parents.iter().any(|parent| {
        fs::read_to_string(parent).is_ok_and(|text| text.contains("#[cfg(test)]\nmod tests;"))
    })
}

#[test]
fn every_write_call_site_is_reviewed() {
    let mut files = Vec::new();
    rust_files(&repo().join("src"), &mut files);
    let mut found: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for file in files {
        // Unit tests write their own temporary files: in a `#[cfg(test)] mod tests` block, or
        // in their own `tests.rs` that the parent module declares under `#[cfg(test)]`.
        if is_unit_test_file(&file) {
            continue;
        }
        let text = fs::read_to_string(&file).unwrap();
        let code = match text.find("\n#[cfg(test)]\nmod tests") {
            Some(at) => &text[..at],
            None => &text,
        };
        let hits: Vec<&str> = WRITE_PATTERNS
            .iter()
            .copied()
            .filter(|p| code.contains(p))
            .collect();
        if !hits.is_empty() {
            let rel = file.strip_prefix(repo()).unwrap().display().to_string();
            found.insert(rel, hits);
        }
    }
    let expected: Vec<&str> = WRITE_SITES.iter().map(|(f, _)| *f).collect();
    let unreviewed: Vec<String> = found
        .iter()
        .filter(|(f, _)| !expected.contains(&f.as_str()))
        .map(|(f, hits)| format!("{f}: {hits:?}"))
        .collect();
    assert!(
        unreviewed.is_empty(),
        "new write call sites; review them and add them to WRITE_SITES:\n{}",
        unreviewed.join("\n")
    );
    let gone: Vec<&&str> = expected
        .iter()
        .filter(|f| !found.contains_key(**f))
        .collect();
    assert!(
        gone.is_empty(),
        "WRITE_SITES lists files without writes: {gone:?}"
    );
}

/// One traced system call that changed the filesystem.
#[derive(Debug)]
struct Change {
    syscall: String,
    paths: Vec<PathBuf>,
    line: String,
}

/// The first quoted string after `from` in `text`, unescaped enough for paths (strace's `\"`,
/// `\\` and octal/hex escapes kept as they are).
fn quoted(text: &str) -> Option<(String, &str)> {
    let start = text.find('"')?;
    let mut out = String::new();
    let mut chars = text[start + 1..].char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                if let Some((_, next)) = chars.next() {
                    out.push(next);
                }
            }
            '"' => return Some((out, &text[start + 1 + i + 1..])),
            c => out.push(c),
        }
    }
    None
}

/// The directory of an `openat`-style dirfd argument: `AT_FDCWD` or `5</some/dir>` (strace -y).
fn dirfd(arg: &str, cwd: &Path) -> Option<PathBuf> {
    let arg = arg.trim();
    if arg.starts_with("AT_FDCWD") {
        return Some(cwd.to_path_buf());
    }
    let open = arg.find('<')?;
    let close = arg.rfind('>')?;
    Some(PathBuf::from(&arg[open + 1..close]))
}

/// Parses strace output (`-f -y -s 4096`) into the successful changes.
fn changes(trace: &str, cwd: &Path) -> Vec<Change> {
    let mut out = Vec::new();
    for line in trace.lines() {
        // `PID syscall(args) = result`
        let body = line.split_once(' ').map_or(line, |(_, rest)| rest).trim();
        let Some((syscall, rest)) = body.split_once('(') else {
            continue;
        };
        let Some((args, result)) = rest.rsplit_once(") = ") else {
            continue;
        };
        if result.trim_start().starts_with('-') || result.trim_start().starts_with('?') {
            continue;
        }
        let resolve = |dir: Option<PathBuf>, name: &str| -> PathBuf {
            let name = Path::new(name);
            if name.is_absolute() {
                name.to_path_buf()
            } else {
                dir.unwrap_or_else(|| cwd.to_path_buf()).join(name)
            }
        };
        let tokens = arguments(args);
        let first_dirfd = tokens.first().and_then(|a| dirfd(a, cwd));
        let paths = match syscall {
            "open" | "creat" | "mkdir" | "unlink" | "rmdir" => {
                let Some((path, after)) = quoted(args) else {
                    continue;
                };
                if syscall == "open" && !writes(after) {
                    continue;
                }
                vec![resolve(None, &path)]
            }
            // openat2's flags are inside its `struct open_how`: `{flags=O_WRONLY|…, resolve=…}`.
            "openat" | "openat2" | "mkdirat" | "unlinkat" => {
                let Some((name, after)) = quoted(args) else {
                    continue;
                };
                if syscall.starts_with("openat") && !writes(after) {
                    continue;
                }
                vec![resolve(first_dirfd, &name)]
            }
            "rename" => {
                let Some((from, after)) = quoted(args) else {
                    continue;
                };
                let Some((to, _)) = quoted(after) else {
                    continue;
                };
                vec![resolve(None, &from), resolve(None, &to)]
            }
            "renameat" | "renameat2" => {
                let Some((from, after)) = quoted(args) else {
                    continue;
                };
                let Some((to, _)) = quoted(after) else {
                    continue;
                };
                let second_dirfd = tokens.get(2).and_then(|a| dirfd(a, cwd));
                vec![resolve(first_dirfd, &from), resolve(second_dirfd, &to)]
            }
            _ => continue,
        };
        out.push(Change {
            syscall: syscall.to_string(),
            paths,
            line: line.to_string(),
        });
    }
    out
}

/// The top-level arguments of a traced call: commas inside quotes and strace's `<path>`
/// annotations do not split.
fn arguments(args: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let (mut quoted, mut angle, mut escaped) = (false, 0usize, false);
    for c in args.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '<' if !quoted => angle += 1,
            '>' if !quoted => angle = angle.saturating_sub(1),
            ',' if !quoted && angle == 0 => {
                out.push(std::mem::take(&mut current).trim().to_string());
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    out.push(current.trim().to_string());
    out
}

/// Whether the flags after an open's path ask for writing or creating.
fn writes(flags: &str) -> bool {
    let flags = flags.split(')').next().unwrap_or(flags);
    ["O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC"]
        .iter()
        .any(|f| flags.contains(f))
}

fn strace_skip_reason() -> Option<String> {
    match Command::new("strace").arg("-V").output() {
        Ok(out) if out.status.success() => {}
        _ => {
            return Some("strace is not installed (scripts/ci-deps.sh installs it as root)".into())
        }
    }
    // ptrace may be forbidden (containers without CAP_SYS_PTRACE, seccomp).
    match Command::new("strace")
        .args(["-f", "-qq", "-o", "/dev/null", "true"])
        .status()
    {
        Ok(status) if status.success() => None,
        _ => Some("strace cannot trace here (ptrace not permitted)".into()),
    }
}

#[test]
fn the_traced_agent_writes_only_below_its_roots() {
    if let Some(reason) = strace_skip_reason() {
        println!("skipped: {reason}");
        return;
    }
    let mut node = TestNode::small();
    let trace = node.base.join("..").join("agent.strace");
    let wrapper: Vec<String> = [
        "strace",
        "-f",
        "-qq",
        "-y",
        "-s",
        "4096",
        "-e",
        "trace=open,openat,openat2,creat,rename,renameat,renameat2,unlink,unlinkat,mkdir,mkdirat,rmdir",
        "-o",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([trace.display().to_string(), "--".to_string()])
    .collect();
    let started = now_ms();
    node.start_under(&wrapper);
    node.settled(started, |_| true);

    // Churn: pods of every class come, a container restarts, a foreign write is repaired, a
    // pod goes, the agent is stopped (it writes its checkpoint and metrics on the way out).
    let pod = |qos, containers| PodSpec {
        uid: new_pod_uid(),
        name: "traced".into(),
        qos,
        containers,
    };
    let db = pod(Qos::Guaranteed, vec![ContainerSpec::guaranteed("db", 2000)]);
    let web = pod(
        Qos::Burstable,
        vec![ContainerSpec::burstable("web", 500, None)],
    );
    let batch = pod(Qos::BestEffort, vec![ContainerSpec::best_effort("batch")]);
    let ids = node.fake.start_pod(&db).unwrap();
    node.fake.start_pod(&web).unwrap();
    node.fake.start_pod(&batch).unwrap();
    node.settled(now_ms(), |s| {
        s.containers
            .iter()
            .filter(|r| r.kind == "container")
            .count()
            == 3
    });
    node.fake.remove_container(&db, &ids[0]).unwrap();
    node.fake.add_container(&db, &db.containers[0]).unwrap();
    node.fake.remove_pod(&batch).unwrap();
    node.settled(now_ms(), |s| {
        s.containers
            .iter()
            .filter(|r| r.kind == "container")
            .count()
            == 2
    });

    // Stop the agent itself (strace's child), so it writes its checkpoint on the way out.
    let strace_pid = node.agent.as_ref().unwrap().pid();
    let children = format!("/proc/{strace_pid}/task/{strace_pid}/children");
    let agent_pid: i32 = fs::read_to_string(&children)
        .unwrap()
        .split_whitespace()
        .next()
        .expect("strace has a child")
        .parse()
        .unwrap();
    kill(Pid::from_raw(agent_pid), Signal::SIGTERM).unwrap();
    let mut agent = node.agent.take().unwrap();
    assert!(
        agent.wait_exit(Duration::from_secs(10)).is_some(),
        "the traced agent did not stop"
    );

    let text = fs::read_to_string(&trace).unwrap();
    let cwd = std::env::current_dir().unwrap();
    let found = changes(&text, &cwd);
    let allowed: Vec<PathBuf> = vec![
        node.fake.cgroup_root().to_path_buf(),
        node.state_dir().clone(),
        node.metrics_file().parent().unwrap().to_path_buf(),
        // Debug builds' test seam (CPUSETD_FAKE_KERNEL_LOG), not part of a release build.
        node.refusal_log(),
    ];
    let canonical = |p: &Path| -> PathBuf {
        // Normalise `..` without touching the filesystem.
        let mut out = PathBuf::new();
        for c in p.components() {
            match c {
                std::path::Component::ParentDir => {
                    out.pop();
                }
                c => out.push(c),
            }
        }
        out
    };
    let outside: Vec<&Change> = found
        .iter()
        .filter(|c| {
            c.paths
                .iter()
                .any(|p| !allowed.iter().any(|root| canonical(p).starts_with(root)))
        })
        .collect();
    let by_kind = found
        .iter()
        .fold(BTreeMap::<&str, usize>::new(), |mut m, c| {
            *m.entry(c.syscall.as_str()).or_default() += 1;
            m
        });
    println!(
        "confinement: {} traced changes checked ({by_kind:?}), {} outside the roots",
        found.len(),
        outside.len()
    );
    assert!(
        found.iter().any(|c| c.syscall.starts_with("rename")),
        "the trace shows no checkpoint rename: is strace output parsed?\n{}",
        &text[..text.len().min(4000)]
    );
    assert!(
        found
            .iter()
            .any(|c| c.paths[0].starts_with(node.fake.cgroup_root())),
        "the trace shows no cgroup write"
    );
    assert!(
        outside.is_empty(),
        "writes outside the cgroup root, state dir and metrics dir:\n{}",
        outside
            .iter()
            .map(|c| c.line.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
}
