#!/usr/bin/env python3
"""Write fake sysfs/procfs trees shaped like the kernel's, plus the expected topology JSON.

Reads a JSON file mapping machine name -> compact description and, for every machine, replaces
OUT/<name>/ with:

  devices/system/cpu/{online,offline,present,possible,isolated,kernel_max}
  devices/system/cpu/cpuN/online                      (not for cpu0, as the kernel does)
  devices/system/cpu/cpuN/topology/*                  (online cpus only)
  devices/system/cpu/cpuN/cache/index{0,1,2,3}/*      (online cpus only)
  devices/system/cpu/cpuN/cpu_capacity                (groups with "capacity")
  devices/cpu_core/cpus, devices/cpu_atom/cpus        (groups with "type": hybrid PMUs)
  devices/system/node/{online,possible,has_cpu,has_memory,has_normal_memory}
  devices/system/node/nodeM/cpulist
  proc/cmdline
  expected.json                                       (the topology cpusetd should discover)

expected.json is computed from the description alone (an oracle independent of the Rust code).

Description fields (all optional except "sockets" and a core layout):
  vendor             "intel" (default) or "amd"
  sockets            number of physical packages
  cores_per_socket, threads_per_core
                     shorthand for one core group: [{"count": C, "threads": T}]
  core_groups        list of core groups per socket, in enumeration order, each
                     {"count", "threads", "cluster" (cores sharing one L2 = cluster, default 1),
                      "core_ids" (sysfs core_id values, default 0.. continuing across groups),
                      "l1d", "l1i", "l2" (cache sizes),
                      "type" ("performance" or "efficient": a hybrid part's core type, written
                      as the kernel's devices/cpu_core/cpus and devices/cpu_atom/cpus),
                      "capacity" (cpuN/cpu_capacity, as arm64 and riscv kernels expose it)}
  numbering          "threads-last" (default; the kernel's usual x86 order: the first thread of
                     every core, then the second threads, ...) or "siblings-adjacent" (all
                     threads of a core get consecutive ids, as on hybrid client parts)
  socket_cpu_base    list of first cpu id per socket; numbering then restarts per socket at that
                     base (firmware that leaves holes between sockets). Default: one global range.
  dies_per_socket    default 1; cores are split evenly, die_id restarts in every package
  numa_per_socket    default 1; cores are split evenly in enumeration order (SNC/NPS)
  cores_per_l3       default all cores of a socket; the L3 id counts L3s across the machine
                     (= socket id with one L3 per socket, consecutive per CCX on EPYC)
  l3                 L3 size, default "32768K"
  cluster_id_unset   true: write cluster_id 65535 (what some AMD kernels show) instead of an index
  offline            cpu list of present but offline cpus
  possible           cpu list (default: the present cpus)
  isolated           content of devices/system/cpu/isolated (default empty)
  memoryless_nodes   list of node ids that have no memory
  cmdline            full kernel command line (default: BOOT_IMAGE=... ro quiet)
  cmdline_extra      appended to the default command line
  kernel_max         NR_CPUS - 1 (default 8191)
"""

import argparse
import json
import os
import shutil
import sys

DEFAULT_CMDLINE = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet"
DEFAULT_CACHES = {"l1d": "32K", "l1i": "32K", "l2": "1024K"}
CLUSTER_ID_UNSET = 65535

KNOWN_FIELDS = {
    "vendor", "sockets", "cores_per_socket", "threads_per_core", "core_groups", "numbering",
    "socket_cpu_base", "dies_per_socket", "numa_per_socket", "cores_per_l3", "l3",
    "cluster_id_unset", "offline", "possible", "isolated", "memoryless_nodes", "cmdline",
    "cmdline_extra", "kernel_max",
}
KNOWN_GROUP_FIELDS = {
    "count", "threads", "cluster", "core_ids", "l1d", "l1i", "l2", "type", "capacity",
}
# A core type -> the PMU directory under devices/ the kernel names its cpus in (perf's hybrid
# PMUs on Intel: cpu_core for performance cores, cpu_atom for efficient ones).
CORE_TYPE_PMU = {"performance": "cpu_core", "efficient": "cpu_atom"}


class DescriptionError(Exception):
    pass


def format_list(ids):
    """Canonical Linux cpu-list format: sorted, runs merged ("0-3,8,10-11"), empty -> ""."""
    ids = sorted(set(ids))
    parts = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def parse_list(text):
    """Parses "0-3,8" (no stride syntax); empty or whitespace -> empty set."""
    ids = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise DescriptionError(f"bad cpu list {text!r}")
        lo = int(lo)
        hi = int(hi) if sep else lo
        if hi < lo:
            raise DescriptionError(f"bad cpu list {text!r}")
        ids.update(range(lo, hi + 1))
    return ids


