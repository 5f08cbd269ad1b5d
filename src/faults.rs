//! Debug builds only: injected failures, so tests can drive the running agent through errors
//! the kernel or the disk produce rarely. Release builds have none of this (the module is
//! compiled only with `debug_assertions`); a debug build without `CPUSETD_FAULTS` behaves as
//! if it were not there.
//!
//! `CPUSETD_FAULTS` is a comma-separated list of rules; each makes the first `N` matching
//! operations fail with an errno:
//!
//! * `write:<file>:<ERRNO>:<N>`: cgroupfs writes of that interface file (`*` for any);
//! * `checkpoint:<ERRNO>:<N>`: checkpoint saves (the temporary file's creation);
//! * `hostrecord:<ERRNO>:<N>`: saves of the host originals (`host.json`, written ahead of
//!   every change outside kubepods);
//! * `watch:<ERRNO>:<N>`: `inotify_add_watch` for a directory that appeared while running;
//! * `startwatch:<ERRNO>:<N>`: `inotify_add_watch` of the kubepods tree at start;
//! * `overflow:<N>`: the next `N` reads of the inotify queue report `IN_Q_OVERFLOW`;
//! * `kill:<file>:<N>`: the agent `SIGKILL`s itself right after the `N`th write of that file
//!   succeeded (cgroupfs interface files, `/proc/irq`'s `smp_affinity_list` and
//!   `default_smp_affinity`, and each cpu's `pm_qos_resume_latency_us` and `scaling_governor`;
//!   `*` for any), as a `kill -9` between a change and its checkpoint.
//!
//! For example `CPUSETD_FAULTS=write:cpuset.cpus:EBUSY:3,checkpoint:ENOSPC:2`. A malformed rule
//! is reported once on stderr and ignored. Each injected failure is logged at debug level.

use std::io;
use std::sync::{Mutex, OnceLock};

use nix::errno::Errno;

/// Where a rule applies.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Site {
    /// A cgroupfs write of this file name (`None`: any).
    Write(Option<String>),
    Checkpoint,
    HostRecord,
    Watch,
    StartWatch,
    Overflow,
    /// `SIGKILL` after a successful write of this file name (`None`: any).
    KillAfterWrite(Option<String>),
}

#[derive(Debug)]
struct Rule {
    site: Site,
    errno: Errno,
    remaining: u32,
}

fn rules() -> &'static Mutex<Vec<Rule>> {
    static RULES: OnceLock<Mutex<Vec<Rule>>> = OnceLock::new();
    RULES.get_or_init(|| {
        let text = std::env::var("CPUSETD_FAULTS").unwrap_or_default();
        let (rules, bad) = parse(&text);
        for rule in bad {
            eprintln!("cpusetd: CPUSETD_FAULTS: ignoring malformed rule {rule:?}");
        }
        Mutex::new(rules)
    })
}

/// Parses the rules; returns them and the texts that are not rules.
fn parse(text: &str) -> (Vec<Rule>, Vec<String>) {
    let mut rules = Vec::new();
    let mut bad = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let parts: Vec<&str> = item.split(':').collect();
        let rule = match parts.as_slice() {
            ["write", file, errno, n] => rule(
                Site::Write((*file != "*").then(|| file.to_string())),
                errno,
                n,
            ),
            ["checkpoint", errno, n] => rule(Site::Checkpoint, errno, n),
            ["hostrecord", errno, n] => rule(Site::HostRecord, errno, n),
            ["watch", errno, n] => rule(Site::Watch, errno, n),
            ["startwatch", errno, n] => rule(Site::StartWatch, errno, n),
            ["overflow", n] => rule(Site::Overflow, &"EOVERFLOW", n),
            ["kill", file, n] => rule(
                Site::KillAfterWrite((*file != "*").then(|| file.to_string())),
                &"EINTR",
                n,
            ),
            _ => None,
        };
        match rule {
            Some(rule) => rules.push(rule),
            None => bad.push(item.to_string()),
        }
    }
    (rules, bad)
}

