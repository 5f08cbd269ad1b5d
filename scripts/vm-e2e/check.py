#!/usr/bin/env python3
"""Host side of scripts/vm-e2e.sh: judges one scenario from what the guest sent on ttyS1.

Usage: check.py SCENARIO RESULTS_FILE EXPECTED_TOPOLOGY_JSON

The guest sends `@@BEGIN <name>` / `@@END <name>` blocks (JSON that cpusetd printed), one
`PASS <scenario>` or `FAIL <scenario>: <why>` line and `@@DONE`. This checks the guest's verdict
and what the guest cannot check without a JSON parser: the topology document equals the
expected one, `status` shows every container where the agent wants it with exactly one 2-CPU
exclusive container, (hotplug) every cpu is shared or exclusive again once the cpu that went
offline is back, (v1, sched) `plan --apply` applied every write, narrowing bottom-up and
widening top-down, (sched) status has cpu-load-balancing in force for the Guaranteed container,
and (sched-v2-6.1) its note refuses clearly with nothing in force; (sched-v2) in force; (irq) housekeeping
and cpu-c-states in force for the 4-cpu housekeeping pod; (bench-v2) every row of the guest_v2
table has samples. Prints nothing and exits 0 on success; prints the
reasons and exits 1.
"""

import json
import sys

GUARANTEED_ID = "aaaa0000aaaa0000aaaa0000aaaa0000aaaa0000aaaa0000aaaa0000aaaa0001"
BURSTABLE_ID = "bbbb0000bbbb0000bbbb0000bbbb0000bbbb0000bbbb0000bbbb0000bbbb0002"
BESTEFFORT_ID = "eeee0000eeee0000eeee0000eeee0000eeee0000eeee0000eeee0000eeee0003"
HOUSEKEEPING_ID = "cccc0000cccc0000cccc0000cccc0000cccc0000cccc0000cccc0000cccc0004"


def parse(text):
    """Blocks by name, verdict lines, and whether the guest said it was done."""
    blocks, verdicts, done = {}, [], False
    current = None
    for raw in text.splitlines():
        line = raw.replace("\r", "")
        if current is not None:
            if line == f"@@END {current}":
                current = None
            else:
                blocks[current].append(line)
            continue
        if line.startswith("@@BEGIN "):
            current = line[len("@@BEGIN "):]
            blocks[current] = []
        elif line == "@@DONE":
            done = True
        elif line.startswith(("PASS ", "FAIL ")):
            verdicts.append(line)
    return {k: "\n".join(v) for k, v in blocks.items()}, verdicts, done


def load(blocks, name, problems):
    if name not in blocks:
        problems.append(f"the guest sent no {name} document")
        return None
    try:
        return json.loads(blocks[name])
    except json.JSONDecodeError as e:
        problems.append(f"the {name} document is not JSON ({e}): {blocks[name][:200]!r}")
        return None