def cmdline_isolation(cmdline):
    """(domain-isolated, nohz_full) CPUs of a command line, as the kernel reads them: isolcpus=
    without flags, or with the `domain` flag, isolates from the scheduler's domains; nohz_full=
    (and isolcpus=nohz,...) only stops the tick. Only plain lists are used in the fixtures."""
    domain, nohz = set(), set()
    for token in cmdline.split():
        key, sep, value = token.partition("=")
        key = key.replace("-", "_")
        if not sep or key not in ("isolcpus", "nohz_full"):
            continue
        items = value.split(",")
        flags = []
        while items and not items[0][:1].isdigit():
            flags.append(items.pop(0))  # flags such as "managed_irq", "domain", "nohz"
        ids = parse_list(",".join(items))
        if key == "nohz_full" or "nohz" in flags:
            nohz |= ids
        if key == "isolcpus" and (not flags or "domain" in flags):
            domain |= ids
    return domain, nohz


def core_groups(desc):
    if "core_groups" in desc:
        return desc["core_groups"]
    if "cores_per_socket" not in desc:
        raise DescriptionError("needs core_groups or cores_per_socket")
    return [{"count": desc["cores_per_socket"], "threads": desc.get("threads_per_core", 1)}]


def build(desc):
    """Turns a description into a list of cpu records (present cpus) plus machine-wide facts."""
    unknown = set(desc) - KNOWN_FIELDS
    if unknown:
        raise DescriptionError(f"unknown fields {sorted(unknown)}")
    sockets = desc["sockets"]
    groups = core_groups(desc)
    for g in groups:
        bad = set(g) - KNOWN_GROUP_FIELDS
        if bad:
            raise DescriptionError(f"unknown core group fields {sorted(bad)}")
        if g.get("type", "performance") not in CORE_TYPE_PMU:
            raise DescriptionError(f"unknown core type {g['type']!r}")
    dies = desc.get("dies_per_socket", 1)
    nps = desc.get("numa_per_socket", 1)
    cores_in_socket = sum(g["count"] for g in groups)
    cores_per_l3 = desc.get("cores_per_l3", cores_in_socket)
    for what, n in (("dies_per_socket", dies), ("numa_per_socket", nps)):
        if cores_in_socket % n:
            raise DescriptionError(f"{cores_in_socket} cores per socket do not split by {what}={n}")
    if cores_in_socket % cores_per_l3:
        raise DescriptionError(f"cores_per_l3={cores_per_l3} does not divide {cores_in_socket}")
    l3_per_socket = cores_in_socket // cores_per_l3

    # Cores in enumeration order, with the domains they belong to.
    cores = []
    cluster_index = 0
    for s in range(sockets):
        local = 0
        next_core_id = 0
        for g in groups:
            size = g.get("cluster", 1)
            if g["count"] % size:
                raise DescriptionError(f"cluster={size} does not divide count={g['count']}")
            ids = g.get("core_ids")
            if ids is not None and len(ids) != g["count"]:
                raise DescriptionError("core_ids must have one entry per core of the group")
            for k in range(g["count"]):
                if k % size == 0 and k:
                    cluster_index += 1
                core_id = ids[k] if ids is not None else next_core_id
                next_core_id = core_id + 1
                cores.append({
                    "socket": s,
                    "local": local,
                    "die": local // (cores_in_socket // dies),
                    "numa": s * nps + local // (cores_in_socket // nps),
                    "l3": s * l3_per_socket + local // cores_per_l3,
                    "cluster": cluster_index,
                    "core_id": core_id,
                    "threads": g["threads"],
                    "l1d": g.get("l1d", DEFAULT_CACHES["l1d"]),
                    "l1i": g.get("l1i", DEFAULT_CACHES["l1i"]),
                    "l2": g.get("l2", DEFAULT_CACHES["l2"]),
                    "type": g.get("type"),
                    "capacity": g.get("capacity"),
                    "cpus": [],
                })
                local += 1
            cluster_index += 1
    for i, core in enumerate(cores):
        core["index"] = i

    # Logical cpu numbering.
    numbering = desc.get("numbering", "threads-last")
    bases = desc.get("socket_cpu_base")
    if bases is not None and len(bases) != sockets:
        raise DescriptionError("socket_cpu_base needs one entry per socket")
    runs = [[c for c in cores if c["socket"] == s] for s in range(sockets)] if bases else [cores]
    for n, run in enumerate(runs):
        next_id = bases[n] if bases else 0
        if numbering == "threads-last":
            order = [(c, t) for t in range(max(c["threads"] for c in run))
                     for c in run if c["threads"] > t]
        elif numbering == "siblings-adjacent":
            order = [(c, t) for c in run for t in range(c["threads"])]
        else:
            raise DescriptionError(f"unknown numbering {numbering!r}")
        for core, _thread in order:
            core["cpus"].append(next_id)
            next_id += 1

    cpus = {}
    for core in cores:
        for cpu in core["cpus"]:
            if cpu in cpus:
                raise DescriptionError(f"cpu {cpu} numbered twice (socket_cpu_base overlap?)")
            cpus[cpu] = core
    present = set(cpus)
    offline = parse_list(desc.get("offline", ""))
    if not offline <= present:
        raise DescriptionError(f"offline cpus {format_list(offline - present)} are not present")
    if 0 in offline:
        raise DescriptionError("cpu0 cannot be offline")
    possible = parse_list(desc["possible"]) if "possible" in desc else set(present)
    if not present <= possible:
        raise DescriptionError("possible must contain every present cpu")
    kernel_max = desc.get("kernel_max", 8191)
    if max(possible) > kernel_max:
        raise DescriptionError("cpu id larger than kernel_max")
    isolated = parse_list(desc.get("isolated", ""))
    nodes = sorted({c["numa"] for c in cores})
    memoryless = set(desc.get("memoryless_nodes", []))
    if not memoryless <= set(nodes):
        raise DescriptionError("memoryless_nodes names an unknown node")
    cmdline = desc.get("cmdline", DEFAULT_CMDLINE)
    if desc.get("cmdline_extra"):
        cmdline += " " + desc["cmdline_extra"]
    return {
        "vendor": desc.get("vendor", "intel"),
        "cores": cores,
        "cpus": cpus,
        "present": present,
        "online": present - offline,
        "possible": possible,
        "kernel_max": kernel_max,
        "isolated": isolated,
        "nodes": nodes,
        "memory_nodes": [n for n in nodes if n not in memoryless],
        "cmdline": cmdline,
        "l3_size": desc.get("l3", "32768K"),
        "cluster_id_unset": desc.get("cluster_id_unset", False),
    }


