//! The CFS quota lift of kubelet's `DisableCPUQuotaWithExclusiveCPUs`: a container holding
//! exclusive cpus runs without a CFS quota, and so does its pod (or the pod's quota would still
//! throttle it). With `--keep-cfs-quota` only the containers whose pod says
//! `cpu-quota.crio.io: "disable"` (and their pods) are lifted. A quota lifted and no longer to
//! be (the pin released, the agent restarted with `--keep-cfs-quota`, `cpusetd reset`) gets its
//! original back.
//!
//! What a cgroup's quota is comes from what the agent last read of it ([`Wanted::cgroups`], the
//! controller's model, which the watcher keeps current): the effect reads a quota file itself
//! only where that and its own record disagree (its lift not seen by the model yet, or a quota
//! set again since: an in-place resize, whose value becomes the original). Lifts go pods
//! first, restores containers first: on cgroup v1 the kernel refuses a child's quota above its
//! parent's and a parent's below a child's (`-1` is always accepted). A quota that someone set
//! again after the lift is theirs: its record is dropped, nothing is written.
//!
//! Saved state (in `state.json`'s `effects` and `host.json` under [`NAME`]): the list of
//! [`Lift`]s, the form `state.json` kept as `quota_lifted` before this was an effect (read into
//! the map under this name, so an upgrade keeps every original).

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Cgroups, Effect, Env, InForce, Recorded, Restored, Wanted};
use crate::agent::metrics::Metrics;
use crate::cgroupfs::values::{parse_cfs_quota, parse_cpu_max};
use crate::cgroupfs::{
    CgroupError, CgroupFs, CgroupPath, CgroupVersion, CpuMax, CpuSettings, FileValue,
    InterfaceFile, Quota, Scan,
};
use crate::checkpoint::host::HostJournal;
use crate::classify::{CgroupKind, Classification};
use crate::logging::error_chain;
use crate::planner::{Step, WriteStep};
use crate::state::Assignments;

/// Its key in the saved-state maps.
pub const NAME: &str = "quota";

/// One quota the agent lifted: the cgroup (relative to the cgroup root) and its quota file's
/// content before the lift (`cpu.cfs_quota_us` on v1, `cpu.max` on v2), put back on release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lift {
    pub cgroup: String,
    pub original: String,
}

#[derive(Debug)]
struct QuotaLift {
    /// The hierarchy holding the quota files (v1 `cpu`, v2 the unified one).
    fs: CgroupFs,
    version: CgroupVersion,
    /// The originals of the quotas it lifted, by cgroup.
    lifted: BTreeMap<CgroupPath, String>,
    /// The lifts read back unlimited after the write (at start: every one recorded).
    in_force: BTreeSet<CgroupPath>,
    journal: Option<HostJournal>,
    /// What it wrote since [`Effect::take_written`].
    written: Vec<(CgroupPath, InterfaceFile, String)>,
    /// Failures said (once each while they last).
    said: HashSet<String>,
}

/// A quota limit as its file shows it, and what lifts it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Limit {
    original: String,
    lift: String,
}

/// What to do with one cgroup.
#[derive(Debug)]
enum Action {
    Lift(CgroupPath, Limit),
    Restore(CgroupPath, String),
    /// Drop the record: the cgroup is gone, or someone set its quota again since the lift.
    Forget(CgroupPath),
}

/// The effect on the hierarchy holding the quota files (none without one), with what earlier
/// runs recorded (the host record's originals win).
pub fn build(env: &Env<'_>, recorded: &Recorded<'_>) -> Option<Box<dyn Effect>> {
    let (_, version, kubepods) = env.cpuset.as_ref()?;
    let fs = env.cpu.clone()?;
    let (saved, host) = recorded.typed::<Vec<Lift>>(NAME);
    let mut lifted = BTreeMap::new();
    for lift in host.unwrap_or(saved) {
        match checked(&lift, *version, kubepods) {
            Ok(path) => {
                lifted.insert(path, lift.original);
            }
            Err(why) => log::warn!(
                "the record of lifted CFS quotas names cgroup {:?} with original {:?}: {why}; \
                 that quota is not restored, put it back by hand",
                lift.cgroup,
                lift.original
            ),
        }
    }
    Some(Box::new(QuotaLift {
        fs,
        version: *version,
        in_force: lifted.keys().cloned().collect(),
        lifted,
        journal: env.journal.clone(),
        written: Vec::new(),
        said: HashSet::new(),
    }))
}

