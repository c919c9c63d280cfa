"""Exports: HDF5 dumps as h5py itself writes them, appends continuing a partial chunk, and
one .pt file per trajectory (RLinf's files: test_rlinf_files.py; the command line's:
test_cli.py)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from test_read_path import flat

import zreplay


def _episodes(path: Path) -> list[dict]:
    return [flat(e) for e in zreplay.iter_hdf5(path)]


@pytest.mark.parametrize("compression", ["gzip", None, "lzf"])
def test_hdf5_dump_is_what_h5py_itself_writes(stored, tmp_path, compression):
    view = zreplay.open(stored)
    out = tmp_path / "e.h5"
    ticks = []
    zreplay.dump(view, out, compression=compression, progress=ticks.append)
    assert sum(ticks) == view.num_episodes
    eps = _episodes(out)
    assert len(eps) == view.num_episodes
    for e in (0, 5, view.num_episodes - 1):
        ref = flat(view.episode(e))
        assert all(np.array_equal(eps[e][k], ref[k]) for k in ref)
    with h5py.File(out) as f:
        ds = f["curr_obs.states"]  # nested keys are root datasets named with "."
        assert ds.compression == compression and ds.shuffle == bool(compression)
        assert ds.chunks[0] > 1
        # the same data written by h5py reads back identically through the same filters
        ref = tmp_path / "ref.h5"
        with h5py.File(ref, "w") as g:
            kw = {"compression": compression, "shuffle": True} if compression else {}
            g.create_dataset("x", data=ds[:], chunks=ds.chunks, maxshape=ds.maxshape, **kw)
        with h5py.File(ref) as g:
            assert np.array_equal(g["x"][:], ds[:]) and g["x"].shuffle == ds.shuffle


def test_hdf5_append_continues_a_partial_chunk(stored, tmp_path):
    view = zreplay.open(stored)
    out = tmp_path / "e.h5"
    zreplay.dump(view, out)
    zreplay.dump(view, out, mode="append")
    eps = _episodes(out)
    n = view.num_episodes
    assert len(eps) == 2 * n
    for e in (0, n - 1):
        assert all(np.array_equal(eps[e][k], eps[n + e][k]) for k in eps[e])
    with h5py.File(out) as f:
        assert f["ep_offset"][n] == f["ep_len"][:n].sum()


def test_export_pt_writes_every_trajectory(stored, tmp_path):
    import torch

    view = zreplay.open(stored)
    from zreplay.compat.rlinf_files import export_rlinf

    assert export_rlinf(view.core, tmp_path / "r", "pt", 1) == 12
    files = sorted((tmp_path / "r").glob("trajectory_*.pt"))
    assert len(files) == 12 and not list((tmp_path / "r").glob("*.tmp"))
    t5 = torch.load(next(f for f in files if f.name.startswith("trajectory_5_")), weights_only=True)
    assert np.array_equal(t5["rewards"].numpy(), view.trajectory(5)["rewards"])
