"""What one pass over a big job costs (issue 29.8): `Runtime._pass` timed on a snapshot of real objects, for
this checkout's operator and, side by side in the same run, another's (`--operator-src`).

A snapshot is the JSON of one namespace's objects and the cluster's nodes, as kubectl prints them, e.g. of
`bench/gang_load.py`'s cluster while its job runs:

    for k in resilienttrainingjobs jobs pods services persistentvolumeclaims networkpolicies; do
        kubectl get $k -n gang-00 -o json > DIR/$k.json; done
    kubectl get nodes -o json > DIR/nodes.json

Each operator fills its own stores from the snapshot (through `Store.put`, as its watches would), then
runs `--passes` passes of each RTJ, in turn, with a client that answers writes from the stores and sends
nothing. The objects are real; the pass makes no API round trip, so the figure is the operator's own CPU
per pass, on one core of this machine.

- `--copies N` puts N copies of the snapshot in the stores, each in a namespace of its own with its own
  uids and nodes (a job is at most 1024 nodes: a cluster of 8,000 GPU nodes is several such jobs). The
  RSS columns are the operator process's resident memory once its stores hold them, and after the passes.
- `--changed F`: before each pass, a fraction F of that job's pods get a new resourceVersion, as a report
  or a kubelet update would give them (stored as a watch event is, outside the timed pass). 0.03 is what
  `bench/gang_load.py` measured at 1000 nodes: 3.2 reports/s against one pass per 10 s.

    PYTHONPATH=operator:worker python bench/pass_cost.py DIR [DIR ...] [--operator-src OTHER] [--passes 20]
        [--copies 1,8] [--changed 0.03]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = {"resilienttrainingjobs": "ResilientTrainingJob", "jobs": "Job", "pods": "Pod", "services": "Service",
         "persistentvolumeclaims": "PersistentVolumeClaim", "networkpolicies": "NetworkPolicy", "nodes": "Node"}

# Runs under the operator's own PYTHONPATH (this checkout's or --operator-src's): only the runtime's entry
# points that both have.
PROBE = r'''
import itertools, json, marshal, statistics, sys, time, uuid
from rtj_operator.runtime import Runtime
from rtj_operator.stores import ref

class Quiet:
    """Writes answered from the stores (a status patch merged into the stored RTJ), nothing sent."""
    def __init__(self, stores): self.stores = stores
    def get(self, kind, name, namespace=None): return None
    def list(self, *a, **k): return []
    def patch(self, kind, name, namespace, patch, subresource=None, strategic=False):
        have = self.stores.of(kind).get(namespace or "", name)
        have = marshal.loads(marshal.dumps(have)) if have is not None else None
        if have is None: return None
        if subresource == "status": have["status"] = {**have.get("status", {}), **patch.get("status", {})}
        have["metadata"]["resourceVersion"] = str(int(have["metadata"]["resourceVersion"]) + 1)
        have["kind"] = kind
        return have
    def create(self, obj, dry_run=False): return obj
    def delete(self, *a, **k): return None
    def event(self, *a, **k): return None
    def evict(self, *a, **k): return "evicted"

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"): return int(line.split()[1]) / 1024

def renamed(value, names):
    """The object with every string that is a known uid, node name or namespace replaced (whole values)."""
    if isinstance(value, dict): return {k: renamed(v, names) for k, v in value.items()}
    if isinstance(value, list): return [renamed(v, names) for v in value]
    if isinstance(value, str): return names.get(value, value)
    return value

directory, passes, files, copies, changed = (sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]),
                                             int(sys.argv[4]), float(sys.argv[5]))
loaded = {kind: json.load(open(f"{directory}/{name}.json"))["items"] for name, kind in files.items()}
uids = {o["metadata"]["uid"] for items in loaded.values() for o in items if o["metadata"].get("uid")}
nodes = {o["metadata"]["name"] for o in loaded["Node"]}
namespaces = {o["metadata"]["namespace"] for kind, items in loaded.items() if kind != "Node" for o in items}
rt = Runtime(None, workers=0)
rt.writer._kube = Quiet(rt.stores)
for k in range(copies):
    names = {} if k == 0 else {**{u: str(uuid.uuid5(uuid.NAMESPACE_OID, f"{u}/{k}")) for u in uids},
                               **{n: f"{n}-c{k}" for n in nodes}, **{ns: f"{ns}-c{k}" for ns in namespaces}}
    for kind, items in loaded.items():
        for item in items:
            rt.stores.of(kind).put({**renamed(item, names), "kind": kind})
for kind in files.values():
    rt.stores.of(kind).synced.set()
del loaded
filled_rss = rss_mb()
keys = [ref(o) for o in rt.stores.of("ResilientTrainingJob").all()]
for key in keys:
    rt._pass(key)  # the first pass writes status: not what a steady pass costs
version = itertools.count(10**12)
times = []
for key in keys * passes:
    pods = sorted(rt.stores.pods.indexed("rtj", key), key=lambda p: p["metadata"]["name"])
    step = max(1, len(pods) // max(1, round(changed * len(pods)))) if changed else 0
    for pod in (pods[len(times) % step::step] if step else []):
        rt.stores.pods.put({**pod, "metadata": {**pod["metadata"], "resourceVersion": str(next(version))}})
    start = time.perf_counter()
    outcome = rt._pass(key)
    times.append(1000 * (time.perf_counter() - start))
    assert outcome.kind == "ok", outcome
times.sort()
p90 = times[int(0.9 * (len(times) - 1))]
print(json.dumps({"pods": len(rt.stores.pods), "median": statistics.median(times), "p90": p90,
                  "rss_filled": filled_rss, "rss_end": rss_mb()}))
'''


def measure(src: Path, directory: Path, passes: int, copies: int, changed: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{src / 'operator'}:{src / 'worker'}"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(directory), str(passes), json.dumps(FILES), str(copies),
                          str(changed)], env=env, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshots", nargs="+", type=Path, help="directories of kubectl JSON (module docstring)")
    parser.add_argument("--operator-src", type=Path, default=None, help="another checkout, timed in the same run")
    parser.add_argument("--passes", type=int, default=20, help="passes of each RTJ, after a first")
    parser.add_argument("--copies", default="1", help="comma-separated: copies of each snapshot in the stores")
    parser.add_argument("--changed", type=float, default=0.03, help="fraction of a job's pods changed before a pass")
    args = parser.parse_args()
    sources = [("this", ROOT)] + ([("other", args.operator_src.resolve())] if args.operator_src else [])
    print(f"One pass of one RTJ over a snapshot of real objects, {args.passes} passes of each RTJ after a first, "
          f"{args.changed:.0%} of its pods changed before each, no API round trips; ms, and the process's RSS in MB")
    print("| snapshot | copies | pods | " + " | ".join(f"{label} median / p90 | {label} RSS filled / end"
                                                      for label, _ in sources)
          + (" | other / this (median) |" if len(sources) > 1 else " |"))
    print("|---|---|---|" + "---|---|" * len(sources) + ("---|" if len(sources) > 1 else ""))
    for directory in args.snapshots:
        for copies in (int(c) for c in args.copies.split(",")):
            found = [measure(src, directory, args.passes, copies, args.changed) for _, src in sources]
            cells = " | ".join(f"{f['median']:.1f} / {f['p90']:.1f} | {f['rss_filled']:.0f} / {f['rss_end']:.0f}"
                               for f in found)
            ratio = f" | {found[1]['median'] / found[0]['median']:.1f}x |" if len(found) > 1 else " |"
            print(f"| {directory.name} | {copies} | {found[0]['pods']} | {cells}{ratio}", flush=True)


if __name__ == "__main__":
    main()