/// A recorded lift's cgroup, when it is one below `kubepods` and its original a quota limit
/// of `version`'s file (what else a record says is never written).
fn checked(
    lift: &Lift,
    version: CgroupVersion,
    kubepods: &CgroupPath,
) -> Result<CgroupPath, String> {
    let path = CgroupPath::new(&lift.cgroup).map_err(|e| format!("no cgroup path ({e})"))?;
    if path.strip_prefix(kubepods).is_none() {
        return Err(format!("not below the kubepods cgroup {kubepods}"));
    }
    let limit = match version {
        CgroupVersion::V1 => parse_cfs_quota(&lift.original).map(limit_v1),
        CgroupVersion::V2 => parse_cpu_max(&lift.original).map(limit_v2),
    };
    match limit {
        Ok(Some(_)) => Ok(path),
        Ok(None) => Err("the original is no limit".to_string()),
        Err(e) => Err(format!("the original is no quota of cgroup {version}: {e}")),
    }
}

/// The cgroups to run without a quota: every container of `wanted` (each holds exclusive
/// cpus) unless `--keep-cfs-quota` keeps it and its pod does not say `cpu-quota.crio.io:
/// "disable"`, and its pod.
fn to_lift(wanted: &Wanted<'_>, cgroups: &dyn Cgroups) -> BTreeSet<CgroupPath> {
    let mut lift = BTreeSet::new();
    for assigned in &wanted.containers {
        if wanted.keep_cfs_quota && !assigned.isolation.no_cpu_quota {
            continue;
        }
        lift.insert(assigned.path.clone());
        if let Some(pod) = cgroups.pod_of(assigned.path) {
            lift.insert(pod);
        }
    }
    lift
}

/// The limit of a v1 `cpu.cfs_quota_us` (`None`: unlimited).
fn limit_v1(quota: Quota) -> Option<Limit> {
    match quota {
        Quota::Unlimited => None,
        Quota::Micros(us) => Some(Limit {
            original: us.to_string(),
            lift: "-1".to_string(),
        }),
    }
}

/// The limit of a v2 `cpu.max` (`None`: unlimited). The lift keeps the period, written out so
/// the file reads back as the kernel shows it.
fn limit_v2(max: CpuMax) -> Option<Limit> {
    (max.quota != Quota::Unlimited).then(|| Limit {
        original: max.to_string(),
        lift: format!("max {}", max.period_us),
    })
}

/// A cgroup's limit as last read: `None` when unread (or missing), `Some(None)` unlimited.
fn limit_of(cpu: &CpuSettings) -> Option<Option<Limit>> {
    match cpu {
        CpuSettings::V1 {
            cfs_quota: FileValue::Value(quota),
            ..
        } => Some(limit_v1(*quota)),
        CpuSettings::V2 {
            max: FileValue::Value(max),
            ..
        } => Some(limit_v2(*max)),
        _ => None,
    }
}

/// The quota lifts `cpusetd plan` shows and `plan --apply` makes after the plan's writes (the
/// one-shot commands keep no record: `reset` recovers such quotas from the runtime configs):
/// for each container of `scan` holding exclusive cpus in `assignments` (under
/// `--keep-cfs-quota` only where its pod says `cpu-quota.crio.io: "disable"`) and its pod,
/// where it still has a quota, in scan (pre-)order: a pod before its containers.
pub fn lift_steps<C: Borrow<Classification>>(
    scan: &Scan,
    classes: &[C],
    parents: &[Option<usize>],
    assignments: &Assignments,
    keep_cfs_quota: bool,
) -> Vec<Step> {
    let mut lift = vec![false; scan.cgroups.len()];
    for (i, class) in classes.iter().map(Borrow::borrow).enumerate() {
        let exclusive = class.kind == CgroupKind::Container
            && class
                .assignment_key()
                .is_some_and(|k| assignments.get(&k).is_some());
        if exclusive && (!keep_cfs_quota || class.isolation.no_cpu_quota) {
            lift[i] = true;
            if let Some(p) = parents[i].filter(|&p| classes[p].borrow().kind == CgroupKind::Pod) {
                lift[p] = true;
            }
        }
    }
    let mut steps = Vec::new();
    for (cgroup, _) in scan.cgroups.iter().zip(lift).filter(|(_, lift)| *lift) {
        let file = match cgroup.cpu {
            CpuSettings::V1 { .. } => InterfaceFile::CpuCfsQuotaUs,
            CpuSettings::V2 { .. } => InterfaceFile::CpuMax,
        };
        if let Some(Some(limit)) = limit_of(&cgroup.cpu) {
            let path = cgroup.path.clone();
            steps.push(Step::new(path, file, limit.lift, WriteStep::LiftQuota));
        }
    }
    steps
}

