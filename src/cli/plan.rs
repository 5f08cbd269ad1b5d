//! `cpusetd plan [--apply] [--json]`: one pass of the agent, shown and optionally performed.
//! The one-shot repair tool: scan the tree, classify, adopt what is pinned, allocate what is
//! missing, print every container and the ordered writes; `--apply` performs them.

use clap::Args;
use serde::Serialize;

use super::node::AgentArgs;
use super::oneshot::apply;
use super::{CommandError, EXIT_FAILURE};
use crate::logging::error_chain;
use crate::planner::{plan, AssignEvent, PlanConfig, WriteStep};
use crate::report::{render_table, rows, CgroupRow, InForce};
use crate::state::Assignments;

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The agent's flags; the checkpoint in --state-dir, when there is one, supplies the
    /// assignments (as the agent would use them).
    #[command(flatten)]
    agent: AgentArgs,
    /// Perform the writes.
    #[arg(long)]
    apply: bool,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Add the pod UID and the full container id to the table.
    #[arg(long)]
    wide: bool,
}

#[derive(Serialize)]
struct JsonWrite {
    path: String,
    file: &'static str,
    value: String,
    step: WriteStep,
}

#[derive(Serialize)]
struct JsonApplied {
    applied: usize,
    gone: usize,
    skipped: usize,
    failed: Vec<String>,
    /// Narrowing writes not made: a child appeared since the scan (run again).
    deferred: usize,
}

#[derive(Serialize)]
struct JsonPlan {
    cgroup_version: String,
    cgroup_driver: String,
    kubepods: String,
    policy: &'static str,
    reserved: Option<String>,
    pod_cpus: Option<String>,
    shared_pool: Option<String>,
    containers: Vec<CgroupRow>,
    writes: Vec<JsonWrite>,
    #[serde(skip_serializing_if = "Option::is_none")]
    applied: Option<JsonApplied>,
}

pub fn run(args: &PlanArgs) -> Result<(), CommandError> {
    let (apply_writes, json, wide) = (args.apply, args.json, args.wide);
    let args = &args.agent;
    args.validate()?;
    let _lock = lock_for_apply(args, apply_writes)?;
    let mut node = args.tree.open()?;
    let policy = args.policy.policy(&node.topology)?;
    let previous = match crate::checkpoint::load(&args.state_dir) {
        crate::checkpoint::LoadOutcome::Loaded(cp) => cp.assignments,
        _ => Assignments::new(),
    };
    let (scan, classes) = node.scan_and_classify()?;
    for (cgroup, class) in scan.cgroups.iter().zip(&classes) {
        for notice in &class.notices {
            log::warn!("cg={} {notice}", cgroup.relative);
        }
    }
    let planned = plan_with_quota_lifts(&node, args, policy.as_ref(), &previous, (&scan, &classes));
    log_events(&planned.events);
    let table = rows(&scan, &classes, &planned, &InForce::none());
    let report = apply_writes.then(|| {
        let known = crate::planner::Known::new(&scan, &planned.parents, &[]);
        apply(&node.hierarchy, planned.writes.clone(), &known)
    });
    let tally = report.as_ref().map(|r| r.tally());

    if json {
        print_json(
            &node.layout,
            policy.as_ref(),
            &planned,
            table,
            report.as_ref(),
        )?;
    } else {
        print_text(&node.layout, policy.as_ref(), &planned, &table, wide, tally);
    }
    if let (Some(r), Some(t)) = (&report, tally) {
        for e in r.refusals() {
            eprintln!("cpusetd: {}", error_chain(e));
        }
        if !t.is_clean() {
            return Err(CommandError {
                status: EXIT_FAILURE,
                message: format!(
                    "{} write(s) failed, {} deferred; the next pass retries them",
                    t.failed, t.stale
                ),
                bare: false,
            });
        }
    }
    Ok(())
}

/// The plan of the node, with the quota lifts after its cpuset writes, as the agent makes
/// them (its quota effect).
fn plan_with_quota_lifts(
    node: &super::node::NodeView,
    args: &AgentArgs,
    policy: Option<&crate::allocator::StaticPolicy>,
    previous: &Assignments,
    (scan, classes): (&crate::cgroupfs::Scan, &[crate::classify::Classification]),
) -> crate::planner::Plan {
    let limits = node.limits();
    let config = PlanConfig {
        topology: &node.topology,
        policy,
        align_memory: args.policy.align_memory,
        limits: Some(&limits),
        respect_isolcpus: args.policy.respect_isolcpus,
    };
    let mut planned = plan(scan, classes, previous, &config);
    planned.writes.extend(crate::effects::quota::lift_steps(
        scan,
        classes,
        &planned.parents,
        &planned.assignments,
        args.policy.keep_cfs_quota,
    ));
    planned
}