def write(path, content):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write(f"{content}\n")


def write_machine(root, m):
    online = m["online"]
    cores = m["cores"]
    cpu_dir = os.path.join(root, "devices", "system", "cpu")
    node_dir = os.path.join(root, "devices", "system", "node")

    def online_of(pred):
        return format_list(cpu for cpu in online if pred(m["cpus"][cpu]))

    write(os.path.join(cpu_dir, "online"), format_list(online))
    # The kernel's "offline" is possible & ~online, so it includes possible-but-absent cpus.
    write(os.path.join(cpu_dir, "offline"), format_list(m["possible"] - online))
    write(os.path.join(cpu_dir, "present"), format_list(m["present"]))
    write(os.path.join(cpu_dir, "possible"), format_list(m["possible"]))
    write(os.path.join(cpu_dir, "isolated"), format_list(m["isolated"]))
    write(os.path.join(cpu_dir, "kernel_max"), str(m["kernel_max"]))

    for cpu in sorted(m["present"]):
        core = m["cpus"][cpu]
        d = os.path.join(cpu_dir, f"cpu{cpu}")
        if cpu != 0:
            write(os.path.join(d, "online"), "1" if cpu in online else "0")
        if cpu not in online:
            os.makedirs(d, exist_ok=True)
            continue
        siblings = online_of(lambda c: c is core)
        package = online_of(lambda c: c["socket"] == core["socket"])
        cluster = online_of(lambda c: c["cluster"] == core["cluster"])
        topo = {
            "physical_package_id": core["socket"],
            "die_id": core["die"],
            "core_id": core["core_id"],
            "core_cpus_list": siblings,
            "thread_siblings_list": siblings,
            "cluster_id": CLUSTER_ID_UNSET if m["cluster_id_unset"] else core["cluster"],
            "cluster_cpus_list": cluster,
            "core_siblings_list": package,
            "package_cpus_list": package,
            "die_cpus_list": online_of(
                lambda c: c["socket"] == core["socket"] and c["die"] == core["die"]),
        }
        for name, value in topo.items():
            write(os.path.join(d, "topology", name), value)
        if core["capacity"] is not None:
            write(os.path.join(d, "cpu_capacity"), core["capacity"])
        caches = [
            (1, "Data", core["index"], siblings, core["l1d"]),
            (1, "Instruction", core["index"], siblings, core["l1i"]),
            (2, "Unified", core["cluster"], cluster, core["l2"]),
            (3, "Unified", core["l3"], online_of(lambda c: c["l3"] == core["l3"]), m["l3_size"]),
        ]
        for i, (level, kind, cache_id, shared, size) in enumerate(caches):
            idx = os.path.join(d, "cache", f"index{i}")
            write(os.path.join(idx, "level"), level)
            write(os.path.join(idx, "type"), kind)
            write(os.path.join(idx, "id"), cache_id)
            write(os.path.join(idx, "shared_cpu_list"), shared)
            write(os.path.join(idx, "size"), size)

    nodes = m["nodes"]
    write(os.path.join(node_dir, "online"), format_list(nodes))
    write(os.path.join(node_dir, "possible"), format_list(nodes))
    write(os.path.join(node_dir, "has_cpu"),
          format_list({m["cpus"][cpu]["numa"] for cpu in online}))
    write(os.path.join(node_dir, "has_memory"), format_list(m["memory_nodes"]))
    write(os.path.join(node_dir, "has_normal_memory"), format_list(m["memory_nodes"]))
    for node in nodes:
        write(os.path.join(node_dir, f"node{node}", "cpulist"),
              online_of(lambda c: c["numa"] == node))

    for core_type, pmu in CORE_TYPE_PMU.items():
        if any(c["type"] for c in cores):
            write(os.path.join(root, "devices", pmu, "cpus"),
                  online_of(lambda c, t=core_type: c["type"] == t))

    write(os.path.join(root, "proc", "cmdline"), m["cmdline"])