impl QuotaLift {
    fn file(&self) -> InterfaceFile {
        match self.version {
            CgroupVersion::V1 => InterfaceFile::CpuCfsQuotaUs,
            CgroupVersion::V2 => InterfaceFile::CpuMax,
        }
    }

    /// The cgroup's limit as its file says now (`None`: unlimited).
    fn read_limit(&self, path: &CgroupPath) -> Result<Option<Limit>, String> {
        let text = self
            .fs
            .read(path, self.file())
            .map_err(|e| error_chain(&e))?;
        let parsed = match self.version {
            CgroupVersion::V1 => parse_cfs_quota(&text).map(limit_v1),
            CgroupVersion::V2 => parse_cpu_max(&text).map(limit_v2),
        };
        parsed.map_err(|e| format!("{}: {e}", self.fs.file_path(path, self.file()).display()))
    }

    /// What to do: restores first, containers before their pods (the record in reverse path
    /// order), then lifts, pods before their containers.
    fn actions(&self, lift: &BTreeSet<CgroupPath>, cgroups: &dyn Cgroups) -> Vec<Action> {
        let mut actions = Vec::new();
        for (path, original) in self.lifted.iter().rev() {
            if lift.contains(path) {
                continue;
            }
            match cgroups.cpu(path).map(limit_of) {
                None => actions.push(Action::Forget(path.clone())),
                Some(None) => {}
                Some(Some(None)) => actions.push(Action::Restore(path.clone(), original.clone())),
                // The model may not have seen the lift yet: the file says.
                Some(Some(Some(_))) => match self.read_limit(path) {
                    Ok(None) => actions.push(Action::Restore(path.clone(), original.clone())),
                    Ok(Some(_)) => actions.push(Action::Forget(path.clone())),
                    Err(_) => {}
                },
            }
        }
        for path in lift {
            let Some(Some(Some(limit))) = cgroups.cpu(path).map(limit_of) else {
                continue;
            };
            if !self.in_force.contains(path) {
                actions.push(Action::Lift(path.clone(), limit));
            } else if let Ok(Some(limit)) = self.read_limit(path) {
                // Set again after the lift (an in-place resize): its new value is the original.
                actions.push(Action::Lift(path.clone(), limit));
            }
        }
        actions
    }

    /// The record as saved.
    fn lifts(lifted: &BTreeMap<CgroupPath, String>) -> Vec<Lift> {
        lifted
            .iter()
            .map(|(path, original)| Lift {
                cgroup: path.to_string(),
                original: original.clone(),
            })
            .collect()
    }

    /// Records `lifted` in the host record (synced), where there is one.
    fn record(&self, lifted: &BTreeMap<CgroupPath, String>) -> Result<(), String> {
        let Some(journal) = &self.journal else {
            return Ok(());
        };
        let value = super::to_saved(&Self::lifts(lifted), lifted.is_empty());
        journal.record(NAME, value).map_err(|e| {
            format!(
                "{}: CFS quotas left as they are while their originals cannot be recorded",
                error_chain(&e)
            )
        })
    }

    /// Writes `value` and reads the file back: whether it shows no limit (`None`: not
    /// known). A cgroup gone leaves the record.
    fn write(&mut self, path: &CgroupPath, value: &str, metrics: &mut Metrics) -> Option<bool> {
        metrics.writes_issued += 1;
        match self.fs.write(path, self.file(), value) {
            Ok(()) => {
                let file = self.file();
                self.written.push((path.clone(), file, value.to_string()));
                self.read_limit(path).ok().map(|limit| limit.is_none())
            }
            Err(e) if e.is_gone() => {
                self.lifted.remove(path);
                self.in_force.remove(path);
                None
            }
            Err(e) => {
                self.fail(&e, metrics);
                None
            }
        }
    }

    /// Writes `original` back where the quota is still unlimited: whether it did (a cgroup
    /// gone, or a quota set since the lift, is left as it is).
    fn put_back(&self, path: &CgroupPath, original: &str) -> Result<bool, String> {
        if self.fs.is_gone(path) {
            return Ok(false);
        }
        if self.read_limit(path)?.is_some() {
            return Ok(false);
        }
        match self.fs.write(path, self.file(), original) {
            Ok(()) => Ok(true),
            Err(e) if e.is_gone() => Ok(false),
            Err(e) => Err(error_chain(&e)),
        }
    }

