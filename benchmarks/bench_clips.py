#!/usr/bin/env python
"""Clip (sequence) sampling benchmark: zreplay against TorchRL's ``SliceSampler``.

One workload is generated once (fixed seed) and written to ``.npy`` files: 1M transitions
(``obs`` f32[64], ``action`` f32[6], ``reward`` f32, ``terminated`` bool) in episodes of
uniform random length 100..900, plus a pool of extra episodes for the online loops.  Every
system then holds exactly those rows, built one call per episode, and is measured in its
own subprocess, one after the other; every ratio printed comes from this one run.
Nothing here asserts on timings.  Before anything is timed, every system's clips are
checked against the source rows (each clip inside one episode, consecutive steps, every
key's values the stored ones).

    python benchmarks/bench_clips.py --wait-idle 300 --profile   # default run (~50 s here)
    python benchmarks/bench_clips.py --quick --out /tmp/clips-quick.json   # smoke (~20 s)

Systems (slice_len L = 32; a batch is 32 slices = 1024 steps, also 256 slices = 8192):

* zreplay ``ReplayBuffer`` with the RAM tier holding every row: ``rb.sample(32, history_len=32)``;
* zreplay ``zreplay.open(dir).sample_clips(32, history_len=32)`` (reads the store on disk,
  page cache warm; no RAM tier), plus a raw TensorStore read of the same kind of rows
  (sorted unique rows of 32 clips, every key in flight) as the floor of that path;
* TorchRL ``TensorDictReplayBuffer`` + ``LazyTensorStorage`` / ``LazyMemmapStorage`` +
  ``SliceSampler(slice_len=32, traj_key="episode", strict_length=True, cache_values=...)``,
  ``rb.sample(1024).reshape(-1, 32)``; ``cache_values=True`` on a static buffer
  (boundaries computed once) and ``cache_values=False`` (recomputed every sample);
* online: one new episode written, then one 32 x 32 sample, in a loop, on a full buffer
  (zreplay evicts whole old episodes; TorchRL's ring overwrites the oldest rows): zreplay
  ``write_episode`` + ``sample``; TorchRL ``extend`` (TensorDict built inside the timing)
  + ``sample`` with ``cache_values=False`` and ``True`` (each extend invalidates the cache);
  zreplay also with ``flush()`` in every iteration (each episode committed before the next).

Sampling distributions differ: zreplay draws uniformly over all valid windows (an episode
is picked in proportion to ``len - L + 1``); TorchRL picks a trajectory uniformly, then a
start inside it.  The table reports the mean length of the episodes that clips came from,
measured and expected under both rules.

Ratio column: ``zreplay / this row`` with the zreplay figure named in ``vs``; > 1 means
zreplay is slower.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (  # noqa: E402  (numpy-only module: children start fast)
    CpuMeter,
    WorkloadTable,
    describe_machine,
    dir_bytes,
    fmt_time,
    med,
    proc_status,
    ratio,
    repeat,
    run_child_job,
    run_undisturbed,
    stats,
    wait_idle,
    warm_allocator,
    warm_page_cache,
    write_json,
)

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "latest" / "clips.json"
L = 32  # slice_len / history_len
SLICES = 32  # 32 x 32 = 1024 steps per batch
BIG_SLICES = 256  # 256 x 32 = 8192 steps
EP_MIN, EP_MAX = 100, 900
SHORT_EP = 300  # "short episode" threshold for the distribution figures
KEYS = ("obs", "action", "reward", "terminated")
EXTRA_PACKAGES = ("torchrl", "tensordict", "psutil")

CONFIGS = {
    "default": {
        "rows": 1_000_000,
        "online_warmup": 30,  # checked, untimed
        "online_iters": 200,  # timed: add 1 episode + sample
        "committed_iters": 40,  # zreplay only: add + sample + flush (each episode committed)
        "repeats": 300,  # 32 x 32 samples
        "big_repeats": 60,  # 256 x 32 samples
        "uncached_repeats": 150,  # TorchRL cache_values=False (O(N) per sample)
        "check_batches": 200,  # correctness + distribution (32 x 32 batches)
        "check_big_batches": 5,
        "idle_each_s": 30.0,
        "retry_if_foreign_cores": 0.3,
    },
    "quick": {
        "rows": 100_000,
        "online_warmup": 10,
        "online_iters": 30,
        "committed_iters": 10,
        "repeats": 40,
        "big_repeats": 8,
        "uncached_repeats": 30,
        "check_batches": 30,
        "check_big_batches": 2,
        "idle_each_s": 5.0,
        "retry_if_foreign_cores": 0.3,
    },
}

SYSTEMS = (
    "zreplay",
    "zreplay_view",
    "zreplay_online",
    "torchrl_tensor",
    "torchrl_memmap",
    "torchrl_online",
)
SYSTEM_FILES = {
    "zreplay_online": ("zreplay_online",),
    "torchrl_memmap": ("torchrl_memmap",),
}


# -- workload ---------------------------------------------------------------------------


def episode_lengths(rng: np.random.Generator, rows: int) -> np.ndarray:
    """Uniform lengths in [EP_MIN, EP_MAX] summing to exactly ``rows`` (a remainder shorter
    than EP_MIN is added to the last episode)."""
    lens, total = [], 0
    while total < rows:
        n = int(rng.integers(EP_MIN, EP_MAX + 1))
        if total + n > rows:
            n = rows - total
            if n < EP_MIN:
                lens[-1] += n
                break
        lens.append(n)
        total += n
    return np.asarray(lens, np.int64)


def make_workload(cfg: dict, wdir: Path, seed: int = 404) -> dict:
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    base = episode_lengths(rng, cfg["rows"])
    n_pool = cfg["online_warmup"] + cfg["online_iters"] + cfg["committed_iters"]
    pool = rng.integers(EP_MIN, EP_MAX + 1, n_pool).astype(np.int64)
    lens = np.concatenate([base, pool])
    n = int(lens.sum())
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    episode = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    step = np.arange(n, dtype=np.int64) - offsets[episode]
    terminated = np.zeros(n, bool)
    terminated[offsets[1:] - 1] = True
    d = {
        "obs": rng.standard_normal((n, 64), dtype=np.float32),
        "action": np.tanh(rng.standard_normal((n, 6), dtype=np.float32)),
        "reward": rng.standard_normal(n, dtype=np.float32),
        "terminated": terminated,
        "episode": episode,
        "step": step,
    }
    (wdir / "data").mkdir(parents=True)
    for k, v in d.items():
        np.save(wdir / "data" / f"{k}.npy", v)
    meta = {
        "rows": int(cfg["rows"]),
        "base_episodes": len(base),
        "pool_episodes": len(pool),
        "lengths": lens.tolist(),
        "row_bytes": int(sum(d[k][0].nbytes for k in KEYS)),
        "raw_bytes": int(sum(d[k][: cfg["rows"]].nbytes for k in KEYS)),
        "generate_s": time.perf_counter() - t0,
    }
    (wdir / "meta.json").write_text(json.dumps(meta))
    return meta


def load_data(wdir: Path) -> dict[str, np.ndarray]:
    """The workload's arrays in anonymous memory (not mmapped)."""
    return {k: np.load(wdir / "data" / f"{k}.npy") for k in (*KEYS, "episode", "step")}


