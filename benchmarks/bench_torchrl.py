"""``zreplay.torchrl.ZarrStorage`` beside TorchRL's own storages, inside TorchRL's
``TensorDictReplayBuffer``, on the same data.

Systems: ``LazyTensorStorage`` (RAM), ``LazyMemmapStorage`` (uncompressed memory-mapped
files), ``ZarrStorage`` (default RAM tier of 1 GiB: every row of these workloads stays
decoded in RAM too) and ``ZarrStorage`` with ``ram_budget_bytes=0`` (committed rows are
read from disk; the page cache is warm, as after a fill) and ``ZarrStorage`` with
``flush_each_extend=True`` (each extend returns once its rows are committed and fsynced:
what a ``kill -9`` cannot lose).

Workloads (rows of a TensorDict, ``episode`` = row // 100):

* ``pixels``: ``pixels`` uint8 [84, 84, 3] synthetic Atari-like frames (a fixed playfield,
  three moving blocks, 2% noise pixels), ``action`` int64, ``reward`` float32 [1],
  ``("next", "done")`` bool [1]; 20k rows (4k with ``--quick``);
* ``vectors``: SAC-like ``observation`` and ``("next", "observation")`` float32 [17],
  ``action`` float32 [6], ``reward`` float32 [1], ``("next", "done")`` bool [1]; 500k rows
  (50k with ``--quick``).

Figures, each system in a fresh child process, one after another: ``extend`` of the whole
workload in batches of 1,000 rows (rows/s; ZarrStorage also until everything is committed
and fsynced: ``flush()``); ``sample()`` of 256 rows with ``RandomSampler``; ``sample()`` of
8 slices of 32 steps with ``SliceSampler(traj_key="episode")`` (boundaries recomputed each
call, TorchRL's default); bytes on disk.  Medians over ``--repeats`` calls after 3 warm-up
calls; torch runs one intra-op thread in every child (``--torch-threads``: on a busy
2-core machine two threads made TorchRL's own gathers 100x slower).  Ratios compare
systems of the same run; the machine's load is in the JSON and under the table.

    python benchmarks/bench_torchrl.py [--quick] [--out results/bench_torchrl.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import benchlib
import numpy as np

SYSTEMS = (
    "LazyTensorStorage",
    "LazyMemmapStorage",
    "ZarrStorage",
    "ZarrStorage (disk)",
    "ZarrStorage (flush each)",
)
WORKLOADS = {"pixels": (20_000, 4_000), "vectors": (500_000, 50_000)}
BATCH, SAMPLE, SLICE_LEN, EPISODE = 1_000, 256, 32, 100


def make_rows(kind: str, start: int, n: int):
    """Rows ``[start, start + n)`` of a workload as a TensorDict (deterministic)."""
    import torch
    from tensordict import TensorDict

    g = torch.arange(start, start + n)
    rng = np.random.default_rng(start)
    done = ((g + 1) % EPISODE == 0).unsqueeze(-1)
    if kind == "pixels":
        frames = np.empty((n, 84, 84, 3), np.uint8)
        frames[:] = 40
        frames[:, 70:, :, :] = 120  # floor
        for j, t in enumerate(range(start, start + n)):
            for b in range(3):  # blocks moving at different speeds
                y, x = (t * (b + 1) * 3) % 70, (t * (b + 2) * 5) % 76
                frames[j, y : y + 8, x : x + 8, b] = 220
        noise = rng.random(frames.shape[:3]) < 0.02
        frames[noise] = rng.integers(0, 255, (int(noise.sum()), 3), dtype=np.uint8)
        data = {
            "pixels": torch.from_numpy(frames),
            "action": torch.from_numpy(rng.integers(0, 6, n)),
            "reward": torch.from_numpy(rng.random((n, 1), np.float32)),
        }
    else:
        obs = torch.from_numpy(rng.standard_normal((n, 17)).astype(np.float32))
        data = {
            "observation": obs,
            ("next", "observation"): obs + 0.01,
            "action": torch.from_numpy(rng.standard_normal((n, 6)).astype(np.float32)),
            "reward": torch.from_numpy(rng.random((n, 1), np.float32)),
        }
    data["episode"] = g // EPISODE
    data[("next", "done")] = done
    return TensorDict(data, batch_size=[n])


def storage_for(system: str, M: int, wdir: Path):
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage

    from zreplay.torchrl import ZarrStorage

    if system == "LazyTensorStorage":
        return LazyTensorStorage(M)
    if system == "LazyMemmapStorage":
        return LazyMemmapStorage(M, scratch_dir=str(wdir / "memmap"))
    if system == "ZarrStorage":
        return ZarrStorage(M, path=wdir / "zarr")
    if system == "ZarrStorage (flush each)":
        return ZarrStorage(M, path=wdir / "zarr", flush_each_extend=True)
    return ZarrStorage(M, path=wdir / "zarr", ram_budget_bytes=0)


def child(job: dict) -> dict:
    """One system, one workload: fill, sample, size."""
    import logging

    import torch
    from torchrl._utils import logger as torchrl_logger
    from torchrl.data import TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import RandomSampler, SliceSampler

    torchrl_logger.setLevel(logging.WARNING)
    # torch's intra-op threads: with 2 on a busy 2-core VM, one random gather of 256 rows
    # waited ~15 ms for a descheduled thread (~0.1 ms with 1); zreplay's gathers are numpy.
    torch.set_num_threads(job["torch_threads"])
    torch.manual_seed(0)
    benchlib.warm_allocator()
    system, kind, M, repeats = job["system"], job["workload"], job["rows"], job["repeats"]
    wdir = Path(job["wdir"]) / f"{kind}-{system.replace(' ', '_')}"
    shutil.rmtree(wdir, ignore_errors=True)
    wdir.mkdir(parents=True)
    batches = [make_rows(kind, a, min(BATCH, M - a)) for a in range(0, M, BATCH)]
    storage = storage_for(system, M, wdir)
    rb = TensorDictReplayBuffer(storage=storage, sampler=RandomSampler(), batch_size=SAMPLE)
    out = {"row_bytes": sum(v[0].numel() * v.element_size() for v in batches[0].values(True, True))}
    t0 = time.perf_counter()
    for b in batches:
        rb.extend(b)
    out["extend_s"] = time.perf_counter() - t0
    if hasattr(storage, "flush"):
        storage.flush()
        out["extend_flush_s"] = time.perf_counter() - t0
    del batches
    gc.collect()
    out["rows"] = len(rb)
    out["sample_random"] = benchlib.repeat(lambda: rb.sample(), repeats, warmup=3)
    sl = TensorDictReplayBuffer(
        storage=storage, sampler=SliceSampler(slice_len=SLICE_LEN, traj_key="episode"),
        batch_size=SAMPLE,
    )  # fmt: skip
    out["sample_slices"] = benchlib.repeat(lambda: sl.sample(), repeats, warmup=3)
    got = sl.sample()
    assert got["episode"].shape == (SAMPLE,) and got["next", "done"].dtype == torch.bool
    out["disk_bytes"] = benchlib.dir_bytes(wdir)
    out["process_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if hasattr(storage, "close"):
        storage.close()
    shutil.rmtree(wdir, ignore_errors=True)
    return out


def rate(res: dict, key: str) -> float | None:
    return res["rows"] / res[key] if key in res and res.get(key) else None


def table(results: dict) -> str:
    """Markdown: one row per workload and figure, one column per system, same-run ratios."""
    head = ["workload", "figure", *SYSTEMS, "Zarr / LazyTensor", "Zarr / LazyMemmap"]
    head.append("flush each / LazyMemmap")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(v, unit):
        if v is None:
            return "n/a"
        if unit == "rows/s":
            return f"{v / 1e3:.0f}k rows/s"
        if unit == "bytes":
            return "0 (RAM)" if v == 0 else f"{v / 1e6:.1f} MB"
        return benchlib.fmt_time(v)

    for kind, per in results.items():
        figures = [
            ("extend (rows/s)", lambda r: rate(r, "extend_s"), "rows/s"),
            ("extend + flush (rows/s)", lambda r: rate(r, "extend_flush_s"), "rows/s"),
            ("sample(256), RandomSampler", lambda r: benchlib.med(r.get("sample_random")), "s"),
            ("sample 8x32, SliceSampler", lambda r: benchlib.med(r.get("sample_slices")), "s"),
            ("disk bytes", lambda r: r.get("disk_bytes"), "bytes"),
        ]
        for name, get, unit in figures:
            vals = {s: (get(per[s]) if "error" not in per[s] else None) for s in SYSTEMS}
            if name.startswith("extend + flush"):  # TorchRL's storages have no flush
                vals["LazyTensorStorage"] = vals["LazyMemmapStorage"] = None
            z = vals["ZarrStorage"]
            rats = [
                benchlib.ratio(z, vals["LazyTensorStorage"]),
                benchlib.ratio(z, vals["LazyMemmapStorage"]),
                benchlib.ratio(vals["ZarrStorage (flush each)"], vals["LazyMemmapStorage"]),
            ]
            row = [kind, name, *(cell(vals[s], unit) for s in SYSTEMS)]
            row += ["n/a" if r is None else f"{r:.2f}x" for r in rats]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small workloads, few repeats")
    ap.add_argument("--repeats", type=int, default=None, help="timed sample() calls (50)")
    ap.add_argument(
        "--out", type=Path, default=benchlib.HERE / "results" / "latest" / "bench_torchrl.json"
    )
    ap.add_argument("--torch-threads", type=int, default=1, help="torch.set_num_threads (1)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        job = json.loads(Path(args.child).read_text())
        try:
            res = child(job)
        except Exception as e:  # noqa: BLE001 - reported by the parent
            res = {"error": repr(e), "traceback": traceback.format_exc()}
        Path(job["out"]).write_text(json.dumps(res))
        return
    info = benchlib.describe_machine("bench_torchrl", ["torchrl", "tensordict"])
    repeats = args.repeats or (10 if args.quick else 50)
    results, sections = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench_torchrl-") as wdir:
        for kind, (full, quick) in WORKLOADS.items():
            rows = quick if args.quick else full
            results[kind] = {}
            for system in SYSTEMS:
                job = {
                    "workload": kind,
                    "rows": rows,
                    "repeats": repeats,
                    "tag": f"{kind}-{system}",
                    "torch_threads": args.torch_threads,
                }
                t0 = time.perf_counter()
                res, sec = benchlib.run_child_job(__file__, system, job, wdir)
                sections[f"{kind}/{system}"] = {**sec, "loadavg": os.getloadavg()}
                results[kind][system] = res
                print(
                    f"  {kind:<8} {system:<20} {time.perf_counter() - t0:6.1f}s (other "
                    f"processes {sec['foreign_cpu_cores']:.2f} cores)",
                    flush=True,
                )
    text = table(results)
    load = {k: round(v["foreign_cpu_cores"], 2) for k, v in sections.items()}
    print("\n" + text + "\n")
    print(f"load average at the end: {os.getloadavg()}; other processes' cores per run: {load}")
    benchlib.write_json(
        args.out,
        {
            "machine": info,
            "quick": args.quick,
            "repeats": repeats,
            "torch_threads": args.torch_threads,
            "workloads": {k: v[1] if args.quick else v[0] for k, v in WORKLOADS.items()},
            "results": results,
            "sections": sections,
            "table_markdown": text,
            "argv": sys.argv,
        },
    )


if __name__ == "__main__":
    main()