def cpus(text):
    """`0-1,4` → {0, 1, 4}"""
    out = set()
    for part in filter(None, (text or "").split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def check_topology(doc, expected, problems):
    if doc == expected:
        return
    problems.append("cpusetd topology --json differs from the expected document:")
    for key in ("offline", "isolated", "memory_nodes"):
        if doc.get(key) != expected.get(key):
            problems.append(f"  {key}: got {doc.get(key)!r}, expected {expected.get(key)!r}")
    got = {c.get("id"): c for c in doc.get("cpus", [])}
    for want in expected["cpus"]:
        have = got.pop(want["id"], None)
        if have != want:
            problems.append(f"  cpu {want['id']}: got {have}, expected {want}")
    for extra in got.values():
        problems.append(f"  unexpected cpu {extra}")


def check_status(status, problems):
    if status.get("differing") != 0:
        problems.append(f"status: {status.get('differing')} cgroup(s) differ from what the agent wants")
    rows = {r.get("container_id"): r for r in status.get("containers", [])}
    exclusive = [r for r in status.get("containers", []) if r.get("exclusive")]
    if [r.get("container_id") for r in exclusive] != [GUARANTEED_ID]:
        problems.append(f"status: exclusive containers {[r.get('path') for r in exclusive]}, "
                        "expected only the guaranteed one")
    if status.get("exclusive_cpu_count") != 2:
        problems.append(f"status: exclusive_cpu_count {status.get('exclusive_cpu_count')}, expected 2")
    shared = cpus(status.get("shared_pool"))
    excl = cpus(status.get("exclusive_cpus"))
    if shared & excl:
        problems.append(f"status: shared pool {status.get('shared_pool')} overlaps exclusive "
                        f"{status.get('exclusive_cpus')}")
    for cid in (BURSTABLE_ID, BESTEFFORT_ID):
        row = rows.get(cid)
        if row is None:
            problems.append(f"status: no row for container {cid[:8]}…")
        elif cpus(row.get("current")) != shared:
            problems.append(f"status: {row.get('path')} is on {row.get('current')}, "
                            f"not the shared pool {status.get('shared_pool')}")
    g = rows.get(GUARANTEED_ID)
    if g is not None and cpus(g.get("current")) != excl:
        problems.append(f"status: guaranteed container is on {g.get('current')}, "
                        f"not its exclusive cpus {status.get('exclusive_cpus')}")


def check_hotplug(status, problems):
    """After the cpu came back: every cpu of the guest is shared or exclusive again."""
    shared = cpus(status.get("shared_pool"))
    excl = cpus(status.get("exclusive_cpus"))
    if shared | excl != set(range(8)):
        problems.append(f"status after hotplug: shared pool {status.get('shared_pool')} and "
                        f"exclusive {status.get('exclusive_cpus')} are not every cpu of the guest")


def check_apply(plan, problems):
    applied = plan.get("applied") or {}
    writes = plan.get("writes", [])
    if applied.get("failed"):
        problems.append(f"plan --apply: the kernel refused writes: {applied['failed']}")
    if not writes or applied.get("applied") != len(writes):
        problems.append(f"plan --apply: applied {applied.get('applied')} of {len(writes)} writes")
    order = [w["path"] for w in writes if w.get("file") == "cpuset.cpus"]

    def position(suffix):
        hits = [i for i, p in enumerate(order) if p.rstrip("/").endswith(suffix)]
        if not hits:
            problems.append(f"plan --apply: no cpuset.cpus write for …/{suffix}")
            return None
        return hits[0]

    # BestEffort chain narrows bottom-up, Burstable chain widens top-down.
    for chain, expect in (
        (["besteffort", "pod6a0e0000-0000-4000-8000-000000000003", BESTEFFORT_ID], "bottom-up"),
        (["burstable", "pod6a0e0000-0000-4000-8000-000000000002", BURSTABLE_ID], "top-down"),
    ):
        suffixes = ["/".join(chain[: i + 1]) for i in range(len(chain))]
        positions = [position(s) for s in suffixes]
        if None in positions:
            continue
        ok = positions == sorted(positions, reverse=(expect == "bottom-up"))
        if not ok:
            problems.append(f"plan --apply: {chain[0]} chain not written {expect}: {order}")


def check_housekeeping(blocks, problems):
    """(irq) The 4-cpu pod saying housekeeping and cpu-c-states disable had both in force, as
    status read them back."""
    status = load(blocks, "status-housekeeping", problems)
    if status is None:
        return
    h = next((r for r in status.get("containers", [])
              if r.get("container_id") == HOUSEKEEPING_ID), None)
    if h is None:
        problems.append("status-housekeeping: no row for the housekeeping container")
        return
    if len(cpus(h.get("current"))) != 4 or h.get("current") != h.get("desired"):
        problems.append(f"status-housekeeping: the container is on {h.get('current')}, "
                        f"desired {h.get('desired')}: not 4 exclusive cpus")
    if "irq-load-balancing (housekeeping)" not in h.get("isolation", []):
        problems.append(f"status-housekeeping: housekeeping not in force: {h.get('note')!r} "
                        f"{h.get('isolation')}")
    if "cpu-c-states.crio.io in force (pm_qos_resume_latency_us n/a)" not in h.get("note", ""):
        problems.append(f"status-housekeeping: c-states not in force: {h.get('note')!r}")


def check_figures(blocks, problems):
    """bench-v2: the guest_v2 table has every row, each with samples (speed is not judged)."""
    if "figures" not in blocks:
        problems.append("the guest sent no figures")
        return
    rows = {}
    for line in blocks["figures"].splitlines():
        name, _, rest = line.partition("  ")
        rows[name.strip()] = rest.split()
    for row in ("floor: mkdir + one cpuset.cpus write", "event -> pin", "event -> exclusive",
                "drift repair"):
        values = rows.get(row)
        if not values or not values[0].isdigit() or int(values[0]) == 0:
            problems.append(f"figures: no samples for {row!r}: {values}")


def main():
    scenario, results_path, expected_path = sys.argv[1:4]
    with open(results_path, encoding="utf-8", errors="replace") as f:
        blocks, verdicts, done = parse(f.read())
    with open(expected_path, encoding="utf-8") as f:
        expected = json.load(f)
    problems = []
    if not verdicts:
        problems.append("the guest gave no verdict" + ("" if done else " (it did not finish)"))
    for line in verdicts:
        if not line.startswith(f"PASS {scenario}"):
            problems.append(f"guest: {line}")
    topology = load(blocks, "topology", problems)
    if topology is not None:
        check_topology(topology, expected, problems)
    if scenario == "bench-v2":
        check_figures(blocks, problems)
    elif verdicts and all(v.startswith("PASS") for v in verdicts):
        status = load(blocks, "status", problems)
        if status is not None:
            check_status(status, problems)
            if scenario.startswith("hotplug"):
                check_hotplug(status, problems)
            g = next((r for r in status.get("containers", [])
                      if r.get("container_id") == GUARANTEED_ID), {})
            if (scenario in ("sched", "sched-v2")
                    and "cpu-load-balancing" not in g.get("isolation", [])):
                problems.append(f"status: cpu-load-balancing not in force for the guaranteed "
                                f"container: {g.get('note')!r}")
            if scenario == "sched-v2-6.1" and ("Linux 6.7 or newer" not in g.get("note", "")
                                           or g.get("isolation")):
                problems.append(f"status: no clear refusal for the guaranteed container: "
                                f"{g.get('note')!r} {g.get('isolation')}")
            if scenario == "irq":
                check_housekeeping(blocks, problems)
        if scenario in ("v1", "hotplug-v1", "sched"):
            plan = load(blocks, "apply", problems)
            if plan is not None:
                check_apply(plan, problems)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