def expected(m):
    """The topology document cpusetd should discover, derived from the description alone."""
    cpus = []
    for cpu in sorted(m["online"]):
        core = m["cpus"][cpu]
        cluster_cpus = [c for c in m["online"] if m["cpus"][c]["cluster"] == core["cluster"]]
        cpus.append({
            "id": cpu,
            "socket": core["socket"],
            "die": core["die"],
            "numa": core["numa"],
            "core": min(c for c in core["cpus"] if c in m["online"]),
            "uncore": core["l3"],
            "cluster": min(cluster_cpus),
        })
    domain, nohz = cmdline_isolation(m["cmdline"])
    doc = {
        "cpus": cpus,
        "offline": format_list(m["present"] - m["online"]),
        "isolated": format_list(m["isolated"] | domain),
        "memory_nodes": format_list(m["memory_nodes"]),
    }
    nohz &= m["online"]
    if nohz:
        doc["nohz_full"] = format_list(nohz)
    types = {t: format_list(cpu for cpu in m["online"] if m["cpus"][cpu]["type"] == t)
             for t in CORE_TYPE_PMU}
    if all(types.values()):
        doc["core_types"] = types
    return doc


def is_fixture_dir(path):
    """Only directories this script made (or empty ones) are ever deleted."""
    entries = set(os.listdir(path))
    return not entries or "expected.json" in entries or entries <= {"devices", "proc"}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: scripts/mkfakesysfs.py testdata/sysfs/machines.json testdata/sysfs",
    )
    parser.add_argument("machines", help="JSON file: machine name -> description")
    parser.add_argument("out", help="directory that receives one <name>/ tree per machine")
    parser.add_argument("--machine", action="append", metavar="NAME",
                        help="only (re)generate this machine (repeatable)")
    args = parser.parse_args()

    with open(args.machines, encoding="utf-8") as f:
        machines = json.load(f)
    names = args.machine or sorted(machines)
    for name in names:
        if name not in machines:
            parser.error(f"no machine {name!r} in {args.machines}")
        try:
            m = build(machines[name])
        except (DescriptionError, KeyError, TypeError) as e:
            print(f"mkfakesysfs: machine {name}: {e}", file=sys.stderr)
            return 2
        root = os.path.join(args.out, name)
        if os.path.lexists(root):
            if not os.path.isdir(root) or not is_fixture_dir(root):
                print(f"mkfakesysfs: refusing to replace {root}: not a fixture tree",
                      file=sys.stderr)
                return 2
            shutil.rmtree(root)
        write_machine(root, m)
        with open(os.path.join(root, "expected.json"), "w", encoding="ascii", newline="\n") as f:
            json.dump(expected(m), f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
