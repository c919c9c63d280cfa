"""Several writers of one buffer: numbers claimed once, trajectory ids unique."""

from __future__ import annotations

import threading
from contextlib import closing

import builders
import pytest
from conftest import check_rows, shard_files

import zreplay
from zreplay.store.format import ID_BITS
from zreplay.store.root import BufferRoot


def test_trajectory_ids_are_unique_across_writers_and_survive_reopen(bufpath):
    a = builders.writer(bufpath, writer_id="a")
    b = builders.writer(bufpath, writer_id="b")
    builders.add_full(a, [0, 1])
    builders.add_full(b, [2])
    a.close()
    b.close()
    # The first writer keeps RLinf's 0, 1, 2...; the next one counts from 1 << ID_BITS.
    view = zreplay.open(bufpath)
    ids = [view.trajectory(i)["trajectory_id"] for i in range(view.num_trajectories)]
    assert ids == [0, 1, 1 << ID_BITS]
    b = builders.writer(bufpath, writer_id="b")
    builders.add_full(b, [3])
    assert b.trajectory(b.num_trajectories - 1).trajectory_id == (1 << ID_BITS) + 1
    # A checkpoint of writer b keeps b's number claimed: a new writer there gets another.
    ckpt = bufpath + ".ckpt"
    b.engine.checkpoint(ckpt)
    b.close()
    c = builders.writer(ckpt, writer_id="w3")
    builders.add_full(c, [4])
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


def _writer(path, wid, lay):
    return builders.writer(path, writer_id=wid, layout=lay)


def test_writers_of_a_new_buffer_cannot_fix_two_layouts(tmp_path):
    """Defect 3: two writers opened on a new buffer with different ``layout=`` each
    created arrays in their own layout while the root recorded only one; reopening the
    other segment then read its shards with the wrong chunk grid (or deleted them)."""
    path = tmp_path / "b"
    small = {"rewards": {"chunk_rows": 4, "shard_rows": 16}}
    other = {"rewards": {"chunk_rows": 8, "shard_rows": 32}}
    a, b = _writer(path, "a", small), _writer(path, "b", other)
    builders.add_full(a, [0])
    with pytest.raises(zreplay.SchemaError, match="layout for key 'rewards'"):
        builders.add_full(b, [1])  # refused before anything is written
    assert shard_files(path, "rewards", "b") == []
    b.close()
    builders.add_full(a, [1])
    a.close()
    with pytest.raises(zreplay.SchemaError, match="created with"):
        _writer(path, "a", other)  # reopening with another layout is refused too
    with closing(_writer(path, "b", small)) as b:  # the recorded layout is fine
        builders.add_full(b, [2])
    view = zreplay.open(path)
    assert view.num_trajectories == 3
    check_rows(view.sample(256))
    assert zreplay.verify(path).ok, str(zreplay.verify(path))


def test_racing_writers_of_a_new_buffer_agree_on_one_layout(tmp_path):
    path = tmp_path / "b"
    lays = [{"rewards": {"chunk_rows": 4 << i, "shard_rows": 64}} for i in range(4)]
    writers = [_writer(path, f"w{i}", lay) for i, lay in enumerate(lays)]
    go, errors = threading.Barrier(len(writers)), []

    def add(i):
        go.wait()
        try:
            builders.add_full(writers[i], [i])
            writers[i].flush()
        except zreplay.SchemaError as e:
            errors.append(e)

    threads = [threading.Thread(target=add, args=(i,)) for i in range(len(writers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in writers:
        w.close()
    assert len(errors) == len(writers) - 1  # exactly one layout won
    view = zreplay.open(path)
    assert view.num_trajectories == 1
    check_rows(view.sample(64))
    assert zreplay.verify(path).ok, str(zreplay.verify(path))
