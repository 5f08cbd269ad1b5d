//! The host effects: what the agent changes besides the cpusets it pins, for the pods holding
//! exclusive cpus or whose annotations ask for it (the CFS quota lift, interrupt affinities and
//! irqbalance, scheduler load balancing and the host cpusets of `--isolate-host`, per-cpu
//! power settings). Each is one type behind
//! [`Effect`]; [`LIST`] names them all, in the order they are applied. The controller,
//! the checkpoint, `reset` and `status` loop over that list and know no effect by name.
//!
//! An effect records the originals of what it changes in `host.json` (synced) **before** it
//! changes them ([`crate::checkpoint::host::HostJournal::record`], under its [`Effect::name`]),
//! says it is in force only where a read back after its writes shows it, and restores what it
//! recorded when nothing asks for it any more (or on `cpusetd reset`). The checkpoint keeps
//! what [`Effect::saved`] returns in one map keyed by effect name ([`EffectState`]).
//!
//! Effects run after the pin writes of a pass, never on the way from a new pod to its pin;
//! one that waits on something outside the kernel (irqbalance's socket, systemd's
//! `systemctl`) does so on a thread of its own, and every file it reads is read through
//! [`crate::bounded`].
//!
//! Adding an effect: one file here implementing [`Effect`] with a `build` function, and one
//! line in [`LIST`].

pub(crate) mod irq;
pub(crate) mod power;
pub(crate) mod quota;
pub(crate) mod sched;

use std::collections::HashMap;
use std::path::Path;

use serde::de::DeserializeOwned;
use std::time::Duration;

use serde_json::Value;

use crate::agent::metrics::Metrics;
use crate::cgroupfs::{CgroupFs, CgroupPath, CgroupVersion, CpuSettings, InterfaceFile};
use crate::checkpoint::host::HostJournal;
pub use crate::checkpoint::EffectState;
use crate::classify::Isolation;
use crate::cpuset::CpuSet;
use crate::state::{AssignmentKey, Assignments};
use crate::topology::Topology;

/// Builds one effect from where it acts and what an earlier run recorded (`None`: it cannot
/// act here, e.g. no cpuset hierarchy for `reset` to restore into).
pub type Build = fn(&Env<'_>, &Recorded<'_>) -> Option<Box<dyn Effect>>;

/// Every host effect, in the order a pass applies them. Adding one is one line here.
pub const LIST: &[Build] = &[quota::build, irq::build, sched::build, power::build];

/// One host effect (see the module docs).
pub trait Effect: std::fmt::Debug + Send {
    /// Its key in the checkpoint's and the host record's map of saved state.
    fn name(&self) -> &'static str;
    /// Brings the host to what `wanted` asks for: when that changed since the last call, or
    /// `always` (a full reconcile: something may have moved it back). Logs what it did and
    /// what failed (each failure once while it lasts) and counts it in `metrics`.
    fn update(&mut self, wanted: &Wanted<'_>, always: bool, metrics: &mut Metrics);
    /// Whether a reconcile tick that found the cgroup tree unchanged re-applies it: what it
    /// changes can move without the tree moving (IRQs registered since, a restarted
    /// irqbalance, a governor set back). An effect whose state is the cpuset tree says no: a
    /// full reconcile re-applies it. It may read to find out (and count what it found).
    fn on_quiet_ticks(&mut self) -> bool {
        true
    }
    /// Takes in what a thread of its own did since the last look (no cgroup or kernel file is
    /// read or written; where an answer changes what is recorded, the host record is written
    /// ahead, as by `update`); whether what is to be saved changed.
    fn sync(&mut self, _metrics: &mut Metrics) -> bool {
        false
    }
    /// The agent is stopping: waits, at most `within`, for what its own thread was asked to be
    /// answered (an exchange in flight whose answer the last checkpoint must hold), before a
    /// last [`Effect::sync`]. An effect whose originals are recorded before its thread acts
    /// has nothing to wait for.
    fn settle(&mut self, _within: Duration) {}
    /// The cgroup interface files it wrote since the last call, with the values written: the
    /// agent's model takes them as it takes the plan's writes, so their echo from the watcher
    /// changes nothing (no re-classification, no further pass).
    fn take_written(&mut self) -> Vec<(CgroupPath, InterfaceFile, String)> {
        Vec::new()
    }
    /// Says once, at the agent's start, what it cannot do on this node.
    fn say_support(&self) {}
    /// Its gauges, from what it read back.
    fn report(&self, metrics: &mut Metrics);
    /// What it has in force, as read back after its writes.
    fn in_force(&self, into: &mut InForce);
    /// What the checkpoint keeps of it (originals, and what is in force): `Value::Null` when
    /// nothing.
    fn saved(&self) -> Value;
    /// Puts back everything it recorded (`cpusetd reset`).
    fn restore(&mut self) -> Restored;
    /// A line for `status` about something outside the record (irqbalance), if any.
    fn status_note(&self, _proc_root: &Path) -> Option<String> {
        None
    }
}

/// Where the effects act.
#[derive(Debug)]
pub struct Env<'a> {
    pub proc_root: &'a Path,
    pub sysfs_root: &'a Path,
    /// The cpuset hierarchy, its version and the kubepods cgroup (`None`: none mounted).
    pub cpuset: Option<(CgroupFs, CgroupVersion, CgroupPath)>,
    /// The hierarchy holding the CFS quota files (v1 `cpu`, v2 the unified one; `None`: none
    /// to act on).
    pub cpu: Option<CgroupFs>,
    /// `--isolate-host`: the CPUs host cgroups are confined to.
    pub isolate_host: Option<CpuSet>,
    /// Where each original is recorded before it is changed (`None`: only in memory, as for
    /// `reset` and `status`).
    pub journal: Option<HostJournal>,
    /// The agent: what waits outside the kernel (irqbalance's socket, systemd's `systemctl`)
    /// runs on a thread of the effect's own, which signals here when it has something new for
    /// [`Effect::sync`]. `None`: done in the caller's thread (`reset`).
    pub effect_done: Option<crossbeam_channel::Sender<()>>,
}

