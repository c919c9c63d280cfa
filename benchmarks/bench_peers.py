#!/usr/bin/env python
"""Peer benchmark: zreplay against TorchRL, zarr-python, TensorStore, h5py and numpy.

Every workload is generated once (fixed seeds) and written to ``.npy`` files; each system
then holds exactly those rows and is built and measured in its own subprocess, one after
the other (so each build's peak RSS is its own and its memory is gone before the next;
TorchRL's two storages share one subprocess, built one after the other).
All ratios printed come from this one run.  Nothing here asserts on timings.

    python benchmarks/bench_peers.py --wait-idle 300     # default run (~7 min here)
    python benchmarks/bench_peers.py --quick --out /tmp/peers-quick.json   # smoke (~1 min)
    python benchmarks/bench_peers.py --only a,c --out /tmp/peers.json --wait-idle 300

Workloads: (a) SAC-like state vectors, 1M transitions; (b) RLinf-like embodied, 100k
transitions with 64x64 simulator-like images; (c) real Atari Pong frames (ale-py, random
policy), ~20k transitions.  Systems: zreplay with the RAM tier on and off, TorchRL 0.14
``LazyTensorStorage`` / ``LazyMemmapStorage``, zarr-python ``oindex`` and raw TensorStore
on zreplay's own arrays, h5py (one chunked compressed dataset per key), numpy in RAM.

Ratio column: ``reference / this row`` with the reference named in the ``vs`` column,
e.g. ``zreplay RAM on / this`` on the numpy row; > 1 means zreplay is slower.  Ingest
rows: this system's rows/s / zreplay's.  Bytes rows: raw / on disk.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

# benchlib imports neither zreplay nor torch, so the numpy/zarr/h5py children start fast.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (
    CpuMeter,
    WorkloadTable,
    copy_tree,
    describe_machine,
    dir_bytes,
    files_under,
    med,
    minor_faults,
    nest,
    proc_status,
    ratio,
    repeat,
    run_child,
    run_child_job,
    run_undisturbed,
    stats,
    wait_idle,
    warm_allocator,
    warm_page_cache,
    write_json,
    zarr_and_tensorstore_gathers,
)

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "latest" / "peers.json"
SAMPLE_N = 256
EXTRA_PACKAGES = ("torchrl", "tensordict", "h5py", "ale-py", "gymnasium", "psutil")

CONFIGS = {
    "default": {
        "a_traj": 100,  # x [T=1000, B=10] = 1,000,000 transitions
        "b_traj": 250,  # x [T=50, B=8] = 100,000 transitions
        "c_frames": 20_000,
        "c_T": 1000,
        "c_rollout_budget_s": 60.0,
        "ram_repeats": 200,  # in-RAM systems
        "disk_repeats": 100,  # zreplay RAM tier off, TensorStore, h5py, memmap
        "slow_repeats": 50,  # zarr-python oindex
        "fancy_repeats": 20,  # h5py fancy indexing (an extra variant of the h5py figure)
        "cold_repeats": 50,
        "steady_adds": 20,
        "open_repeats": 3,
        "idle_each_s": 30.0,
        "retry_if_foreign_cores": 0.3,  # run a system again (once) if disturbed this much
    },
    "quick": {
        "a_traj": 4,
        "b_traj": 6,
        "c_frames": 2000,
        "c_T": 500,
        "c_rollout_budget_s": 10.0,
        "ram_repeats": 20,
        "disk_repeats": 10,
        "slow_repeats": 2,
        "fancy_repeats": 2,
        "cold_repeats": 3,
        "steady_adds": 4,
        "open_repeats": 1,
        "idle_each_s": 5.0,
        "retry_if_foreign_cores": 0.3,
    },
}

WORKLOADS = {
    "a": "SAC-like state vectors",
    "b": "RLinf-like embodied (64x64 simulator-like images)",
    "c": "Atari Pong frames (ale-py, random policy)",
}

# Systems in the order they run; each is one subprocess (TorchRL's two storages share one).
SYSTEMS = ("numpy", "zreplay", "zarr_ts", "torchrl", "h5py")
# What a system's child leaves in the workload directory (removed before a re-run).
SYSTEM_FILES = {
    "zreplay": ("zreplay", "zreplay_steady"),
    "torchrl": ("torchrl_tensor", "torchrl_memmap"),
    "h5py": ("data.h5",),
}
# h5py compression per workload: lzf is fast enough for the 2.5 GB of (b) on 2 cores;
# gzip for the Atari frames, where bytes on disk are the point.
H5_COMPRESSION = {"a": ("lzf", None), "b": ("lzf", None), "c": ("gzip", 1)}


# -- small helpers ----------------------------------------------------------------------


def fname(key: str) -> str:
    return key.replace("/", "__")


class PeakRss:
    """Peak resident memory of one build: VmHWM reset through ``/proc/self/clear_refs``
    (Linux >= 4.0) at start, so the figure is the build's own peak over what the process
    already held (its imports and the source arrays)."""

    def start(self) -> PeakRss:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.method = "VmHWM after reset via /proc/self/clear_refs"
        except OSError:
            self.method = "VmHWM since process start (clear_refs unavailable)"
        self.base_kb = proc_status()["VmRSS"]
        return self

    def stop(self) -> dict:
        st = proc_status()
        return {
            "peak_rss_mb": st["VmHWM"] / 1024,
            "baseline_rss_mb": self.base_kb / 1024,
            "peak_delta_mb": (st["VmHWM"] - self.base_kb) / 1024,
            "rss_after_mb": st["VmRSS"] / 1024,
            "method": self.method,
        }


def evict(paths) -> int:
    """Drop every file under ``paths`` from the page cache (written back first; pages
    mapped by a live mmap are not dropped, so callers unmap first)."""
    n = 0
    for f in files_under(paths):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
    return n


def cold_repeat(fn, repeats: int, before, warmup: int = 1) -> dict:
    """Time ``fn()`` right after ``before()`` (untimed: evict the files, reopen)."""
    out = []
    for i in range(warmup + repeats):
        before()
        t0 = time.perf_counter()
        fn()
        if i >= warmup:
            out.append(time.perf_counter() - t0)
    return stats(out)


def allocated_bytes(path) -> int:
    total = 0
    for f in files_under([path]):
        try:
            total += os.stat(f).st_blocks * 512
        except FileNotFoundError:
            pass
    return total


def fmt_bytes(b: float) -> str:
    return f"{b / 1e6:.2f} MB" if b < 1e9 else f"{b / 1e9:.2f} GB"


# -- workloads --------------------------------------------------------------------------


def gen_sac(n_traj: int, T: int = 1000, B: int = 10, seed: int = 101) -> dict:
    """State vectors as random walks (obs drifts per env; next_obs is the next step)."""
    rng = np.random.default_rng(seed)
    shp = (n_traj, T, B)
    d = {
        "obs": np.empty((*shp, 64), np.float32),
        "next_obs": np.empty((*shp, 64), np.float32),
        "actions": np.empty((*shp, 8), np.float32),
        "rewards": np.empty((*shp, 1), np.float32),
        "dones": np.empty((*shp, 1), bool),
    }
    for i in range(n_traj):
        start = rng.normal(0, 1, (1, B, 64)).astype(np.float32)
        steps = rng.standard_normal((T + 1, B, 64), dtype=np.float32)
        steps *= 0.05
        walk = np.cumsum(steps, axis=0, dtype=np.float32)
        walk += start
        d["obs"][i] = walk[:T]
        d["next_obs"][i] = walk[1:]
        a = np.cumsum(rng.standard_normal((T, B, 8), dtype=np.float32) * 0.2, axis=0)
        d["actions"][i] = np.tanh(a)
        d["rewards"][i, ..., 0] = -np.square(walk[1:, :, :4]).mean(-1) - 0.01 * np.square(
            d["actions"][i]
        ).sum(-1)
        d["dones"][i] = rng.random((T, B, 1)) < 1 / 200
    return d


def gen_embodied(n_traj: int, T: int = 50, B: int = 8, seed: int = 202) -> dict:
    """RLinf-like chunks: simulator-like RGB frames (smooth wall gradient over a flat table,
    three moving coloured blocks, sensor noise sigma 2 on 25% of pixels, as in
    bench_foundation), 16-d proprio states as random walks, C*A=4*7 actions."""
    H = W = 64
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W].astype(np.float32)
    K = 61  # noise bank; a frame is compressed alone (1-row chunks), so reuse is invisible
    bank = rng.normal(0, 2.0, (K, H, W, 3)) * (rng.random((K, H, W, 1)) < 0.25)
    bank = np.rint(bank).astype(np.int16)
    shp = (n_traj, T, B)
    d = {
        "curr_obs/main_images": np.empty((*shp, H, W, 3), np.uint8),
        "curr_obs/states": np.empty((*shp, 16), np.float32),
        "next_obs/main_images": np.empty((*shp, H, W, 3), np.uint8),
        "next_obs/states": np.empty((*shp, 16), np.float32),
        "actions": np.empty((*shp, 28), np.float32),
        "rewards": np.empty((*shp, 4), np.float32),
        "dones": np.zeros((*shp, 4), bool),
    }
    t_all = np.arange(T + 1)
    for i in range(n_traj):
        for b in range(B):
            ph = rng.uniform(0, 2 * np.pi, 3)
            wall = np.stack(
                [90 + 30 * np.sin(x / W * np.pi + ph[c]) + 20 * y / H for c in range(3)], -1
            )
            table = np.broadcast_to(rng.integers(60, 200, 3).astype(np.float32), (H, W, 3))
            horizon = int(rng.integers(20, 36))
            base = np.rint(np.where((y < horizon)[..., None], wall, table)).astype(np.int16)
            f = base[None] + bank[(int(rng.integers(K)) + t_all) % K]
            for _ in range(3):
                s = int(rng.integers(6, 16))
                col = rng.integers(0, 255, 3).astype(np.int16)
                pos = (rng.uniform(0, 48, 2) + rng.uniform(-2, 2, 2) * t_all[:, None]) % (H - s)
                pos = pos.astype(int)
                for t in range(T + 1):
                    px, py = pos[t]
                    f[t, py : py + s, px : px + s] = col
            np.clip(f, 0, 255, out=f)
            f8 = f.astype(np.uint8)
            d["curr_obs/main_images"][i, :, b] = f8[:T]
            d["next_obs/main_images"][i, :, b] = f8[1:]
        st = np.cumsum(rng.normal(0, 0.05, (T + 1, B, 16)), axis=0).astype(np.float32)
        d["curr_obs/states"][i] = st[:T]
        d["next_obs/states"][i] = st[1:]
        d["actions"][i] = np.tanh(np.cumsum(rng.normal(0, 0.2, (T, B, 28)), axis=0))
        d["rewards"][i] = rng.random((T, B, 4)) < 0.05
        d["dones"][i, -1] = True
    return d


def _area_bins(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    starts = (np.arange(n_out) * n_in) // n_out
    return starts, np.diff(np.append(starts, n_in))


def resize_area(frames: np.ndarray, out_hw=(84, 84)) -> np.ndarray:
    """[n, 210, 160, 3] uint8 -> [n, 84, 84, 3]: mean over each output pixel's source bins."""
    rs, rc = _area_bins(frames.shape[1], out_hw[0])
    cs, cc = _area_bins(frames.shape[2], out_hw[1])
    acc = np.add.reduceat(frames.astype(np.uint16), rs, axis=1)
    acc = np.add.reduceat(acc, cs, axis=2)
    area = (rc[:, None] * cc[None, :])[None, :, :, None].astype(np.uint16)
    return ((acc + area // 2) // area).astype(np.uint8)


def gen_atari(n_frames: int, T: int, budget_s: float, seed: int = 303) -> tuple[dict, dict]:
    """Real Pong frames from ale-py with a random policy, resized to 84x84 RGB."""
    import ale_py
    import gymnasium

    gymnasium.register_envs(ale_py)
    env = gymnasium.make("ALE/Pong-v5")
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    frames = np.empty((n_frames, 84, 84, 3), np.uint8)
    actions = np.empty(n_frames, np.int64)
    rewards = np.empty(n_frames, np.float32)
    dones = np.empty(n_frames, bool)
    raw, raw_at = [], 0
    episodes = 0
    t0 = time.perf_counter()
    n = 0
    while n < n_frames:
        a = int(env.action_space.sample())
        raw.append(obs)
        actions[n] = a
        obs, r, term, trunc, _ = env.step(a)
        rewards[n] = r
        dones[n] = term or trunc
        if dones[n]:
            episodes += 1
            obs, _ = env.reset()
        n += 1
        if len(raw) == 500 or n == n_frames:
            frames[raw_at:n] = resize_area(np.stack(raw))
            raw, raw_at = [], n
            if time.perf_counter() - t0 > budget_s:
                break
    env.close()
    n = (n // T) * T
    n_traj = n // T
    shp = (n_traj, T, 1)
    d = {
        "obs": frames[:n].reshape(*shp, 84, 84, 3),
        "actions": actions[:n].reshape(*shp, 1),
        "rewards": rewards[:n].reshape(*shp, 1),
        "dones": dones[:n].reshape(*shp, 1),
    }
    info = {
        "env": "ALE/Pong-v5 (frameskip 4, sticky actions 0.25), random policy",
        "rollout_s": time.perf_counter() - t0,
        "frames": n,
        "episodes_finished": episodes,
        "resize": "210x160 -> 84x84 area mean (numpy add.reduceat)",
    }
    return d, info


def make_workload(w: str, cfg: dict, wdir: Path) -> dict:
    t0 = time.perf_counter()
    extra = {}
    if w == "a":
        d, T, B = gen_sac(cfg["a_traj"]), 1000, 10
    elif w == "b":
        d, T, B = gen_embodied(cfg["b_traj"]), 50, 8
    else:
        d, extra = gen_atari(cfg["c_frames"], cfg["c_T"], cfg["c_rollout_budget_s"])
        T, B = cfg["c_T"], 1
    gen_s = time.perf_counter() - t0
    (wdir / "data").mkdir(parents=True)
    for k, v in d.items():
        np.save(wdir / "data" / f"{fname(k)}.npy", v)
    first = next(iter(d.values()))
    n_traj = int(first.shape[0])
    meta = {
        "workload": w,
        "title": WORKLOADS[w],
        "keys": {k: [str(v.dtype), list(v.shape[3:])] for k, v in d.items()},
        "T": T,
        "B": B,
        "n_traj": n_traj,
        "rows": n_traj * T * B,
        "row_bytes": sum(v[0, 0, 0].nbytes for v in d.values()),
        "raw_bytes": sum(v.nbytes for v in d.values()),
        "raw_bytes_per_key": {k: v.nbytes for k, v in d.items()},
        "generate_s": gen_s,
        **extra,
    }
    (wdir / "meta.json").write_text(json.dumps(meta, indent=1))
    del d
    gc.collect()
    return meta


# -- children: one per system -----------------------------------------------------------


def load_data(wdir: Path, meta: dict) -> dict[str, np.ndarray]:
    """The workload's arrays ``[n_traj, T, B, ...]`` in anonymous memory (not mmapped, so
    the systems' copies read warm RAM, like a trainer's rollout buffers)."""
    return {k: np.load(wdir / "data" / f"{fname(k)}.npy") for k in meta["keys"]}


def rows_view(arr: np.ndarray) -> np.ndarray:
    """``[n_traj, T, B, ...]`` -> ``[N, ...]`` (time-major within each trajectory; a view)."""
    return arr.reshape(-1, *arr.shape[3:])


def traj_rows(arr: np.ndarray, i: int) -> np.ndarray:
    return arr[i].reshape(-1, *arr.shape[3:])


def ingest_figures(
    meta: dict, per_call: list[float], total_s: float, faults0: int, **extra
) -> dict:
    """Figures of a build; ``faults0``: minor faults before it (the whole process's, so a
    background writer's first touches count too)."""
    return {
        "per_call": stats(per_call),
        "minflt_per_call": (minor_faults() - faults0) / max(1, len(per_call)),
        "seconds": total_s,
        "rows_per_s": meta["rows"] / total_s,
        "mb_per_s": meta["raw_bytes"] / 1e6 / total_s,
        "calls": len(per_call),
        "rows_per_call": meta["T"] * meta["B"],
        **extra,
    }


def child_numpy(job, meta, data) -> dict:
    """The physical limit: preallocated arrays, one copy per trajectory, ``arr[idx]``."""
    N, keys = meta["rows"], list(meta["keys"])
    rss = PeakRss().start()
    f0 = minor_faults()
    t0 = time.perf_counter()
    dest = {k: np.empty((N, *data[k].shape[3:]), data[k].dtype) for k in keys}
    per_call = []
    tb = meta["T"] * meta["B"]
    for i in range(meta["n_traj"]):
        a = time.perf_counter()
        for k in keys:
            dest[k][i * tb : (i + 1) * tb] = traj_rows(data[k], i)
        per_call.append(time.perf_counter() - a)
    total = time.perf_counter() - t0
    res = {"build": ingest_figures(meta, per_call, total, f0, rss=rss.stop())}
    del data
    rng = np.random.default_rng(7)

    def gather():
        idx = rng.integers(0, N, SAMPLE_N)
        return {k: a[idx] for k, a in dest.items()}

    res["sample_ram"] = repeat(gather, job["cfg"]["ram_repeats"], warmup=3)
    return res


def child_zreplay(job, meta, data) -> dict:
    import zreplay
    from zreplay import TrajectoryReplayBuffer

    cfg, wdir = job["cfg"], Path(job["wdir"])
    keys, n_traj, N = list(meta["keys"]), meta["n_traj"], meta["rows"]
    path = wdir / "zreplay"
    trajs = [nest({k: data[k][i] for k in keys}) for i in range(n_traj)]
    res = {}

    # Build: RAM tier holding every trajectory; adds back to back, then flush.
    rss = PeakRss().start()
    f0 = minor_faults()
    t0 = time.perf_counter()
    buf = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), sample_window_size=0, cache_size=n_traj
    )
    per_add = []
    for tr in trajs:
        a = time.perf_counter()
        buf.add_trajectories([tr])
        per_add.append(time.perf_counter() - a)
    adds_s = time.perf_counter() - t0
    buf.flush()
    total = time.perf_counter() - t0
    res["build"] = ingest_figures(
        meta, per_add, total, f0, add_loop_s=adds_s, flush_s=total - adds_s, rss=rss.stop()
    )
    st = buf.get_stats()
    res["build"]["rows_in_ram"] = st["rows_in_ram"]
    res["build"]["ram_bytes"] = st["ram_bytes"]
    if st["rows_in_ram"] < N:
        print(f"WARNING: only {st['rows_in_ram']} of {N} rows in the RAM tier", flush=True)

    # The copy the add is compared with: {k: v.copy()} of the same trajectories.
    copies = []
    for i in range(max(10, min(n_traj, cfg["steady_adds"]))):
        a = time.perf_counter()
        c = copy_tree(trajs[i % n_traj])
        copies.append(time.perf_counter() - a)
        del c
    res["copy_traj"] = stats(copies)

    res["sample_ram"] = repeat(lambda: buf.sample(SAMPLE_N), cfg["ram_repeats"], warmup=3)
    buf.close()
    del buf
    gc.collect()

    # Steady state: RLinf's default cache_size=5 after the ring has wrapped, writer idle
    # at each call (flush between, untimed), as in bench_foundation.
    spath = wdir / "zreplay_steady"
    pool = trajs[: min(4, n_traj)]
    sbuf = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(spath), sample_window_size=0, cache_size=5
    )
    for i in range(12):
        sbuf.add_trajectories([pool[i % len(pool)]])
        sbuf.flush()
    steady, steady_commit, interleaved = [], [], []
    for i in range(cfg["steady_adds"]):
        tr = pool[i % len(pool)]
        a = time.perf_counter()
        sbuf.add_trajectories([tr])
        b = time.perf_counter()
        sbuf.flush()
        steady.append(b - a)
        steady_commit.append(time.perf_counter() - a)
        # The peer under the same conditions: right after a commit, caches as cold.
        a = time.perf_counter()
        c = copy_tree(tr)
        interleaved.append(time.perf_counter() - a)
        del c
    sbuf.close()
    del sbuf
    shutil.rmtree(spath)
    res["add_steady"] = stats(steady)
    res["add_flush_steady"] = stats(steady_commit)
    res["copy_interleaved"] = stats(interleaved)
    copies = []
    for i in range(max(10, cfg["steady_adds"])):
        a = time.perf_counter()
        c = copy_tree(pool[i % len(pool)])
        copies.append(time.perf_counter() - a)
        del c
    res["copy_steady"] = stats(copies)
    # The same bytes copied into a warm 5-slot ring (the RAM tier's footprint, so the
    # destination is not cache-hot as a freshly reused malloc block is), no transpose.
    ring = [copy_tree(pool[0]) for _ in range(5)]
    copies = []
    for i in range(max(10, cfg["steady_adds"])):
        src, dst = pool[i % len(pool)], ring[i % 5]
        a = time.perf_counter()
        for k in keys:
            *parents, leaf = k.split("/")
            s_node, d_node = src, dst
            for p in parents:
                s_node, d_node = s_node[p], d_node[p]
            np.copyto(d_node[leaf], s_node[leaf])
        copies.append(time.perf_counter() - a)
    res["copy_ring"] = stats(copies)
    del ring
    del trajs, pool, data
    gc.collect()

    # RAM tier off, page cache warm.
    res["warmed_bytes"] = warm_page_cache(path)
    buf = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), enable_cache=False, sample_window_size=0
    )
    res["rows_in_ram_off"] = buf.get_stats()["rows_in_ram"]
    res["sample_disk"] = repeat(lambda: buf.sample(SAMPLE_N), cfg["disk_repeats"], warmup=3)
    view = zreplay.open(path, seed=3)
    res["sample_view"] = repeat(lambda: view.sample(SAMPLE_N), cfg["disk_repeats"], warmup=3)
    if job["workload"] == "c":
        res["sample_cold"] = cold_repeat(
            lambda: buf.sample(SAMPLE_N), cfg["cold_repeats"], lambda: evict([path])
        )
        warm_page_cache(path)
    buf.close()

    data_dir = path / "segments" / "default" / "data"
    res["bytes"] = {k: dir_bytes(data_dir / k) for k in keys}
    res["bytes_total_dir"] = dir_bytes(path)
    res["bytes_allocated_dir"] = allocated_bytes(path)
    meta_json = json.loads((path / "zarr.json").read_text())
    res["layout"] = meta_json["attributes"]["zreplay"]["layout"]
    return res


