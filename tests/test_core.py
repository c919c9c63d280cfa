"""The buffer core as a public API: what a new facade builds on (CONTRIBUTING.md)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import check_rows, make_traj

import zreplay
from zreplay.compat.rlinf_trajectory import prepare
from zreplay.core import BufferCore, Prepared, RamPolicy, RandomStream
from zreplay.samplers import Prioritized
from zreplay.sampling.clips import ClipSpec

CONTRIBUTING = Path(__file__).resolve().parents[1] / "CONTRIBUTING.md"


def _snippet(section: str) -> str:
    text = CONTRIBUTING.read_text().split(f"## {section}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


@pytest.mark.parametrize(
    "section, printed",
    [
        ("A sampler", ["[3.]"]),
        ("A place to store buffers", ["8 (3, 3)"]),
        ("A facade", ["{'obs': (4, 3), 'reward': (4,)}", "20"]),
    ],
)
def test_the_extension_examples_print_what_they_say(
    section, printed, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    exec(compile(_snippet(section), "CONTRIBUTING.md", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.split("\n")[: len(printed)] == printed


def test_writer_core_adds_samples_and_reads_trajectories(tmp_path):
    core = BufferCore.writer(tmp_path / "b", stream=RandomStream(3))
    ids = core.add([prepare(make_traj(i)) for i in range(4)])
    assert ids == [0, 1, 2, 3] and core.num_trajectories == 4 and core.num_rows == 72
    batch = core.sample(64)
    assert set(batch) == set(core.keys)
    check_rows(zreplay.schema.unflatten(batch))
    rec = core.trajectory(-1)
    assert (rec.trajectory_id, rec.T, rec.B) == (3, 6, 3)
    assert rec.columns["actions"].shape == (6, 3, 6) and not rec.continues.any()
    clips = core.sample_clips(ClipSpec(2, action_keys=("actions",)), 8)
    assert clips["actions"].shape == (8, 2, 6)
    assert core.episode(0)["rewards"].ndim == 2
    core.close()
    assert core.closed


def test_records_copy_into_another_core_with_ids_and_episodes(tmp_path):
    src = BufferCore.writer(tmp_path / "a")
    src.add([prepare(make_traj(i)) for i in range(3)])
    dst = BufferCore.writer(tmp_path / "b")
    assert dst.add([rec.prepared() for rec in src.trajectories()]) == [0, 1, 2]
    np.testing.assert_array_equal(dst.episode_table()["length"], src.episode_table()["length"])
    src.close(), dst.close()


def test_reader_core_sees_every_segment_and_refuses_writes(tmp_path):
    path = tmp_path / "b"
    writers = [BufferCore.writer(path, writer_id=w) for w in ("a", "b")]
    for i, w in enumerate(writers):
        w.add([prepare(make_traj(10 * i))])
        w.flush()
    view = BufferCore.reader(path, seed=0)
    assert [wid for wid, _ in view.engine.segments()] == ["a", "b"]
    assert view.num_rows == 36 and not view.writable
    assert not hasattr(view, "add")  # a view's core has no writes, by its type
    writers[0].add([prepare(make_traj(1))])
    writers[0].flush()
    assert view.num_rows == 36 and view.refresh() and view.num_rows == 54
    for w in writers:
        w.close()


def test_state_round_trips_through_a_commit_and_full_state(tmp_path):
    path = tmp_path / "b"
    core = BufferCore.writer(path, sampler=Prioritized(), stream=RandomStream(9))
    core.add([prepare(make_traj(i)) for i in range(3)])
    b = core.sample(16)
    core.update_priorities(b["index"], np.arange(16.0))
    leaves, full = core.priorities(b["index"]), core.full_state()
    core.close()
    again = BufferCore.writer(path, sampler=Prioritized(), stream=RandomStream(0))
    assert again.stream.seed == 9 and again.stream.step == 1  # resumed from the commit
    np.testing.assert_array_equal(again.priorities(b["index"]), leaves)
    again.update_priorities(b["index"], 0.0)
    assert not np.array_equal(again.priorities(b["index"]), leaves)
    again.load_full_state(full)
    np.testing.assert_array_equal(again.priorities(b["index"]), leaves)
    again.close()


def test_set_sampler_and_reseed_per_rank(tmp_path):
    core = BufferCore.writer(None, ram=RamPolicy(trajectories=2))
    core.add([Prepared({"x": np.arange(20.0).reshape(10, 2)}, 10, 2)])
    core.stream.reseed(5, rank=0)
    a = core.sample(8)["x"]
    core.stream.reseed(5, rank=1)
    assert not np.array_equal(core.sample(8)["x"], a)  # ranks draw different streams
    core.stream.reseed(5, rank=0)
    np.testing.assert_array_equal(core.sample(8)["x"], a)
    core.set_sampler(Prioritized())
    assert "weight" in core.sample(4)
    core.close()
