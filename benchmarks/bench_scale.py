#!/usr/bin/env python
"""Scale benchmark: how zreplay's reads, open time, memory and footprint grow with the
number of stored rows, against TorchRL's ``LazyMemmapStorage`` holding the same rows.

The same episodic state data is written once as a zreplay buffer and once as a TorchRL
memmap storage, at each size of ``--sizes``: ``obs`` f32[8], ``action`` f32[2], ``reward``
f32, ``done`` bool (the termination flag, set on the last step), 45 bytes a row, in
episodes of 1,000 steps.  The rows come in blocks of 1M: four generated (fixed seeds)
before the clock starts, every later block one of them with ``obs`` shifted by a
per-block constant, so both systems get identical rows, every block differs, no process
holds more than five blocks, and generating rows never overlaps the writes (zreplay's
background writer would compress meanwhile).  Each system is built in its own
subprocess, then measured in a fresh one (its own RSS, its own imports).  Nothing here
asserts on timings.

    python benchmarks/bench_scale.py --quick                      # 100k and 1M rows (~30 s)
    python benchmarks/bench_scale.py --sizes 1M,10M --keep --tmpdir /data/scale
    python benchmarks/bench_scale.py --reuse /data/scale/zreplay-scale-XXXX   # re-measure only
    python benchmarks/bench_scale.py --sizes 1M,30M --runs 4      # the same check 4 times
    python benchmarks/bench_scale.py                              # 1M, 30M, 300M (~25 GB!)

``--runs N`` measures each size N times, each run in fresh processes with the column
cache file emptied (the same check again), and prints every run's ``sample(256)`` and
clips medians, ratio to TorchRL and growth over the smallest size: the spread between
runs is reported, never a best-of.

Building (the figures are per system and size; ``build wall`` is the write loop and the
call that finishes it, from the first write on):

* zreplay: ``TrajectoryReplayBuffer(auto_save=True, cache_size=1, sample_window_size=0)``,
  one ``add_trajectories([block])`` per 1M-row block, the block passed as one ``[T=1000,
  B=1000]`` trajectory (1,000 parallel episodes; the ``done`` flags split it into
  episodes), then ``flush()`` and ``close()`` (compressed, checksummed, fsynced:
  ``durable=True``, the default).  This is the fastest public write path measured here:
  ``zreplay.ReplayBuffer.write_episode`` one 1,000-step episode per call took ~5x longer
  (~1.3M vs ~7M rows/s at 2M rows on this 2-core VM).
* TorchRL 0.14: ``ReplayBuffer(storage=LazyMemmapStorage(N, scratch_dir=<dir>/storage),
  sampler=RandomSampler(), batch_size=256)``, one ``extend(TensorDict)`` of 1M rows per
  block, then ``rb.dumps(<dir>)``, which is zero-copy because the storage already lives in
  ``<dir>/storage`` (it writes the metadata; nothing is fsynced).
* ``write`` = rows / (build wall - the per-block obs shifts), the call that finishes the
  build included; ``+ sync`` adds the ``os.sync()`` the parent runs right after each
  build (TorchRL's rows are dirty page cache until then, zreplay's mostly fsynced
  already).  The sync also keeps writeback out of the measurements that follow.

Measuring (one fresh process per system; the page cache is **warm**: the parent reads
every file of the system once right before its child starts, so each system is measured
with its own data in RAM even when both do not fit together; ``--drop-caches`` evicts the
system's files instead, with ``posix_fadvise(DONTNEED)`` per file, which needs no root,
but the VM's disk may still cache beneath):

* ``open``: zreplay ``zreplay.open(path)``; TorchRL, as a user reopens a dumped memmap
  buffer: ``LazyMemmapStorage(N, scratch_dir=<dir>/storage, existsok=True)``, a
  ``ReplayBuffer`` around it and ``rb.loads(<dir>)``, which maps the files in place
  (``TensorDict.load_memmap``) because ``scratch_dir`` is the dumped storage directory
  (TorchRL 0.14.1 ``TensorStorageCheckpointer.loads``; any other ``scratch_dir`` copies
  every row into a new memmap).
* ``sample(256)``: zreplay ``view.sample(256)`` (every key); TorchRL ``rb.sample()``
  (``RandomSampler``, batch 256).  ``clips 32x32``: zreplay ``view.sample_clips(32,
  history_len=32)``; TorchRL ``TensorDictReplayBuffer`` on the same storage object with
  ``SliceSampler(slice_len=32, end_key="done", strict_length=True, cache_values=True)``,
  ``rb.sample(1024).reshape(-1, 32)`` (as in bench_clips.py).  Median and p90 of
  ``repeats`` calls after ``warmup`` untimed ones; the very first call of each is
  reported apart (``1st``): zreplay fills its column cache file there (the child's
  ``ZREPLAY_CACHE_DIR`` is emptied first), TorchRL's ``SliceSampler`` finds every episode
  boundary (O(rows)) there.  ``1st sample(256), 2nd view``: the first call of a second
  view opened after that in the same child, which maps the file the first one filled (as
  a DataLoader worker or the next run would).
* zreplay's view keeps the small keys (every key here) decoded in its column cache file
  (default budget: the machine's RAM), served by the page cache like TorchRL's memmap;
  ``column cache file``: the blocks it takes on disk.  The ``cache off`` rows
  (``column_cache_bytes=0, chunk_cache_bytes=0``, same child) show the store's read path
  at every size.  ``sample(256), store dropped``: the same draws again after the store's
  files are evicted from the page cache (``posix_fadvise(DONTNEED)``; the column cache file
  stays): the warm-up and the fill read the store twice, which makes its pages compete
  with the file's (at 300M rows they do not fit in 24 GB together), where a run without
  the warm-up reads them once.
* ``RSS``: VmRSS after the open and after all the sampling, absolute and over the
  process's RSS right before the open (imports done: zreplay imports torch too); the
  growth after sampling split into anonymous memory (zreplay's column cache, TensorStore)
  and file-backed pages (TorchRL's mapped files count as their pages are touched: page
  cache, shared and reclaimable).
* ``disk``: apparent bytes of every file of the system's directory (``dir_bytes``).

Growth tables: each figure at each size divided by the same figure at the smallest size
(RSS figures: the growth over the pre-open RSS); ratio table: zreplay / TorchRL per size
(> 1: zreplay slower or larger; for rows/s, faster).  Torch's intra-op threads (default:
one per core) serve TorchRL's gathers and spin while they wait, so under load one thread
is often faster: TorchRL's ``sample(256)`` and clips are timed with the default threads
and with 1, and the faster (by median) is the figure (both in the JSON, ``by_threads``);
``--torch-threads N`` times N threads only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

# benchlib imports neither zreplay nor torch.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (  # noqa: E402
    CpuMeter,
    describe_machine,
    dir_bytes,
    files_under,
    fmt_time,
    ratio,
    repeat,
    run_child_job,
    wait_idle,
    warm_allocator,
    warm_page_cache,
    write_json,
)

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "latest" / "scale.json"
T = 1000  # steps per episode
BLOCK = 1_000_000  # rows generated and written per call
POOL = 4  # distinct blocks generated before a build's clock starts
DATA_VERSION = 1  # bump when gen_block, the pool or a build changes (--reuse rebuilds)
SAMPLE_N = 256
CLIPS, L = 32, 32  # 32 clips of 32 steps
ROW_BYTES = 8 * 4 + 2 * 4 + 4 + 1
DEFAULT_SIZES = "1M,30M,300M"
QUICK_SIZES = "100k,1M"
SYSTEMS = ("zreplay", "torchrl")
TITLES = {"zreplay": "zreplay", "torchrl": "TorchRL memmap"}
EXTRA_PACKAGES = ("torchrl", "tensordict", "psutil")
CONFIGS = {
    "default": {"repeats": 300, "warmup": 5},
    "quick": {"repeats": 60, "warmup": 3},
}
# Bytes on disk per row and system, for the free-space check (a margin over what 1M
# rows measured: zreplay ~37, TorchRL 45).
DISK_PER_ROW = {"zreplay": 50, "torchrl": 46}


# -- sizes, data ------------------------------------------------------------------------


def parse_size(s: str) -> int:
    s = s.strip()
    mult = {"k": 10**3, "K": 10**3, "m": 10**6, "M": 10**6, "g": 10**9, "G": 10**9}
    n = float(s[:-1]) * mult[s[-1]] if s and s[-1] in mult else float(s)
    rows = int(round(n))
    if rows <= 0 or rows % T:
        raise argparse.ArgumentTypeError(f"size {s!r}: rows must be a positive multiple of {T}")
    return rows


def label(rows: int) -> str:
    if rows % 10**6 == 0:
        return f"{rows // 10**6}M"
    if rows % 10**3 == 0:
        return f"{rows // 10**3}k"
    return str(rows)


def blocks(rows: int) -> list[tuple[int, int]]:
    """``(block number, rows in it)``: 1M-row blocks (the last may be shorter)."""
    return [(b, min(BLOCK, rows - b * BLOCK)) for b in range((rows + BLOCK - 1) // BLOCK)]


def gen_block(b: int, n: int) -> dict[str, np.ndarray]:
    """Block ``b``: ``n // 1000`` episodes ``[episodes, T, ...]``: obs a random walk,
    actions squashed noise, reward from obs and action, done on each last step."""
    rng = np.random.default_rng(10_000 + b)
    ne = n // T
    steps = rng.standard_normal((ne, T, 8), dtype=np.float32)
    steps *= 0.05
    obs = np.cumsum(steps, axis=1, dtype=np.float32)
    obs += rng.standard_normal((ne, 1, 8), dtype=np.float32)
    action = np.tanh(rng.standard_normal((ne, T, 2), dtype=np.float32))
    reward = -np.square(obs[..., :4]).mean(-1) - 0.01 * np.square(action).sum(-1)
    done = np.zeros((ne, T), bool)
    done[:, -1] = True
    return {"obs": obs, "action": action, "reward": reward.astype(np.float32), "done": done}


# -- memory, files ----------------------------------------------------------------------


def mem_mb() -> dict:
    """VmRSS, RssAnon, RssFile and VmHWM of this process in MB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[k] = int(v.split()[0]) / 1024
    return out