def child_zarr_ts(job, meta, data) -> dict:
    """zarr-python ``oindex`` and raw TensorStore reads of zreplay's own arrays."""
    del data
    cfg, wdir = job["cfg"], Path(job["wdir"])
    keys, N = list(meta["keys"]), meta["rows"]
    path = wdir / "zreplay"
    res = {"warmed_bytes": warm_page_cache(path)}
    rng = np.random.default_rng(11)
    zarr_gather, ts_gather = zarr_and_tensorstore_gathers(path, keys, N, rng, SAMPLE_N)

    res["sample_zarr"] = repeat(zarr_gather, cfg["slow_repeats"], warmup=2)
    res["sample_ts"] = repeat(ts_gather, cfg["disk_repeats"], warmup=3)
    if job["workload"] == "c":
        res["sample_ts_cold"] = cold_repeat(ts_gather, cfg["cold_repeats"], lambda: evict([path]))
        res["sample_zarr_cold"] = cold_repeat(
            zarr_gather, cfg["cold_repeats"], lambda: evict([path])
        )
        warm_page_cache(path)
    return res


TRL_LOAD_CHILD = r"""
import json, resource, sys, time
n, jobs = int(sys.argv[1]), json.loads(sys.argv[2])
from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer
out = {}
for kind, path, scratch in jobs:
    t0 = time.perf_counter()
    if kind == "tensor":
        storage = LazyTensorStorage(n)
    else:
        storage = LazyMemmapStorage(n, scratch_dir=scratch, existsok=True)
    rb = ReplayBuffer(storage=storage, batch_size=256)
    rb.loads(path)
    dt = time.perf_counter() - t0
    rows = len(rb)
    rb.sample()
    del rb, storage
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out[kind] = {"seconds": dt, "rows": rows, "maxrss_kb": peak}
print(json.dumps(out))
"""