/// What earlier runs recorded: the checkpoint's map and the host record's, which is written
/// ahead of each change and so never older (its originals win).
#[derive(Debug, Clone, Copy, Default)]
pub struct Recorded<'a> {
    pub checkpoint: Option<&'a EffectState>,
    pub host: Option<&'a EffectState>,
}

impl Recorded<'_> {
    /// The checkpoint's and the host record's state of effect `name`, typed. A record that
    /// does not read as `T` is said and left out (its effect starts from nothing).
    pub fn typed<T: DeserializeOwned + Default>(&self, name: &str) -> (T, Option<T>) {
        let read = |map: Option<&EffectState>, whence: &str| -> Option<T> {
            let value = map?.get(name)?;
            match serde_json::from_value(value.clone()) {
                Ok(typed) => Some(typed),
                Err(e) => {
                    log::warn!(
                        "the {whence}'s record of host effect {name:?} cannot be read ({e}): \
                         what it names is not restored; put it back by hand"
                    );
                    None
                }
            }
        };
        (
            read(self.checkpoint, "checkpoint").unwrap_or_default(),
            read(self.host, "host record"),
        )
    }
}

/// The value an effect's state is saved as (`Null` when it is empty).
pub fn to_saved<T: serde::Serialize>(state: &T, empty: bool) -> Value {
    if empty {
        return Value::Null;
    }
    serde_json::to_value(state).unwrap_or(Value::Null)
}

/// Builds every effect of [`LIST`] that can act here.
pub fn build(env: &Env<'_>, recorded: &Recorded<'_>) -> Vec<Box<dyn Effect>> {
    LIST.iter()
        .filter_map(|build| build(env, recorded))
        .collect()
}

/// The checkpoint's map: each effect's [`Effect::saved`] that is not empty.
pub fn saved(effects: &[Box<dyn Effect>]) -> EffectState {
    effects
        .iter()
        .map(|e| (e.name().to_string(), e.saved()))
        .filter(|(_, v)| !v.is_null())
        .collect()
}

/// What the effects have in force, together.
pub fn in_force(effects: &[Box<dyn Effect>]) -> InForce {
    let mut all = InForce::default();
    for effect in effects {
        effect.in_force(&mut all);
    }
    all
}

/// A container holding exclusive cpus: what its pod asks for, its cgroup, its cpus.
#[derive(Debug, Clone, Copy)]
pub struct Assigned<'a> {
    pub isolation: &'a Isolation,
    pub path: &'a CgroupPath,
    pub cpus: &'a CpuSet,
}

/// What the agent last read of the cgroups (the controller's model, which the watcher keeps
/// current): an effect that acts on cgroups plans from it and reads little itself.
pub trait Cgroups: std::fmt::Debug {
    /// `path`'s CPU bandwidth settings as last read; `None` when the agent knows no such
    /// cgroup.
    fn cpu(&self, path: &CgroupPath) -> Option<&CpuSettings>;
    /// The pod cgroup of the container at `container`, when its parent is one.
    fn pod_of(&self, container: &CgroupPath) -> Option<CgroupPath>;
}

/// What the effects are asked for: every container holding exclusive cpus, the node's cores,
/// `--keep-cfs-quota`, and the cgroups as the agent knows them.
#[derive(Debug, Clone)]
pub struct Wanted<'a> {
    pub containers: Vec<Assigned<'a>>,
    pub topology: &'a Topology,
    /// `--keep-cfs-quota`: only the pods that say `cpu-quota.crio.io: "disable"` run
    /// without a CFS quota.
    pub keep_cfs_quota: bool,
    /// `None`: no cgroup is known (nothing is lifted nor put back).
    pub cgroups: Option<&'a dyn Cgroups>,
}

impl<'a> Wanted<'a> {
    /// The containers of `known` (what each asks for, and its cgroup) that hold exclusive
    /// cpus in `assignments`.
    pub fn of(
        known: &'a HashMap<AssignmentKey, (Isolation, CgroupPath)>,
        assignments: &'a Assignments,
        topology: &'a Topology,
        keep_cfs_quota: bool,
        cgroups: &'a dyn Cgroups,
    ) -> Wanted<'a> {
        let containers = known
            .iter()
            .filter_map(|(key, (isolation, path))| {
                let held = assignments.get(key)?;
                let cpus = &held.cpus;
                Some(Assigned {
                    isolation,
                    path,
                    cpus,
                })
            })
            .collect();
        Wanted {
            containers,
            topology,
            keep_cfs_quota,
            cgroups: Some(cgroups),
        }
    }
}

/// What is in force node-wide, as the effects read it back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InForce {
    /// The cgroups whose CFS quota the agent lifted, as read back.
    pub quota: std::collections::BTreeSet<CgroupPath>,
    /// The CPUs device interrupts are kept off.
    pub irq: CpuSet,
    /// The CPUs out of scheduler load balancing.
    pub sched: CpuSet,
    /// Why load balancing is not (wholly) off where asked, when it is not.
    pub sched_not_in_force: Option<String>,
    /// The per-cpu power settings in force.
    pub power: crate::cpu_power::PowerSaved,
}

/// What one [`Effect::restore`] did.
#[derive(Debug, Default)]
pub struct Restored {
    /// Lines for standard output.
    pub said: Vec<String>,
    /// Failures, one line each, for standard error.
    pub errors: Vec<String>,
}

#[cfg(test)]
mod tests;
