"""Helpers shared by the benchmark scripts: timing statistics, file walks, and the peer
read paths over zreplay's own arrays.

Imports neither zreplay nor torch, so benchmark children that load it start fast.
"""

from __future__ import annotations

import json
import os
import resource
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np


def zarr_and_tensorstore_gathers(
    path: Path, keys: list[str], n_rows: int, rng: np.random.Generator, sample_n: int
) -> tuple[Callable[[], dict], Callable[[], dict]]:
    """``(zarr_gather, ts_gather)``: each draws ``sample_n`` uniform rows of a zreplay buffer
    at ``path`` (segment ``default``) and reads every key the way a careful user would:
    zarr-python one ``oindex`` per key, raw TensorStore with every key's read issued before
    waiting; both on sorted unique rows, then scattered back with the inverse indices."""
    import tensorstore as ts
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr lists commit.json as an unknown node
        g = zarr.open_group(str(path), mode="r")
        zarrs = {k: g[f"segments/default/data/{k}"] for k in keys}
    stores = {
        k: ts.open(
            {
                "driver": "zarr3",
                "kvstore": {
                    "driver": "file",
                    "path": str(Path(path) / "segments/default/data" / k),
                },
            }
        ).result()
        for k in keys
    }

    def zarr_gather():
        idx = rng.integers(0, n_rows, sample_n)
        uniq, inv = np.unique(idx, return_inverse=True)
        return {k: a.oindex[uniq][inv] for k, a in zarrs.items()}

    def ts_gather():
        idx = rng.integers(0, n_rows, sample_n)
        uniq, inv = np.unique(idx, return_inverse=True)
        futs = {k: s[uniq].read() for k, s in stores.items()}
        return {k: f.result()[inv] for k, f in futs.items()}

    return zarr_gather, ts_gather


def stats(seconds: list[float]) -> dict:
    """Median, p90, min, mean and count of durations in seconds."""
    a = np.asarray(seconds, np.float64)
    return {
        "median_s": float(np.median(a)),
        "p90_s": float(np.percentile(a, 90)),
        "min_s": float(a.min()),
        "mean_s": float(a.mean()),
        "n": int(len(a)),
    }


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def repeat(fn, repeats: int, warmup: int = 2) -> dict:
    """Stats of ``fn()`` over ``repeats`` calls after ``warmup`` untimed calls,
    plus the minor page faults per call (fresh pages touched: on this VM ~2 us each)."""
    for _ in range(warmup):
        fn()
    out = []
    f0 = minor_faults()
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return {**stats(out), "minflt_per_call": (minor_faults() - f0) / repeats}


def files_under(paths) -> list[str]:
    out = []
    for p in paths:
        p = str(p)
        if os.path.isfile(p):
            out.append(p)
            continue
        for dirpath, _dirs, files in os.walk(p):
            out.extend(os.path.join(dirpath, f) for f in files)
    return out


def dir_bytes(path) -> int:
    """Apparent size of every file under ``path``."""
    total = 0
    for f in files_under([path]):
        try:
            total += os.path.getsize(f)
        except FileNotFoundError:
            pass
    return total


def warm_page_cache(path) -> int:
    """Read every file under ``path`` once; returns the bytes read."""
    n = 0
    for f in files_under([path]):
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                n += len(chunk)
    return n


def nest(flat: dict) -> dict:
    """``{"a/b": v}`` -> ``{"a": {"b": v}}`` (zreplay and TensorDict take nested dicts)."""
    out: dict = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def describe_machine(title: str, extra_packages) -> dict:
    """Machine facts plus versions of ``extra_packages``; prints a one-line header."""
    import importlib.metadata

    from bench_foundation import machine_info

    info = machine_info()
    for pkg in extra_packages:
        try:
            info["versions"][pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            info["versions"][pkg] = None
    print(
        f"{title} on {info['cpu_model']}, {info['cores']} cores, "
        f"{info['mem_total_gib']} GiB, python {info['python']}, "
        + ", ".join(f"{k} {v}" for k, v in info["versions"].items()),
        flush=True,
    )
    return info


def run_child_job(script: str, system: str, job: dict, wdir) -> tuple[dict, dict]:
    """Run ``python script --child job.json`` (the system measured in a fresh process);
    returns its JSON result (``{"error", "stderr_tail"}`` on failure) and the CPU section
    measured around it (``CpuMeter``: other processes' load meanwhile)."""
    import subprocess
    import sys

    from bench_foundation import CpuMeter

    tag = job.get("tag", system)
    job_path, out = Path(wdir) / f"job_{tag}.json", Path(wdir) / f"res_{tag}.json"
    job = {**job, "system": system, "wdir": str(wdir), "out": str(out)}
    job_path.write_text(json.dumps(job))
    out.unlink(missing_ok=True)
    meter = CpuMeter().start()
    r = subprocess.run(
        [sys.executable, str(Path(script).resolve()), "--child", str(job_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    section = meter.stop()
    res = json.loads(out.read_text()) if out.exists() else {}
    if r.returncode != 0 or not res or "error" in res:
        res.setdefault("error", f"child exited {r.returncode} without a result")
        res["stderr_tail"] = r.stderr[-3000:]
        print(f"  {system}: ERROR {res['error']}\n{res.get('traceback', r.stderr[-1500:])}")
    return res, section


def run_undisturbed(system: str, run, args, cfg: dict, idle: dict, disturbed: dict, note=None):
    """``run() -> (result, section)`` after waiting for an idle machine; once more if other
    processes used more than ``cfg["retry_if_foreign_cores"]`` cores meanwhile (the
    disturbed first section is kept in ``disturbed``).  ``note(result)`` adds to the line."""
    from bench_peers import wait_idle

    for attempt in (0, 1):
        if args.wait_idle > 0:
            idle[system] = wait_idle(min(args.wait_idle, cfg["idle_each_s"]))
        t0 = time.perf_counter()
        res, sec = run()
        print(
            f"  {system:<15} {time.perf_counter() - t0:6.1f}s  (other processes "
            f"{sec['foreign_cpu_cores']:.2f} cores, child peak RSS "
            f"{res.get('process_peak_rss_mb', 0):.0f} MB{note(res) if note else ''})",
            flush=True,
        )
        if (
            attempt == 0
            and args.wait_idle > 0
            and sec["foreign_cpu_cores"] > cfg["retry_if_foreign_cores"]
        ):
            disturbed[system] = sec
            print(f"  {system}: disturbed by other processes; running it again")
            continue
        return res, sec


def write_json(path, result: dict, indent: int = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=indent, default=float))
    print(f"wrote {path}")