def _trl_one(kind: str, job: dict, meta: dict, data: dict) -> dict:
    """Build one TorchRL storage with every row, sample it, dump it."""
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, ReplayBuffer

    cfg, wdir = job["cfg"], Path(job["wdir"])
    keys, N, n_traj = list(meta["keys"]), meta["rows"], meta["n_traj"]
    tb = meta["T"] * meta["B"]
    rbdir = wdir / f"torchrl_{kind}"
    scratch = rbdir / "storage"
    res = {}

    def make_rb():
        if kind == "tensor":
            storage = LazyTensorStorage(N)
        else:
            storage = LazyMemmapStorage(N, scratch_dir=str(scratch), existsok=True)
        return ReplayBuffer(storage=storage, batch_size=SAMPLE_N)

    rss = PeakRss().start()
    f0 = minor_faults()
    t0 = time.perf_counter()
    rb = make_rb()
    per_call = []
    for i in range(n_traj):
        a = time.perf_counter()
        td = TensorDict(
            nest({k: torch.from_numpy(traj_rows(data[k], i)) for k in keys}), batch_size=[tb]
        )
        rb.extend(td)
        per_call.append(time.perf_counter() - a)
    total = time.perf_counter() - t0
    del td
    res["build"] = ingest_figures(meta, per_call, total, f0, rss=rss.stop())
    res["build"]["len"] = len(rb)
    torch.manual_seed(0)
    if kind == "memmap":
        res["warmed_bytes"] = warm_page_cache(scratch)
    reps = cfg["ram_repeats"] if kind == "tensor" else cfg["disk_repeats"]
    res["sample"] = repeat(rb.sample, reps, warmup=3)

    t0 = time.perf_counter()
    rb.dumps(rbdir)  # memmap: zero-copy (scratch_dir is rbdir/storage)
    res["dumps_s"] = time.perf_counter() - t0
    res["dump_bytes"] = dir_bytes(rbdir)
    res["bytes"] = {}
    for f in files_under([scratch]):
        rel = os.path.relpath(f, scratch)
        if rel.endswith(".memmap"):
            res["bytes"][rel[: -len(".memmap")]] = os.path.getsize(f)
    res["bytes_allocated_dir"] = allocated_bytes(rbdir)

    if kind == "memmap" and job["workload"] == "c":
        # Cold: pages mapped by a live mapping are never evicted, so each repeat drops the
        # buffer (unmapping its files), evicts them and maps them again (zero-copy loads).
        holder = {"rb": rb}

        def reopen():
            holder["rb"] = None
            gc.collect()
            evict([scratch])
            nrb = make_rb()
            nrb.loads(rbdir)
            holder["rb"] = nrb

        res["sample_cold"] = cold_repeat(lambda: holder["rb"].sample(), cfg["cold_repeats"], reopen)
        holder.clear()
    del rb
    gc.collect()
    return res


