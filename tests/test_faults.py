"""A full disk: writes that fail for real, in a child process, then succeed again.

The child lowers its RLIMIT_FSIZE (with SIGXFSZ ignored) so that every write of a file
past the limit fails with EFBIG, exactly as a write into a full disk fails with ENOSPC,
including the short write first; raising the limit again is "space is back".  Each
scenario picks a limit that lets some files of the write through and stops others.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time

import numpy as np
import pytest
from conftest import check_rows, make_traj, run_children, traj_equal

import zreplay
from zreplay import WriteFailedError


@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """Files of this process cannot grow past ``nbytes`` inside the block."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def temp_files(path) -> list[str]:
    return [
        f
        for _, _, fs in os.walk(path)
        for f in fs
        if f.endswith((".partial", ".tmp", ".__lock")) or ".tmp" in f
    ]


def assert_committed(path, trajs) -> None:
    """A reader in another process would see exactly ``trajs``, bit for bit."""
    view = zreplay.open(path)
    assert view.num_trajectories == len(trajs)
    for i, t in enumerate(trajs):
        traj_equal(view.trajectory(i), t)
    report = zreplay.verify(path)
    assert report.ok, str(report)


SMALL = {"x": {"chunk_rows": 8, "shard_rows": 32}}  # shard files of ~110-130 bytes


def _tiny(i: int, T: int = 4) -> dict:
    return {"x": np.full((T, 2, 1), i, np.uint8)}


def _tiny_equal(view, n: int, T: int = 4) -> None:
    assert view.num_trajectories == n
    for i in range(n):
        np.testing.assert_array_equal(view.trajectory(i)["x"], _tiny(i, T)["x"])


def _shards_fail(path: str) -> None:
    """Data shards cannot be written (the image shards pass 2000 bytes; index chunks,
    zarr.json and commit.json fit): the error surfaces, added data waits in RAM."""
    made: dict[int, dict] = {}  # as many as the failure takes to surface (a loaded machine: more)

    def traj(i: int) -> dict:
        return made[i] if i in made else made.setdefault(i, make_traj(i))

    def first(n: int) -> list:
        return [traj(i) for i in range(n)]

    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path, cache_size=20)
    buf.add_trajectories(first(3))
    buf.flush()
    with file_size_limit(2000):
        assert buf.add_trajectories([traj(3)]) == [3]  # into RAM; the commit will fail
        deadline = time.monotonic() + 10
        k = 4
        while True:  # the first add after the failure reports it and adds nothing
            try:
                assert buf.add_trajectories([traj(k)]) == [k]
            except WriteFailedError as e:
                assert "File too large" in str(e) and "gen " in str(e)
                assert isinstance(e.__cause__, (OSError, ValueError))
                break
            k += 1
            assert time.monotonic() < deadline, "the failed commit was never reported"
            time.sleep(0.01)
        assert len(buf) == k  # trajectory k was refused
        assert_committed(path, first(3))  # the last commit; nothing of the failed one
        check_rows(buf.sample(200))  # in-process sampling still sees everything added
        # The next add retries in the background (the failure was reported) and succeeds.
        assert buf.add_trajectories([traj(k)]) == [k]
        with pytest.raises(WriteFailedError, match="File too large"):
            buf.flush()  # still full: the retry failed too
        with pytest.raises(WriteFailedError):
            buf.flush()
        assert_committed(path, first(3))
    buf.flush()  # space is back
    assert_committed(path, first(k + 1))
    buf.add_trajectories([traj(k + 1)])
    buf.close()
    assert_committed(path, first(k + 2))
    assert temp_files(path) == []


def _commit_record_fails(path: str) -> None:
    """Data, index and array metadata (each file < 600 bytes) are written, the commit
    record (~710 bytes: it names its long writer id) is not: it must never be published
    half-written, nor leave its temp file."""
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, layout=SMALL, writer_id="w" * 120
    )
    buf.add_trajectories([_tiny(0), _tiny(1)])
    buf.flush()
    with file_size_limit(600):
        buf.add_trajectories([_tiny(2)])
        with pytest.raises(WriteFailedError, match="File too large") as e:
            buf.flush()
        assert "commit.json" in str(e.value)
        _tiny_equal(zreplay.open(path), 2)
        assert temp_files(path) == []
    buf.flush()
    _tiny_equal(zreplay.open(path), 3)
    buf.close()
    assert zreplay.verify(path).ok


def _growth_fails(path: str) -> None:
    """Growing the arrays for a commit fails (TensorStore rewrites the array's zarr.json,
    ~470 bytes, before every commit); data and index chunks would fit."""
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path, layout=SMALL)
    buf.add_trajectories([_tiny(i) for i in range(4)])  # 32 rows: a whole shard
    buf.flush()
    with file_size_limit(300):
        buf.add_trajectories([_tiny(4)])
        with pytest.raises(WriteFailedError, match="File too large") as e:
            buf.flush()
        assert "data/x/zarr.json" in str(e.value)
        _tiny_equal(zreplay.open(path), 4)
    buf.flush()
    buf.add_trajectories([_tiny(5)])
    buf.close()
    _tiny_equal(zreplay.open(path), 6)
    assert zreplay.verify(path).ok and temp_files(path) == []


def _creation_fails(path: str) -> None:
    """The first add of a new buffer cannot create its arrays (the root's zarr.json with
    the schema fits in 500 bytes, array metadata does not): a clear error, nothing added,
    and the next add completes the half-created segment."""
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path)
    with file_size_limit(500):
        with pytest.raises(WriteFailedError, match="could not create the arrays"):
            buf.add_trajectories([_tiny(0)])
        assert len(buf) == 0 and buf.schema is None
        with pytest.raises(WriteFailedError):
            buf.add_trajectories([_tiny(0)])
    assert buf.add_trajectories([_tiny(0), _tiny(1)]) == [0, 1]
    buf.close()
    _tiny_equal(zreplay.open(path), 2)
    assert zreplay.verify(path).ok and temp_files(path) == []


def _lock_fails(path: str) -> None:
    """The writer lock (~100 bytes of JSON) cannot be written: opening fails and leaves
    no half-written lock, which any other writer would take for a stale one."""
    zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path).close()
    lock = os.path.join(path, "segments", "default", "zreplay", "writer.lock")
    with file_size_limit(50):
        with pytest.raises(OSError, match="File too large: .*writer.lock"):
            zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path)
        assert not os.path.exists(lock)
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path) as buf:
        assert os.path.getsize(lock) > 50
        buf.add_trajectories([_tiny(0)])
    _tiny_equal(zreplay.open(path), 1)


SCENARIOS = {
    "writer lock": _lock_fails,
    "data shards": _shards_fail,
    "commit record": _commit_record_fails,
    "array growth": _growth_fails,
    "array creation": _creation_fails,
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_full_disk_surfaces_keeps_last_commit_and_recovers(tmp_path, scenario):
    run_children([(SCENARIOS[scenario], (str(tmp_path / "buf"),))])
