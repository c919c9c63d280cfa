"""Opening a buffer interrupted at any point: a creation killed part way is finished by
the next writer (and reported by ``verify`` until then)."""

from __future__ import annotations

import os

import numpy as np
import zarr
from conftest import processes
from faultlib import CRASH_STATUS, Faults

import zreplay


def _traj(i: int) -> dict:
    return {"obs": np.full((4, 2, 3), i, np.float32), "rewards": np.zeros((4, 2), np.float32)}


def _create(path: str) -> None:
    zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path).close()


def _create_killed_at(path: str, at: int) -> None:
    with Faults(at, "crash").installed():
        _create(path)


def test_a_creation_killed_at_any_write_is_finished_by_the_next_writer(tmp_path):
    with Faults().installed() as count:
        _create(str(tmp_path / "count"))
    assert count.calls > 5
    ctx = processes()
    for at in range(1, count.calls + 1):
        path = str(tmp_path / f"b{at}")
        p = ctx.Process(target=_create_killed_at, args=(path, at))
        p.start()
        p.join(120)
        assert p.exitcode == CRASH_STATUS, f"call {at}: exit code {p.exitcode}"
        root_made = os.path.isfile(os.path.join(path, "zarr.json"))
        unfinished = not all(
            os.path.isfile(os.path.join(path, *rel, "zarr.json"))
            for rel in [("segments",), ("zreplay",)]
        )
        if root_made:
            report = zreplay.verify(path)
            assert report.ok != unfinished, f"call {at}: {report}"
            if unfinished:
                assert "creation was interrupted" in str(report), f"call {at}: {report}"
        with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as buf:
            buf.add_trajectories([_traj(1), _traj(2)])
            buf.save_checkpoint(str(tmp_path / f"ckpt{at}"))
        assert zreplay.verify(path).ok, f"call {at}: {zreplay.verify(path)}"
        group = zarr.open_group(path, mode="r")
        assert {name for name, _ in group.members()} >= {"segments", "zreplay"}, f"call {at}"
        assert zreplay.open(path).num_trajectories == 2, f"call {at}"
        assert zreplay.open(str(tmp_path / f"ckpt{at}")).num_trajectories == 2, f"call {at}"
