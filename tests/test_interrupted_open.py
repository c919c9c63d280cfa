"""Opening a buffer interrupted at any point: a creation killed part way is finished by
the next writer (and reported by ``verify`` until then); a Ctrl-C in the first open (which
imports TensorStore) can be retried."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

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


# A SIGINT arrives while TensorStore's native module initialises (it imports ml_dtypes
# from there): the moment a notebook user's Ctrl-C lands in the first open.
INTERRUPTED_IMPORT = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np
    import zreplay
    assert "tensorstore" not in sys.modules

    class Interrupt:
        fired = False
        def find_spec(self, name, path=None, target=None):
            if name == "ml_dtypes" and not Interrupt.fired:
                Interrupt.fired = True
                os.kill(os.getpid(), signal.SIGINT)
            return None

    sys.meta_path.insert(0, Interrupt())
    path = sys.argv[1]
    traj = {"obs": np.zeros((4, 2, 3), np.float32), "rewards": np.zeros((4, 2), np.float32)}
    try:
        with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as buf:
            buf.add_trajectories([traj])
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    assert Interrupt.fired
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as buf:
        buf.add_trajectories([traj])
    print("retried", zreplay.open(path).num_trajectories, flush=True)
    """
)


def test_a_ctrl_c_in_the_first_open_can_be_retried(tmp_path):
    got = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_IMPORT, str(tmp_path / "buf")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 0, got.stdout + got.stderr
    assert got.stdout.split() == ["interrupted", "retried", "1"], got.stdout + got.stderr