def huge_mb() -> dict:
    """Memory this process maps with 2 MiB pages, in MB (``/proc/self/smaps_rollup``):
    file pages (a memmap, the column cache file) and anonymous ones.  Random rows of a
    large mapping cost a TLB miss each where its pages are 4 KiB."""
    out = {}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("FilePmdMapped", "AnonHugePages"):
                    out[k] = int(v.split()[0]) / 1024
    except OSError:
        pass
    return out


def reset_peak() -> bool:
    """Reset VmHWM (Linux >= 4.0), so a build's peak is its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def evict(path) -> int:
    """Drop every file under ``path`` from the page cache (written back first)."""
    n = 0
    for f in files_under([path]):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
    return n


def colcache_dir(size_dir: Path) -> Path:
    """zreplay's column cache directory for one size (ZREPLAY_CACHE_DIR of its child)."""
    return size_dir / "zreplay-colcache"


def allocated_bytes(path: Path) -> int:
    """Bytes the files under ``path`` take on disk (cache files are sparse)."""
    return sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())


def system_dir(size_dir: Path, system: str) -> Path:
    return size_dir / system


# -- children ---------------------------------------------------------------------------


def _threads(job) -> int:
    import torch

    if job.get("torch_threads"):
        torch.set_num_threads(int(job["torch_threads"]))
    return torch.get_num_threads()


