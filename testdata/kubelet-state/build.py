#!/usr/bin/env python3
"""Builds the cpu_manager_state fixtures of this directory the way kubelet 1.36 (v3) and 1.37
(v4) build them, from kubelet's pkg/kubelet/cm/cpumanager/state/checkpoint.go:

* v3 `MarshalCheckpoint`: Checksum = 0, then FNV-1a 32 of `dump.ForHash(cp)` (go-spew `%#v`,
  Indent " ", SortKeys, SpewKeys, DisableMethods, DisablePointerAddresses, DisableCapacities)
  with the type name written `CPUManagerCheckpoint`; then `json.Marshal` (fields in struct
  order, map keys sorted, PodEntry as {"cpuSet": "<list>"}).
* v4 `MarshalCheckpoint`: Data = json.Marshal(CPUManagerCheckpointData{PolicyName,
  DefaultCPUSet, Entries, PodEntries}); DataChecksum = checksum.New(Data), i.e. FNV-1a 32 of
  go-spew's `%#v` of a string: "(string)" and its bytes; the v3 fields inline with Checksum 0.

No kubelet-produced file was available: these are built by this recipe, and the hashed strings
are spelled out below so each can be checked by eye against go-spew's format rules.
Run from this directory: python3 build.py
"""
import json

def fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h

def cpus(text):
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out

def spew_v3(policy, default, entries, pods):
    ent = " ".join(
        f"{pod}:map[" + " ".join(f"{c}:{s}" for c, s in sorted(ctrs.items())) + "]"
        for pod, ctrs in sorted(entries.items()))
    pe = " ".join(
        f"{pod}:{{CPUSet:(cpuset.CPUSet){{elems:(map[int]struct {{}})map["
        + " ".join(f"{c}:{{}}" for c in cpus(s)) + "]}}"
        for pod, s in sorted(pods.items()))
    return (f"(*state.CPUManagerCheckpoint){{PolicyName:(string){policy} "
            f"DefaultCPUSet:(string){default} "
            f"Entries:(map[string]map[string]string)map[{ent}] "
            f"PodEntries:(state.PodCPUAssignments)map[{pe}] Checksum:(checksum.Checksum)0}}")

def go_json(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)

POLICY, DEFAULT = "static", "0,5-7"
ENTRIES = {"6f1c2d3e-4a5b-4c6d-8e7f-0a1b2c3d4e5f": {"app": "1-2"}}
PODS = {"9a8b7c6d-5e4f-4a3b-9c2d-1e0f2a3b4c5d": "3-4"}

def fields():
    return {"policyName": POLICY, "defaultCpuSet": DEFAULT, "entries": ENTRIES,
            "podEntries": {uid: {"cpuSet": s} for uid, s in sorted(PODS.items())}}

def v3():
    hashed = spew_v3(POLICY, DEFAULT, ENTRIES, PODS)
    doc = dict(fields(), checksum=fnv1a32(hashed.encode()))
    return hashed, go_json(doc)

def v4(tamper=False):
    data = go_json(fields())
    checksum = fnv1a32(("(string)" + data).encode())
    if tamper:
        data = data.replace('"app":"1-2"', '"app":"1-3"')
    doc = dict(fields(), checksum=0, data=data, dataChecksum=checksum)
    return data, go_json(doc)

if __name__ == "__main__":
    hashed, text = v3()
    print(hashed, fnv1a32(hashed.encode()))
    open("v3.json", "w").write(text + "\n")
    data, text = v4()
    print("(string)" + data, fnv1a32(("(string)" + data).encode()))
    open("v4.json", "w").write(text + "\n")
    open("v4-corrupt-data.json", "w").write(v4(tamper=True)[1] + "\n")
