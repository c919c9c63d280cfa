#!/usr/bin/env python
"""Foundation benchmark for zreplay: ingest, sampling (RAM tier / disk), open cost, compression.

Every zreplay figure is compared, in the same run, with a peer doing the same work the
plainest way (numpy copy/gather, zarr-python ``oindex``, raw TensorStore reads, raw file
writes).  Times are medians over repeats with fresh random indices each repeat; nothing
here asserts on timings.

    python benchmarks/bench_foundation.py                 # default run (a few minutes)
    python benchmarks/bench_foundation.py --quick         # CI smoke (< 30 s)
    python benchmarks/bench_foundation.py --out PATH.json

Ratio column: zreplay time / peer time (> 1: zreplay is slower), or raw / on-disk bytes
for the compression rows.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from benchlib import (
    CpuMeter,
    copy_tree,
    dir_bytes,
    machine_info,
    nest,
    repeat,
    rlinf_image_trajectory,
    run_child,
    stats,
    warm_page_cache,
    write_json,
    zarr_and_tensorstore_gathers,
)

import zreplay
from zreplay import TrajectoryReplayBuffer

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "latest" / "foundation.json"

# RLinf-like embodied workload: T chunk steps x B envs.
T, B, H, W = 50, 8, 64, 64
SAMPLE_N = 256
POOL = 4  # distinct trajectories generated once and cycled

CONFIGS = {
    "default": {
        "lat_adds": 30,  # isolated add_trajectories calls (flush between, untimed)
        "ingest_trajs": 60,  # sustained ingest into the RAM-tier buffer
        "bp_trajs": 40,  # sustained ingest with cache_size=5 (backpressure)
        "ram_repeats": 400,
        "disk_repeats": 100,
        "zarr_repeats": 15,
        "ts_repeats": 100,
        "open_sizes": [1_000, 10_000, 100_000],
        "open_repeats": 3,
        "build_budget_s": 90.0,
    },
    "quick": {
        "lat_adds": 4,
        "ingest_trajs": 6,
        "bp_trajs": 6,
        "ram_repeats": 30,
        "disk_repeats": 10,
        "zarr_repeats": 3,
        "ts_repeats": 10,
        "open_sizes": [1_000],
        "open_repeats": 1,
        "build_budget_s": 10.0,
    },
}

# Small schema for the open-time figure: T=10, B=10.
SMALL_T, SMALL_B = 10, 10


# -- helpers ----------------------------------------------------------------------------


def flat_items(tree: dict, prefix: str = ""):
    for k, v in tree.items():
        path = f"{prefix}/{k}" if prefix else k
        if isinstance(v, dict):
            yield from flat_items(v, path)
        else:
            yield path, v


def tree_nbytes(tree: dict) -> int:
    return sum(v.nbytes for _, v in flat_items(tree))


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


# -- data -------------------------------------------------------------------------------


def make_frames(rng: np.random.Generator, n_frames: int) -> np.ndarray:
    """Simulator-like RGB frames [n_frames, B, H, W, 3]: a smooth wall gradient over a flat
    table, three moving coloured blocks, and sensor noise (sigma 2) on 25% of pixels.
    Compresses about 2-3x per frame with zstd-1 (a noise-free render would give 4x+)."""
    y, x = np.mgrid[0:H, 0:W].astype(np.float32)
    out = np.empty((n_frames, B, H, W, 3), np.uint8)
    for b in range(B):
        ph = rng.uniform(0, 2 * np.pi, 3)
        wall = np.stack(
            [90 + 30 * np.sin(x / W * np.pi + ph[c]) + 20 * y / H for c in range(3)], -1
        )
        table = np.broadcast_to(rng.integers(60, 200, 3).astype(np.float32), (H, W, 3))
        horizon = int(rng.integers(20, 36))
        base = np.rint(np.where((y < horizon)[..., None], wall, table))
        blocks = [
            (
                int(rng.integers(6, 16)),
                rng.integers(0, 255, 3),
                rng.uniform(-2, 2, 2),
                rng.uniform(0, 48, 2),
            )
            for _ in range(3)
        ]
        for t in range(n_frames):
            f = base.copy()
            mask = rng.random((H, W, 1)) < 0.25
            f += mask * np.rint(rng.normal(0, 2.0, base.shape))
            for s, col, v, p in blocks:
                px, py = ((p + v * t) % (H - s)).astype(int)
                f[py : py + s, px : px + s] = col
            out[t, b] = np.clip(f, 0, 255)
    return out


def make_trajectory(seed: int) -> dict:
    """benchlib's RLinf-like trajectory with this benchmark's own frames (its recorded
    figures were measured on them)."""
    return nest(
        rlinf_image_trajectory(seed, T, B, H, W, frames_of=lambda rng, n, *_: make_frames(rng, n))
    )


def small_trajectory(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    shape = (SMALL_T, SMALL_B)
    return {
        "obs": rng.standard_normal((*shape, 8), dtype=np.float32),
        "actions": rng.standard_normal((*shape, 2), dtype=np.float32),
        "rewards": rng.standard_normal((*shape, 1), dtype=np.float32),
        "dones": np.zeros((*shape, 1), bool),
    }


# -- result table -----------------------------------------------------------------------


class Table:
    def __init__(self):
        self.rows: list[dict] = []

    def add(self, figure, zval, peer="", ratio=None, **data):
        row = {"figure": figure, "zreplay": zval, "peer": peer, "ratio": ratio, **data}
        self.rows.append(row)
        print(self.format_row(row), flush=True)

    @staticmethod
    def header() -> str:
        return f"{'figure':<44} {'zreplay':>14}    {'peer':<30} {'ratio':>8}"

    @staticmethod
    def format_row(row: dict) -> str:
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        return f"{row['figure']:<44} {row['zreplay']:>14}    {row['peer']:<30} {ratio:>8}"

    def text(self) -> str:
        return "\n".join([self.header(), *(self.format_row(r) for r in self.rows)])


# -- figures ----------------------------------------------------------------------------


def isolated_adds(buf, pool, n: int, first: int = 0) -> tuple[dict, dict]:
    """``n`` adds of one trajectory each, the writer idle at each call (flush between).

    Returns stats of the add call alone and of add + flush (the trajectory committed)."""
    add_t, commit_t = [], []
    for i in range(n):
        tr = pool[(first + i) % POOL]
        t0 = time.perf_counter()
        buf.add_trajectories([tr])
        t1 = time.perf_counter()
        buf.flush()
        add_t.append(t1 - t0)
        commit_t.append(time.perf_counter() - t0)
    return stats(add_t), stats(commit_t)


def copy_peer(pool, n: int) -> dict:
    """Time ``{k: v.copy()}`` of one trajectory (malloc reuses already-faulted pages)."""
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        c = copy_tree(pool[i % POOL])
        out.append(time.perf_counter() - t0)
        del c
    return stats(out)


def first_fill_adds(buf, pool, n: int) -> tuple[dict, dict]:
    """Isolated adds into a RAM tier that is filling for the first time, interleaved with
    the same copy into never-touched numpy memory (first-touch page faults included in
    both; on a VM they can cost more than the copy itself)."""
    dest = {k: np.empty((n, *v.shape), v.dtype) for k, v in flat_items(pool[0])}
    add_t, cold_t = [], []
    for i in range(n):
        tr = pool[(i + 1) % POOL]
        t0 = time.perf_counter()
        buf.add_trajectories([tr])
        add_t.append(time.perf_counter() - t0)
        buf.flush()
        t0 = time.perf_counter()
        for k, v in flat_items(tr):
            np.copyto(dest[k][i], v)
        cold_t.append(time.perf_counter() - t0)
    return stats(add_t), stats(cold_t)


def bench_ingest_warm(cfg, pool, raw_traj_bytes, tmp: Path, table: Table) -> None:
    """RLinf's default cache_size=5: the RAM tier ring wraps, so its pages are warm.

    Isolated add latency (writer idle), then sustained ingest where the caller waits for
    the writer whenever 5 trajectories are uncommitted (backpressure)."""
    path = tmp / "warm"
    buf = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), cache_size=5, sample_window_size=0
    )
    t0 = time.perf_counter()
    buf.add_trajectories([pool[0]])
    t_first = time.perf_counter() - t0
    buf.flush()
    isolated_adds(buf, pool, 12)  # wrap the ring twice: every slot touched
    s_add, s_commit = isolated_adds(buf, pool, cfg["lat_adds"])
    s_copy = copy_peer(pool, max(cfg["lat_adds"], 10))
    table.add(
        "add_trajectories 1 traj, median (warm RAM)",
        ms(s_add["median_s"]),
        f"copy {ms(s_copy['median_s'])}",
        s_add["median_s"] / s_copy["median_s"],
        key="add_latency",
        cache_size=5,
        zreplay_stats=s_add,
        peer_stats=s_copy,
        first_add_s=t_first,
        traj_raw_bytes=raw_traj_bytes,
    )
    table.add(
        "add_trajectories 1 traj, p90 (warm RAM)",
        ms(s_add["p90_s"]),
        f"copy {ms(s_copy['p90_s'])}",
        s_add["p90_s"] / s_copy["p90_s"],
        key="add_latency_p90",
    )
    table.add(
        "add + flush (1 traj committed), median",
        ms(s_commit["median_s"]),
        "",
        None,
        key="add_flush_latency",
        zreplay_stats=s_commit,
    )

    n = cfg["bp_trajs"]
    per_add = []
    t0 = time.perf_counter()
    for i in range(n):
        a = time.perf_counter()
        buf.add_trajectories([pool[i % POOL]])
        per_add.append(time.perf_counter() - a)
    buf.flush()
    el = time.perf_counter() - t0
    buf.close()
    shutil.rmtree(path)
    s = stats(per_add)
    mb = n * raw_traj_bytes / 1e6
    table.add(
        f"ingest {n} traj + flush, cache_size=5",
        f"{mb / el:.0f} MB/s",
        f"{n * T * B / el:.0f} frames/s",
        None,
        key="ingest_cache5",
        trajectories=n,
        seconds=el,
        mb_per_s=mb / el,
        frames_per_s=n * T * B / el,
        per_add=s,
    )
    table.add(
        "  add latency under backpressure, median/p90",
        f"{s['median_s'] * 1e3:.1f}/{s['p90_s'] * 1e3:.1f} ms",
        "",
        None,
        key="ingest_cache5_latency",
    )


def bench_ingest_ram(cfg, pool, raw_traj_bytes, main_dir: Path, tmp: Path, table: Table):
    """The buffer of the sampling figures: cache_size = every trajectory it will hold, so
    every add writes RAM-tier pages for the first time (first-touch page faults)."""
    n_total = cfg["lat_adds"] + cfg["ingest_trajs"] + 1
    # Image keys in zstd-1: the disk figures compare zreplay's gather with raw TensorStore
    # and zarr-python on the same bytes, and TensorStore cannot read zreplay's image codecs
    # (the default for uint8 frames, store/layout.py); bench_frames measures those.
    frames = {
        k: {"codec": "zstd", "level": 1} for k in ("curr_obs/main_images", "next_obs/main_images")
    }
    buf = TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=str(main_dir),
        cache_size=n_total,
        sample_window_size=0,
        layout=frames,
    )
    buf.add_trajectories([pool[0]])
    buf.flush()
    s_add, s_cold = first_fill_adds(buf, pool, cfg["lat_adds"])
    table.add(
        "add_trajectories 1 traj, median (RAM 1st fill)",
        ms(s_add["median_s"]),
        f"cold copy {ms(s_cold['median_s'])}",
        s_add["median_s"] / s_cold["median_s"],
        key="add_latency_first_fill",
        cache_size=n_total,
        zreplay_stats=s_add,
        peer_stats=s_cold,
    )

    # Sustained ingest, flush included; the writer overlaps with the caller's copies.
    n = cfg["ingest_trajs"]
    per_add = []
    t0 = time.perf_counter()
    for i in range(n):
        a = time.perf_counter()
        buf.add_trajectories([pool[i % POOL]])
        per_add.append(time.perf_counter() - a)
    buf.flush()
    el = time.perf_counter() - t0
    mb = n * raw_traj_bytes / 1e6
    frames = n * T * B

    # Peer: the same raw bytes written uncompressed, one file per trajectory, fsynced.
    raw_dir = tmp / "rawwrite"
    raw_dir.mkdir()
    t0 = time.perf_counter()
    for i in range(n):
        with open(raw_dir / f"{i}.bin", "wb") as fh:
            for _, v in flat_items(pool[i % POOL]):
                fh.write(memoryview(np.ascontiguousarray(v)).cast("B"))
            fh.flush()
            os.fsync(fh.fileno())
    el_raw = time.perf_counter() - t0
    shutil.rmtree(raw_dir)
    table.add(
        f"ingest {n} traj + flush (RAM tier on)",
        f"{mb / el:.0f} MB/s",
        f"raw write+fsync {mb / el_raw:.0f} MB/s",
        el / el_raw,
        key="ingest",
        trajectories=n,
        cache_size=n_total,
        seconds=el,
        mb_per_s=mb / el,
        frames_per_s=frames / el,
        peer_seconds=el_raw,
        per_add=stats(per_add),
    )
    table.add(
        "  same, frames (rows) per second",
        f"{frames / el:.0f} f/s",
        f"raw {frames / el_raw:.0f} f/s",
        el / el_raw,
        key="ingest_frames",
    )
    return buf


def bench_ram_sample(cfg, buf: TrajectoryReplayBuffer, pool, table: Table) -> None:
    st = buf.get_stats()
    n_rows = st["total_samples"]
    if st["rows_in_ram"] < n_rows:
        print(f"WARNING: only {st['rows_in_ram']} of {n_rows} rows are in the RAM tier")
    # Peer: preallocated numpy arrays holding the same number of rows (env-major, as stored).
    keys = [k for k, _ in flat_items(pool[0])]
    peer = {}
    for k, v in flat_items(pool[0]):
        peer[k] = np.empty((n_rows, *v.shape[2:]), v.dtype)
    for i in range(0, n_rows, T * B):
        tr = dict(flat_items(pool[(i // (T * B)) % POOL]))
        for k in keys:
            v = tr[k]
            peer[k][i : i + T * B] = np.swapaxes(v, 0, 1).reshape(T * B, *v.shape[2:])
    rng = np.random.default_rng(7)

    def numpy_gather():
        idx = rng.integers(0, n_rows, SAMPLE_N)
        return {k: a[idx] for k, a in peer.items()}

    sz = repeat(lambda: buf.sample(SAMPLE_N), cfg["ram_repeats"])
    sp = repeat(numpy_gather, cfg["ram_repeats"])
    table.add(
        f"sample({SAMPLE_N}) RAM tier",
        ms(sz["median_s"]),
        f"numpy {ms(sp['median_s'])}",
        sz["median_s"] / sp["median_s"],
        key="sample_ram",
        rows=n_rows,
        rows_in_ram=st["rows_in_ram"],
        zreplay_stats=sz,
        peer_stats=sp,
    )


def bench_disk_sample(cfg, main_dir: Path, table: Table) -> None:
    warmed = warm_page_cache(main_dir)
    buf = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(main_dir), enable_cache=False, sample_window_size=0
    )
    n_rows = buf.total_samples
    keys = list(buf.schema.keys)
    sz = repeat(lambda: buf.sample(SAMPLE_N), cfg["disk_repeats"])
    st = buf.get_stats()
    buf.close()

    view = zreplay.open(main_dir, seed=3)
    sv = repeat(lambda: view.sample(SAMPLE_N), cfg["disk_repeats"])

    rng = np.random.default_rng(11)
    zarr_gather, ts_gather = zarr_and_tensorstore_gathers(main_dir, keys, n_rows, rng, SAMPLE_N)
    sza = repeat(zarr_gather, cfg["zarr_repeats"], warmup=1)
    sts = repeat(ts_gather, cfg["ts_repeats"])
    common = {"rows": n_rows, "rows_in_ram": st["rows_in_ram"], "warmed_bytes": warmed}
    table.add(
        f"sample({SAMPLE_N}) disk, enable_cache=False",
        ms(sz["median_s"]),
        f"zarr oindex {ms(sza['median_s'])}",
        sz["median_s"] / sza["median_s"],
        key="sample_disk_vs_zarr",
        zreplay_stats=sz,
        peer_stats=sza,
        **common,
    )
    table.add(
        f"sample({SAMPLE_N}) disk, enable_cache=False",
        ms(sz["median_s"]),
        f"raw tensorstore {ms(sts['median_s'])}",
        sz["median_s"] / sts["median_s"],
        key="sample_disk_vs_ts",
        peer_stats=sts,
    )
    table.add(
        f"zreplay.open(p).sample({SAMPLE_N}) (view)",
        ms(sv["median_s"]),
        f"raw tensorstore {ms(sts['median_s'])}",
        sv["median_s"] / sts["median_s"],
        key="view_sample_vs_ts",
        zreplay_stats=sv,
    )


def bench_mixed_sample(cfg, pool, main_dir: Path, table: Table) -> None:
    """What mixing costs: the sampling buffer's rows sealed as the offline part, as many
    online rows beside them in a writer's RAM tier, and ``sample(256)`` drawn 50/50 by
    ``samplers.Mixed(0.5)`` against the same buffer drawn by ``Uniform`` over every row
    (about half offline too), each on a writer opened afresh with its RAM tier filled,
    then from two views taking turns call by call."""
    from zreplay.samplers import Mixed, Uniform

    zreplay.seal(main_dir, "default")
    n_off = zreplay.open(main_dir).num_trajectories

    def writer(sampler):
        return TrajectoryReplayBuffer(
            auto_save=True,
            auto_save_path=str(main_dir),
            writer_id="online",
            cache_size=n_off,
            sampler=sampler,
        )

    buf = writer(Uniform())
    for i in range(n_off):
        buf.add_trajectories([pool[i % POOL]])
    buf.close()
    timed = {"mixed": [], "uniform": [], "mixed_small": [], "uniform_small": []}
    samplers = {"mixed": Mixed(0.5), "uniform": Uniform()}
    for name in ("uniform", "mixed", "mixed", "uniform"):  # ABBA: drifts cancel
        buf = writer(samplers[name].unbound_copy())
        deadline = time.perf_counter() + 60
        while buf.get_stats()["rows_in_ram"] < n_off * T * B and time.perf_counter() < deadline:
            time.sleep(0.05)  # the reopened writer refills its RAM tier in the background
        for _ in range(2):  # warm-up
            buf.sample(SAMPLE_N)
        for _ in range(max(2, cfg["disk_repeats"] // 2)):
            t0 = time.perf_counter()
            buf.sample(SAMPLE_N)
            timed[name].append(time.perf_counter() - t0)
        # The draw and one small key (no image decode): what mixing itself adds.
        for _ in range(max(4, cfg["ram_repeats"] // 2)):
            t0 = time.perf_counter()
            buf.core.sample(SAMPLE_N, keys=["rewards"])
            timed[name + "_small"].append(time.perf_counter() - t0)
        buf.close()
    timed = {n: stats(t) for n, t in timed.items()}
    views = {
        n: zreplay.open(main_dir, sampler=s, seed=1)
        for n, s in [("mixed", Mixed(0.5)), ("uniform", Uniform())]
    }
    turns = {"mixed": [], "uniform": []}
    for _ in range(2):  # warm-up
        for v in views.values():
            v.sample(SAMPLE_N)
    for _ in range(cfg["disk_repeats"]):
        for name, v in views.items():
            t0 = time.perf_counter()
            v.sample(SAMPLE_N)
            turns[name].append(time.perf_counter() - t0)
    sv = {n: stats(t) for n, t in turns.items()}
    rows = 2 * n_off * T * B
    small = {"mixed": timed["mixed_small"], "uniform": timed["uniform_small"]}
    for where, got in (("writer", timed), ("writer, rewards only", small), ("view", sv)):
        table.add(
            f"sample({SAMPLE_N}) Mixed(0.5), {where}",
            ms(got["mixed"]["median_s"]),
            f"Uniform {ms(got['uniform']['median_s'])}",
            got["mixed"]["median_s"] / got["uniform"]["median_s"],
            key="sample_mixed_" + where.replace(", ", "_").replace(" ", "_"),
            rows=rows,
            offline_rows=rows // 2,
            zreplay_stats=got["mixed"],
            peer_stats=got["uniform"],
        )


def bench_compression(main_dir: Path, table: Table) -> None:
    view = zreplay.open(main_dir)
    n_rows = view.num_rows
    data = main_dir / "segments" / "default" / "data"
    tot_raw = tot_disk = 0
    per_key = {}
    for k in view.keys():
        spec = view.schema.specs[k]
        raw = n_rows * spec.row_bytes
        disk = dir_bytes(data / k)
        tot_raw += raw
        tot_disk += disk
        per_key[k] = {"raw_bytes": raw, "disk_bytes": disk, "compression": raw / max(1, disk)}
    everything = dir_bytes(main_dir)
    for k, d in per_key.items():
        table.add(
            f"disk {k}",
            f"{d['disk_bytes'] / 1e6:.2f} MB",
            f"raw {d['raw_bytes'] / 1e6:.2f} MB",
            d["compression"],
            key=f"bytes/{k}",
            **d,
        )
    table.add(
        "disk all data keys",
        f"{tot_disk / 1e6:.1f} MB",
        f"raw {tot_raw / 1e6:.1f} MB",
        tot_raw / max(1, tot_disk),
        key="bytes/total",
        raw_bytes=tot_raw,
        disk_bytes=tot_disk,
        buffer_dir_bytes=everything,
        rows=n_rows,
    )


def build_small(path: Path, n: int, budget_s: float) -> tuple[int, float]:
    tr = small_trajectory(5)
    buf = TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), cache_size=1000, sample_window_size=0
    )
    t0 = time.perf_counter()
    done = 0
    while done < n:
        k = min(500, n - done)
        buf.add_trajectories([tr] * k)
        done += k
        if time.perf_counter() - t0 > budget_s:
            break
    buf.close()
    return done, time.perf_counter() - t0


def bench_open(cfg, tmp: Path, table: Table) -> None:
    reps = cfg["open_repeats"]
    base = [run_child("baseline", tmp) for _ in range(reps)]
    base_kb = float(np.median([b["maxrss_kb"] for b in base]))
    for n in cfg["open_sizes"]:
        path = tmp / f"open_{n}"
        built, build_s = build_small(path, n, cfg["build_budget_s"])
        note = "" if built == n else f" (build stopped at {built} after {build_s:.0f}s)"
        for mode, label in (("view", "zreplay.open"), ("buffer", "TrajectoryReplayBuffer")):
            runs = [run_child(mode, path) for _ in range(reps)]
            t = float(np.median([r["seconds"] for r in runs]))
            rss_kb = float(np.median([r["maxrss_kb"] for r in runs])) - base_kb
            vm_kb = float(np.median([r["vmrss_delta_kb"] for r in runs]))
            assert all(r["n"] == built for r in runs), runs
            table.add(
                f"open {built // 1000}k traj: {label}{note}",
                ms(t),
                f"peak RSS +{rss_kb / 1024:.1f} MB (RSS +{vm_kb / 1024:.1f})",
                None,
                key=f"open/{mode}/{n}",
                trajectories=built,
                rows=built * SMALL_T * SMALL_B,
                build_seconds=build_s,
                seconds_runs=[r["seconds"] for r in runs],
                seconds=t,
                rss_delta_kb=rss_kb,
                vmrss_delta_kb=vm_kb,
                baseline_rss_kb=base_kb,
                disk_bytes=dir_bytes(path),
            )
        shutil.rmtree(path)


# -- main -------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="small CI smoke run (< 30 s)")
    ap.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})"
    )
    ap.add_argument(
        "--tmpdir", type=Path, default=None, help="where to build buffers (default: system temp)"
    )
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for other processes to go quiet before starting",
    )
    args = ap.parse_args(argv)
    mode = "quick" if args.quick else "default"
    cfg = CONFIGS[mode]
    t_start = time.perf_counter()
    info = machine_info()
    print(
        f"zreplay foundation benchmark ({mode}) on {info['cpu_model']}, {info['cores']} cores, "
        f"{info['mem_total_gib']} GiB, python {info['python']}, "
        + ", ".join(f"{k} {v}" for k, v in info["versions"].items())
    )

    t0 = time.perf_counter()
    pool = [make_trajectory(1000 + i) for i in range(POOL)]
    raw_traj_bytes = tree_nbytes(pool[0])
    print(
        f"workload: T={T} B={B}, {raw_traj_bytes / 1e6:.2f} MB raw per trajectory, "
        f"{POOL} distinct trajectories generated in {time.perf_counter() - t0:.1f}s\n"
    )
    table = Table()
    tmp = Path(tempfile.mkdtemp(prefix="zreplay-bench-", dir=args.tmpdir))
    sections = {}

    def run(name, fn, *a):
        meter = CpuMeter().start()
        out = fn(*a)
        sections[name] = meter.stop()
        return out

    deadline = time.perf_counter() + args.wait_idle
    while True:
        idle = CpuMeter().start()
        time.sleep(1.0)
        sections["idle_check"] = idle.stop()
        if sections["idle_check"]["foreign_cpu_cores"] <= 0.2 or time.perf_counter() > deadline:
            break
    if sections["idle_check"]["foreign_cpu_cores"] > 0.2:
        print(
            f"WARNING: other processes use {sections['idle_check']['foreign_cpu_cores']:.2f} "
            "cores right now; figures will be noisy"
        )
    print(table.header(), flush=True)
    try:
        main_dir = tmp / "main"
        run("ingest_warm", bench_ingest_warm, cfg, pool, raw_traj_bytes, tmp, table)
        buf = run("ingest_ram", bench_ingest_ram, cfg, pool, raw_traj_bytes, main_dir, tmp, table)
        run("sample_ram", bench_ram_sample, cfg, buf, pool, table)
        buf.close()
        del buf
        run("sample_disk", bench_disk_sample, cfg, main_dir, table)
        run("compression", bench_compression, main_dir, table)
        run("sample_mixed", bench_mixed_sample, cfg, pool, main_dir, table)
        shutil.rmtree(main_dir)
        run("open", bench_open, cfg, tmp, table)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    total = time.perf_counter() - t_start
    foreign = {k: round(v["foreign_cpu_cores"], 2) for k, v in sections.items()}
    print(f"\ntotal {total:.1f}s, parent peak RSS {peak_rss_mb():.0f} MB")
    print(f"CPU used by other processes per section (cores): {foreign}")

    result = {
        "benchmark": "foundation",
        "mode": mode,
        "config": cfg,
        "workload": {
            "T": T,
            "B": B,
            "image": [H, W, 3],
            "sample_n": SAMPLE_N,
            "traj_raw_bytes": raw_traj_bytes,
            "keys": {k: [str(v.dtype), list(v.shape)] for k, v in flat_items(pool[0])},
            "small_schema": {"T": SMALL_T, "B": SMALL_B},
        },
        "machine": info,
        "total_s": total,
        "sections": sections,
        "parent_peak_rss_mb": peak_rss_mb(),
        "ratio_definition": "zreplay time / peer time (>1: zreplay slower); bytes rows: raw / disk",
        "table": table.text(),
        "rows": table.rows,
    }
    write_json(args.out, result, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
