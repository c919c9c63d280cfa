#!/usr/bin/env python
"""Prioritized replay benchmark: zreplay's ``SumTree`` / ``PrioritizedState`` against cpprb's
``PrioritizedReplayBuffer`` and a plain numpy baseline.

The workload is the PER inner loop of a learner: 1M rows with lognormal priorities, then
per iteration draw 256 rows (with importance weights) and write 256 new random priorities
for exactly those rows.  Initial priorities and every iteration's new priorities are
generated once (fixed seeds) and written to ``.npy`` files; each system loads them and is
measured in its own subprocess, and the systems run in interleaved rounds (zreplay,
cpprb, numpy, zreplay, ...) so that a burst of foreign load hits all of them.  All
ratios printed come from this one run.  Nothing here asserts on timings.

    python benchmarks/bench_priority.py --out benchmarks/results/priority.json   # ~1-2 min
    python benchmarks/bench_priority.py --quick --out /tmp/priority-quick.json  # smoke, ~15 s

Systems (alpha 0.6, beta 0.4, eps 1e-6 everywhere; leaf = (p + eps) ** alpha):

* zreplay ``PrioritizedState``: ``sample(rng, 256)`` -> ``(rows, weights)`` (weights
  normalised by the global-minimum priority) + ``update(rows, new_p)`` (stale-row check
  included); i.i.d. and ``stratified=True`` draws;
* zreplay ``SumTree`` alone: ``sample`` leaf indices + ``update(leaf, (p + eps) ** alpha)``
  (no weights, no row mapping: the floor under ``PrioritizedState``);
* zreplay ``TrajectoryReplayBuffer(sampler=Prioritized(...))``, the whole public path:
  ``sample(256)`` (draw under the buffer's lock, gather the rows from the RAM tier into
  torch tensors, ``index``/``weight`` beside them) + ``update_priorities(batch["index"],
  new_p)``; one float32 per row (like cpprb's), 1M rows in 100 trajectories ``[1000, 10]``
  in a temporary store, all of them in the RAM tier;
* cpprb 11 ``PrioritizedReplayBuffer(N, {"x": {}})`` (one float per row, C++ sum/min
  segment trees, stratified draws): ``sample(256, beta)`` + ``update_priorities(indexes,
  new_p)``, with ``check_for_update`` off (its default) and on;
* numpy: leaves ``(p + eps) ** alpha`` in one array; sample = ``cumsum`` +
  ``searchsorted`` + global ``min`` for the weights (both O(N), recomputed every draw);
  update = in-place fancy assignment.

Ratio column: ``zreplay PrioritizedState / this row`` (the i.i.d. row, per-iteration
median); < 1 means zreplay is faster.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (  # noqa: E402  (numpy-only module)
    describe_machine,
    fmt_time,
    run_child_job,
    stats,
    wait_idle,
    write_json,
)

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "latest" / "priority.json"
BATCH = 256
ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
SYSTEMS = ("zreplay", "buffer", "cpprb", "numpy")
EXTRA_PACKAGES = ("cpprb", "psutil")

CONFIGS = {
    "default": {"rows": 1_000_000, "iters": 2000, "numpy_iters": 200, "warmup": 50, "rounds": 3},
    "quick": {"rows": 100_000, "iters": 200, "numpy_iters": 50, "warmup": 10, "rounds": 1},
}


# -- workload ---------------------------------------------------------------------------


def make_workload(cfg: dict, wdir: Path, seed: int = 505) -> None:
    rng = np.random.default_rng(seed)
    np.save(wdir / "initial.npy", rng.lognormal(0.0, 1.0, cfg["rows"]))
    n = cfg["warmup"] + cfg["iters"]
    np.save(wdir / "new.npy", rng.lognormal(0.0, 1.0, (n, BATCH)))


def timed_loop(sample, update, new_p: np.ndarray, warmup: int, iters: int) -> dict:
    """Per iteration: ``rows = sample()`` then ``update(rows, new_p[i])``, each timed."""
    t_s, t_u, t_it = [], [], []
    clock = time.perf_counter
    for i in range(warmup + iters):
        t0 = clock()
        rows = sample()
        t1 = clock()
        update(rows, new_p[i])
        t2 = clock()
        if i >= warmup:
            t_s.append(t1 - t0)
            t_u.append(t2 - t1)
            t_it.append(t2 - t0)
    return {"iteration": stats(t_it), "sample": stats(t_s), "update": stats(t_u)}


def chi_like_check(drawn_priorities: np.ndarray, all_priorities: np.ndarray) -> dict:
    """Mean priority of drawn rows against the mean expected under (p + eps) ** alpha:
    a cheap sanity check that each system samples by priority (recorded, not asserted)."""
    leaf = (all_priorities + EPS) ** ALPHA
    expected = float((all_priorities * leaf).sum() / leaf.sum())
    return {"mean_drawn_p": float(drawn_priorities.mean()), "expected_mean_p": expected}


# -- children ---------------------------------------------------------------------------


def child_zreplay(cfg: dict, initial: np.ndarray, new_p: np.ndarray) -> dict:
    from zreplay.sampling.prioritized_state import PrioritizedState
    from zreplay.sampling.sumtree import SumTree

    n = initial.size
    out = {}
    for name, stratified in (("state", False), ("state_stratified", True)):
        t0 = time.perf_counter()
        state = PrioritizedState(n, alpha=ALPHA, beta=BETA, eps=EPS)
        state.add(np.arange(n), priorities=initial)
        build = time.perf_counter() - t0
        rng = np.random.default_rng(1)
        rows, w = state.sample(rng, 100_000, stratified=stratified)
        check = chi_like_check(initial[rows], initial)
        box = {}

        def sample(state=state, rng=rng, stratified=stratified, box=box):
            rows, box["w"] = state.sample(rng, BATCH, stratified=stratified)
            return rows

        res = timed_loop(sample, state.update, new_p, cfg["warmup"], cfg["iters"])
        out[name] = {**res, "build_s": build, "check": check, "max_weight": float(box["w"].max())}

    leaves = (initial + EPS) ** ALPHA
    t0 = time.perf_counter()
    tree = SumTree.from_leaves(leaves)
    build = time.perf_counter() - t0
    rng = np.random.default_rng(2)
    check = chi_like_check(initial[tree.sample(rng, 100_000)], initial)

    def tree_update(leaf, p, tree=tree):
        tree.update(leaf, (p + EPS) ** ALPHA)

    res = timed_loop(
        lambda: tree.sample(rng, BATCH), tree_update, new_p, cfg["warmup"], cfg["iters"]
    )
    out["tree"] = {**res, "build_s": build, "check": check}
    return out


def child_buffer(cfg: dict, initial: np.ndarray, new_p: np.ndarray) -> dict:
    import zreplay
    from zreplay.samplers import Prioritized

    n = initial.size
    T, B = 1000, 10
    t0 = time.perf_counter()
    buf = zreplay.TrajectoryReplayBuffer(
        seed=1, sample_window_size=0, sampler=Prioritized(alpha=ALPHA, beta=BETA, eps=EPS)
    )
    x = np.zeros((T, B, 1), np.float32)
    for s in range(0, n, T * B):
        buf.add_trajectories([{"x": x[: min(T, (n - s) // B)]}])
    buf.update_priorities(np.arange(n), initial)
    buf.flush()
    build = time.perf_counter() - t0
    assert buf.get_stats()["rows_in_ram"] == n, "the benchmark wants every row in the RAM tier"
    drawn = np.concatenate([buf.sample(1000)["index"].numpy() for _ in range(100)])
    check = chi_like_check(initial[drawn], initial)
    box = {}

    def sample():
        batch = buf.sample(BATCH)
        box["w"] = batch["weight"]
        return batch["index"]

    res = timed_loop(sample, buf.update_priorities, new_p, cfg["warmup"], cfg["iters"])
    buf.close()
    return {
        "buffer": {**res, "build_s": build, "check": check, "max_weight": float(box["w"].max())}
    }


def child_cpprb(cfg: dict, initial: np.ndarray, new_p: np.ndarray) -> dict:
    import cpprb

    n = initial.size
    out = {}
    for name, check_for_update in (("cpprb", False), ("cpprb_check", True)):
        t0 = time.perf_counter()
        rb = cpprb.PrioritizedReplayBuffer(
            n,
            {"x": {"dtype": np.float32}},
            alpha=ALPHA,
            eps=EPS,
            check_for_update=check_for_update,
        )
        step = 100_000
        for s in range(0, n, step):
            e = min(n, s + step)
            rb.add(x=np.zeros(e - s, np.float32), priorities=initial[s:e])
        build = time.perf_counter() - t0
        drawn = np.concatenate([rb.sample(1000, beta=BETA)["indexes"] for _ in range(100)])
        check = chi_like_check(initial[drawn.astype(np.int64)], initial)
        box = {}

        def sample(rb=rb, box=box):
            batch = rb.sample(BATCH, beta=BETA)
            box["w"] = batch["weights"]
            return batch["indexes"]

        res = timed_loop(sample, rb.update_priorities, new_p, cfg["warmup"], cfg["iters"])
        out[name] = {**res, "build_s": build, "check": check, "max_weight": float(box["w"].max())}
    return out


def child_numpy(cfg: dict, initial: np.ndarray, new_p: np.ndarray) -> dict:
    leaves = (initial + EPS) ** ALPHA
    rng = np.random.default_rng(3)
    box = {}

    def sample():
        cs = np.cumsum(leaves)
        idx = np.searchsorted(cs, rng.random(BATCH) * cs[-1], side="right")
        np.minimum(idx, leaves.size - 1, out=idx)
        box["w"] = (leaves[idx] / leaves.min()) ** -BETA
        return idx

    def update(idx, p):
        leaves[idx] = (p + EPS) ** ALPHA

    cs = np.cumsum(leaves)
    drawn = np.searchsorted(cs, rng.random(100_000) * cs[-1], side="right")
    check = chi_like_check(initial[np.minimum(drawn, leaves.size - 1)], initial)
    res = timed_loop(sample, update, new_p, min(cfg["warmup"], 10), cfg["numpy_iters"])
    return {"numpy": {**res, "check": check, "max_weight": float(box["w"].max())}}


CHILDREN = {
    "zreplay": child_zreplay,
    "buffer": child_buffer,
    "cpprb": child_cpprb,
    "numpy": child_numpy,
}


def child_main(job_path: Path) -> int:
    job = json.loads(job_path.read_text())
    out = Path(job["out"])
    try:
        wdir = Path(job["wdir"])
        initial = np.load(wdir / "initial.npy")
        new_p = np.load(wdir / "new.npy")
        res = CHILDREN[job["system"]](job["cfg"], initial, new_p)
    except Exception as e:  # recorded in the JSON, the run goes on
        res = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    out.write_text(json.dumps(res, default=float))
    return 0


# -- parent -----------------------------------------------------------------------------


ROWS = (  # (key, label)
    ("state", "zreplay PrioritizedState (i.i.d.)"),
    ("state_stratified", "zreplay PrioritizedState (stratified)"),
    ("tree", "zreplay SumTree only (no weights)"),
    ("buffer", "zreplay TrajectoryReplayBuffer+Prioritized"),
    ("cpprb", "cpprb PrioritizedReplayBuffer"),
    ("cpprb_check", "cpprb, check_for_update=True"),
    ("numpy", "numpy cumsum + searchsorted"),
)


def merge_rounds(rounds: list[dict]) -> dict:
    """Per variant: the median over rounds of each figure, plus every round's figures."""
    merged: dict = {}
    for key, _ in ROWS:
        got = [r[key] for r in rounds if key in r]
        if not got:
            continue
        m = {}
        for part in ("iteration", "sample", "update"):
            m[part] = {
                "median_s": float(np.median([g[part]["median_s"] for g in got])),
                "p90_s": float(np.median([g[part]["p90_s"] for g in got])),
                "rounds": [g[part] for g in got],
            }
        m["check"] = got[0].get("check")
        m["max_weight"] = got[0].get("max_weight")
        m["build_s"] = got[0].get("build_s")
        merged[key] = m
    return merged