def child_torchrl(job, meta, data) -> dict:
    """LazyTensorStorage, then LazyMemmapStorage (the first freed before the second is
    built; each build's peak RSS is measured from its own start); then ``loads`` of both
    dumps timed in fresh subprocesses."""
    wdir = Path(job["wdir"])
    res = {}
    for kind in ("tensor", "memmap"):
        try:
            res[kind] = _trl_one(kind, job, meta, data)
        except Exception as e:  # one storage failing must not hide the other
            res[kind] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        gc.collect()
    del data
    gc.collect()
    todo = [
        (kind, str(wdir / f"torchrl_{kind}"), str(wdir / f"torchrl_{kind}" / "storage"))
        for kind in ("memmap", "tensor")
        if "error" not in res[kind]
    ]
    runs = []
    for _ in range(job["cfg"]["open_repeats"] if todo else 0):
        r = subprocess.run(
            [sys.executable, "-c", TRL_LOAD_CHILD, str(meta["rows"]), json.dumps(todo)],
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0:
            res["loads_error"] = r.stderr[-2000:]
            break
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    for kind, *_ in todo:
        res[kind]["loads_runs"] = [r[kind] for r in runs]
    return res


def _h5_chunk_rows(row_bytes: int) -> int:
    """1 row for images; 64-256 rows (~16 KiB) for vectors, as zreplay's read unit."""
    rows = 1
    while rows * 2 * row_bytes <= 16 << 10 and rows < 256:
        rows *= 2
    return rows


def child_h5py(job, meta, data) -> dict:
    import h5py

    cfg, wdir, w = job["cfg"], Path(job["wdir"]), job["workload"]
    keys, N, n_traj = list(meta["keys"]), meta["rows"], meta["n_traj"]
    tb = meta["T"] * meta["B"]
    path = wdir / "data.h5"
    comp, level = H5_COMPRESSION[w]
    res = {"compression": comp if level is None else f"{comp}-{level}", "chunks": {}}

    rss = PeakRss().start()
    f0 = minor_faults()
    t0 = time.perf_counter()
    f = h5py.File(path, "w", libver="latest")
    dsets = {}
    for k in keys:
        a = data[k]
        row_shape = a.shape[3:]
        crow = _h5_chunk_rows(a[0, 0, 0].nbytes)
        res["chunks"][k] = crow
        dsets[k] = f.create_dataset(
            k,
            shape=(N, *row_shape),
            dtype=a.dtype,
            chunks=(crow, *row_shape),
            compression=comp,
            compression_opts=level,
            shuffle=a.dtype.kind == "f",
        )
    per_call = []
    for i in range(n_traj):
        a = time.perf_counter()
        for k in keys:
            dsets[k][i * tb : (i + 1) * tb] = traj_rows(data[k], i)
        per_call.append(time.perf_counter() - a)
    f.close()
    total = time.perf_counter() - t0
    res["build"] = ingest_figures(meta, per_call, total, f0, rss=rss.stop())
    specs = {k: (data[k].dtype, data[k].shape[3:]) for k in keys}
    del data
    gc.collect()

    res["warmed_bytes"] = warm_page_cache(path)
    t0 = time.perf_counter()
    f = h5py.File(path, "r")
    dsets = {k: f[k] for k in keys}
    res["open_s"] = time.perf_counter() - t0
    res["bytes"] = {k: int(d.id.get_storage_size()) for k, d in dsets.items()}
    res["bytes_file"] = os.path.getsize(path)
    rng = np.random.default_rng(13)
    holder = {"dsets": dsets}

    def loop_gather():
        idx = rng.integers(0, N, SAMPLE_N)
        uniq, inv = np.unique(idx, return_inverse=True)
        # runs of consecutive rows: one hyperslab read each
        cuts = np.flatnonzero(np.diff(uniq) != 1) + 1
        starts = np.concatenate([[0], cuts])
        stops = np.concatenate([cuts, [len(uniq)]])
        out = {}
        for k, d in holder["dsets"].items():
            dtype, row_shape = specs[k]
            buf = np.empty((len(uniq), *row_shape), dtype)
            for s, e in zip(starts.tolist(), stops.tolist(), strict=True):
                r0 = int(uniq[s])
                d.read_direct(buf, np.s_[r0 : r0 + (e - s)], np.s_[s:e])
            out[k] = buf[inv]
        return out

    def fancy_gather():
        idx = rng.integers(0, N, SAMPLE_N)
        uniq, inv = np.unique(idx, return_inverse=True)
        return {k: d[uniq][inv] for k, d in holder["dsets"].items()}

    res["sample_loop"] = repeat(loop_gather, cfg["disk_repeats"], warmup=3)
    res["sample_fancy"] = repeat(fancy_gather, cfg["fancy_repeats"], warmup=2)
    if w == "c":

        def reopen():
            nonlocal f
            f.close()
            evict([path])
            f = h5py.File(path, "r")
            holder["dsets"] = {k: f[k] for k in keys}

        res["sample_cold"] = cold_repeat(loop_gather, cfg["cold_repeats"], reopen)
    f.close()
    return res


CHILDREN = {
    "numpy": child_numpy,
    "zreplay": child_zreplay,
    "zarr_ts": child_zarr_ts,
    "torchrl": child_torchrl,
    "h5py": child_h5py,
}


def child_main(job_path: Path) -> int:
    job = json.loads(job_path.read_text())
    wdir = Path(job["wdir"])
    meta = json.loads((wdir / "meta.json").read_text())
    out = {"system": job["system"], "pid": os.getpid()}
    warm_allocator()
    try:
        t0 = time.perf_counter()
        box = [load_data(wdir, meta)]
        out["load_s"] = time.perf_counter() - t0
        # The system's function holds the only reference, so its ``del data`` frees it.
        out.update(CHILDREN[job["system"]](job, meta, box.pop()))
    except BaseException as e:  # reported in the table as an error, the run goes on
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()
    st = proc_status()
    out["process_peak_rss_mb"] = st["VmHWM"] / 1024
    Path(job["out"]).write_text(json.dumps(out, default=float))
    return 0


# -- the parent: run children, build tables and targets ---------------------------------


def build_table(w: str, meta: dict, R: dict, opens: dict) -> tuple[WorkloadTable, dict]:
    """Table rows and the figures the targets need, from the children's results."""
    t = WorkloadTable()
    z, zt, npy = R.get("zreplay", {}), R.get("zarr_ts", {}), R.get("numpy", {})
    trt, trm, h5 = R.get("torchrl_tensor", {}), R.get("torchrl_memmap", {}), R.get("h5py", {})
    h5c = h5.get("compression", "?")

    # sample(256), everything in RAM
    fig = f"sample({SAMPLE_N}), in RAM"
    z_ram = med(z.get("sample_ram"))
    t.add(fig, "zreplay RAM tier on", z_ram, med(z.get("sample_ram"), "p90_s"), vs="(reference)")
    for name, d in (
        ("numpy arr[idx] per key", npy.get("sample_ram")),
        ("TorchRL LazyTensorStorage .sample()", trt.get("sample")),
    ):
        t.add(fig, name, med(d), med(d, "p90_s"), ratio(z_ram, med(d)), "zreplay RAM on / this")

    # sample(256), disk tier, warm page cache
    fig = f"sample({SAMPLE_N}), disk, warm"
    z_disk = med(z.get("sample_disk"))
    t.add(
        fig,
        "zreplay RAM tier off",
        z_disk,
        med(z.get("sample_disk"), "p90_s"),
        vs="(reference)",
    )
    for name, d in (
        ("zreplay.open(p) view", z.get("sample_view")),
        ("raw TensorStore gather", zt.get("sample_ts")),
        ("zarr-python oindex", zt.get("sample_zarr")),
        (f"h5py ({h5c}) run-slice loop", h5.get("sample_loop")),
        (f"h5py ({h5c}) fancy index", h5.get("sample_fancy")),
        ("TorchRL LazyMemmapStorage (mapped)", trm.get("sample")),
    ):
        t.add(fig, name, med(d), med(d, "p90_s"), ratio(z_disk, med(d)), "zreplay RAM off / this")

    if w == "c":
        fig = f"sample({SAMPLE_N}), disk, COLD"
        z_cold = med(z.get("sample_cold"))
        t.add(
            fig,
            "zreplay RAM tier off",
            z_cold,
            med(z.get("sample_cold"), "p90_s"),
            vs="(reference)",
        )
        for name, d in (
            ("raw TensorStore gather", zt.get("sample_ts_cold")),
            ("zarr-python oindex", zt.get("sample_zarr_cold")),
            (f"h5py ({h5c}) run-slice loop", h5.get("sample_cold")),
            ("TorchRL LazyMemmapStorage", trm.get("sample_cold")),
        ):
            t.add(fig, name, med(d), med(d, "p90_s"), ratio(z_cold, med(d)), "zreplay cold / this")

    # add / extend, one trajectory (T*B rows) per call
    tb = meta["T"] * meta["B"]
    fig = f"add/extend {tb} rows per call"
    zb = z.get("build", {})
    z_add = med(zb.get("per_call"))
    copy = med(z.get("copy_traj"))
    t.add(
        fig,
        "zreplay add, RAM tier 1st fill",
        z_add,
        med(zb.get("per_call"), "p90_s"),
        ratio(z_add, copy),
        "this / {k: v.copy()}",
    )
    nb = npy.get("build", {})
    t.add(
        fig,
        "  numpy copy into fresh prealloc",
        med(nb.get("per_call")),
        med(nb.get("per_call"), "p90_s"),
        ratio(z_add, med(nb.get("per_call"))),
        "zreplay 1st fill / this",
    )
    z_steady = med(z.get("add_steady"))
    copy_steady = med(z.get("copy_steady"))
    copy_inter = med(z.get("copy_interleaved"))
    t.add(
        fig,
        "zreplay add, steady (cache_size=5)",
        z_steady,
        med(z.get("add_steady"), "p90_s"),
        ratio(z_steady, copy_inter),
        "this / {k: v.copy()} interleaved",
    )
    t.add(
        fig,
        "  {k: v.copy()}, interleaved",
        copy_inter,
        med(z.get("copy_interleaved"), "p90_s"),
    )
    t.add(
        fig,
        "  {k: v.copy()}, tight loop",
        copy_steady,
        med(z.get("copy_steady"), "p90_s"),
        ratio(z_steady, copy_steady),
        "zreplay steady / this",
    )
    t.add(
        fig,
        "  copy into a warm 5-slot ring",
        med(z.get("copy_ring")),
        med(z.get("copy_ring"), "p90_s"),
        ratio(z_steady, med(z.get("copy_ring"))),
        "zreplay steady / this",
    )
    t.add(
        fig,
        "  zreplay add + flush, steady",
        med(z.get("add_flush_steady")),
        med(z.get("add_flush_steady"), "p90_s"),
    )
    for name, d in (
        ("TorchRL LazyTensorStorage extend", trt.get("build", {}).get("per_call")),
        ("TorchRL LazyMemmapStorage extend", trm.get("build", {}).get("per_call")),
        (f"h5py ({h5c}) write", h5.get("build", {}).get("per_call")),
    ):
        t.add(fig, name, med(d), med(d, "p90_s"), ratio(z_add, med(d)), "zreplay 1st fill / this")

    # sustained ingest (whole build), peak RSS
    fig = "ingest: rows/s, MB/s raw"
    zr = zb.get("rows_per_s")
    for name, b in (
        ("zreplay RAM on, flush incl.", zb),
        ("numpy copy into prealloc", nb),
        ("TorchRL LazyTensorStorage", trt.get("build", {})),
        ("TorchRL LazyMemmapStorage", trm.get("build", {})),
        (f"h5py ({h5c}), close incl.", h5.get("build", {})),
    ):
        if not b:
            t.add(fig, name, text=("n/a", ""))
            continue
        t.add(
            fig,
            name,
            text=(f"{b['rows_per_s']:.0f}", f"{b['mb_per_s']:.0f} MB/s"),
            ratio=ratio(b["rows_per_s"], zr),
            vs="this rows/s / zreplay",
        )
    fig = "build peak RSS (delta/total)"
    for name, b in (
        ("zreplay RAM on", zb),
        ("numpy", nb),
        ("TorchRL LazyTensorStorage", trt.get("build", {})),
        ("TorchRL LazyMemmapStorage", trm.get("build", {})),
        (f"h5py ({h5c})", h5.get("build", {})),
    ):
        rss = b.get("rss")
        if rss:
            t.add(
                fig,
                name,
                text=(f"+{rss['peak_delta_mb']:.0f} MB", f"{rss['peak_rss_mb']:.0f} MB"),
                rss=rss,
            )

    # open / resume
    fig = "open / resume"
    for name, runs in (
        ("zreplay TrajectoryReplayBuffer", opens.get("buffer")),
        ("zreplay.open(p)", opens.get("view")),
        ("TorchRL LazyTensorStorage loads", trt.get("loads_runs")),
        ("TorchRL LazyMemmapStorage loads", trm.get("loads_runs")),
    ):
        if runs:
            s = [r["seconds"] for r in runs]
            t.add(fig, name, float(np.median(s)), max(s), runs=runs)
        else:
            t.add(fig, name, text=("n/a", ""))
    if trt.get("dumps_s") is not None:
        t.add(fig, "  TorchRL LazyTensorStorage dumps", trt["dumps_s"], None)
    if trm.get("dumps_s") is not None:
        t.add(fig, "  TorchRL LazyMemmapStorage dumps", trm["dumps_s"], None)
    if h5.get("open_s") is not None:
        t.add(fig, "h5py.File + datasets (in-process)", h5["open_s"], None)

    # bytes on disk per key
    raw_k = meta["raw_bytes_per_key"]
    for k in meta["keys"]:
        fig = f"disk: {k}"
        raw = raw_k[k]
        t.add(fig, "raw (numpy nbytes)", text=(fmt_bytes(raw), ""))
        for name, src in (
            ("zreplay", z.get("bytes")),
            (f"h5py ({h5c})", h5.get("bytes")),
            ("TorchRL LazyMemmapStorage", trm.get("bytes")),
            ("TorchRL LazyTensorStorage dumps", trt.get("bytes")),
        ):
            if src and k in src:
                t.add(
                    fig,
                    name,
                    text=(fmt_bytes(src[k]), ""),
                    ratio=ratio(raw, src[k]),
                    vs="raw / disk",
                )
    fig = "disk: all keys"
    tot_raw = meta["raw_bytes"]
    t.add(fig, "raw (numpy nbytes)", text=(fmt_bytes(tot_raw), ""))
    for name, tot in (
        ("zreplay data arrays", sum(z["bytes"].values()) if z.get("bytes") else None),
        ("zreplay whole directory", z.get("bytes_total_dir")),
        (f"h5py ({h5c}) file", h5.get("bytes_file")),
        ("TorchRL LazyMemmapStorage dir", trm.get("dump_bytes")),
        ("TorchRL LazyTensorStorage dumps dir", trt.get("dump_bytes")),
    ):
        if tot:
            t.add(fig, name, text=(fmt_bytes(tot), ""), ratio=ratio(tot_raw, tot), vs="raw / disk")

    figures = {
        "z_ram": z_ram,
        "numpy": med(npy.get("sample_ram")),
        "trl_tensor": med(trt.get("sample")),
        "z_disk": z_disk,
        "zarr": med(zt.get("sample_zarr")),
        "ts": med(zt.get("sample_ts")),
        "z_add_first_fill": z_add,
        "copy_traj": copy,
        "numpy_first_touch_copy": med(nb.get("per_call")),
        "z_add_steady": z_steady,
        "copy_steady": copy_steady,
        "copy_interleaved": copy_inter,
        "ingest_rows_per_s": zr,
        "ingest_mb_per_s": zb.get("mb_per_s"),
    }
    if w == "c" and z.get("bytes"):
        figures["obs_raw_over_disk"] = ratio(raw_k["obs"], z["bytes"]["obs"])
        figures["all_raw_over_disk"] = ratio(tot_raw, sum(z["bytes"].values()))
    return t, figures


def targets_for(w: str, f: dict) -> list[dict]:
    out = []

    def add(name, value, ok_if, limit, how):
        if value is None:
            status = "n/a"
        else:
            status = "PASS" if (value <= limit if ok_if == "<=" else value >= limit) else "MISS"
        out.append(
            {
                "workload": w,
                "target": name,
                "value": value,
                "limit": f"{ok_if} {limit}",
                "status": status,
                "how": how,
            }
        )

    if w == "a":
        add(
            "RAM-tier sample(256) vs TorchRL LazyTensorStorage.sample",
            ratio(f["z_ram"], f["trl_tensor"]),
            "<=",
            1.0,
            "zreplay RAM on median / TorchRL median",
        )
        add(
            "RAM-tier sample(256) vs numpy gather",
            ratio(f["z_ram"], f["numpy"]),
            "<=",
            3.0,
            "zreplay RAM on median / numpy arr[idx] median",
        )
    if w in ("b", "c"):
        add(
            "disk sample(256), warm, >= 10x faster than zarr oindex",
            ratio(f["zarr"], f["z_disk"]),
            ">=",
            10.0,
            "zarr oindex median / zreplay RAM off median",
        )
        add(
            "disk sample(256), warm, vs raw TensorStore gather",
            ratio(f["z_disk"], f["ts"]),
            "<=",
            1.5,
            "zreplay RAM off median / raw TensorStore median",
        )
    add(
        "add_trajectories per call (steady, cache_size=5) vs copy, interleaved",
        ratio(f["z_add_steady"], f["copy_interleaved"]),
        "<=",
        3.0,
        "median add (writer idle, flush between) / median {k: v.copy()} of the same "
        "trajectory timed right after each add + flush",
    )
    add(
        "  same, vs copy in a tight loop (cache-hot)",
        ratio(f["z_add_steady"], f["copy_steady"]),
        "<=",
        3.0,
        "median add (writer idle) / median {k: v.copy()} timed back to back",
    )
    add(
        "add_trajectories per call (RAM tier 1st fill) vs copy (tight loop)",
        ratio(f["z_add_first_fill"], f["copy_traj"]),
        "<=",
        3.0,
        "median add during the build / median {k: v.copy()} timed back to back",
    )
    add(
        "  same, vs first-touch copy into fresh memory",
        ratio(f["z_add_first_fill"], f["numpy_first_touch_copy"]),
        "<=",
        3.0,
        "median add during the build / median numpy copy into a fresh preallocated array",
    )
    if w == "c":
        add(
            "ingest of 84x84x3 frames, flush incl. (frames/s)",
            f["ingest_rows_per_s"],
            ">=",
            5000,
            "rows of the whole build / (adds + flush) seconds",
        )
        add(
            "Atari frames (obs) on disk, raw / disk",
            f.get("obs_raw_over_disk"),
            ">=",
            50.0,
            "numpy nbytes of obs / bytes under data/obs",
        )
    return out


def fmt_target(t: dict) -> str:
    v = t["value"]
    vs = "n/a" if v is None else (f"{v:.0f}" if v >= 1000 else f"{v:.2f}")
    return f"  [{t['status']:<4}] ({t['workload']}) {t['target']}: {vs} (target {t['limit']})"


def run_workload(w: str, cfg: dict, tmp: Path, args, sections: dict) -> dict:
    wdir = tmp / w
    wdir.mkdir()
    print(f"\n=== workload ({w}): {WORKLOADS[w]} ===", flush=True)
    meter = CpuMeter().start()
    meta = make_workload(w, cfg, wdir)
    sections[f"{w}/generate"] = meter.stop()
    print(
        f"  {meta['rows']:,} rows = {meta['n_traj']} trajectories x [T={meta['T']}, "
        f"B={meta['B']}], {meta['raw_bytes'] / 1e6:.0f} MB raw, generated in "
        f"{meta['generate_s']:.1f}s; keys "
        + ", ".join(f"{k} {d}{s}" for k, (d, s) in meta["keys"].items()),
        flush=True,
    )
    results, idle, disturbed = {}, {}, {}
    for system in SYSTEMS:

        def run(system=system):
            for name in SYSTEM_FILES.get(system, ()):
                p = wdir / name
                shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
            return run_child_job(__file__, system, {"workload": w, "cfg": cfg}, wdir)

        res, sec = run_undisturbed(system, run, args, cfg, idle, disturbed)
        sections[f"{w}/{system}"] = sec
        results[system] = res
        if system == "torchrl":  # one child, two systems
            for kind in ("tensor", "memmap"):
                sub = res.pop(kind, None) or {"error": res.get("error", "no result")}
                results[f"torchrl_{kind}"] = sub
                if "error" in sub:
                    print(f"  torchrl {kind}: ERROR {sub['error']}\n{sub.get('traceback', '')}")
            shutil.rmtree(wdir / "torchrl_tensor", ignore_errors=True)
            shutil.rmtree(wdir / "torchrl_memmap", ignore_errors=True)

    opens = {}
    zpath = wdir / "zreplay"
    if zpath.exists():
        meter = CpuMeter().start()
        for mode in ("buffer", "view"):
            try:
                opens[mode] = [run_child(mode, zpath) for _ in range(cfg["open_repeats"])]
            except RuntimeError as e:
                print(f"  open {mode}: ERROR {e}")
        sections[f"{w}/open"] = meter.stop()

    table, figures = build_table(w, meta, results, opens)
    targets = targets_for(w, figures)
    print(
        f"\n--- ({w}) {WORKLOADS[w]}: {meta['rows']:,} rows, {meta['raw_bytes'] / 1e6:.0f} MB raw"
    )
    print(table.text())
    print("\ntargets:")
    for tg in targets:
        print(fmt_target(tg))
    shutil.rmtree(wdir, ignore_errors=True)
    return {
        "meta": meta,
        "results": results,
        "open_runs": opens,
        "idle_checks": idle,
        "disturbed_first_attempts": disturbed,
        "figures": figures,
        "targets": targets,
        "table": table.text(),
        "rows": table.rows,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="scaled-down smoke run (< ~60 s)")
    ap.add_argument("--only", default="a,b,c", help="workloads to run, e.g. a,c (default a,b,c)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON (default {DEFAULT_OUT})")
    ap.add_argument("--tmpdir", type=Path, default=None, help="where to build (default: temp)")
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for other processes to go quiet before starting (and up "
        "to 30 s before each system)",
    )
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        return child_main(args.child)

    only = [w.strip() for w in args.only.split(",") if w.strip()]
    bad = [w for w in only if w not in WORKLOADS]
    if bad:
        ap.error(f"unknown workload(s) {bad}; choose from {sorted(WORKLOADS)}")
    mode = "quick" if args.quick else "default"
    cfg = CONFIGS[mode]
    t_start = time.perf_counter()
    info = describe_machine(
        f"zreplay peer benchmark ({mode}, workloads {','.join(only)})", EXTRA_PACKAGES
    )
    sections: dict = {}
    idle0 = wait_idle(args.wait_idle) if args.wait_idle > 0 else None
    if idle0:
        print(
            f"idle check: other processes {idle0['foreign_cpu_cores']:.2f} cores after "
            f"waiting {idle0['waited_s']:.0f}s",
            flush=True,
        )
    tmp = Path(tempfile.mkdtemp(prefix="zreplay-peers-", dir=args.tmpdir))
    out = {}
    try:
        for w in only:
            out[w] = run_workload(w, cfg, tmp, args, sections)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = time.perf_counter() - t_start
    targets = [t for w in only for t in out[w]["targets"]]
    print("\n=== targets (ratios from this run) ===")
    for tg in targets:
        print(fmt_target(tg))
    foreign = {k: round(v["foreign_cpu_cores"], 2) for k, v in sections.items()}
    print(f"\ntotal {total:.1f}s")
    print(f"CPU used by other processes per section (cores): {foreign}")

    result = {
        "benchmark": "peers",
        "mode": mode,
        "config": cfg,
        "workloads": only,
        "sample_n": SAMPLE_N,
        "machine": info,
        "total_s": total,
        "idle_check_start": idle0,
        "sections": sections,
        "max_foreign_cpu_cores": max(
            (v["foreign_cpu_cores"] for v in sections.values()), default=0
        ),
        "ratio_definition": (
            "ratio = reference / row system (named in 'vs'); > 1: zreplay slower. Bytes rows: "
            "raw / on disk. Ingest rows: this system's rows/s / zreplay's rows/s."
        ),
        "targets": targets,
        "results": out,
    }
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
