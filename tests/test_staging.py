"""The staging budget: adds do not wait for the background writer while uncommitted rows
fit the RAM tier plus ``staging_bytes``, and do wait (backpressure) once they do not."""

from __future__ import annotations

import threading
import time

import numpy as np
from conftest import make_traj

import zreplay


class Gate:
    """Holds the committer's writes until opened."""

    def __init__(self, committer):
        self.open = threading.Event()
        write = committer._write

        def gated(job):
            self.open.wait()
            write(job)

        committer._write = gated


def _buffer(path, n_staged: int, cache_size: int = 2):
    """A buffer whose staging budget holds ``n_staged`` of make_traj's trajectories,
    with its committer held (one trajectory committed first, which fixes the schema)."""
    probe = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=path + ".probe")
    probe.add_trajectories([make_traj(0)])
    row_bytes = probe.core.engine.schema.row_bytes
    rows = probe.get_stats()["total_samples"]
    probe.close()
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True,
        auto_save_path=path,
        cache_size=cache_size,
        sample_window_size=0,
        staging_bytes=n_staged * rows * row_bytes,
    )
    buf.add_trajectories([make_traj(0)])
    buf.flush()
    return buf, Gate(buf.core.engine._committer)


def _adder(buf, ids):
    added = []

    def run():
        for i in ids:
            buf.add_trajectories([make_traj(i)])
            added.append(i)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, added


def _waits_after(t, added: list, n: int) -> None:
    """The adder thread ``t`` makes ``n`` adds, then waits (alive, no further add)."""
    deadline = time.monotonic() + 60
    while len(added) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    t.join(0.5)
    assert t.is_alive() and len(added) == n


def test_adds_do_not_wait_while_the_budget_has_room(bufpath):
    # Window 2 trajectories + staging 6: eight adds fit while nothing can be committed
    # (before the budget existed, the third one waited for the writer).
    buf, gate = _buffer(bufpath, n_staged=6)
    try:
        t, added = _adder(buf, range(1, 9))
        t.join(60)
        assert not t.is_alive() and len(added) == 8
        st = buf.get_stats()
        assert st["committed_trajectories"] == 1 and st["pending_trajectories"] == 8
        # Staged rows are sampleable (from RAM) before they are on disk.
        batch = buf.sample(2000)
        assert len(np.unique(batch["actions"][:, 0].numpy() // 10000)) == 9
    finally:
        gate.open.set()
    buf.close()
    view = zreplay.open(bufpath)
    assert view.num_trajectories == 9
    got = [int(view.trajectory(i)["actions"][0, 0, 0]) // 10000 for i in range(9)]
    assert got == list(range(9))


def test_adds_wait_once_the_budget_is_used_up(bufpath):
    buf, gate = _buffer(bufpath, n_staged=3)
    try:
        t, added = _adder(buf, range(1, 11))
        # Window 2 + staging 3 = 5 uncommitted trajectories; the sixth add must wait
        # for the (held) writer instead of overwriting rows that are not on disk.
        _waits_after(t, added, 5)
        st = buf.get_stats()
        assert st["committed_trajectories"] == 1 and st["pending_trajectories"] == 5
    finally:
        gate.open.set()
    t.join(60)
    assert not t.is_alive() and len(added) == 10
    buf.close()
    view = zreplay.open(bufpath)
    got = [int(view.trajectory(i)["actions"][0, 0, 0]) // 10000 for i in range(11)]
    assert got == list(range(11))


def test_staging_does_not_change_what_the_ram_tier_keeps(bufpath):
    buf, gate = _buffer(bufpath, n_staged=6, cache_size=2)
    rows = buf.get_stats()["total_samples"]
    t, added = _adder(buf, range(1, 9))  # the ring grows to stage them
    t.join(60)
    assert not t.is_alive()
    assert buf.get_stats()["cache_size"] == 8  # uncommitted rows are only in RAM
    gate.open.set()
    buf.flush()
    # Committed: only the cache_size newest trajectories stay in RAM, as without staging.
    st = buf.get_stats()
    assert st["cache_size"] == 2 and st["rows_in_ram"] == 2 * rows
    buf.add_trajectories([make_traj(9)])
    buf.flush()
    st = buf.get_stats()
    assert st["cache_size"] == 2 and st["rows_in_ram"] == 2 * rows
    buf.close()


def test_staging_bytes_zero_waits_as_the_ring_alone(bufpath):
    buf, gate = _buffer(bufpath, n_staged=0, cache_size=2)
    try:
        t, added = _adder(buf, range(1, 6))
        _waits_after(t, added, 2)
    finally:
        gate.open.set()
    t.join(60)
    buf.close()
