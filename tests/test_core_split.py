"""The core split by role: one read side over the engine protocol, a writable core and a
view's core whose types say what each can do, and the state a writer commits held apart
from the core (the committer never calls back into it)."""

from __future__ import annotations

import gc
import json
import time

import numpy as np
from conftest import make_traj

from zreplay.compat.rlinf_trajectory import prepare
from zreplay.core import BufferCore, RandomStream, ViewCore, WritableCore
from zreplay.core.saved import SavedState
from zreplay.engine.protocol import Engine
from zreplay.samplers import Prioritized, Uniform

WRITES = ("add", "adopt", "replacing")  # the core's; the writer's own are its engine's:
ENGINE_WRITES = ("clear", "checkpoint", "set_capacity", "drop_ram")


def test_writer_and_reader_make_their_kind_over_one_engine_protocol(tmp_path):
    core = BufferCore.writer(tmp_path / "b")
    core.add([prepare(make_traj(0))])
    core.flush()
    view = BufferCore.reader(tmp_path / "b")
    assert type(core) is WritableCore and type(view) is ViewCore
    assert isinstance(core.engine, Engine) and isinstance(view.engine, Engine)
    for m in WRITES:  # a view's core cannot write: its type has no such method
        assert hasattr(core, m) and not hasattr(view, m), m
    for m in ENGINE_WRITES:
        assert hasattr(core.engine, m) and not hasattr(view.engine, m), m
    # The read side is one code over either engine: same rows, same episodes.
    assert core.num_rows == view.num_rows == 18
    np.testing.assert_array_equal(
        core.rows(np.arange(core.num_rows))["actions"],
        view.rows(np.arange(view.num_rows))["actions"],
    )
    np.testing.assert_array_equal(core.episode_table()["length"], view.episode_table()["length"])
    assert core.refresh() is False and core.stale() is False
    core.close()


def test_the_writer_commits_a_saved_state_not_the_core(tmp_path):
    core = BufferCore.writer(tmp_path / "b", stream=RandomStream(5))
    source = core.engine.source
    assert isinstance(source, SavedState) and not isinstance(source, BufferCore)
    assert source.stream is core.stream
    core.facade_state["mine"] = 1
    core.view_rows = 7
    core.add([prepare(make_traj(0))])
    core.sample(4)
    core.flush()
    saved = dict(core.engine.commit.sampler)
    assert saved["facade"] == {"mine": 1} and saved["view_rows"] == 7
    assert saved["step"] == 1 and saved["seed"] == 5
    assert saved == json.loads(json.dumps(core.saved.state()))
    core.close()


def test_a_sampler_set_later_is_the_one_whose_state_is_committed(tmp_path):
    core = BufferCore.writer(tmp_path / "b", sampler=Uniform())
    core.add([prepare(make_traj(i)) for i in range(2)])
    core.set_sampler(Prioritized())
    b = core.sample(8)
    core.update_priorities(b["index"], np.full(8, 3.0))
    leaves = core.priorities(b["index"])
    core.close()
    assert core.engine.commit.sampler["sampler"]["kind"] == "Prioritized"
    again = BufferCore.writer(tmp_path / "b", sampler=Prioritized())
    np.testing.assert_array_equal(again.priorities(b["index"]), leaves)  # saved leaves
    again.close()


def test_priorities_are_saved_without_the_core_being_asked(tmp_path, monkeypatch):
    """The committer builds a commit's priorities from the state source and the writer's
    own row space: a core method called from the committer thread would fail here."""
    core = BufferCore.writer(tmp_path / "b", sampler=Prioritized())
    core.add([prepare(make_traj(i)) for i in range(2)])
    b = core.sample(8)
    core.update_priorities(b["index"], np.full(8, 2.0))
    leaves = core.priorities(b["index"])

    def refused(*a, **k):
        raise AssertionError("the committer called back into the core")

    for name in ("priorities", "full_state", "read"):  # (it has no state(): saved.state())
        monkeypatch.setattr(WritableCore, name, refused)
    core.flush()
    monkeypatch.undo()
    assert "priority" in core.engine.commit.sampler
    core.close()
    again = BufferCore.writer(tmp_path / "b", sampler=Prioritized())
    np.testing.assert_array_equal(again.priorities(b["index"]), leaves)
    again.close()


def test_a_dropped_writable_core_owner_still_closes_its_writer(tmp_path):
    class Owner:
        pass

    owner = Owner()
    core = BufferCore.writer(tmp_path / "b", owner=owner)
    core.add([prepare(make_traj(0))])
    writer = core.engine
    del owner, core
    gc.collect()
    for _ in range(200):  # the close runs on a thread of its own
        if writer.closed:
            break
        time.sleep(0.01)
    assert writer.closed and writer.commit.n_traj == 1
