"""The two peer read paths over zreplay's own arrays, shared by both benchmark scripts.

Imports neither zreplay nor torch, so benchmark children that load it start fast.
"""

from __future__ import annotations

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
