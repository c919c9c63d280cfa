#!/usr/bin/env python
"""A/B benchmark: two versions of zreplay measured back to back on this machine.

Each side is a git revision of this repository (its ``src`` tree is extracted with ``git
archive`` into a temporary directory, removed afterwards) or a directory holding a
``src/zreplay`` tree (``--new .`` is the working tree, uncommitted changes included; an
existing directory wins over a revision of the same name).
Every measurement runs in a fresh subprocess with ``PYTHONPATH=<tree>/src`` put first;
the child checks that ``zreplay`` (and every ``zreplay.*`` module it loaded) comes from
that tree and fails the whole run otherwise (an editable install elsewhere would
otherwise silently measure the wrong code).  Each side builds its own buffers with its
own code, in its own temporary directory, from the same generated rows.

Only public API that both versions have is used, so a refactor that keeps the API can be
compared with any older commit:

    (a) ``sample(256)`` from the RAM tier of a ``TrajectoryReplayBuffer`` (state vectors:
        obs f32[64], actions f32[8], rewards f32[1], dones bool[1]; trajectories
        [T=1000, B=10], every row in the RAM tier); beside it, in the same child, the
        floor it is judged against: a numpy gather of 256 uniform rows of the same
        columns held as plain arrays, handed out as tensors (``rng.integers``, one fancy
        index per key, ``torch.from_numpy``); the table's last lines give each side's
        RAM-tier sample over that floor
    (b) ``sample(256)`` from disk: the image dataset reopened with ``enable_cache=False``
        (page cache warm), rows read through TensorStore
    (c) ``zreplay.open(path).sample(256)`` on the image dataset
    (d) ``add_trajectories`` latency per call of a [50, 8] image trajectory and of a
        [1000, 10] state trajectory: the median over isolated adds once the RAM tier's
        ring has been filled and wraps (writer idle: ``flush()`` between the calls,
        untimed), so the figure is the caller-side cost rather than the first touch of
        fresh RAM-tier pages (the per-call median during the first fill, in the JSON,
        was 1.9 ms in one run and 37.5 ms in the next, same code); and the wall time
        of the fill itself (back-to-back adds into a RAM tier that holds them all)
        until ``flush()`` returned
    (e) ``zreplay.open(path).sample_clips(32, history_len=8)`` on the image dataset
    (f) prioritized ``sample(256)`` + ``update_priorities(batch["index"], |random|)``
        through ``TrajectoryReplayBuffer(sampler=Prioritized())``, ~1M rows of small
        state vectors, all in the RAM tier

The image dataset is RLinf-like: trajectories [T=50, B=8] of ``curr_obs``/``next_obs``
(``main_images`` u8[64, 64, 3], ``states`` f32[16]), ``actions`` f32[28], ``rewards``
f32[4], ``dones``/``terminations``/``truncations`` bool[4].  Four distinct trajectories
of each kind are generated once (fixed seeds) and cycled.  Each side builds the image
dataset once (setup, untimed); the other data are built inside the measuring child.

One child per workload group, side and round: ``state`` ((a) and the state half of
(d)), ``image_fill`` (the image half of (d)), ``read`` ((b), (c), (e)) and ``prio``
((f)); ``--only`` picks groups.

Rounds are interleaved: in every round each workload runs for both sides, one right
after the other, the order alternating between rounds, so drift in machine load hits
both.  The table gives, per figure, the median over rounds of each round's median, the
ratio new/old of those (< 1: new is faster) and the spread (min-max of the round
medians).  Below it, every round's own new/old, and their median over the quiet rounds
(neither child saw other processes use more than 0.2 cores): on this shared 2-core VM
the load of other sessions comes and goes within seconds, so read a ratio together with
how consistent its rounds are.  The JSON adds every round's stats, the 1-min load
average and the CPU other processes used during every child and the whole run.
``--wait-idle S`` waits up to S seconds for a quiet machine before each round.

    python benchmarks/bench_ab.py --old 7b277e9 --new .          # default run, ~3-4 min here
    python benchmarks/bench_ab.py --old main --new . --quick     # smoke run, ~1 min
    python benchmarks/bench_ab.py --old HEAD~3 --new HEAD --rounds 7 --out /tmp/ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
from benchlib import (
    CpuMeter,
    fmt_time,
    machine_info,
    proc_status,
    repeat,
    run_child_job,
    stats,
    wait_idle,
    write_json,
)

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "latest" / "ab.json"
SAMPLE_N = 256
POOL = 4  # distinct trajectories per kind, generated once and cycled
IMG_T, IMG_B, H, W = 50, 8, 64, 64
STATE_T, STATE_B = 1000, 10
CLIPS, HISTORY = 32, 8
QUIET_CORES = 0.2  # a child is undisturbed if other processes used at most this much CPU

CONFIGS = {
    "default": {
        "rounds": 5,
        "state_traj": 100,  # x [1000, 10] = 1M state rows: (a) and the state fill of (d)
        "image_traj": 60,  # x [50, 8] = 24k image rows: the dataset of (b), (c), (e)
        "image_fill_traj": 60,  # image fill of (d)
        "warm_adds": 30,  # (d) isolated adds after the fill, per kind
        "prio_traj": 100,  # x [1000, 10] = 1M small rows: (f)
        "ram_repeats": 2000,
        "disk_repeats": 50,
        "view_repeats": 50,
        "clips_repeats": 100,
        "prio_iters": 1000,
        "prio_warmup": 50,
    },
    "quick": {
        "rounds": 2,
        "state_traj": 5,
        "image_traj": 8,
        "image_fill_traj": 8,
        "warm_adds": 8,
        "prio_traj": 10,
        "ram_repeats": 1000,
        "disk_repeats": 8,
        "view_repeats": 8,
        "clips_repeats": 20,
        "prio_iters": 500,
        "prio_warmup": 20,
    },
}

# Child processes, in the order a round runs them; each measures the figures listed.
WORKLOADS = {
    "state": ("add_state", "fill_state", "sample_ram", "numpy_gather"),
    "image_fill": ("add_image", "fill_image"),
    "read": ("sample_disk", "view_sample", "view_clips"),
    "prio": ("prio_iter",),
}


def figure_labels(cfg: dict) -> dict[str, str]:
    state_rows = cfg["state_traj"] * STATE_T * STATE_B
    image_rows = cfg["image_traj"] * IMG_T * IMG_B
    return {
        "sample_ram": f"(a) `sample(256)` RAM tier, {state_rows:,} state rows",
        "numpy_gather": f"(a) floor: numpy gather of 256 rows of the same {state_rows:,}",
        "sample_disk": f"(b) `sample(256)` disk (`enable_cache=False`), {image_rows:,} image rows",
        "view_sample": f"(c) `zreplay.open(p).sample(256)`, {image_rows:,} image rows",
        "add_image": f"(d) `add_trajectories` [{IMG_T},{IMG_B}] image traj (warm ring)",
        "fill_image": f"(d) fill {cfg['image_fill_traj']} image traj until `flush()` returned",
        "add_state": f"(d) `add_trajectories` [{STATE_T},{STATE_B}] state traj (warm ring)",
        "fill_state": f"(d) fill {cfg['state_traj']} state traj until `flush()` returned",
        "view_clips": f"(e) view `sample_clips({CLIPS}, history_len={HISTORY})`",
        "prio_iter": (
            f"(f) prioritized `sample(256)` + `update_priorities`, "
            f"{cfg['prio_traj'] * STATE_T * STATE_B:,} rows"
        ),
    }


FIGURE_ORDER = (
    "sample_ram",
    "numpy_gather",
    "sample_disk",
    "view_sample",
    "add_image",
    "fill_image",
    "add_state",
    "fill_state",
    "view_clips",
    "prio_iter",
)


# -- data (generated once in the parent, same rows for both sides) ----------------------


def image_trajectory(seed: int) -> dict:
    from benchlib import nest, rlinf_image_trajectory

    return nest(rlinf_image_trajectory(seed, IMG_T, IMG_B, H, W))


def state_trajectory(seed: int, obs_dim: int = 64, act_dim: int = 8) -> dict:
    rng = np.random.default_rng(seed)
    shape = (STATE_T, STATE_B)
    dones = np.zeros((*shape, 1), bool)
    dones[-1] = True
    walk = np.cumsum(rng.normal(0, 0.1, (*shape, obs_dim)), 0).astype(np.float32)
    act = np.tanh(np.cumsum(rng.normal(0, 0.1, (*shape, act_dim)), 0)).astype(np.float32)
    return {
        "obs": walk,
        "actions": act,
        "rewards": rng.standard_normal((*shape, 1), dtype=np.float32),
        "dones": dones,
    }


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in tree.items():
        path = f"{prefix}/{k}" if prefix else k
        out.update(flatten(v, path) if isinstance(v, dict) else {path: v})
    return out


def make_pools(wdir: Path) -> dict:
    """Write the trajectory pools as ``.npz`` files (children load them); returns sizes."""
    t0 = time.perf_counter()
    pools = {
        "image": [image_trajectory(7000 + i) for i in range(POOL)],
        "state": [state_trajectory(8000 + i) for i in range(POOL)],
        "prio": [state_trajectory(9000 + i, obs_dim=8, act_dim=2) for i in range(POOL)],
    }
    meta = {"generate_s": 0.0}
    for kind, trajs in pools.items():
        for i, tr in enumerate(trajs):
            np.savez(wdir / f"{kind}_{i}.npz", **flatten(tr))
        meta[f"{kind}_traj_bytes"] = sum(v.nbytes for v in flatten(trajs[0]).values())
        meta[f"{kind}_keys"] = {
            k: [str(v.dtype), list(v.shape)] for k, v in flatten(trajs[0]).items()
        }
    meta["generate_s"] = time.perf_counter() - t0
    return meta


def load_pool(wdir: Path, kind: str) -> list[dict]:
    from benchlib import nest

    out = []
    for i in range(POOL):
        with np.load(wdir / f"{kind}_{i}.npz") as z:
            out.append(nest({k: z[k] for k in z.files}))
    return out


# -- children ----------------------------------------------------------------------------


class WrongTree(RuntimeError):
    """zreplay was imported from somewhere other than the tree under test."""


def zreplay_from(src: Path):
    """Import zreplay and check it (and every ``zreplay.*`` module loaded so far) lies
    inside ``src``; returns the module.  Where the import would come from is checked
    first, so a wrong tree is reported as such even if importing it would fail."""
    import importlib.util

    spec = importlib.util.find_spec("zreplay")
    origin = None if spec is None else spec.origin
    if origin is None or not Path(origin).resolve().is_relative_to(src):
        raise WrongTree(f"zreplay would be imported from {origin}, not from {src}")
    import zreplay

    stray = []
    for name, mod in list(sys.modules.items()):
        if name != "zreplay" and not name.startswith("zreplay."):
            continue
        f = getattr(mod, "__file__", None)
        if f is not None and not Path(f).resolve().is_relative_to(src):
            stray.append(f"{name}: {f}")
    if stray:
        raise WrongTree(f"zreplay modules outside the tree under test {src}: {stray}")
    return zreplay


def _fill(buf, pool: list[dict], n: int) -> tuple[dict, dict, float]:
    """``n`` back-to-back adds of one trajectory each, then ``flush()``: the stats of the
    add calls, the whole fill (first add to ``flush()`` returned) and the flush wait."""
    lat = []
    t_start = time.perf_counter()
    for i in range(n):
        tr = pool[i % POOL]
        t0 = time.perf_counter()
        buf.add_trajectories([tr])
        lat.append(time.perf_counter() - t0)
    t_last = time.perf_counter()
    buf.flush()
    t_end = time.perf_counter()
    return stats(lat), stats([t_end - t_start]), t_end - t_last


def _warm_adds(buf, pool: list[dict], n: int) -> dict:
    """Stats of ``n`` isolated adds into a buffer whose RAM ring is full (each add reuses
    the slots of the oldest, committed trajectory); ``flush()`` between them, untimed."""
    lat = []
    for i in range(n):
        tr = pool[i % POOL]
        t0 = time.perf_counter()
        buf.add_trajectories([tr])
        lat.append(time.perf_counter() - t0)
        buf.flush()
    return stats(lat)


def _buffer(zreplay, path: Path, cache_size: int, seed: int, **kw):
    return zreplay.TrajectoryReplayBuffer(
        seed=seed,
        cache_size=cache_size,
        sample_window_size=0,
        auto_save=True,
        auto_save_path=str(path),
        **kw,
    )


def _numpy_gather(pool: list[dict], n_rows: int, repeats: int) -> dict:
    """The floor for (a): 256 uniform rows of the same columns as plain arrays (the
    pool's trajectories flattened to rows, cycled up to ``n_rows``), as tensors."""
    import torch

    cols = {}
    for key in pool[0]:
        rows = [tr[key].reshape(-1, *tr[key].shape[2:]) for tr in pool]
        reps = -(-n_rows // sum(len(r) for r in rows))
        cols[key] = np.ascontiguousarray(np.concatenate(rows * reps)[:n_rows])
    rng = np.random.default_rng(0)

    def gather():
        idx = rng.integers(0, n_rows, SAMPLE_N)
        return {k: torch.from_numpy(v[idx]) for k, v in cols.items()}

    return repeat(gather, repeats, warmup=5)


def child_state(zreplay, job: dict) -> dict:
    cfg, scratch = job["cfg"], Path(job["scratch"]) / "state"
    pool = load_pool(Path(job["pool"]), "state")
    n = cfg["state_traj"]
    buf = _buffer(zreplay, scratch, n, seed=11, enable_cache=True)
    first, fill, flush_wait = _fill(buf, pool, n)
    st = buf.get_stats()
    out = {
        "fill_state": fill,
        "extra": {
            "state_add_first_fill": first,
            "state_flush_wait_s": flush_wait,
            "rows": st.get("total_samples"),
            "rows_in_ram": st.get("rows_in_ram"),
        },
    }
    # Before the warm adds: once the ring wraps, the oldest rows are on disk only.
    out["sample_ram"] = repeat(lambda: buf.sample(SAMPLE_N), cfg["ram_repeats"], warmup=5)
    out["numpy_gather"] = _numpy_gather(pool, st.get("total_samples"), cfg["ram_repeats"])
    out["add_state"] = _warm_adds(buf, pool, cfg["warm_adds"])
    buf.close()
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def child_image_fill(zreplay, job: dict) -> dict:
    cfg, scratch = job["cfg"], Path(job["scratch"]) / "image_fill"
    pool = load_pool(Path(job["pool"]), "image")
    n = cfg["image_fill_traj"]
    buf = _buffer(zreplay, scratch, n, seed=12, enable_cache=True)
    first, fill, flush_wait = _fill(buf, pool, n)
    warm = _warm_adds(buf, pool, cfg["warm_adds"])
    buf.close()
    shutil.rmtree(scratch, ignore_errors=True)
    return {
        "add_image": warm,
        "fill_image": fill,
        "extra": {"image_add_first_fill": first, "image_flush_wait_s": flush_wait},
    }


def child_build_images(zreplay, job: dict) -> dict:
    """Setup (once per side): the image dataset that (b), (c) and (e) read."""
    cfg, path = job["cfg"], Path(job["images"])
    pool = load_pool(Path(job["pool"]), "image")
    buf = _buffer(zreplay, path, cfg["image_traj"], seed=13, enable_cache=True)
    _first, fill, _flush_wait = _fill(buf, pool, cfg["image_traj"])
    rows = buf.get_stats().get("total_samples")
    buf.close()
    return {"extra": {"build_s": fill["median_s"], "rows": rows}}


def child_read(zreplay, job: dict) -> dict:
    cfg, path = job["cfg"], Path(job["images"])
    buf = _buffer(zreplay, path, 1, seed=14, enable_cache=False)
    out = {"sample_disk": repeat(lambda: buf.sample(SAMPLE_N), cfg["disk_repeats"], warmup=3)}
    rows = buf.get_stats().get("total_samples")
    buf.close()
    view = zreplay.open(str(path))
    out["view_sample"] = repeat(lambda: view.sample(SAMPLE_N), cfg["view_repeats"], warmup=3)
    out["view_clips"] = repeat(
        lambda: view.sample_clips(CLIPS, history_len=HISTORY), cfg["clips_repeats"], warmup=3
    )
    out["extra"] = {"rows": rows, "view_rows": view.num_rows}
    return out


def child_prio(zreplay, job: dict) -> dict:
    from zreplay.samplers import Prioritized

    cfg, scratch = job["cfg"], Path(job["scratch"]) / "prio"
    pool = load_pool(Path(job["pool"]), "prio")
    n = cfg["prio_traj"]
    t0 = time.perf_counter()
    buf = _buffer(zreplay, scratch, n, seed=15, enable_cache=True, sampler=Prioritized())
    for i in range(n):
        buf.add_trajectories([pool[i % POOL]])
    buf.flush()
    build = time.perf_counter() - t0
    st = buf.get_stats()
    iters, warm = cfg["prio_iters"], cfg["prio_warmup"]
    new_p = np.abs(np.random.default_rng(16).standard_normal((iters + warm, SAMPLE_N)))
    t_it, t_s, t_u = [], [], []
    clock = time.perf_counter
    for i in range(warm + iters):
        t0 = clock()
        batch = buf.sample(SAMPLE_N)
        t1 = clock()
        buf.update_priorities(batch["index"], new_p[i])
        t2 = clock()
        if i >= warm:
            t_it.append(t2 - t0)
            t_s.append(t1 - t0)
            t_u.append(t2 - t1)
    buf.close()
    shutil.rmtree(scratch, ignore_errors=True)
    return {
        "prio_iter": stats(t_it),
        "extra": {
            "prio_sample": stats(t_s),
            "prio_update": stats(t_u),
            "build_s": build,
            "rows": st.get("total_samples"),
            "rows_in_ram": st.get("rows_in_ram"),
        },
    }


CHILDREN = {
    "state": child_state,
    "image_fill": child_image_fill,
    "read": child_read,
    "prio": child_prio,
    "build_images": child_build_images,
}


def child_main(job_path: Path) -> int:
    job = json.loads(job_path.read_text())
    src = Path(job["src"]).resolve()
    if sys.path[:1] != [str(src)]:
        sys.path.insert(0, str(src))  # PYTHONPATH put it right after the script's directory
    out: dict = {"workload": job["system"], "pid": os.getpid(), "loadavg": os.getloadavg()}
    rc = 0
    try:
        zreplay = zreplay_from(src)
        out["zreplay_file"] = zreplay.__file__
        out.update(CHILDREN[job["system"]](zreplay, job))
        zreplay_from(src)  # the modules the workload imported lazily too
    except WrongTree as e:
        out.update(error=str(e), fatal=True)
        rc = 3
    except BaseException as e:  # reported in the table as an error, the run goes on
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()
        rc = 2
    out["process_peak_rss_mb"] = proc_status()["VmHWM"] / 1024
    Path(job["out"]).write_text(json.dumps(out, default=float))
    return rc


# -- the parent: materialise the trees, run the rounds, summarise -----------------------


def git(*args: str, cwd: Path = HERE) -> str:
    r = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip()


def materialise(spec: str, dest: Path) -> dict:
    """A side of the comparison: ``spec`` is a directory holding ``src/zreplay`` (used in
    place) or a git revision of this repository (its ``src`` extracted under ``dest``)."""
    p = Path(spec).expanduser()
    if p.is_dir():
        if not (p / "src" / "zreplay" / "__init__.py").is_file():
            raise SystemExit(f"{spec}: a directory, but without src/zreplay/__init__.py")
        root = p.resolve()
        side = {"spec": spec, "kind": "path", "root": str(root), "src": str(root / "src")}
        try:
            side["head"] = git("rev-parse", "HEAD", cwd=root)
            side["dirty_src"] = git("status", "--porcelain", "src", cwd=root)
        except (RuntimeError, OSError):
            pass
        return side
    try:
        sha = git("rev-parse", "--verify", "--quiet", f"{spec}^{{commit}}")
    except RuntimeError:
        raise SystemExit(
            f"{spec}: neither a directory with src/zreplay nor a revision of {HERE.parent}"
        ) from None
    dest.mkdir(parents=True)
    top = git("rev-parse", "--show-toplevel")
    proc = subprocess.Popen(
        ["git", "-C", top, "archive", "--format=tar", sha, "src"], stdout=subprocess.PIPE
    )
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        tar.extractall(dest, filter="data")
    if proc.wait() != 0 or not (dest / "src" / "zreplay" / "__init__.py").is_file():
        raise SystemExit(f"{spec} ({sha}): git archive gave no src/zreplay")
    subject = git("log", "-1", "--format=%s", sha)
    return {
        "spec": spec,
        "kind": "rev",
        "commit": sha,
        "subject": subject,
        "root": str(dest),
        "src": str(dest / "src"),
    }


def child_env(src: str) -> dict:
    env = dict(os.environ)
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = src + (os.pathsep + rest if rest else "")
    return env


def run_one(workload: str, side: str, sides: dict, cfg: dict, tmp: Path, tag: str) -> dict:
    s = sides[side]
    job = {
        "tag": tag,
        "cfg": cfg,
        "src": s["src"],
        "pool": str(tmp / "pool"),
        "images": str(tmp / side / "images"),
        "scratch": str(tmp / side / "scratch"),
    }
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    res, sec = run_child_job(__file__, workload, job, tmp / "jobs", env=child_env(s["src"]))
    res["wall_s"] = time.perf_counter() - t0
    res["section"] = sec
    res["loadavg_1m_before"] = load
    if res.get("fatal"):  # zreplay came from another tree: every figure would be wrong
        raise SystemExit(f"FATAL ({side}, {workload}): {res.get('error')}")
    return res


def summarise(figures, rounds_res: list[dict]) -> dict:
    """Per figure: each side's round medians, their median and min/max, the ratio of the
    medians, every round's own new/old, and the same over the quiet rounds (neither
    side's child saw other processes use more than ``QUIET_CORES``)."""
    out = {}
    for fig in figures:
        w = next(w for w, figs in WORKLOADS.items() if fig in figs)
        per = {"old": [], "new": []}
        quiet = []
        for rr in rounds_res:
            for side in per:
                v = rr.get(side, {}).get(fig)
                per[side].append(None if v is None else v["median_s"])
            loads = [rr["foreign"].get(side, {}).get(w) for side in per]
            quiet.append(all(x is not None and x <= QUIET_CORES for x in loads))
        both = zip(per["old"], per["new"], quiet, strict=True)
        pairs = [(o, n, q) for o, n, q in both if o and n]
        row = {"round_medians_s": per}
        for side, vals in per.items():
            ok = [v for v in vals if v is not None]
            row[side] = (
                {"median_s": float(np.median(ok)), "min_s": min(ok), "max_s": max(ok)}
                if ok
                else None
            )
        row["ratio"] = row["new"]["median_s"] / row["old"]["median_s"] if pairs else None
        row["round_ratios"] = [n / o for o, n, _q in pairs]
        row["quiet_round_ratios"] = [n / o for o, n, q in pairs if q]
        out[fig] = row
    return out


def round_ratio_lines(summary: dict, labels: dict) -> list[str]:
    out = []
    for fig, row in summary.items():
        rs = row["round_ratios"]
        if not rs:
            continue
        q = row["quiet_round_ratios"]
        faster = sum(r < 1 for r in rs)
        quiet = f"quiet rounds {len(q)}, median {np.median(q):.2f}" if q else "no quiet round"
        out.append(
            f"  {labels[fig][:3]} {fig:<12} {' '.join(f'{r:.2f}' for r in rs)}  "
            f"(new faster in {faster}/{len(rs)}; {quiet})"
        )
    return out


def spread(d: dict | None) -> str:
    return "n/a" if d is None else f"{fmt_time(d['min_s'])}-{fmt_time(d['max_s'])}"


def markdown_table(summary: dict, labels: dict) -> str:
    lines = [
        "| workload | old | new | new/old | spread (old; new) |",
        "|---|---|---|---|---|",
    ]
    for fig, row in summary.items():
        o, n = row["old"], row["new"]
        ratio = "n/a" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        lines.append(
            f"| {labels[fig]} | {fmt_time(o and o['median_s'])} | {fmt_time(n and n['median_s'])}"
            f" | {ratio} | {spread(o)}; {spread(n)} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--old", help="baseline: a git revision of this repository or a directory")
    ap.add_argument("--new", help="candidate: a git revision or a directory ('.': working tree)")
    ap.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds (default 5, quick 2)"
    )
    ap.add_argument("--quick", action="store_true", help="small smoke run (~1 min)")
    ap.add_argument(
        "--only",
        default=",".join(WORKLOADS),
        help=f"comma-separated child workloads to run (default all: {','.join(WORKLOADS)})",
    )
    ap.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})"
    )
    ap.add_argument("--tmpdir", type=Path, default=None, help="where to build (default: temp)")
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for other processes to go quiet before each round",
    )
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        return child_main(args.child)
    if not args.old or not args.new:
        ap.error("--old and --new are required")
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    bad = [w for w in only if w not in WORKLOADS]
    if bad:
        ap.error(f"unknown workload(s) {bad}; choose from {list(WORKLOADS)}")
    mode = "quick" if args.quick else "default"
    cfg = dict(CONFIGS[mode])
    rounds = args.rounds or cfg["rounds"]
    if rounds < 1:
        ap.error("--rounds must be >= 1")
    cfg["rounds"] = rounds

    t_start = time.perf_counter()
    whole = CpuMeter().start()
    load_start = os.getloadavg()
    info = machine_info()
    print(
        f"zreplay A/B benchmark ({mode}, {rounds} rounds) on {info['cpu_model']}, "
        f"{info['cores']} cores, {info['mem_total_gib']} GiB, python {info['python']}, "
        + ", ".join(f"{k} {v}" for k, v in info["versions"].items() if k != "zreplay"),
        flush=True,
    )
    idle_checks = [wait_idle(args.wait_idle)] if args.wait_idle > 0 else []
    tmp = Path(tempfile.mkdtemp(prefix="zreplay-ab-", dir=args.tmpdir))
    failures: list[str] = []
    try:
        sides = {
            "old": materialise(args.old, tmp / "old" / "tree"),
            "new": materialise(args.new, tmp / "new" / "tree"),
        }
        for side, s in sides.items():
            what = s.get("commit") or s.get("head") or ""
            dirty = " (uncommitted src changes)" if s.get("dirty_src") else ""
            print(f"  {side}: {s['spec']} -> {s['src']} {what[:12]}{dirty}", flush=True)
        for d in ("pool", "jobs", "old/scratch", "new/scratch"):
            (tmp / d).mkdir(parents=True, exist_ok=True)
        meta = make_pools(tmp / "pool")
        print(
            f"  data: {POOL} image trajectories [{IMG_T},{IMG_B}] "
            f"({meta['image_traj_bytes'] / 1e6:.1f} MB each), {POOL} state [{STATE_T},"
            f"{STATE_B}] ({meta['state_traj_bytes'] / 1e6:.1f} MB), {POOL} small state "
            f"({meta['prio_traj_bytes'] / 1e6:.2f} MB), generated in {meta['generate_s']:.1f}s",
            flush=True,
        )
        setup = {}
        if "read" in only:
            for side in sides:
                r = run_one("build_images", side, sides, cfg, tmp, f"build_{side}")
                setup[side] = r
                if "error" in r:
                    failures.append(f"build_images/{side}: {r['error']}")
                else:
                    print(
                        f"  {side}: image dataset of {r['extra']['rows']:,} rows built in "
                        f"{r['extra']['build_s']:.1f}s",
                        flush=True,
                    )
        rounds_res: list[dict] = []
        for r in range(rounds):
            order = ("old", "new") if r % 2 == 0 else ("new", "old")
            if args.wait_idle > 0 and r > 0:
                idle_checks.append(wait_idle(args.wait_idle))
            rr: dict = {"order": order, "old": {}, "new": {}, "foreign": {}, "children": []}
            for w in only:
                for side in order:
                    res = run_one(w, side, sides, cfg, tmp, f"{w}_{side}_r{r}")
                    rr["children"].append(
                        {
                            "workload": w,
                            "side": side,
                            "wall_s": res["wall_s"],
                            "loadavg_1m_before": res["loadavg_1m_before"],
                            "foreign_cpu_cores": res["section"]["foreign_cpu_cores"],
                            "own_cpu_cores": res["section"]["own_cpu_cores"],
                            "extra": res.get("extra"),
                            "process_peak_rss_mb": res.get("process_peak_rss_mb"),
                            "error": res.get("error"),
                        }
                    )
                    cores = res["section"]["foreign_cpu_cores"]
                    rr["foreign"].setdefault(side, {})[w] = cores
                    if "error" in res:
                        failures.append(f"{w}/{side}/round {r}: {res['error']}")
                        continue
                    for fig in WORKLOADS[w]:
                        rr[side][fig] = res[fig]
            foreign = [c["foreign_cpu_cores"] for c in rr["children"]]
            print(
                f"  round {r + 1}/{rounds} ({order[0]} first): "
                f"{sum(c['wall_s'] for c in rr['children']):.1f}s, load "
                f"{os.getloadavg()[0]:.2f}, other processes {np.mean(foreign):.2f} cores "
                f"(max {max(foreign):.2f})",
                flush=True,
            )
            rounds_res.append(rr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    figures = [f for f in FIGURE_ORDER if any(f in WORKLOADS[w] for w in only)]
    labels = figure_labels(cfg)
    summary = summarise(figures, rounds_res)
    table = markdown_table(summary, labels)
    whole_sec = whole.stop()
    total = time.perf_counter() - t_start
    foreign = [c["foreign_cpu_cores"] for rr in rounds_res for c in rr["children"]]
    print()
    print(table)
    print(
        f"\nold = {args.old}, new = {args.new}; median over {rounds} rounds of each round's "
        f"median; new/old < 1: new faster; spread = min-max of the round medians."
    )
    print(
        "per-round new/old (same round, run back to back; quiet: neither run saw other "
        f"processes use > {QUIET_CORES} cores):"
    )
    print("\n".join(round_ratio_lines(summary, labels)))
    for side in ("old", "new"):
        ram, floor = (summary.get(f, {}).get(side) for f in ("sample_ram", "numpy_gather"))
        if ram and floor:
            print(
                f"{side}: RAM-tier sample(256) / numpy gather of the same rows = "
                f"{ram['median_s'] / floor['median_s']:.2f}x"
            )
    print(
        f"total {total:.1f}s; load average (1 min) {load_start[0]:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end; CPU used by other processes: "
        f"{whole_sec['foreign_cpu_cores']:.2f} cores over the run, per child mean "
        f"{np.mean(foreign):.2f} / max {max(foreign):.2f}"
    )
    for f in failures:
        print(f"ERROR {f}")

    result = {
        "benchmark": "ab",
        "mode": mode,
        "config": cfg,
        "workloads": {w: list(WORKLOADS[w]) for w in only},
        "sides": sides,
        "data": meta,
        "workload_shapes": {
            "image": {"T": IMG_T, "B": IMG_B, "image": [H, W, 3]},
            "state": {"T": STATE_T, "B": STATE_B},
            "sample_n": SAMPLE_N,
            "clips": [CLIPS, HISTORY],
        },
        "machine": info,
        "load": {
            "loadavg_start": load_start,
            "loadavg_end": os.getloadavg(),
            "whole_run": whole_sec,
            "idle_waits": idle_checks,
            "quiet_cores": QUIET_CORES,
            "per_child_foreign_cpu_cores_mean": float(np.mean(foreign)),
            "per_child_foreign_cpu_cores_max": float(max(foreign)),
        },
        "setup": {
            side: {k: r.get(k) for k in ("extra", "wall_s", "error", "section")}
            for side, r in setup.items()
        },
        "rounds": rounds_res,
        "summary": summary,
        "labels": labels,
        "ratio_definition": "new / old of the median over rounds of each round's median (<1: new faster)",
        "table": table,
        "failures": failures,
        "total_s": total,
    }
    write_json(args.out, result, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
