#!/usr/bin/env python
"""How many hallways the inside has: the figures issue 34 tracks, for one source tree.

Static figures (read from the tree's ``src/zreplay`` with ``ast``, nothing imported):

* methods per class (all, public) and the classes with the most;
* one-line forwarders: methods whose whole body (a docstring aside) is ``return
  self.a.b(...)`` / ``self.a.b(...)`` / ``return self.a.b`` (two attribute hops or more from
  ``self``), i.e. a call handed one level down unchanged;
* test files per concept: how many ``tests/test_*.py`` files define a test whose name
  names the concept (checkpoint, clear, evict, lock, priorit, pickle, fork).

Dynamic figures (the tree imported in a child process with ``PYTHONPATH=<tree>/src``):

* frames: the most zreplay frames on the stack at once during one ``sample`` from each
  facade (TrajectoryReplayBuffer, BufferView, stable-worldmodel's ReplayBuffer), i.e. the
  hops from the facade the user called down to the deepest call (the stack is printed);
* normalizations: calls into ``zreplay/numbers.py`` during that ``sample``;
* rate-gate entries: calls into ``zreplay/core/rate.py`` during one rate-limited sample
  (a ``MinSize(1)`` limiter, already satisfied).

    python benchmarks/bench_inside.py --tree . --out inside.json
    python benchmarks/bench_inside.py --tree /path/to/old/checkout   # another tree

Prints a table and writes JSON (``--out``, default ``results/latest/inside.json``).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONCEPTS = ("checkpoint", "clear", "evict", "lock", "priorit", "pickl", "fork")


def _attr_depth(node: ast.AST) -> int:
    """Hops from ``self`` in ``self.a.b...`` (0 if not rooted at ``self``)."""
    depth = 0
    while isinstance(node, ast.Attribute):
        depth += 1
        node = node.value
    return depth if isinstance(node, ast.Name) and node.id == "self" else 0


def _is_forwarder(fn: ast.FunctionDef) -> bool:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1:
        return False
    stmt = body[0]
    value = stmt.value if isinstance(stmt, (ast.Return, ast.Expr)) else None
    if isinstance(value, ast.Call):
        return _attr_depth(value.func) >= 2 and all(
            isinstance(a, (ast.Name, ast.Constant, ast.Starred)) for a in value.args
        )
    return isinstance(stmt, ast.Return) and _attr_depth(value) >= 2


def static_figures(tree: Path) -> dict:
    classes, forwarders = [], []
    for path in sorted((tree / "src" / "zreplay").rglob("*.py")):
        rel = str(path.relative_to(tree / "src"))
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            methods = [n for n in node.body if isinstance(n, ast.FunctionDef)]
            public = [m for m in methods if not m.name.startswith("_")]
            classes.append(
                {"class": f"{rel}:{node.name}", "methods": len(methods), "public": len(public)}
            )
            forwarders += [f"{rel}:{node.name}.{m.name}" for m in methods if _is_forwarder(m)]
    classes.sort(key=lambda c: -c["public"])
    per_concept = {}
    for concept in CONCEPTS:
        files = set()
        for path in sorted((tree / "tests").glob("test_*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                    if concept in node.name.lower():
                        files.add(path.name)
        per_concept[concept] = sorted(files)
    return {"classes": classes, "forwarders": forwarders, "test_files_per_concept": per_concept}


# Run in a child with the tree's src first on sys.path.
CHILD = r'''
import json, sys, tempfile, os
from pathlib import Path
import numpy as np
import zreplay
src = Path(zreplay.__file__).resolve().parent
assert str(src).startswith(sys.argv[1]), (src, sys.argv[1])
from zreplay import TrajectoryReplayBuffer, ReplayBuffer, MinSize
import torch

def traj(t=50, b=4):
    return {"obs": np.zeros((t, b, 8), np.float32), "actions": np.zeros((t, b, 2), np.float32),
            "rewards": np.zeros((t, b), np.float32), "dones": np.zeros((t, b), bool)}

def profile(fn):
    """(most zreplay frames on the stack at once, calls into numbers.py, calls into rate.py)"""
    state = {"max": 0, "numbers": 0, "rate": 0, "path": []}
    def ours(frame):
        return str(Path(frame.f_code.co_filename).resolve()).startswith(str(src))
    def hook(frame, event, arg):
        if event == "call":
            f, path = frame, []
            while f is not None:
                if ours(f):
                    path.append(f"{Path(f.f_code.co_filename).stem}.{f.f_code.co_name}")
                f = f.f_back
            if len(path) > state["max"]:
                state["max"], state["path"] = len(path), path[::-1]
            name = frame.f_code.co_filename
            state["numbers"] += name.endswith(os.path.join("zreplay", "numbers.py"))
            state["rate"] += name.endswith(os.path.join("core", "rate.py"))
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return state

out = {}
with tempfile.TemporaryDirectory() as d:
    rb = TrajectoryReplayBuffer(seed=0, auto_save=True, auto_save_path=f"{d}/rl",
                                sample_window_size=0)
    rb.add_trajectories([traj()])
    rb.flush()
    rb.sample(8)
    s = profile(lambda: rb.sample(256))
    out["TrajectoryReplayBuffer.sample"] = s
    rb.close()
    view = zreplay.open(f"{d}/rl")
    view.sample(8)
    out["BufferView.sample"] = profile(lambda: view.sample(256))
    view.close()
    swm = ReplayBuffer(100_000, path=f"{d}/swm", history_len=1)
    ep = {"obs": np.zeros((50, 8), np.float32), "action": np.zeros((50, 2), np.float32)}
    swm.write_episodes([ep, ep])
    swm.flush()
    swm.sample(8)
    out["ReplayBuffer.sample"] = profile(lambda: swm.sample(256))
    swm.close()
    rl = TrajectoryReplayBuffer(seed=0, auto_save=True, auto_save_path=f"{d}/rate",
                                sample_window_size=0, rate_limiter=MinSize(1))
    rl.add_trajectories([traj()])
    rl.flush()
    rl.sample(8)
    out["TrajectoryReplayBuffer.sample (rate-limited)"] = profile(lambda: rl.sample(256))
    rl.close()
print(json.dumps(out))
'''


def dynamic_figures(tree: Path) -> dict:
    src = str((tree / "src").resolve())
    env = {**os.environ, "PYTHONPATH": src}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, src], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"the child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", default=str(HERE.parent), help="a checkout holding src/zreplay")
    ap.add_argument("--out", default=str(HERE / "results" / "latest" / "inside.json"))
    args = ap.parse_args()
    tree = Path(args.tree).resolve()
    figures = {"tree": str(tree), **static_figures(tree), "samples": dynamic_figures(tree)}
    classes = figures["classes"]
    print(f"tree: {tree}")
    print(f"classes: {len(classes)}; most public methods:")
    for c in classes[:6]:
        print(f"  {c['public']:3d} public / {c['methods']:3d} all  {c['class']}")
    print(f"one-line forwarders: {len(figures['forwarders'])}")
    by_class: dict[str, int] = {}
    for f in figures["forwarders"]:
        by_class[f.rsplit(".", 1)[0]] = by_class.get(f.rsplit(".", 1)[0], 0) + 1
    for name, n in sorted(by_class.items(), key=lambda kv: -kv[1])[:6]:
        print(f"  {n:3d}  {name}")
    print(f"{'sample from':48s} {'frames':>6s} {'numbers.py calls':>16s} {'rate.py calls':>13s}")
    for name, s in figures["samples"].items():
        print(f"{name:48s} {s['max']:6d} {s['numbers']:16d} {s['rate']:13d}")
    for name, s in figures["samples"].items():
        print(f"deepest stack of {name}: {' > '.join(s['path'])}")
    print("test files per concept:")
    for concept, files in figures["test_files_per_concept"].items():
        print(f"  {concept:10s} {len(files):3d}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