fn rule(site: Site, errno: &&str, n: &&str) -> Option<Rule> {
    let errno = match *errno {
        "ENOENT" => Errno::ENOENT,
        "EBUSY" => Errno::EBUSY,
        "EACCES" => Errno::EACCES,
        "EINVAL" => Errno::EINVAL,
        "ENOSPC" => Errno::ENOSPC,
        "EROFS" => Errno::EROFS,
        "EPERM" => Errno::EPERM,
        "EIO" => Errno::EIO,
        "EMFILE" => Errno::EMFILE,
        "EOVERFLOW" => Errno::EOVERFLOW,
        "EINTR" => Errno::EINTR,
        _ => return None,
    };
    Some(Rule {
        site,
        errno,
        remaining: n.parse().ok()?,
    })
}

/// Takes one failure from the first rule matching `site`, if any is left.
fn take(matches: impl Fn(&Site) -> bool, what: &str) -> Option<io::Error> {
    let mut rules = rules().lock().unwrap_or_else(|e| e.into_inner());
    let rule = rules
        .iter_mut()
        .find(|r| r.remaining > 0 && matches(&r.site))?;
    rule.remaining -= 1;
    log::debug!("injected fault: {what}: {}", rule.errno);
    Some(io::Error::from(rule.errno))
}

/// An injected failure for a cgroupfs write of `file`.
pub fn cgroup_write(file: &str) -> Option<io::Error> {
    take(
        |site| matches!(site, Site::Write(f) if f.as_deref().is_none_or(|f| f == file)),
        file,
    )
}

/// An injected failure for a checkpoint save.
pub fn checkpoint_save() -> Option<io::Error> {
    take(|site| *site == Site::Checkpoint, "checkpoint")
}

/// An injected failure for a save of the host originals.
pub fn host_record_save() -> Option<io::Error> {
    take(|site| *site == Site::HostRecord, "host record")
}

/// An injected failure for `inotify_add_watch`.
pub fn add_watch() -> Option<io::Error> {
    take(|site| *site == Site::Watch, "inotify_add_watch")
}

/// An injected failure for `inotify_add_watch` of the kubepods tree at start.
pub fn start_watch() -> Option<io::Error> {
    take(
        |site| *site == Site::StartWatch,
        "inotify_add_watch at start",
    )
}

/// After a successful write of `file`: `SIGKILL` this process when a `kill` rule counts down
/// to this write.
pub fn written(file: &str) {
    let mut rules = rules().lock().unwrap_or_else(|e| e.into_inner());
    let Some(rule) = rules.iter_mut().find(|r| {
        r.remaining > 0
            && matches!(&r.site, Site::KillAfterWrite(f) if f.as_deref().is_none_or(|f| f == file))
    }) else {
        return;
    };
    rule.remaining -= 1;
    if rule.remaining == 0 {
        log::debug!("injected fault: SIGKILL after a write of {file}");
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// Whether this read of the inotify queue is to report an overflow.
pub fn queue_overflow() -> bool {
    take(|site| *site == Site::Overflow, "inotify queue overflow").is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_bad_ones_are_named() {
        let (rules, bad) = parse(
            "write:cpuset.cpus:EBUSY:3, checkpoint:ENOSPC:2,watch:ENOSPC:1,overflow:1,\
             write:*:EACCES:1,kill:cpuset.sched_load_balance:2,write:x:EWHAT:1,nonsense",
        );
        let shown: Vec<(Site, Errno, u32)> = rules
            .iter()
            .map(|r| (r.site.clone(), r.errno, r.remaining))
            .collect();
        assert_eq!(
            shown,
            [
                (Site::Write(Some("cpuset.cpus".into())), Errno::EBUSY, 3),
                (Site::Checkpoint, Errno::ENOSPC, 2),
                (Site::Watch, Errno::ENOSPC, 1),
                (Site::Overflow, Errno::EOVERFLOW, 1),
                (Site::Write(None), Errno::EACCES, 1),
                (
                    Site::KillAfterWrite(Some("cpuset.sched_load_balance".into())),
                    Errno::EINTR,
                    2
                ),
            ]
        );
        assert_eq!(bad, ["write:x:EWHAT:1", "nonsense"]);
    }
}
