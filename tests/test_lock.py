"""The writer lock across hosts and PID namespaces: a live holder is never judged stale
on evidence that does not hold there (a pid seen from another PID namespace), a dead one
is taken over (at once on its kernel, after its lease elsewhere), and a writer whose lock
was taken over commits nothing more."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import zreplay
from zreplay.errors import WriterLockedError
from zreplay.store import lock as lockmod

HOLDER = textwrap.dedent(
    """
    import sys, numpy as np, zreplay
    buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path={path!r})
    def traj(i):
        return {{"obs": np.full((4, 2, 3), i, np.float32), "rewards": np.zeros((4, 2), np.float32)}}
    buf.add_trajectories([traj(0), traj(1)])
    buf.flush()
    print("ready", flush=True)
    for line in sys.stdin:  # each line: add one more trajectory and flush
        buf.add_trajectories([traj(int(line))])
        buf.flush()
        print("flushed", flush=True)
    buf.close()
    print("closed", flush=True)
    """
)

CONTENDER = textwrap.dedent(
    """
    import numpy as np, zreplay
    try:
        buf = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path={path!r})
    except zreplay.WriterLockedError as e:
        print("locked:", e, flush=True)
        raise SystemExit(3)
    buf.add_trajectories([{{"obs": np.full((4, 2, 3), 99, np.float32),
                            "rewards": np.zeros((4, 2), np.float32)}}])
    buf.flush()
    buf.close()
    print("took it", flush=True)
    """
)


def _holder(path, env=None):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(path=path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _finish(proc) -> None:
    proc.stdin.write("2\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "flushed"
    proc.stdin.close()
    assert proc.stdout.readline().strip() == "closed"
    assert proc.wait(30) == 0


def _obs_values(path) -> list[float]:
    view = zreplay.open(path)
    return sorted(float(view.trajectory(i)["obs"][0, 0, 0]) for i in range(view.num_trajectories))


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    got = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=10)
    return got.returncode == 0


def test_a_live_writer_in_another_pid_namespace_keeps_its_lock(bufpath):
    """The case a container with host networking meets: same host name, another PID
    namespace.  The contender runs in a fresh PID namespace (``unshare --pid``), where
    the holder's pid is not alive (or is its own pid 1)."""
    if not _unshare_works():
        pytest.skip("unshare --pid is not permitted here (needs root or user namespaces)")
    holder = _holder(bufpath)
    try:
        got = subprocess.run(
            ["unshare", "--pid", "--fork", sys.executable, "-c", CONTENDER.format(path=bufpath)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert got.returncode == 3, got.stdout + got.stderr
        assert f"pid {holder.pid}" in got.stdout
        _finish(holder)
    finally:
        holder.kill()
        holder.wait()
    assert _obs_values(bufpath) == [0.0, 1.0, 2.0]  # nothing the holder flushed is lost


def test_a_lock_whose_pid_means_nothing_here_is_judged_by_its_flock(bufpath):
    """Without unshare: the lock file shows a pid dead in this namespace; the holder is
    alive and keeps its flock, so the contender must not take over."""
    holder = _holder(bufpath)
    try:
        lock = os.path.join(bufpath, "segments", "default", "zreplay", "writer.lock")
        with open(lock) as f:
            info = json.load(f)
        info.update(pid=2**22 + 7, pidns="pid:[1]")
        with open(lock, "w") as f:  # in place: the holder's flock stays on this file
            json.dump(info, f)
        with pytest.raises(WriterLockedError, match=f"pid {2**22 + 7}"):
            zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath)
        with pytest.raises(WriterLockedError):
            zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath, capacity=8)
        _finish(holder)
    finally:
        holder.kill()
        holder.wait()
    assert _obs_values(bufpath) == [0.0, 1.0, 2.0]


def test_a_dead_holder_on_this_kernel_is_taken_over_at_once_whatever_its_namespace(bufpath):
    holder = _holder(bufpath)
    lock = os.path.join(bufpath, "segments", "default", "zreplay", "writer.lock")
    with open(lock) as f:
        info = json.load(f)
    holder.kill()
    holder.wait()
    info.update(pid=os.getpid(), pidns="pid:[1]")  # even "our own pid" from elsewhere
    with open(lock, "w") as f:
        json.dump(info, f)
    t0 = time.monotonic()
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath) as buf:
        assert len(buf) == 2
    assert time.monotonic() - t0 < 10  # no lease to wait for: the flock is free


def test_where_only_a_lease_can_tell_a_live_holder_is_found_out(bufpath, monkeypatch):
    """Another kernel (or an object store): no flock, no comparable pid.  The holder
    renews its lease; the contender sees a renewal and gives up within the lease."""
    env = {**os.environ, "ZREPLAY_LOCK_LEASE_S": "1.5"}
    holder = _holder(bufpath, env)
    try:
        monkeypatch.setattr(lockmod, "BOOT_ID", "another-kernel")
        t0 = time.monotonic()
        with pytest.raises(WriterLockedError, match=f"pid {holder.pid}"):
            zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath)
        assert time.monotonic() - t0 < 1.5 + 5
        _finish(holder)
    finally:
        holder.kill()
        holder.wait()
    assert _obs_values(bufpath) == [0.0, 1.0, 2.0]


def test_where_only_a_lease_can_tell_a_dead_holder_is_taken_over_once_it_ran_out(
    bufpath, monkeypatch
):
    env = {**os.environ, "ZREPLAY_LOCK_LEASE_S": "1.5"}
    holder = _holder(bufpath, env)
    holder.kill()
    holder.wait()
    monkeypatch.setattr(lockmod, "BOOT_ID", "another-kernel")
    t0 = time.monotonic()
    with zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath) as buf:
        waited = time.monotonic() - t0
        assert len(buf) == 2
    assert 1.5 <= waited < 1.5 + 10  # the whole lease, then the takeover


def _traj(i):
    return {"obs": np.full((4, 2, 3), i, np.float32), "rewards": np.zeros((4, 2), np.float32)}


def test_a_writer_whose_lock_was_taken_over_commits_nothing_more(bufpath, monkeypatch):
    """The old writer (stopped longer than its lease, then resumed) must fail, not
    overwrite the new writer's commits: both flush() calls returning was the bug."""
    monkeypatch.setenv("ZREPLAY_LOCK_LEASE_S", "1")
    old = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath)
    old.add_trajectories([_traj(0)])
    old.flush()
    new = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath, break_lock=True)
    new.add_trajectories([_traj(1)])
    new.flush()
    old.add_trajectories([_traj(2)])  # accepted in RAM: the writer finds out at commit
    with pytest.raises(WriterLockedError, match="no longer holds"):
        old.flush()
    with pytest.raises(WriterLockedError):
        old.add_trajectories([_traj(3)])
    new.add_trajectories([_traj(4)])
    new.close()
    old.close()  # closing the loser is quiet and touches nothing
    assert _obs_values(bufpath) == [0.0, 1.0, 4.0]
    assert zreplay.verify(bufpath).ok


def test_a_lock_object_dropped_without_release_leaves_no_flock_behind(tmp_path):
    from zreplay.store.liveness import probe

    seg = tmp_path / "seg"
    (seg / "zreplay").mkdir(parents=True)
    lk = lockmod.WriterLock(seg)
    lk.acquire()
    assert probe(lk.path) is True
    lk._flock.__del__()  # what the garbage collector does with a forgotten lock
    assert probe(lk.path) is False


def test_the_same_process_is_told_what_holds_its_segment(bufpath):
    a = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath)
    try:
        with pytest.raises(WriterLockedError, match="That is this process"):
            zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath)
    finally:
        a.close()