def _build_loop(rows: int, write) -> dict:
    """``write(block, n)`` every block; wall, generation and per-call times.

    The first ``POOL`` blocks are generated before the clock starts; block ``b`` beyond
    them is pool block ``b % POOL`` with ``obs`` shifted by ``b // POOL`` (a new array:
    every block's rows differ).  So the writes are not overlapped by generating rows,
    which would flatter zreplay (its background writer compresses meanwhile)."""
    nb = blocks(rows)
    g = time.perf_counter()
    pool = [gen_block(b, n) for b, n in nb[:POOL]]
    pool_s = time.perf_counter() - g
    per, gen_s = [], 0.0
    t0 = time.perf_counter()
    for b, n in nb:
        g = time.perf_counter()
        d = pool[b % POOL]
        if b >= POOL:
            ne = n // T
            d = {k: v[:ne] for k, v in d.items()}
            d["obs"] = d["obs"] + np.float32(b // POOL)
        gen_s += time.perf_counter() - g
        a = time.perf_counter()
        write(d, n)
        per.append(time.perf_counter() - a)
        del d
    return {
        "loop_s": time.perf_counter() - t0,
        "pool_generate_s": pool_s,
        "generate_s": gen_s,
        "per_call_s": per,
        "t0": t0,
    }


def build_zreplay(job) -> dict:
    import zreplay

    rows, path = job["rows"], Path(job["path"])
    res = {"torch_threads": _threads(job), "peak_reset": reset_peak(), "rss_before": mem_mb()}
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), cache_size=1, sample_window_size=0
    )

    def write(d, n):
        # [episodes, T, ...] -> one [T, episodes, ...] trajectory (a view; zreplay copies
        # it env-major into its RAM tier, so each episode lands contiguous).
        buf.add_trajectories([{k: np.swapaxes(v, 0, 1) for k, v in d.items()}])

    loop = _build_loop(rows, write)
    a = time.perf_counter()
    buf.flush()
    buf.close()
    res["finish_s"] = time.perf_counter() - a
    return _build_result(res, loop, rows, "flush() + close()")


def build_torchrl(job) -> dict:
    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyMemmapStorage, ReplayBuffer
    from torchrl.data.replay_buffers.samplers import RandomSampler

    rows, root = job["rows"], Path(job["path"])
    res = {"torch_threads": _threads(job), "peak_reset": reset_peak(), "rss_before": mem_mb()}
    storage = LazyMemmapStorage(rows, scratch_dir=str(root / "storage"))
    rb = ReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=SAMPLE_N)

    def write(d, n):
        td = TensorDict(
            {k: torch.from_numpy(v.reshape(n, *v.shape[2:])) for k, v in d.items()},
            batch_size=[n],
        )
        rb.extend(td)

    loop = _build_loop(rows, write)
    a = time.perf_counter()
    rb.dumps(root)  # zero-copy: the storage already lives in root/storage
    res["finish_s"] = time.perf_counter() - a
    if len(rb) != rows:
        raise RuntimeError(f"TorchRL buffer holds {len(rb)} rows, expected {rows}")
    return _build_result(res, loop, rows, "rb.dumps(dir)")


def _build_result(res: dict, loop: dict, rows: int, finish: str) -> dict:
    wall = time.perf_counter() - loop["t0"]
    per = loop["per_call_s"]
    res.update(
        {
            "rows": rows,
            "calls": len(per),
            "rows_per_call": min(rows, BLOCK),
            "per_call_median_s": float(np.median(per)),
            "per_call_max_s": float(np.max(per)),
            "pool_generate_s": loop["pool_generate_s"],
            "generate_s": loop["generate_s"],
            "wall_s": wall,
            "write_s": wall - loop["generate_s"],
            "rows_per_s": rows / (wall - loop["generate_s"]),
            "finish": finish,
            "rss_after": mem_mb(),
        }
    )
    return res


def _sane_clips(done: np.ndarray) -> None:
    """A clip may end an episode only on its last step."""
    if done.shape != (CLIPS, L):
        raise RuntimeError(f"clips: done has shape {done.shape}, expected {(CLIPS, L)}")
    if done[:, :-1].any():
        raise RuntimeError("a clip crosses an episode boundary")