class Workload:
    def __init__(self, meta: dict, data: dict):
        self.meta = meta
        self.data = data
        self.lens = np.asarray(meta["lengths"], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lens)]).astype(np.int64)
        self.base = meta["base_episodes"]
        self.rows = meta["rows"]

    def episode(self, e: int) -> dict[str, np.ndarray]:
        a, b = int(self.offsets[e]), int(self.offsets[e + 1])
        return {k: self.data[k][a:b] for k in KEYS}

    def pool(self) -> range:
        return range(self.base, len(self.lens))


class Checker:
    """Maps sampled rows back to the source (exact: ``obs[:, :2]`` as one uint64 key,
    unique over the workload) and checks every clip: one episode, consecutive steps, every
    key equal to the stored row."""

    def __init__(self, wl: Workload):
        d = wl.data
        self.data, self.lens = d, wl.lens
        key = np.ascontiguousarray(d["obs"][:, :2]).view(np.uint64).ravel()
        self.order = np.argsort(key, kind="stable")
        self.sorted = key[self.order]
        if np.any(self.sorted[1:] == self.sorted[:-1]):
            raise RuntimeError("workload obs keys are not unique; change the seed")
        self.clips = 0

    def rows_of(self, obs: np.ndarray) -> np.ndarray:
        key = np.ascontiguousarray(obs[..., :2]).view(np.uint64).reshape(obs.shape[:-1])
        pos = np.searchsorted(self.sorted, key.ravel())
        pos = np.minimum(pos, len(self.sorted) - 1)
        if not np.array_equal(self.sorted[pos], key.ravel()):
            raise AssertionError("a sampled obs row is not a stored row")
        return self.order[pos].reshape(key.shape)

    def check(self, batch: dict, n_slices: int, episode=None) -> np.ndarray:
        """``batch``: ``{key: [n_slices, L, ...]}`` numpy; returns each clip's episode."""
        for k in KEYS:
            want = (n_slices, L, *self.data[k].shape[1:])
            if tuple(batch[k].shape) != want:
                raise AssertionError(f"{k}: shape {tuple(batch[k].shape)}, expected {want}")
        gid = self.rows_of(batch["obs"])
        for k in KEYS:
            if not np.array_equal(self.data[k][gid], batch[k]):
                raise AssertionError(f"{k}: values differ from the stored rows")
        ep = self.data["episode"][gid]
        if not np.all(ep == ep[:, :1]):
            raise AssertionError("a clip crosses an episode boundary")
        if not np.all(np.diff(self.data["step"][gid], axis=1) == 1):
            raise AssertionError("a clip's steps are not consecutive")
        if episode is not None and not np.array_equal(np.asarray(episode), ep):
            raise AssertionError("the returned episode ids are not the stored ones")
        self.clips += n_slices
        return ep[:, 0]

    def distribution(self, eps: np.ndarray) -> dict:
        ln = self.lens[np.asarray(eps)]
        return {
            "clips": int(len(ln)),
            "mean_episode_len": float(ln.mean()),
            "short_share": float((ln < SHORT_EP).mean()),
        }


