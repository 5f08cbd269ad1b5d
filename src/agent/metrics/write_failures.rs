//! The writes a pass could not make, counted (by errno) and said once per cgroup, file and
//! errno, not once per pass (every pass tries again).

use super::Metrics;
use crate::agent::said::CONTROLLER;
use crate::cgroupfs::{CgroupError, CgroupPath, InterfaceFile};
use crate::logging::error_chain;
use crate::planner::Step;

impl Metrics {
    /// A narrowing a child holds up: one the kernel refused (EBUSY) is a race with a runtime,
    /// re-planned at once: counted as a retry and said once, not an error.
    pub(crate) fn count_stale(
        &mut self,
        step: &Step,
        child: Option<&CgroupPath>,
        refused: Option<&CgroupError>,
    ) {
        if let Some(error) = refused {
            let errno = error.errno().unwrap_or(0);
            *self.write_retries.entry(errno).or_default() += 1;
            if self.first_failure(&step.path, step.file, errno) {
                let error = error_chain(error);
                log::info!(target: CONTROLLER, "{error} (a child holds more: re-planning)");
            }
        } else if let Some(child) = child {
            log::debug!(
                target: CONTROLLER,
                "cg={} not narrowed yet: {child}, which this pass did not plan, holds more",
                step.path
            );
        }
    }

    /// A write the kernel refused, counted and said once. `parent`: the parent whose narrowing
    /// waits for it, or (`empty`: a v1 cgroup never set up, whose cpus and mems fail alike and
    /// are said once) that is narrowed past it.
    pub(crate) fn count_refused(
        &mut self,
        step: &Step,
        error: &CgroupError,
        parent: Option<&CgroupPath>,
        empty: bool,
    ) {
        let errno = error.errno().unwrap_or(0);
        *self.write_errors.entry(errno).or_default() += 1;
        let (path, past) = (&step.path, parent.filter(|_| empty));
        let file = past.map_or(step.file, |_| InterfaceFile::CpusetCpus);
        if !self.first_failure(path, file, errno) {
            return;
        }
        let fix = "writable by root without capabilities (chown it to root)";
        match (parent, past) {
            (_, Some(parent)) => log::warn!(
                target: CONTROLLER,
                "{}: cg={path} is empty, so no task runs in it and its parent {parent} is \
                 narrowed past it; make it {fix} or remove it; retried at each reconcile",
                error_chain(error),
            ),
            (Some(parent), None) => {
                log::warn!(target: CONTROLLER, "{}", error_chain(error));
                log::warn!(
                    target: CONTROLLER,
                    "cg={parent} cannot be narrowed while its child {path} holds more and \
                     cannot be written: make {path} {fix} or remove it if it is empty; retried \
                     at each reconcile"
                );
            }
            (None, None) => log::warn!(target: CONTROLLER, "{}", error_chain(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::WriteStep;

    const EACCES: i32 = nix::errno::Errno::EACCES as i32;

    fn refused(errno: nix::errno::Errno) -> CgroupError {
        CgroupError::Write {
            path: "/sys/fs/cgroup/cpuset/kubepods/pod/c/cpuset.cpus".into(),
            value: "1".into(),
            source: std::io::Error::from_raw_os_error(errno as i32),
        }
    }

    fn step(file: InterfaceFile) -> Step {
        let path = CgroupPath::new("kubepods/pod/c").unwrap();
        Step::new(path, file, "1".into(), WriteStep::Narrow)
    }

    #[test]
    fn refusals_are_counted_every_time_and_new_once_per_file_and_errno() {
        let mut metrics = Metrics::default();
        let (cpus, eacces) = (
            InterfaceFile::CpusetCpus,
            refused(nix::errno::Errno::EACCES),
        );
        metrics.count_refused(&step(cpus), &eacces, None, false);
        metrics.count_refused(&step(cpus), &eacces, None, false);
        assert_eq!(metrics.write_errors.get(&EACCES), Some(&2));
        // Said once: the failure is known now.
        assert!(!metrics.first_failure(&step(cpus).path, cpus, EACCES));
        // An empty cgroup's cpus and mems fail alike: one failure, said of its cpus.
        let parent = CgroupPath::new("kubepods/pod").unwrap();
        let mems = InterfaceFile::CpusetMems;
        metrics.count_refused(&step(mems), &eacces, Some(&parent), true);
        assert_eq!(metrics.write_errors.get(&EACCES), Some(&3));
        assert!(metrics.first_failure(&step(mems).path, mems, EACCES));
    }

    #[test]
    fn a_narrowing_the_kernel_refused_over_a_new_child_is_a_retry_not_an_error() {
        let mut metrics = Metrics::default();
        let ebusy = refused(nix::errno::Errno::EBUSY);
        let cpus = InterfaceFile::CpusetCpus;
        metrics.count_stale(&step(cpus), None, Some(&ebusy));
        metrics.count_stale(&step(cpus), None, None);
        let errno = nix::errno::Errno::EBUSY as i32;
        assert_eq!(metrics.write_retries.get(&errno), Some(&1));
        assert!(metrics.write_errors.is_empty());
    }
}