def _timed_first(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_zreplay(job) -> dict:
    import zreplay

    rows, path, cfg = job["rows"], Path(job["path"]), job["cfg"]
    res = {"torch_threads": _threads(job), "rss_before_open": mem_mb()}
    t0 = time.perf_counter()
    view = zreplay.open(path, seed=1)
    res["open_s"] = time.perf_counter() - t0
    res["rss_after_open"] = mem_mb()
    if view.num_rows != rows or view.num_episodes != rows // T:
        raise RuntimeError(
            f"zreplay view: {view.num_rows} rows, {view.num_episodes} episodes; "
            f"expected {rows}, {rows // T}"
        )

    def sample():
        return view.sample(SAMPLE_N)

    def clips():
        return view.sample_clips(CLIPS, history_len=L)

    res["first_sample_s"] = _timed_first(sample)
    res["first_clips_s"] = _timed_first(clips)
    # A second view (as a DataLoader worker or the next run would open one): it maps the
    # column cache file the first view filled.
    again = zreplay.open(path, seed=3)
    res["reopen_first_sample_s"] = _timed_first(lambda: again.sample(SAMPLE_N))

    got = sample()
    if got["obs"].shape != (SAMPLE_N, 8) or sorted(got) != ["action", "done", "obs", "reward"]:
        raise RuntimeError(f"zreplay sample: keys {sorted(got)}, obs {got['obs'].shape}")
    _sane_clips(np.asarray(clips()["done"]))
    res["sample"] = repeat(sample, cfg["repeats"], cfg["warmup"])
    res["clips"] = repeat(clips, cfg["repeats"], cfg["warmup"])
    res["rss_after_sampling"] = mem_mb()
    res["huge_pages_after_sampling"] = huge_mb()
    # The store's pages were read twice (the parent's warm-up, the fill) and so compete
    # with the column cache file for the page cache; a run without the warm-up reads
    # them once.  The same draws again once they are dropped (the file stays).
    evict(path)
    res["sample_store_dropped"] = repeat(sample, cfg["repeats"], cfg["warmup"])

    # The store's read path at every size: no column cache.
    v0 = zreplay.open(path, seed=2, column_cache_bytes=0, chunk_cache_bytes=0)
    res["nocache_sample"] = repeat(lambda: v0.sample(SAMPLE_N), cfg["repeats"], cfg["warmup"])
    res["nocache_clips"] = repeat(
        lambda: v0.sample_clips(CLIPS, history_len=L), cfg["repeats"], cfg["warmup"]
    )
    return res


def measure_torchrl(job) -> dict:
    import torch
    from torchrl.data import LazyMemmapStorage, ReplayBuffer, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import RandomSampler, SliceSampler

    rows, root, cfg = job["rows"], Path(job["path"]), job["cfg"]
    res = {"torch_threads": _threads(job), "rss_before_open": mem_mb()}
    t0 = time.perf_counter()
    storage = LazyMemmapStorage(rows, scratch_dir=str(root / "storage"), existsok=True)
    rb = ReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=SAMPLE_N)
    rb.loads(root)  # maps root/storage in place (scratch_dir is that directory)
    res["open_s"] = time.perf_counter() - t0
    res["rss_after_open"] = mem_mb()
    if len(rb) != rows:
        raise RuntimeError(f"TorchRL buffer: {len(rb)} rows, expected {rows}")
    crb = TensorDictReplayBuffer(
        storage=storage,
        sampler=SliceSampler(slice_len=L, end_key="done", strict_length=True, cache_values=True),
        batch_size=CLIPS * L,
    )

    def sample():
        return rb.sample()

    def clips():
        return crb.sample().reshape(-1, L)

    res["first_sample_s"] = _timed_first(sample)
    res["first_clips_s"] = _timed_first(clips)
    got = sample()
    if tuple(got["obs"].shape) != (SAMPLE_N, 8):
        raise RuntimeError(f"TorchRL sample: obs {tuple(got['obs'].shape)}")
    _sane_clips(clips()["done"].numpy())
    # Torch's intra-op threads spin while they wait: with another process on a core, one
    # thread is often faster (bench_io.py).  Without --torch-threads both are measured
    # and each figure keeps the faster (by median) as the peer.
    variants = [res["torch_threads"]]
    if not job.get("torch_threads") and res["torch_threads"] != 1:
        variants.append(1)
    res["by_threads"] = {}
    for n in variants:
        torch.set_num_threads(n)
        res["by_threads"][n] = {
            "sample": repeat(sample, cfg["repeats"], cfg["warmup"]),
            "clips": repeat(clips, cfg["repeats"], cfg["warmup"]),
        }
    for fig in ("sample", "clips"):
        best = min(variants, key=lambda n, fig=fig: res["by_threads"][n][fig]["median_s"])
        res[fig] = {**res["by_threads"][best][fig], "torch_threads": best}
    res["rss_after_sampling"] = mem_mb()
    res["huge_pages_after_sampling"] = huge_mb()
    return res


CHILDREN = {
    ("build", "zreplay"): build_zreplay,
    ("build", "torchrl"): build_torchrl,
    ("measure", "zreplay"): measure_zreplay,
    ("measure", "torchrl"): measure_torchrl,
}