def expected_distribution(lens: np.ndarray) -> dict:
    """Mean length of a clip's episode and share of clips from episodes < SHORT_EP steps,
    under uniform-over-windows (zreplay) and uniform-over-trajectories (TorchRL)."""
    ok = lens[lens >= L]
    w = (ok - L + 1).astype(np.float64)
    return {
        "windows": {
            "mean_episode_len": float((ok * w).sum() / w.sum()),
            "short_share": float(w[ok < SHORT_EP].sum() / w.sum()),
        },
        "trajectories": {
            "mean_episode_len": float(ok.mean()),
            "short_share": float((ok < SHORT_EP).mean()),
        },
    }


# -- children ---------------------------------------------------------------------------


def _timed_loop(fn, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _build_zreplay(wl: Workload, path: Path, passes: int = 1):
    """A full buffer, one ``write_episode`` per episode, then ``flush``.  The RAM tier is
    sized for 1.25x the buffer (everything stays in RAM); ``passes=2`` writes the episodes
    twice so that the tier's ring has wrapped (its memory touched, as in any long run) and
    later writes land in warm memory, like TorchRL's storage after its first fill."""
    import zreplay

    rows = wl.rows
    rb = zreplay.ReplayBuffer(
        max_steps=rows,
        history_len=L,
        path=str(path),
        ram_budget_bytes=(rows + rows // 4) * wl.meta["row_bytes"],
        seed=0,
    )
    per = []
    t0 = time.perf_counter()
    for _ in range(passes):
        for e in range(wl.base):
            a = time.perf_counter()
            rb.write_episode(wl.episode(e))
            per.append(time.perf_counter() - a)
    adds = time.perf_counter() - t0
    rb.flush()
    total = time.perf_counter() - t0
    st = rb.core.engine.stats()  # the RAM tier holds all of them (checked)
    build = {
        "passes": passes,
        "per_call": stats(per),
        "adds_s": adds,
        "seconds": total,
        "rows_per_s": passes * rows / total,
        "rows": st["rows"],
        "rows_in_ram": st["rows_in_ram"],
        "ram_bytes": st["ram_bytes"],
    }
    if st["rows_in_ram"] < st["rows"]:
        print(f"WARNING: only {st['rows_in_ram']} of {st['rows']} rows in the RAM tier", flush=True)
    return rb, build


def _check_loop(chk: Checker, draw, n_batches: int, n_slices: int) -> np.ndarray:
    eps = [chk.check(draw(), n_slices) for _ in range(n_batches)]
    return np.concatenate(eps)


def _measure_static(res: dict, job: dict, chk, small, big) -> None:
    """Check ``small``/``big`` clip batches, then time them (and profile on request)."""
    cfg = job["cfg"]
    eps = _check_loop(chk, small, cfg["check_batches"], SLICES)
    _check_loop(chk, big, cfg["check_big_batches"], BIG_SLICES)
    res["distribution"] = chk.distribution(eps)
    res["sample"] = repeat(small, cfg["repeats"], warmup=3)
    res["sample_big"] = repeat(big, cfg["big_repeats"], warmup=2)
    if job.get("profile"):
        res["profile"] = _profile(small, cfg["repeats"])


def child_zreplay(job, wl: Workload, chk: Checker) -> dict:
    """RAM tier holding every row: ``rb.sample(n, history_len=32)``."""
    rb, build = _build_zreplay(wl, Path(job["wdir"]) / "zreplay")
    res = {"build": build}

    def small():
        return rb.sample(SLICES, history_len=L)

    def big():
        return rb.sample(BIG_SLICES, history_len=L)

    _measure_static(res, job, chk, small, big)
    rb.close()
    res["bytes_dir"] = dir_bytes(Path(job["wdir"]) / "zreplay")
    return res


def _clip_rows(rng, lens: np.ndarray, offsets: np.ndarray, n: int) -> np.ndarray:
    """``[n, L]`` rows of clips drawn uniformly over valid windows (zreplay's rule) from
    episodes stored back to back at ``offsets``."""
    cum = np.cumsum(np.maximum(0, lens - L + 1))
    flat = rng.integers(0, cum[-1], n)
    ep = np.searchsorted(cum, flat, side="right")
    k = flat - np.where(ep > 0, cum[np.maximum(ep - 1, 0)], 0)
    return (offsets[ep] + k)[:, None] + np.arange(L)


def child_zreplay_view(job, wl: Workload, chk: Checker) -> dict:
    """``zreplay.open(dir).sample_clips`` on the directory the ``zreplay`` child built
    (page cache warm), and raw TensorStore reads of such clip rows for reference."""
    import tensorstore as ts

    import zreplay

    cfg, path = job["cfg"], Path(job["wdir"]) / "zreplay"
    res = {"warmed_bytes": warm_page_cache(path)}
    view = zreplay.open(path, seed=1)
    res["view_rows"] = view.num_rows

    def small():
        return view.sample_clips(SLICES, history_len=L)

    def big():
        return view.sample_clips(BIG_SLICES, history_len=L)

    _measure_static(res, job, chk, small, big)

    # Raw TensorStore over zreplay's own arrays: same rule, sorted unique rows, every
    # key's read issued before waiting, then scattered back (what the view does, minus
    # zreplay).  Once with zreplay's context (no decoded-chunk cache), once with a cache
    # holding every decoded chunk (what is left: TensorStore's per-read cost).
    meta_json = json.loads((path / "zarr.json").read_text())
    res["layout"] = meta_json["attributes"]["zreplay"]["layout"]
    base_lens = wl.lens[: wl.base]
    base_off = wl.offsets[: wl.base + 1]
    rng = np.random.default_rng(21)
    data_dir = path / "segments" / "default" / "data"

    def open_stores(cache_bytes: int) -> dict:
        ctx = ts.Context({"cache_pool": {"total_bytes_limit": cache_bytes}})
        return {
            k: ts.open(
                {"driver": "zarr3", "kvstore": {"driver": "file", "path": f"{data_dir / k}/"}},
                read=True,
                context=ctx,
            ).result()
            for k in KEYS
        }

    def ts_gather(stores, n):
        rows = _clip_rows(rng, base_lens, base_off, n)
        uniq, inv = np.unique(rows, return_inverse=True)
        futs = {k: s[uniq].read() for k, s in stores.items()}
        return {k: f.result()[inv.reshape(rows.shape)] for k, f in futs.items()}

    stores = open_stores(0)
    _check_loop(chk, lambda: ts_gather(stores, SLICES), 5, SLICES)
    res["ts"] = repeat(lambda: ts_gather(stores, SLICES), cfg["repeats"], warmup=3)
    res["ts_big"] = repeat(lambda: ts_gather(stores, BIG_SLICES), cfg["big_repeats"], warmup=2)
    cached = open_stores(4 * wl.meta["raw_bytes"] + (256 << 20))
    for s in cached.values():  # decode every chunk once into the cache
        s[: wl.rows].read().result()
    _check_loop(chk, lambda: ts_gather(cached, SLICES), 5, SLICES)
    res["ts_cached"] = repeat(lambda: ts_gather(cached, SLICES), cfg["repeats"], warmup=3)
    res["ts_cached_big"] = repeat(
        lambda: ts_gather(cached, BIG_SLICES), cfg["big_repeats"], warmup=2
    )
    cached = None  # drop the decoded-chunk cache
    gc.collect()

    # What one sample decodes: chunks touched per key (zreplay reads whole chunks).
    touched = {}
    for n, name in ((SLICES, "small"), (BIG_SLICES, "big")):
        per_key = {}
        for k in KEYS:
            crow = res["layout"][k]["chunk_rows"]
            row_b = wl.data[k][0].nbytes
            counts = [
                len(np.unique(_clip_rows(rng, base_lens, base_off, n) // crow)) for _ in range(50)
            ]
            c = float(np.mean(counts))
            per_key[k] = {
                "chunk_rows": crow,
                "chunks": c,
                "decoded_bytes": c * crow * row_b,
                "returned_bytes": n * L * row_b,
            }
        touched[name] = per_key
    res["chunks_touched"] = touched
    return res


def child_zreplay_online(job, wl: Workload, chk: Checker) -> dict:
    """A fresh full buffer, then ``write_episode`` + ``sample(32, history_len=32)`` per
    iteration (the background writer commits each episode meanwhile)."""
    cfg = job["cfg"]
    rb, build = _build_zreplay(wl, Path(job["wdir"]) / "zreplay_online", passes=2)
    res = {"build": build}
    pool = list(wl.pool())
    warm = cfg["online_warmup"]
    eps = []
    for e in pool[:warm]:  # checked, untimed
        rb.write_episode(wl.episode(e))
        eps.append(chk.check(rb.sample(SLICES, history_len=L), SLICES))
    rb.flush()
    adds, samples, loops, thread_cpu = [], [], [], []
    iters = pool[warm : warm + cfg["online_iters"]]
    cpu0 = time.process_time()
    t_loop = time.perf_counter()
    for e in iters:
        ep = wl.episode(e)
        c0 = time.thread_time()
        t0 = time.perf_counter()
        rb.write_episode(ep)
        t1 = time.perf_counter()
        rb.sample(SLICES, history_len=L)
        t2 = time.perf_counter()
        thread_cpu.append(time.thread_time() - c0)
        adds.append(t1 - t0)
        samples.append(t2 - t1)
        loops.append(t2 - t0)
    loop_s = time.perf_counter() - t_loop
    t0 = time.perf_counter()
    rb.flush()
    drain_s = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    n = len(loops)
    eps.append(chk.check(rb.sample(SLICES, history_len=L), SLICES))
    res.update(
        {
            "iterations": n,
            "add": stats(adds),
            "sample": stats(samples),
            "add_sample": stats(loops),
            "caller_cpu": stats(thread_cpu),
            "loop_s": loop_s,
            "drain_s": drain_s,
            "process_cpu_per_iter_s": cpu / n,
            "wall_per_iter_incl_drain_s": (loop_s + drain_s) / n,
            "rows_after": rb.num_steps_stored,
            "episodes_after": rb.num_episodes,
        }
    )
    # Each episode committed before the next iteration (what the background writer costs
    # when the caller leaves it time to commit episodes one by one): add + sample + flush.
    committed, cpu_c = [], []
    for e in pool[warm + cfg["online_iters"] :]:
        ep = wl.episode(e)
        c0 = time.process_time()
        t0 = time.perf_counter()
        rb.write_episode(ep)
        rb.sample(SLICES, history_len=L)
        rb.flush()
        committed.append(time.perf_counter() - t0)
        cpu_c.append(time.process_time() - c0)
    eps.append(chk.check(rb.sample(SLICES, history_len=L), SLICES))
    res["add_sample_flush"] = stats(committed)
    res["add_sample_flush_cpu"] = stats(cpu_c)
    res["distribution"] = chk.distribution(np.concatenate(eps))
    if job.get("profile"):
        it = iter(iters * 4)

        def one():
            rb.write_episode(wl.episode(next(it)))
            rb.sample(SLICES, history_len=L)

        res["profile"] = _profile(one, n)
    rb.close()
    return res


def _trl_td(wl: Workload, a: int, b: int):
    import torch
    from tensordict import TensorDict

    d = wl.data
    return TensorDict(
        {
            "obs": torch.from_numpy(d["obs"][a:b]),
            "action": torch.from_numpy(d["action"][a:b]),
            "reward": torch.from_numpy(d["reward"][a:b]),
            "terminated": torch.from_numpy(d["terminated"][a:b]),
            "episode": torch.from_numpy(d["episode"][a:b]),
        },
        batch_size=[b - a],
    )


def _trl_build(wl: Workload, kind: str, cache_values: bool, scratch: Path | None):
    """A full buffer, one ``extend`` per episode (TensorDict built inside the timing)."""
    from torchrl.data import (
        LazyMemmapStorage,
        LazyTensorStorage,
        SliceSampler,
        TensorDictReplayBuffer,
    )

    rows = wl.rows
    if kind == "tensor":
        storage = LazyTensorStorage(rows)
    else:
        storage = LazyMemmapStorage(rows, scratch_dir=str(scratch), existsok=True)
    rb = TensorDictReplayBuffer(
        storage=storage,
        sampler=SliceSampler(
            slice_len=L, traj_key="episode", strict_length=True, cache_values=cache_values
        ),
    )
    per = []
    t0 = time.perf_counter()
    for e in range(wl.base):
        a = time.perf_counter()
        rb.extend(_trl_td(wl, int(wl.offsets[e]), int(wl.offsets[e + 1])))
        per.append(time.perf_counter() - a)
    total = time.perf_counter() - t0
    if len(rb) != rows:
        raise RuntimeError(f"TorchRL buffer holds {len(rb)} rows, expected {rows}")
    return rb, {"per_call": stats(per), "seconds": total, "rows_per_s": rows / total}


def _trl_sampler(rb, n_slices: int):
    def draw():
        return rb.sample(n_slices * L).reshape(-1, L)

    return draw


def _trl_check(chk: Checker, draw, n_batches: int, n_slices: int) -> np.ndarray:
    eps = []
    for _ in range(n_batches):
        td = draw()
        batch = {k: td[k].numpy() for k in KEYS}
        eps.append(chk.check(batch, n_slices, episode=td["episode"].numpy()))
    return np.concatenate(eps)


def _trl_static(job, wl, chk, kind: str) -> dict:
    import torch

    cfg, wdir = job["cfg"], Path(job["wdir"])
    torch.manual_seed(0)
    res = {"torch_threads": torch.get_num_threads()}
    scratch = wdir / "torchrl_memmap" if kind == "memmap" else None
    for cache in (True, False):
        rb, build = _trl_build(wl, kind, cache, scratch)
        if scratch is not None:
            warm_page_cache(scratch)
        tag = "cached" if cache else "uncached"
        small, big = _trl_sampler(rb, SLICES), _trl_sampler(rb, BIG_SLICES)
        reps = cfg["repeats"] if cache else cfg["uncached_repeats"]
        out = {"build": build}
        eps = _trl_check(chk, small, cfg["check_batches"] if cache else 20, SLICES)
        _trl_check(chk, big, cfg["check_big_batches"], BIG_SLICES)
        out["distribution"] = chk.distribution(eps)
        out["sample"] = repeat(small, reps, warmup=3)
        out["sample_big"] = repeat(big, max(5, cfg["big_repeats"] * reps // cfg["repeats"]), 2)
        out["sample_flat"] = repeat(partial(rb.sample, SLICES * L), reps, warmup=3)
        if scratch is not None:
            out["bytes_dir"] = dir_bytes(scratch)
        res[tag] = out
        rb = small = big = None  # free the storage before the next build
        gc.collect()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return res


def child_torchrl_tensor(job, wl, chk) -> dict:
    return _trl_static(job, wl, chk, "tensor")


def child_torchrl_memmap(job, wl, chk) -> dict:
    return _trl_static(job, wl, chk, "memmap")


def child_torchrl_online(job, wl, chk) -> dict:
    """LazyTensorStorage, full; ``extend(one episode)`` + ``sample(1024)`` per iteration,
    with ``cache_values=False`` and ``True`` (each on its own freshly built buffer)."""
    import torch

    cfg = job["cfg"]
    res = {"torch_threads": torch.get_num_threads()}
    pool = list(wl.pool())
    warm = cfg["online_warmup"]
    for cache in (False, True):
        torch.manual_seed(0)
        rb, build = _trl_build(wl, "tensor", cache, None)
        draw = _trl_sampler(rb, SLICES)
        eps = []
        for e in pool[:warm]:  # checked, untimed
            rb.extend(_trl_td(wl, int(wl.offsets[e]), int(wl.offsets[e + 1])))
            eps.append(_trl_check(chk, draw, 1, SLICES))
        adds, samples, loops = [], [], []
        cpu0 = time.process_time()
        t_loop = time.perf_counter()
        for e in pool[warm : warm + cfg["online_iters"]]:
            a, b = int(wl.offsets[e]), int(wl.offsets[e + 1])
            t0 = time.perf_counter()
            rb.extend(_trl_td(wl, a, b))
            t1 = time.perf_counter()
            draw()
            t2 = time.perf_counter()
            adds.append(t1 - t0)
            samples.append(t2 - t1)
            loops.append(t2 - t0)
        loop_s = time.perf_counter() - t_loop
        cpu = time.process_time() - cpu0
        eps.append(_trl_check(chk, draw, 1, SLICES))
        res["cached" if cache else "uncached"] = {
            "build": build,
            "iterations": len(loops),
            "add": stats(adds),
            "sample": stats(samples),
            "add_sample": stats(loops),
            "loop_s": loop_s,
            "wall_per_iter_s": loop_s / len(loops),
            "process_cpu_per_iter_s": cpu / len(loops),
            "distribution": chk.distribution(np.concatenate(eps)),
        }
        rb = draw = None
        gc.collect()
    return res


def _profile(fn, n: int, top: int = 25) -> list[dict]:
    """cProfile of ``n`` calls: the ``top`` functions by own time."""
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    st = pstats.Stats(pr)
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():
        rows.append(
            {
                "function": f"{os.path.relpath(file) if file.startswith('/') else file}:"
                f"{line}({func})",
                "calls": nc,
                "tottime_us_per_sample": tt / n * 1e6,
                "cumtime_us_per_sample": ct / n * 1e6,
            }
        )
    rows.sort(key=lambda r: -r["tottime_us_per_sample"])
    return rows[:top]


CHILDREN = {
    "zreplay": child_zreplay,
    "zreplay_view": child_zreplay_view,
    "zreplay_online": child_zreplay_online,
    "torchrl_tensor": child_torchrl_tensor,
    "torchrl_memmap": child_torchrl_memmap,
    "torchrl_online": child_torchrl_online,
}


def child_main(job_path: Path) -> int:
    job = json.loads(job_path.read_text())
    wdir = Path(job["wdir"])
    meta = json.loads((wdir / "meta.json").read_text())
    out = {"system": job["system"], "pid": os.getpid()}
    warm_allocator()
    try:
        t0 = time.perf_counter()
        wl = Workload(meta, load_data(wdir))
        chk = Checker(wl)
        out["load_s"] = time.perf_counter() - t0
        out.update(CHILDREN[job["system"]](job, wl, chk))
        out["clips_checked"] = chk.clips
    except BaseException as e:  # reported in the table as an error, the run goes on
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()
    out["process_peak_rss_mb"] = proc_status()["VmHWM"] / 1024
    Path(job["out"]).write_text(json.dumps(out, default=float))
    return 0


# -- the parent -------------------------------------------------------------------------


def build_table(meta: dict, R: dict) -> tuple[WorkloadTable, dict, dict]:
    t = WorkloadTable()
    z, zv, zo = R.get("zreplay", {}), R.get("zreplay_view", {}), R.get("zreplay_online", {})
    trt, trm, tro = (
        R.get("torchrl_tensor", {}),
        R.get("torchrl_memmap", {}),
        R.get("torchrl_online", {}),
    )
    figures = {}

    for n, suffix in ((SLICES, ""), (BIG_SLICES, "_big")):
        fig = f"{n} x {L} clips ({n * L} steps)"
        sk = "sample" + suffix
        zr, zd = med(z.get(sk)), med(zv.get(sk))
        figures[f"zreplay_ram{suffix}"], figures[f"zreplay_view{suffix}"] = zr, zd
        t.add(fig, "zreplay ReplayBuffer, RAM tier", zr, med(z.get(sk), "p90_s"), vs="(reference)")
        t.add(fig, "zreplay.open view, disk (warm cache)", zd, med(zv.get(sk), "p90_s"))
        for name, d, ref, vs in (
            (
                "TorchRL LazyTensor, cache_values=True",
                trt.get("cached", {}),
                zr,
                "zreplay RAM / this",
            ),
            (
                "TorchRL LazyTensor, cache_values=False",
                trt.get("uncached", {}),
                zr,
                "zreplay RAM / this",
            ),
            (
                "TorchRL LazyMemmap, cache_values=True",
                trm.get("cached", {}),
                zd,
                "zreplay view / this",
            ),
            (
                "TorchRL LazyMemmap, cache_values=False",
                trm.get("uncached", {}),
                zd,
                "zreplay view / this",
            ),
        ):
            m = med(d.get(sk))
            t.add(fig, name, m, med(d.get(sk), "p90_s"), ratio(ref, m), vs)
        for name, key in (
            ("raw TensorStore, same rule (view floor)", "ts" + suffix),
            ("  same, decoded chunks cached in RAM", "ts_cached" + suffix),
        ):
            m = med(zv.get(key))
            t.add(fig, name, m, med(zv.get(key), "p90_s"), ratio(zd, m), "zreplay view / this")
        figures[f"trl_tensor_cached{suffix}"] = med(trt.get("cached", {}).get(sk))
        figures[f"trl_tensor_uncached{suffix}"] = med(trt.get("uncached", {}).get(sk))
        figures[f"trl_memmap_cached{suffix}"] = med(trm.get("cached", {}).get(sk))
        figures[f"trl_memmap_uncached{suffix}"] = med(trm.get("uncached", {}).get(sk))

    fig = f"online: add 1 episode + {SLICES}x{L}"
    za = med(zo.get("add_sample"))
    figures["zreplay_online"] = za
    t.add(
        fig,
        "zreplay write_episode + sample",
        za,
        med(zo.get("add_sample"), "p90_s"),
        vs="(reference)",
    )
    t.add(fig, "  write_episode", med(zo.get("add")), med(zo.get("add"), "p90_s"))
    t.add(fig, "  sample", med(zo.get("sample")), med(zo.get("sample"), "p90_s"))
    if zo.get("process_cpu_per_iter_s") is not None:
        t.add(
            fig,
            "  CPU/iter incl. background commit",
            text=(fmt_time(zo["process_cpu_per_iter_s"]), ""),
        )
        t.add(
            fig,
            "  wall/iter incl. final flush",
            text=(fmt_time(zo["wall_per_iter_incl_drain_s"]), ""),
        )
    if zo.get("add_sample_flush"):
        t.add(
            fig,
            "zreplay add+sample+flush, 1 commit/ep",
            med(zo["add_sample_flush"]),
            med(zo["add_sample_flush"], "p90_s"),
        )
        t.add(
            fig,
            "  CPU/iter (writer included)",
            text=(fmt_time(med(zo["add_sample_flush_cpu"])), ""),
        )
    for cache in ("uncached", "cached"):
        d = tro.get(cache, {})
        label = "False" if cache == "uncached" else "True"
        m = med(d.get("add_sample"))
        figures[f"trl_online_{cache}"] = m
        t.add(
            fig,
            f"TorchRL extend + sample, cache={label}",
            m,
            med(d.get("add_sample"), "p90_s"),
            ratio(za, m),
            "zreplay online / this",
        )
        t.add(fig, "  extend (TensorDict built)", med(d.get("add")), med(d.get("add"), "p90_s"))
        t.add(fig, "  sample", med(d.get("sample")), med(d.get("sample"), "p90_s"))
        if d.get("process_cpu_per_iter_s") is not None:
            t.add(fig, "  CPU/iter", text=(fmt_time(d["process_cpu_per_iter_s"]), ""))
        if d.get("wall_per_iter_s") is not None:
            w = d["wall_per_iter_s"]
            t.add(
                fig,
                "  wall/iter (loop total / n)",
                text=(fmt_time(w), ""),
                ratio=ratio(zo.get("wall_per_iter_incl_drain_s"), w),
                vs="zreplay incl. flush / this",
            )

    fig = "build: 1 call per episode"
    for name, b in (
        ("zreplay write_episode, flush incl.", z.get("build")),
        ("TorchRL LazyTensor extend", trt.get("cached", {}).get("build")),
        ("TorchRL LazyMemmap extend", trm.get("cached", {}).get("build")),
    ):
        if b:
            t.add(
                fig,
                name,
                text=(f"{b['seconds']:.2f} s", f"{b['rows_per_s'] / 1e6:.2f} Mrow/s"),
            )

    exp = expected_distribution(np.asarray(meta["lengths"][: meta["base_episodes"]]))
    fig = f"clip's episode: mean len / <{SHORT_EP} share"
    for name, d in (
        ("expected, uniform over windows", exp["windows"]),
        ("expected, uniform over trajectories", exp["trajectories"]),
        ("zreplay RAM tier (measured)", z.get("distribution")),
        ("zreplay.open view (measured)", zv.get("distribution")),
        ("TorchRL LazyTensor (measured)", trt.get("cached", {}).get("distribution")),
        ("TorchRL LazyMemmap (measured)", trm.get("cached", {}).get("distribution")),
    ):
        if d:
            t.add(
                fig,
                name,
                text=(f"{d['mean_episode_len']:.0f}", f"{100 * d['short_share']:.1f}%"),
            )

    ratios = {
        "RAM: zreplay / TorchRL LazyTensor cached (32x32)": ratio(
            figures["zreplay_ram"], figures["trl_tensor_cached"]
        ),
        "RAM: zreplay / TorchRL LazyTensor uncached (32x32)": ratio(
            figures["zreplay_ram"], figures["trl_tensor_uncached"]
        ),
        "RAM: zreplay / TorchRL LazyTensor cached (256x32)": ratio(
            figures["zreplay_ram_big"], figures["trl_tensor_cached_big"]
        ),
        "disk: zreplay view / TorchRL LazyMemmap cached (32x32)": ratio(
            figures["zreplay_view"], figures["trl_memmap_cached"]
        ),
        "disk: zreplay view / TorchRL LazyMemmap uncached (32x32)": ratio(
            figures["zreplay_view"], figures["trl_memmap_uncached"]
        ),
        "disk: zreplay view / TorchRL LazyMemmap cached (256x32)": ratio(
            figures["zreplay_view_big"], figures["trl_memmap_cached_big"]
        ),
        "disk: zreplay view / raw TensorStore, same rule (32x32)": ratio(
            figures["zreplay_view"], med(zv.get("ts"))
        ),
        "online: zreplay / TorchRL cache_values=False": ratio(
            figures["zreplay_online"], figures["trl_online_uncached"]
        ),
        "online: zreplay / TorchRL cache_values=True": ratio(
            figures["zreplay_online"], figures["trl_online_cached"]
        ),
        "online, loop wall / n (zreplay incl. final flush) / TorchRL cache=False": ratio(
            zo.get("wall_per_iter_incl_drain_s"), tro.get("uncached", {}).get("wall_per_iter_s")
        ),
    }
    return t, figures, {"ratios": ratios, "expected_distribution": exp}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="scaled-down smoke run (< 60 s)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON (default {DEFAULT_OUT})")
    ap.add_argument("--tmpdir", type=Path, default=None, help="where to build (default: temp)")
    ap.add_argument(
        "--only", default=",".join(SYSTEMS), help=f"systems to run (default {','.join(SYSTEMS)})"
    )
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for other processes to go quiet before starting (and up "
        "to 30 s before each system); a disturbed system is run once more",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also cProfile zreplay's sample loops (top functions by own time in the JSON)",
    )
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        return child_main(args.child)

    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in SYSTEMS]
    if bad:
        ap.error(f"unknown system(s) {bad}; choose from {list(SYSTEMS)}")
    if "zreplay_view" in only and "zreplay" not in only:
        ap.error("zreplay_view reads the directory the zreplay system builds; add zreplay")
    mode = "quick" if args.quick else "default"
    cfg = CONFIGS[mode]
    t_start = time.perf_counter()
    info = describe_machine(f"zreplay clip benchmark ({mode})", EXTRA_PACKAGES)
    sections: dict = {}
    idle0 = wait_idle(args.wait_idle) if args.wait_idle > 0 else None
    tmp = Path(tempfile.mkdtemp(prefix="zreplay-clips-", dir=args.tmpdir))
    results, idle, disturbed = {}, {}, {}
    try:
        meter = CpuMeter().start()
        meta = make_workload(cfg, tmp)
        sections["generate"] = meter.stop()
        lens = np.asarray(meta["lengths"])
        print(
            f"workload: {meta['rows']:,} rows in {meta['base_episodes']} episodes (length "
            f"{EP_MIN}..{EP_MAX}, mean {lens[: meta['base_episodes']].mean():.0f}), "
            f"{meta['raw_bytes'] / 1e6:.0f} MB raw ({meta['row_bytes']} B/row); "
            f"{meta['pool_episodes']} more episodes for the online loops; generated in "
            f"{meta['generate_s']:.1f}s",
            flush=True,
        )
        for system in only:

            def run(system=system):
                for name in SYSTEM_FILES.get(system, ()):
                    shutil.rmtree(tmp / name, ignore_errors=True)
                job = {"cfg": cfg, "profile": args.profile}
                return run_child_job(__file__, system, job, tmp)

            res, sec = run_undisturbed(
                system,
                run,
                args,
                cfg,
                idle,
                disturbed,
                note=lambda r: f", {r.get('clips_checked', 0)} clips checked",
            )
            sections[system] = sec
            results[system] = res
            if system == "zreplay_online":
                shutil.rmtree(tmp / "zreplay_online", ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    table, figures, extra = build_table(meta, results)
    total = time.perf_counter() - t_start
    print(f"\n--- clips: {meta['rows']:,} rows, {meta['base_episodes']} episodes, L={L}")
    print(table.text())
    print("\nsame-run ratios (zreplay time / other time; > 1: zreplay slower):")
    for k, v in extra["ratios"].items():
        print(f"  {k:<72} {'n/a' if v is None else f'{v:.2f}x'}")
    zv = results.get("zreplay_view", {})
    if zv.get("chunks_touched"):
        print("\nzreplay.open view: chunks decoded per 32x32 sample (whole chunks are read):")
        for k, c in zv["chunks_touched"]["small"].items():
            print(
                f"  {k:<11} {c['chunks']:5.1f} chunks of {c['chunk_rows']:4d} rows = "
                f"{c['decoded_bytes'] / 1e3:7.1f} kB decoded for "
                f"{c['returned_bytes'] / 1e3:6.1f} kB returned"
            )
    foreign = {k: round(v["foreign_cpu_cores"], 2) for k, v in sections.items()}
    print(f"\ntotal {total:.1f}s")
    print(f"CPU used by other processes per section (cores): {foreign}")

    result = {
        "benchmark": "clips",
        "mode": mode,
        "config": cfg,
        "slice_len": L,
        "slices": [SLICES, BIG_SLICES],
        "systems": only,
        "machine": info,
        "total_s": total,
        "idle_check_start": idle0,
        "idle_checks": idle,
        "disturbed_first_attempts": disturbed,
        "sections": sections,
        "max_foreign_cpu_cores": max(
            (v["foreign_cpu_cores"] for v in sections.values()), default=0
        ),
        "workload": {k: v for k, v in meta.items() if k != "lengths"},
        "episode_lengths": meta["lengths"],
        "ratio_definition": "ratio = zreplay figure named in 'vs' / row system; > 1: zreplay "
        "slower",
        "figures": figures,
        **extra,
        "table": table.text(),
        "rows": table.rows,
        "results": results,
    }
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
