"""What one pass over a big job costs (issue 29.8): `Runtime._pass` timed on a snapshot of real objects, for
this checkout's operator and, side by side in the same run, another's (`--operator-src`).

A snapshot is the JSON of one namespace's objects and the cluster's nodes, as kubectl prints them, e.g. of
`bench/gang_load.py`'s cluster while its job runs:

    for k in resilienttrainingjobs jobs pods services persistentvolumeclaims networkpolicies; do
        kubectl get $k -n gang-00 -o json > DIR/$k.json; done
    kubectl get nodes -o json > DIR/nodes.json

Each operator fills its own stores from the snapshot (through `Store.put`, as its watches would), then
runs `--passes` passes of the namespace's first RTJ with a client that answers writes from the stores and
sends nothing. The objects are real; the pass makes no API round trip, so the figure is the operator's own
CPU per pass, on one core of this machine.

    PYTHONPATH=operator:worker python bench/pass_cost.py DIR [DIR ...] [--operator-src OTHER] [--passes 20]
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
import copy, json, statistics, sys, time
from rtj_operator.runtime import Runtime
from rtj_operator.stores import ref

class Quiet:
    """Writes answered from the stores (a status patch merged into the stored RTJ), nothing sent."""
    def __init__(self, stores): self.stores = stores
    def get(self, kind, name, namespace=None): return None
    def list(self, *a, **k): return []
    def patch(self, kind, name, namespace, patch, subresource=None, strategic=False):
        have = copy.deepcopy(self.stores.of(kind).get(namespace or "", name))
        if have is None: return None
        if subresource == "status": have["status"] = {**have.get("status", {}), **patch.get("status", {})}
        have["metadata"]["resourceVersion"] = str(int(have["metadata"]["resourceVersion"]) + 1)
        have["kind"] = kind
        return have
    def create(self, obj, dry_run=False): return obj
    def delete(self, *a, **k): return None
    def event(self, *a, **k): return None
    def evict(self, *a, **k): return "evicted"

directory, passes, files = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
rt = Runtime(None, workers=0)
rt.writer._kube = Quiet(rt.stores)
for name, kind in files.items():
    for item in json.load(open(f"{directory}/{name}.json"))["items"]:
        rt.stores.of(kind).put({**item, "kind": kind})
    rt.stores.of(kind).synced.set()
key = ref(rt.stores.of("ResilientTrainingJob").all()[0])
rt._pass(key)  # the first pass writes status: not what a steady pass costs
times = []
for _ in range(passes):
    start = time.perf_counter()
    outcome = rt._pass(key)
    times.append(1000 * (time.perf_counter() - start))
    assert outcome.kind == "ok", outcome
times.sort()
p90 = times[int(0.9 * (len(times) - 1))]
print(json.dumps({"pods": len(rt.stores.pods), "median": statistics.median(times), "p90": p90}))
'''


def measure(src: Path, directory: Path, passes: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{src / 'operator'}:{src / 'worker'}"}
    out = subprocess.run([sys.executable, "-c", PROBE, str(directory), str(passes), json.dumps(FILES)], env=env,
                         check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshots", nargs="+", type=Path, help="directories of kubectl JSON (module docstring)")
    parser.add_argument("--operator-src", type=Path, default=None, help="another checkout, timed in the same run")
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()
    sources = [("this", ROOT)] + ([("other", args.operator_src.resolve())] if args.operator_src else [])
    print(f"One pass of one RTJ over a snapshot of real objects, {args.passes} passes after a first, no API round "
          "trips, ms")
    print("| snapshot | pods | " + " | ".join(f"{label} median / p90" for label, _ in sources)
          + (" | other / this (median) |" if len(sources) > 1 else " |"))
    print("|---|---|" + "---|" * len(sources) + ("---|" if len(sources) > 1 else ""))
    for directory in args.snapshots:
        found = [measure(src, directory, args.passes) for _, src in sources]
        cells = " | ".join(f"{f['median']:.1f} / {f['p90']:.1f}" for f in found)
        ratio = f" | {found[1]['median'] / found[0]['median']:.1f}x |" if len(found) > 1 else " |"
        print(f"| {directory.name} | {found[0]['pods']} | {cells}{ratio}", flush=True)


if __name__ == "__main__":
    main()
