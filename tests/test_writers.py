"""Several writers of one buffer: numbers claimed once, trajectory ids unique."""

from __future__ import annotations

import threading

from conftest import make_traj

import zreplay
from zreplay.store.format import ID_BITS
from zreplay.store.root import BufferRoot


def test_trajectory_ids_are_unique_across_writers_and_survive_reopen(bufpath):
    a = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath, writer_id="a")
    b = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath, writer_id="b")
    a.add_trajectories([make_traj(0), make_traj(1)])
    b.add_trajectories([make_traj(2)])
    a.close()
    b.close()
    # The first writer keeps RLinf's 0, 1, 2...; the next one counts from 1 << ID_BITS.
    view = zreplay.open(bufpath)
    ids = [view.trajectory(i)["trajectory_id"] for i in range(view.num_trajectories)]
    assert ids == [0, 1, 1 << ID_BITS]
    b = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=bufpath, writer_id="b")
    b.add_trajectories([make_traj(3)])
    assert b.trajectory(len(b) - 1)["trajectory_id"] == (1 << ID_BITS) + 1
    # A checkpoint of writer b keeps b's number claimed: a new writer there gets another.
    ckpt = bufpath + ".ckpt"
    b.save_checkpoint(ckpt)
    b.close()
    c = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=ckpt, writer_id="w3")
    c.add_trajectories([make_traj(4)])
    c.close()
    view = zreplay.open(ckpt)
    ids = [view.trajectory(i)["trajectory_id"] for i in range(view.num_trajectories)]
    assert len(set(ids)) == 3 and ids[-1] == 0


def test_writer_numbers_are_claimed_once_even_when_racing(tmp_path):
    root = BufferRoot(tmp_path / "buf")
    root.create()
    got: dict[str, int] = {}

    def claim(w):
        got[w] = root.writer_number(w)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got.values()) == list(range(8))
    # A writer that crashed before its first commit finds its claim again.
    assert root.writer_number("w5") == got["w5"]
    assert root.writer_number("new") == 8