/// One writer: with --apply, a running agent's lock means "it applies this itself".
fn lock_for_apply(
    args: &AgentArgs,
    apply_writes: bool,
) -> Result<Option<crate::checkpoint::StateLock>, CommandError> {
    if !apply_writes || !args.state_dir.join(crate::checkpoint::LOCK_FILE).exists() {
        return Ok(None);
    }
    crate::checkpoint::StateLock::acquire(&args.state_dir)
        .map(Some)
        .map_err(|e| {
            CommandError::usage(format!(
                "{}: the agent applies its plans itself; run `plan` without --apply to look",
                error_chain(&e)
            ))
        })
}

/// Says what the policy could not do (at warn): refused or short allocations, rejected pods.
fn log_events(events: &[AssignEvent]) {
    for event in events {
        match event {
            AssignEvent::Failed {
                key,
                requested,
                error,
            } => {
                log::warn!(
                    "{key}: {requested} exclusive cpus cannot be given, stays shared: {error}"
                );
            }
            AssignEvent::Short {
                key,
                cpus,
                wanted,
                error,
                ..
            } => log::warn!(
                "{key}: no replacement for the cpus it lost can be given: keeps cpus={cpus} ({} \
                 of {wanted}): {error}",
                cpus.len()
            ),
            AssignEvent::PodRejected { key, rejection } => log::warn!(
                "pod{}: pod rejected {} ({}, container {}): {}: no container of the pod gets \
                 exclusive cpus",
                key.pod_uid(),
                rejection.reason.rejected_as(),
                rejection.reason,
                rejection.container,
                rejection.message
            ),
            _ => {}
        }
    }
}

/// The plan (and with --apply, what was applied) as JSON on stdout.
fn print_json(
    layout: &crate::cgroupfs::CgroupLayout,
    policy: Option<&crate::allocator::StaticPolicy>,
    planned: &crate::planner::Plan,
    table: Vec<CgroupRow>,
    report: Option<&crate::writer::Executed>,
) -> Result<(), CommandError> {
    let tally = report.map(crate::writer::Executed::tally);
    let doc = JsonPlan {
        cgroup_version: layout.version.to_string(),
        cgroup_driver: layout.driver.to_string(),
        kubepods: layout.kubepods.to_string(),
        policy: if policy.is_some() { "static" } else { "none" },
        reserved: policy.map(|p| p.reserved().to_string()),
        pod_cpus: planned.pools.as_ref().map(|p| p.pod_cpus.to_string()),
        shared_pool: planned.pools.as_ref().map(|p| p.shared.to_string()),
        containers: table,
        writes: planned
            .writes
            .iter()
            .map(|w| JsonWrite {
                path: w.path.to_string(),
                file: w.file.name(),
                value: w.value.clone(),
                step: w.step,
            })
            .collect(),
        applied: report.zip(tally).map(|(r, t)| JsonApplied {
            applied: t.written,
            gone: t.gone,
            skipped: t.skipped,
            failed: r.refusals().map(|e| error_chain(e)).collect(),
            deferred: t.stale,
        }),
    };
    let text = serde_json::to_string_pretty(&doc).map_err(|e| CommandError::failure(&e))?;
    println!("{text}");
    Ok(())
}

/// The plan (and with --apply, the tally of what was applied) as text on stdout.
fn print_text(
    layout: &crate::cgroupfs::CgroupLayout,
    policy: Option<&crate::allocator::StaticPolicy>,
    planned: &crate::planner::Plan,
    table: &[CgroupRow],
    wide: bool,
    tally: Option<crate::writer::Tally>,
) {
    println!(
        "cgroup {} ({} driver), kubepods {}",
        layout.version, layout.driver, layout.kubepods
    );
    match (policy, &planned.pools) {
        (Some(p), Some(pools)) => println!(
            "policy static: reserved {}, pod cpus {}, shared pool {}, {} exclusive assignment(s)",
            p.reserved(),
            pools.pod_cpus,
            pools.shared,
            planned.assignments.len()
        ),
        _ => println!("policy none: nothing is managed"),
    }
    println!();
    print!("{}", render_table(table, wide));
    println!();
    if planned.writes.is_empty() {
        println!("no writes: the tree is as planned");
    } else {
        println!("writes, in order ({}):", planned.writes.len());
        for w in &planned.writes {
            let step = match w.step {
                WriteStep::Widen => "widen ",
                WriteStep::Narrow => "narrow",
                WriteStep::LiftQuota => "quota ",
            };
            println!("  {step} {}/{} = {}", w.path, w.file.name(), w.value);
        }
    }
    if let Some(r) = &tally {
        println!(
            "applied {} write(s); {} skipped (cgroup gone), {} skipped (a write above failed), {} failed, {} deferred (the tree changed since the scan)",
            r.written, r.gone, r.skipped, r.failed, r.stale
        );
    }
}