    /// Writes `original` back to `path` if its file still reads unlimited: the model the
    /// action was decided on may be older than a quota the runtime set since (an in-place
    /// resize writes `cpu.shares` first and the quota after it; writing the original over
    /// the new quota would put the container above the pod's new one, which the v1 kernel
    /// then refuses to kubelet with EINVAL). A quota set since is its owner's and is
    /// forgotten. Whether the original was put back.
    fn restore_one(&mut self, path: &CgroupPath, original: &str, metrics: &mut Metrics) -> bool {
        match self.read_limit(path) {
            Ok(None) => {}
            Ok(Some(_)) => {
                self.lifted.remove(path);
                self.in_force.remove(path);
                return false;
            }
            // Gone, or unreadable for now: the next update decides again.
            Err(_) => return false,
        }
        if self.write(path, original, metrics) != Some(false) {
            return false;
        }
        self.lifted.remove(path);
        self.in_force.remove(path);
        true
    }

    fn fail(&mut self, error: &CgroupError, metrics: &mut Metrics) {
        *metrics
            .write_errors
            .entry(error.errno().unwrap_or(0))
            .or_default() += 1;
        let line = error_chain(error);
        if self.said.insert(line.clone()) {
            log::warn!("{line}: the CFS quota is left as it is; retried at each reconcile");
        }
    }

    /// Makes `actions`, each original durable in the host record before its lift.
    fn apply(&mut self, actions: Vec<Action>, metrics: &mut Metrics) -> (usize, usize) {
        let mut next = self.lifted.clone();
        for action in &actions {
            if let Action::Lift(path, limit) = action {
                next.insert(path.clone(), limit.original.clone());
            }
        }
        if let Err(line) = self.record(&next) {
            if self.said.insert(line.clone()) {
                log::warn!("{line}");
            }
            return (0, 0);
        }
        self.lifted = next;
        let (mut lifted, mut restored) = (0, 0);
        for action in actions {
            match action {
                Action::Forget(path) => {
                    self.lifted.remove(&path);
                    self.in_force.remove(&path);
                }
                Action::Restore(path, original) => {
                    restored += usize::from(self.restore_one(&path, &original, metrics));
                }
                Action::Lift(path, limit) => match self.write(&path, &limit.lift, metrics) {
                    Some(true) => {
                        self.in_force.insert(path);
                        lifted += 1;
                    }
                    _ => {
                        self.in_force.remove(&path);
                    }
                },
            }
        }
        (lifted, restored)
    }
}

impl Effect for QuotaLift {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Nothing is read or written while nothing is to be lifted or restored. `always` changes
    /// nothing: what it acts on is the agent's model of the tree, which a full reconcile
    /// refreshes.
    fn update(&mut self, wanted: &Wanted<'_>, _always: bool, metrics: &mut Metrics) {
        let Some(cgroups) = wanted.cgroups else {
            return;
        };
        let lift = to_lift(wanted, cgroups);
        if lift.is_empty() && self.lifted.is_empty() {
            return;
        }
        let actions = self.actions(&lift, cgroups);
        if actions.is_empty() {
            return;
        }
        let before = self.lifted.len();
        let (lifted, restored) = self.apply(actions, metrics);
        if self.lifted.len() != before || lifted + restored > 0 {
            if let Err(line) = self.record(&self.lifted) {
                log::warn!("{line}");
            }
        }
        if lifted + restored > 0 {
            log::info!(
                "CFS quota lifted on {lifted} cgroup(s), put back on {restored}; {} lifted now",
                self.in_force.len()
            );
        }
    }

    fn take_written(&mut self) -> Vec<(CgroupPath, InterfaceFile, String)> {
        std::mem::take(&mut self.written)
    }

    /// Its state is the cgroup tree: a full reconcile re-applies it.
    fn on_quiet_ticks(&mut self) -> bool {
        false
    }

    fn report(&self, _metrics: &mut Metrics) {}

    fn in_force(&self, into: &mut InForce) {
        into.quota.clone_from(&self.in_force);
    }

    fn saved(&self) -> Value {
        super::to_saved(&Self::lifts(&self.lifted), self.lifted.is_empty())
    }

    /// Puts back every quota recorded that is still unlimited, containers before their pods; a
    /// quota set again since is left as it is.
    fn restore(&mut self) -> Restored {
        let mut restored = Restored::default();
        if self.lifted.is_empty() {
            return restored;
        }
        let mut put_back = 0;
        for (path, original) in std::mem::take(&mut self.lifted).into_iter().rev() {
            match self.put_back(&path, &original) {
                Ok(true) => put_back += 1,
                Ok(false) => {}
                Err(why) => {
                    restored
                        .errors
                        .push(format!("cannot restore the CFS quota of {path}: {why}"));
                    self.lifted.insert(path, original);
                }
            }
        }
        restored
            .said
            .push(format!("{put_back} lifted CFS quota(s) restored"));
        restored
    }
}

#[cfg(test)]
mod tests;
