//! The writer: executes a [`WritePlan`] against the cgroup hierarchy, in order.
//!
//! ENOENT means the cgroup is gone (a container exited between scan and write): skipped, not an
//! error, and nothing more is written below it. Any other errno is reported with the path, the
//! value and the errno, and the rest of the plan goes on where the nesting rules still allow it:
//! writes of the same file below a cgroup whose write failed are skipped (the kernel would refuse
//! them too, and the next pass retries the lot).

use std::collections::HashSet;

use crate::cgroupfs::{CgroupError, Hierarchy, InterfaceFile};
use crate::planner::{PlannedWrite, WritePlan};

/// What happened to a plan.
#[derive(Debug, Default)]
pub struct WriteReport {
    /// Writes the kernel (or the fake tree) accepted.
    pub applied: usize,
    /// Writes skipped because their cgroup, or an ancestor, is gone.
    pub gone: usize,
    /// Writes skipped because a write above them failed.
    pub skipped: usize,
    /// Writes that failed, with the error (path, value and errno inside).
    pub failed: Vec<(PlannedWrite, CgroupError)>,
}

impl WriteReport {
    pub fn is_clean(&self) -> bool {
        self.failed.is_empty()
    }
}

/// Where a file lives: cpuset files in the cpuset hierarchy, cpu files in the cpu one.
fn controller_of(file: InterfaceFile) -> Controller {
    match file {
        InterfaceFile::CpuCfsQuotaUs
        | InterfaceFile::CpuCfsPeriodUs
        | InterfaceFile::CpuMax
        | InterfaceFile::CpuShares
        | InterfaceFile::CpuWeight => Controller::Cpu,
        _ => Controller::Cpuset,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Controller {
    Cpuset,
    Cpu,
}

/// Executes `plan` in order. `parents[i]` is the parent of scanned cgroup `i` (as planned).
pub fn apply(hierarchy: &Hierarchy, plan: &WritePlan, parents: &[Option<usize>]) -> WriteReport {
    let mut report = WriteReport::default();
    let mut gone = vec![false; parents.len()];
    // Cgroups whose write of a file failed, per file.
    let mut failed: HashSet<(usize, InterfaceFile)> = HashSet::new();
    let ancestors =
        |cgroup: usize| std::iter::successors(Some(cgroup), |&i| parents.get(i).copied().flatten());
    for write in plan {
        if ancestors(write.cgroup).any(|i| gone.get(i) == Some(&true)) {
            report.gone += 1;
            continue;
        }
        if !failed.is_empty()
            && ancestors(write.cgroup)
                .skip(1)
                .any(|i| failed.contains(&(i, write.file)))
        {
            report.skipped += 1;
            continue;
        }
        let fs = match controller_of(write.file) {
            Controller::Cpuset => &hierarchy.cpuset,
            Controller::Cpu => &hierarchy.cpu,
        };
        match fs.write(&write.path, write.file, &write.value) {
            Ok(()) => report.applied += 1,
            Err(e) if e.is_gone() => {
                log::debug!(
                    "cg={} gone before {} was written",
                    write.path,
                    write.file.name()
                );
                if let Some(flag) = gone.get_mut(write.cgroup) {
                    *flag = true;
                }
                report.gone += 1;
            }
            Err(e) => {
                failed.insert((write.cgroup, write.file));
                report.failed.push((write.clone(), e));
            }
        }
    }
    report
}