def child_main(job_path: Path) -> int:
    job = json.loads(job_path.read_text())
    out = {"system": job["system"], "phase": job["phase"], "pid": os.getpid()}
    warm_allocator()
    try:
        out.update(CHILDREN[job["phase"], job["system"]](job))
    except BaseException as e:  # reported, the run goes on
        out["error"] = f"{type(e).__name__}: {e}"
        out["traceback"] = traceback.format_exc()
    out["process_peak_rss_mb"] = mem_mb().get("VmHWM")
    Path(job["out"]).write_text(json.dumps(out, default=float))
    return 0


# -- the parent -------------------------------------------------------------------------


def build_size(rows: int, size_dir: Path, args, sections: dict) -> dict:
    """Build what ``size_dir`` lacks (each system once, recorded in ``build_*.json``);
    returns the build records (reused ones marked)."""
    size_dir.mkdir(parents=True, exist_ok=True)
    builds = {}
    for system in SYSTEMS:
        rec_path = size_dir / f"build_{system}.json"
        sdir = system_dir(size_dir, system)
        if rec_path.exists() and sdir.exists():
            rec = json.loads(rec_path.read_text())
            if rec.get("rows") == rows and rec.get("data_version") == DATA_VERSION:
                rec["reused"] = True
                builds[system] = rec
                print(f"  build {system:<8} reused ({rec_path})", flush=True)
                continue
        shutil.rmtree(sdir, ignore_errors=True)
        rec_path.unlink(missing_ok=True)
        job = {
            "phase": "build",
            "tag": f"build_{system}",
            "rows": rows,
            "path": str(sdir),
            "torch_threads": args.torch_threads,
        }
        res, sec = run_child_job(__file__, system, job, size_dir)
        t0 = time.perf_counter()
        os.sync()
        res["sync_s"] = time.perf_counter() - t0
        res["section"] = sec
        sections[f"{label(rows)}/build_{system}"] = sec
        if "error" not in res:
            res["rows_per_s_synced"] = rows / (res["write_s"] + res["sync_s"])
            res["data_version"] = DATA_VERSION
            res["built_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
            rec_path.write_text(json.dumps(res, indent=1, default=float))
            print(
                f"  build {system:<8} {sec['wall_s']:7.1f}s  write {res['write_s']:.1f}s "
                f"({res['rows_per_s'] / 1e6:.2f}M rows/s), generate {res['generate_s']:.1f}s, "
                f"sync {res['sync_s']:.1f}s, peak RSS {res['process_peak_rss_mb']:.0f} MB "
                f"(other processes {sec['foreign_cpu_cores']:.2f} cores)",
                flush=True,
            )
        builds[system] = res
    return builds


def measure_size(rows: int, size_dir: Path, cfg: dict, args, sections: dict, run=1) -> dict:
    """Measure each system once in a fresh process (run ``run``): every run is the same
    check, the column cache file emptied first, so runs differ only by the machine."""
    out = {}
    tag = "" if args.runs == 1 else f"#{run}"
    for system in SYSTEMS:
        sdir = system_dir(size_dir, system)
        prep = CpuMeter().start()
        if args.drop_caches:
            evicted = evict(sdir)
            cache = {"page_cache": "evicted", "files": evicted}
        else:
            cache = {"page_cache": "warm", "bytes_read": warm_page_cache(sdir)}
        cache["prep_s"] = prep.stop()["wall_s"]
        idle = wait_idle(args.wait_idle) if args.wait_idle > 0 else None
        job = {
            "phase": "measure",
            "tag": f"measure_{system}",
            "rows": rows,
            "path": str(sdir),
            "cfg": cfg,
            "torch_threads": args.torch_threads,
        }
        env = None
        if system == "zreplay":  # its column cache file starts absent: the 1st call fills it
            env = {**os.environ, "ZREPLAY_CACHE_DIR": str(colcache_dir(size_dir))}
            shutil.rmtree(colcache_dir(size_dir), ignore_errors=True)
        res, sec = run_child_job(__file__, system, job, size_dir, env=env)
        res.update(cache, section=sec, idle_check=idle, disk_bytes=dir_bytes(sdir))
        if system == "zreplay":
            res["colcache_disk_bytes"] = allocated_bytes(colcache_dir(size_dir))
        sections[f"{label(rows)}/measure_{system}{tag}"] = sec
        if "error" not in res:
            print(
                f"  measure{tag} {system:<8} {sec['wall_s']:5.1f}s  sample(256) "
                f"{fmt_time(res['sample']['median_s'])}, clips {fmt_time(res['clips']['median_s'])}"
                + (
                    f" (torch threads {res['sample']['torch_threads']} / "
                    f"{res['clips']['torch_threads']})"
                    if "torch_threads" in res["sample"]
                    else ""
                )
                + f" (other processes {sec['foreign_cpu_cores']:.2f} cores)",
                flush=True,
            )
        out[system] = res
    return out


# Figures: (key, label, kind, getter(build, measure) -> float | None).  kind: "t" time,
# "mb", "bytes", "rate".
def _g(d: dict | None, *path):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def _rss(m, when):
    a, b = _g(m, when, "VmRSS"), _g(m, "rss_before_open", "VmRSS")
    return None if a is None else (a, None if b is None else a - b)


def _grow(m, key):
    a, b = _g(m, "rss_after_sampling", key), _g(m, "rss_before_open", key)
    return None if a is None or b is None else a - b


FIGURES = [
    ("sample_median", "sample(256) median", "t", lambda b, m: _g(m, "sample", "median_s")),
    ("sample_p90", "sample(256) p90", "t", lambda b, m: _g(m, "sample", "p90_s")),
    ("clips_median", "clips 32x32 median", "t", lambda b, m: _g(m, "clips", "median_s")),
    ("clips_p90", "clips 32x32 p90", "t", lambda b, m: _g(m, "clips", "p90_s")),
    (
        "sample_nocache_median",
        "sample(256) cache off med",
        "t",
        lambda b, m: _g(m, "nocache_sample", "median_s"),
    ),
    (
        "clips_nocache_median",
        "clips 32x32 cache off med",
        "t",
        lambda b, m: _g(m, "nocache_clips", "median_s"),
    ),
    (
        "sample_store_dropped_median",
        "sample(256), store dropped",
        "t",
        lambda b, m: _g(m, "sample_store_dropped", "median_s"),
    ),
    (
        "sample_store_dropped_p90",
        "  p90",
        "t",
        lambda b, m: _g(m, "sample_store_dropped", "p90_s"),
    ),
    ("first_sample", "1st sample(256)", "t", lambda b, m: _g(m, "first_sample_s")),
    ("first_clips", "1st clips 32x32", "t", lambda b, m: _g(m, "first_clips_s")),
    (
        "reopen_first_sample",
        "1st sample(256), 2nd view",
        "t",
        lambda b, m: _g(m, "reopen_first_sample_s"),
    ),
    ("open", "open", "t", lambda b, m: _g(m, "open_s")),
    ("rss_open", "RSS after open", "mb", lambda b, m: _rss(m, "rss_after_open")),
    ("rss_sampled", "RSS after sampling", "mb", lambda b, m: _rss(m, "rss_after_sampling")),
    ("rss_sampled_anon", "  anon growth", "mb", lambda b, m: _grow(m, "RssAnon")),
    ("rss_sampled_file", "  file-backed growth", "mb", lambda b, m: _grow(m, "RssFile")),
    ("disk", "disk bytes", "bytes", lambda b, m: _g(m, "disk_bytes")),
    ("colcache_disk", "column cache file", "bytes", lambda b, m: _g(m, "colcache_disk_bytes")),
    ("write", "write rows/s", "rate", lambda b, m: _g(b, "rows_per_s")),
    ("write_synced", "write rows/s + sync", "rate", lambda b, m: _g(b, "rows_per_s_synced")),
    ("build_wall", "build wall", "t", lambda b, m: _g(b, "wall_s")),
    ("build_peak_rss", "build peak RSS", "mb", lambda b, m: _g(b, "process_peak_rss_mb")),
]
RATIO_FIGS = ("sample_median", "sample_p90", "clips_median", "clips_p90")


def fmt_value(kind: str, v) -> str:
    if v is None:
        return "n/a"
    if kind == "t":
        return fmt_time(v)
    if kind == "mb":
        if isinstance(v, tuple):
            a, d = v
            return f"{a:.0f} MB" + ("" if d is None else f" (+{d:.0f})")
        return f"{v:.0f} MB"
    if kind == "bytes":
        return f"{v / 1e6:.1f} MB" if v < 1e9 else f"{v / 1e9:.2f} GB"
    if kind == "rate":
        return f"{v / 1e6:.2f}M/s"
    return str(v)


def scalar(v):
    """The number a ratio uses: RSS figures use the growth over the pre-open RSS."""
    if isinstance(v, tuple):
        return v[1]
    return v


def figure_values(R: dict) -> dict:
    """``{size label: {system: {figure key: value}}}``."""
    out = {}
    for lab, r in R.items():
        out[lab] = {}
        for system in SYSTEMS:
            b, m = r["build"].get(system), r["measure"].get(system)
            if b and "error" in b:
                b = None
            if m and "error" in m:
                m = None
            out[lab][system] = {key: get(b, m) for key, _, _, get in FIGURES}
    return out


def size_table(lab: str, rows: int, vals: dict) -> str:
    head = f"{'figure':<27} {'zreplay':>20} {'TorchRL memmap':>20} {'zreplay/TorchRL':>16}"
    lines = [
        f"--- {lab}: {rows:,} rows ({rows // T:,} episodes x {T} steps, "
        f"{rows * ROW_BYTES / 1e6:,.0f} MB raw) ---",
        head,
        "-" * len(head),
    ]
    for key, name, kind, _ in FIGURES:
        z, t = vals["zreplay"][key], vals["torchrl"][key]
        if z is None and t is None:
            continue
        r = ratio(scalar(z), scalar(t))
        rs = "" if r is None else f"{r:.2f}x"
        lines.append(f"{name:<27} {fmt_value(kind, z):>20} {fmt_value(kind, t):>20} {rs:>16}")
    return "\n".join(lines)


def growth(vals: dict, labels: list[str]) -> dict:
    """``{system: {figure: {label: value / value at the smallest size}}}``."""
    base = labels[0]
    out = {s: {} for s in SYSTEMS}
    for s in SYSTEMS:
        for key, *_ in FIGURES:
            b0 = scalar(vals[base][s][key])
            out[s][key] = {lab: ratio(scalar(vals[lab][s][key]), b0) for lab in labels}
    return out


def growth_table(vals: dict, labels: list[str], gr: dict) -> str:
    w = 20
    head = f"{'figure':<27} {'system':<15}" + "".join(f"{lab:>{w}}" for lab in labels)
    lines = [
        f"=== growth: each figure / the same figure at {labels[0]} (RSS: over pre-open RSS)",
        head,
        "-" * len(head),
    ]
    for key, name, kind, _ in FIGURES:
        for s in SYSTEMS:
            cells = []
            for lab in labels:
                v, g = vals[lab][s][key], gr[s][key][lab]
                if kind == "mb" and isinstance(v, tuple):
                    v = v[1]
                txt = fmt_value(kind, v)
                if lab != labels[0] and g is not None:
                    txt += f" {g:.2f}x"
                cells.append(f"{txt:>{w}}")
            if all(vals[lab][s][key] is None for lab in labels):
                continue
            lines.append(f"{name:<27} {TITLES[s]:<15}" + "".join(cells))
    return "\n".join(lines)


def ratio_table(vals: dict, labels: list[str]) -> tuple[str, dict]:
    head = f"{'zreplay / TorchRL':<27}" + "".join(f"{lab:>10}" for lab in labels)
    lines = ["=== zreplay / TorchRL per size (> 1: zreplay slower)", head, "-" * len(head)]
    out = {}
    for key, name, *_ in FIGURES:
        if key not in RATIO_FIGS:
            continue
        out[key] = {
            lab: ratio(vals[lab]["zreplay"][key], vals[lab]["torchrl"][key]) for lab in labels
        }
        lines.append(
            f"{name:<27}"
            + "".join(
                f"{'n/a' if out[key][lab] is None else f'{out[key][lab]:.2f}x':>10}"
                for lab in labels
            )
        )
    return "\n".join(lines), out


def runs_table(R: dict, labels: list[str]) -> tuple[str, dict]:
    """Every run's ``sample(256)`` and clips medians, zreplay / TorchRL and zreplay's
    growth over its own figure at the smallest size in the same run (not a best-of: the
    spread between runs is the point), with zreplay's page faults per call."""
    head = (
        f"{'size':<6}{'run':>4}{'zreplay':>10}{'TorchRL':>10}{'ratio':>8}{'growth':>8}"
        f"{'minflt':>8}{'majflt':>8}{'2M-mapped':>11}{'clips ratio':>13}"
    )
    lines = [
        "=== sample(256) median in every run (ratio: zreplay / TorchRL; growth: zreplay / "
        f"its own at {labels[0]} in the same run; page faults: zreplay's per call; 2M-mapped: "
        "file memory zreplay's process maps with 2 MiB pages)",
        head,
        "-" * len(head),
    ]
    out = {"sample_median": {}, "clips_median": {}, "sample_growth": {}}
    for lab in labels:
        for key in out:
            out[key][lab] = []
        for i, m in enumerate(R[lab]["runs"]):
            z, t = m.get("zreplay") or {}, m.get("torchrl") or {}
            zs, ts = _g(z, "sample", "median_s"), _g(t, "sample", "median_s")
            base = R[labels[0]]["runs"][min(i, len(R[labels[0]]["runs"]) - 1)]
            z0 = _g(base.get("zreplay"), "sample", "median_s")
            r, g = ratio(zs, ts), ratio(zs, z0)
            rc = ratio(_g(z, "clips", "median_s"), _g(t, "clips", "median_s"))
            out["sample_median"][lab].append(r)
            out["clips_median"][lab].append(rc)
            out["sample_growth"][lab].append(g)

            def x(v):
                return "n/a" if v is None else f"{v:.2f}x"

            def n(v):
                return "n/a" if v is None else f"{v:.1f}"

            lines.append(
                f"{lab:<6}{i + 1:>4}{fmt_value('t', zs):>10}{fmt_value('t', ts):>10}"
                f"{x(r):>8}{x(g):>8}{n(_g(z, 'sample', 'minflt_per_call')):>8}"
                f"{n(_g(z, 'sample', 'majflt_per_call')):>8}"
                f"{fmt_value('mb', _g(z, 'huge_pages_after_sampling', 'FilePmdMapped')):>11}"
                f"{x(rc):>13}"
            )
    return "\n".join(lines), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--sizes",
        default=None,
        help=f"rows per size, comma-separated, suffixes k/M (default {DEFAULT_SIZES}; "
        f"300M rows need ~25 GB free under --tmpdir: ~11 GB zreplay, 13.5 GB TorchRL)",
    )
    ap.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES}, fewer repeats")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON (default {DEFAULT_OUT})")
    ap.add_argument(
        "--tmpdir",
        type=Path,
        default=None,
        help="where the data is built (a new zreplay-scale-* directory in it; default: the "
        "system temp dir). Needs ~95 bytes per row of the largest size (both systems)",
    )
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep the built data (print its directory, for --reuse); default: each size's "
        "data is removed once measured",
    )
    ap.add_argument(
        "--reuse",
        type=Path,
        default=None,
        metavar="DIR",
        help="measure the data a --keep run left in DIR (its build figures are reported "
        "from its records); sizes missing there are built into DIR; nothing is removed",
    )
    ap.add_argument(
        "--drop-caches",
        action="store_true",
        help="evict each system's files from the page cache (posix_fadvise, no root needed) "
        "before measuring it, instead of reading them once (warm, the default)",
    )
    ap.add_argument(
        "--torch-threads", type=int, default=None, help="torch.set_num_threads in the children"
    )
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per figure")
    ap.add_argument(
        "--runs",
        type=int,
        default=1,
        help="measure each size this many times (fresh processes, the column cache file "
        "emptied each time) and report every run; the tables of figures show the first",
    )
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="before each measurement, wait up to S seconds for other processes to go quiet",
    )
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        return child_main(args.child)

    mode = "quick" if args.quick else "default"
    cfg = dict(CONFIGS[mode])
    if args.repeats:
        cfg["repeats"] = args.repeats
    spec = args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    try:
        sizes = sorted({parse_size(s) for s in spec.split(",") if s.strip()})
    except (argparse.ArgumentTypeError, ValueError, KeyError) as e:
        ap.error(str(e))
    labels = [label(n) for n in sizes]
    info = describe_machine(
        f"zreplay scale benchmark ({mode}, sizes {','.join(labels)})", EXTRA_PACKAGES
    )
    t_start = time.perf_counter()
    if args.reuse is not None:
        root = args.reuse.resolve()
        root.mkdir(parents=True, exist_ok=True)
    else:
        if args.tmpdir is not None:
            args.tmpdir.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix="zreplay-scale-", dir=args.tmpdir))
    keep = args.keep or args.reuse is not None
    need = max(sizes) * sum(DISK_PER_ROW.values())
    if keep:
        need = sum(sizes) * sum(DISK_PER_ROW.values())
    free = shutil.disk_usage(root).free
    print(f"data under {root} ({free / 1e9:.0f} GB free, up to ~{need / 1e9:.1f} GB needed)")
    if need > free:
        print("WARNING: probably not enough free disk for the largest size", flush=True)

    R, sections = {}, {}
    try:
        for rows, lab in zip(sizes, labels, strict=True):
            size_dir = root / f"rows_{lab}"
            print(f"\n=== {lab}: {rows:,} rows ===", flush=True)
            builds = build_size(rows, size_dir, args, sections)
            runs = [
                measure_size(rows, size_dir, cfg, args, sections, run)
                for run in range(1, args.runs + 1)
            ]
            measures = runs[0]
            R[lab] = {
                "rows": rows,
                "dir": str(size_dir),
                "build": builds,
                "measure": measures,
                "runs": runs,
            }
            for phase, d in [("build", builds), *(("measure", m) for m in runs)]:
                for s, r in d.items():
                    if "error" in r:
                        print(f"  {phase} {s}: ERROR {r['error']}\n{r.get('traceback', '')}")
            if not keep:
                shutil.rmtree(size_dir, ignore_errors=True)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)

    vals = figure_values(R)
    texts = [size_table(lab, R[lab]["rows"], vals[lab]) for lab in labels]
    gr = growth(vals, labels)
    texts.append(growth_table(vals, labels, gr))
    rtext, ratios = ratio_table(vals, labels)
    texts.append(rtext)
    run_text, by_run = runs_table(R, labels)
    texts.append(run_text)
    print()
    print("\n\n".join(texts))
    total = time.perf_counter() - t_start
    foreign = {k: round(v["foreign_cpu_cores"], 2) for k, v in sections.items()}
    print(f"\ntotal {total:.1f}s; CPU used by other processes per section (cores): {foreign}")
    if keep:
        print(f"data kept in {root} (reuse: --reuse {root})")

    result = {
        "benchmark": "scale",
        "mode": mode,
        "config": cfg,
        "sizes": sizes,
        "labels": labels,
        "episode_len": T,
        "row_bytes": ROW_BYTES,
        "block_rows": BLOCK,
        "sample_n": SAMPLE_N,
        "clips": [CLIPS, L],
        "page_cache": "evicted (posix_fadvise)" if args.drop_caches else "warm",
        "torch_threads": args.torch_threads,
        "data_dir": str(root) if keep else None,
        "machine": info,
        "total_s": total,
        "sections": sections,
        "max_foreign_cpu_cores": max(
            (v["foreign_cpu_cores"] for v in sections.values()), default=0
        ),
        "figures": {
            lab: {
                s: {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}
                for s, d in vals[lab].items()
            }
            for lab in labels
        },
        "growth": gr,
        "ratios_zreplay_over_torchrl": ratios,
        "runs": args.runs,
        "by_run": by_run,
        "definitions": {
            "growth": "figure at a size / the same figure at the smallest size; RSS figures "
            "use VmRSS after the event minus VmRSS right before the open",
            "ratio": "zreplay figure / TorchRL figure at the same size (first run)",
            "by_run": "per run: sample_median and clips_median are zreplay / TorchRL, "
            "sample_growth is zreplay's sample(256) median / its own at the smallest size "
            "in the same run",
            "rows_per_s": "rows / (build wall - row generation), finishing call included",
            "rows_per_s_synced": "rows / (write_s + the os.sync() after the build)",
        },
        "tables": texts,
        "results": R,
    }
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
