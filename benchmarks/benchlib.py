"""Helpers shared by the benchmark scripts: timing statistics, file walks, and the peer
read paths over zreplay's own arrays.

Imports neither zreplay nor torch, so benchmark children that load it start fast.
"""

from __future__ import annotations

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