def print_table(merged: dict) -> list[str]:
    ref = merged.get("state", {}).get("iteration", {}).get("median_s")
    head = (
        f"{'system':40s} {'iter med':>10s} {'iter p90':>10s} {'sample med':>10s} "
        f"{'update med':>10s} {'ratio':>7s}"
    )
    lines = [head, "-" * len(head)]
    for key, label in ROWS:
        if key not in merged:
            lines.append(f"{label:40s} {'n/a':>10s}")
            continue
        m = merged[key]
        it = m["iteration"]["median_s"]
        r = "" if ref is None else f"{ref / it:.2f}x"
        lines.append(
            f"{label:40s} {fmt_time(it):>10s} {fmt_time(m['iteration']['p90_s']):>10s} "
            f"{fmt_time(m['sample']['median_s']):>10s} {fmt_time(m['update']['median_s']):>10s} "
            f"{r:>7s}"
        )
    print("\n".join(lines))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="scaled-down smoke run")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON (default {DEFAULT_OUT})")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for other processes to go quiet before starting",
    )
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        return child_main(args.child)

    mode = "quick" if args.quick else "default"
    cfg = dict(CONFIGS[mode])
    if args.rounds:
        cfg["rounds"] = args.rounds
    info = describe_machine(
        f"zreplay priority benchmark ({mode}: {cfg['rows']:,} rows, batch {BATCH}, "
        f"{cfg['iters']} iterations x {cfg['rounds']} rounds)",
        EXTRA_PACKAGES,
    )
    idle0 = wait_idle(args.wait_idle) if args.wait_idle > 0 else None
    t_start = time.perf_counter()
    wdir = Path(tempfile.mkdtemp(prefix="zreplay-priority-"))
    per_round: list[dict] = []
    sections: dict = {}
    errors: dict = {}
    try:
        make_workload(cfg, wdir)
        for rnd in range(cfg["rounds"]):
            got: dict = {}
            for system in SYSTEMS:
                job = {"cfg": cfg, "tag": f"{system}_{rnd}"}
                res, section = run_child_job(__file__, system, job, wdir)
                sections[f"{system}/{rnd}"] = section
                if "error" in res:
                    errors[system] = res
                    continue
                got.update(res)
            per_round.append(got)
            print(
                f"round {rnd}: "
                + ", ".join(f"{k} {fmt_time(v['iteration']['median_s'])}" for k, v in got.items()),
                flush=True,
            )
    finally:
        shutil.rmtree(wdir, ignore_errors=True)
    merged = merge_rounds(per_round)
    print()
    table = print_table(merged)
    foreign = {k: round(v["foreign_cpu_cores"], 2) for k, v in sections.items()}
    total = time.perf_counter() - t_start
    print(f"\ntotal {total:.1f}s; CPU used by other processes per child (cores): {foreign}")
    result = {
        "benchmark": "priority",
        "mode": mode,
        "config": cfg,
        "batch": BATCH,
        "alpha": ALPHA,
        "beta": BETA,
        "eps": EPS,
        "machine": info,
        "total_s": total,
        "idle_check_start": idle0,
        "sections": sections,
        "max_foreign_cpu_cores": max(
            (v["foreign_cpu_cores"] for v in sections.values()), default=0
        ),
        "ratio_definition": (
            "ratio = zreplay PrioritizedState (i.i.d.) iteration median / this row's; "
            "< 1: zreplay faster. Figures: median over rounds of each round's median / p90."
        ),
        "table": table,
        "results": merged,
        "errors": errors,
    }
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
