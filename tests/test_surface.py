"""Facades declare instead of forward (api/facade.py ``Of``): a name a facade shares with
the object that does the work is that object's attribute, read through it, with the same
behaviour on every facade."""

from __future__ import annotations

import pytest
from conftest import make_traj

import zreplay
from zreplay.api.facade import Of
from zreplay.errors import BufferClosedError


def _declared(cls):
    return {n: getattr(cls, n) for n in dir(cls) if isinstance(getattr(cls, n), Of)}


def test_every_declaration_says_what_it_is_and_names_a_real_attribute(tmp_path):
    rl = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "b"))
    rl.add_trajectories([make_traj(0)])
    rl.flush()
    swm = zreplay.ReplayBuffer(max_steps=100)
    view = zreplay.open(tmp_path / "b")
    for cls, facade in ((type(rl), rl), (type(swm), swm), (type(view), view)):
        declared = _declared(cls)
        assert {"closed", "schema", "num_episodes", "priorities"} <= set(declared)
        for name, of in declared.items():
            assert of.__doc__, (cls, name)  # help() still says what it is
            getattr(facade, name)  # the declared path exists (AttributeError otherwise)
    rl.close(), swm.close(), view.close()


def test_a_declared_method_is_the_working_objects_own(tmp_path):
    rl = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "b"))
    rl.add_trajectories([make_traj(0)])
    assert rl.flush.__self__ is rl.core and rl.clear_cache.__self__ is rl.core.engine
    assert rl.total_samples == rl.core.engine.num_rows == 18
    rl.clear_cache()  # RLinf's name for the engine's drop_ram: the rows stay on disk
    assert rl.total_samples == 18 and rl.sample(4)["rewards"].shape[0] == 4
    rl.close()
    view = zreplay.open(tmp_path / "b")
    assert view.segment_rows.__self__ is view.core.engine
    assert view.positions_of("default", [0, 17]).tolist() == [0, 17]
    assert view.path == rl.path and view.num_rows == 18 and view.writer_ids == ["default"]


def test_closed_writable_facades_refuse_their_shared_calls_alike(tmp_path):
    rl = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "r"))
    swm = zreplay.ReplayBuffer(max_steps=100, path=tmp_path / "s")
    for buf in (rl, swm):
        buf.close()
        buf.close()  # idempotent
        assert buf.closed
        for call in (buf.flush, buf.clear):
            with pytest.raises(BufferClosedError, match="make the buffer again"):
                call()
    with pytest.raises(BufferClosedError, match="make the buffer again"):
        rl.clear_cache()


def test_a_dropped_learner_tells_its_rate_gate_whichever_facade_it_is(tmp_path, monkeypatch):
    """A learner's drop says "closing soon" to its rate gate before its close runs on a
    thread of its own (so a learner declared again under its name waits for that close):
    a writable learner's core as a view's (its override once told only the writer lock)."""
    import gc

    from zreplay.core.rate import RateGate

    told, real = [], RateGate.closing_soon
    monkeypatch.setattr(RateGate, "closing_soon", lambda g: (told.append(g.learner_id), real(g)))
    path = str(tmp_path / "b")
    lim = zreplay.MinSize(1)
    rl = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, rate_limiter=lim, learner_id="rl"
    )
    rl.add_trajectories([make_traj(0)])
    rl.sample(4)
    del rl
    gc.collect()
    view = zreplay.open(path, rate_limiter=lim, learner_id="view")
    view.sample(4)
    del view
    gc.collect()
    assert told == ["rl", "view"]
    again = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=path, rate_limiter=lim, learner_id="rl"
    )  # waits for the dropped one's close, then resumes its count
    assert again.total_samples == 18 and again.sample(2)["rewards"].shape[0] == 2
    again.close()
