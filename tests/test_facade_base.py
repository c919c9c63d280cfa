"""What every facade shares, declared once (api/facade.py), and the reader options
declared once beside the store options (core/options.py)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from conftest import make_traj

import zreplay
from zreplay.api.facade import Facade, WritableFacade
from zreplay.core.options import READER_DEFAULTS, ReaderOptions

# A value other than the default for every declared reader option: a new option left out
# here fails the first test, so it cannot be forgotten in pickling either.
NON_DEFAULT = {
    "storage_options": {"anon": True},
    "column_cache_bytes": 0,
    "chunk_cache_bytes": 12345,
}


@pytest.fixture
def stored(tmp_path):
    path = tmp_path / "b"
    buf = zreplay.TrajectoryReplayBuffer(
        auto_save=True, auto_save_path=str(path), durable=False, seed=0
    )
    buf.add_trajectories([make_traj(i) for i in range(3)])
    buf.close()
    return path


def test_every_declared_reader_option_survives_pickling_a_view(stored):
    assert set(NON_DEFAULT) == set(ReaderOptions.__annotations__) == set(READER_DEFAULTS)
    for name, value in NON_DEFAULT.items():
        assert value != READER_DEFAULTS[name], name
        view = zreplay.open(stored, **{name: value})
        again = pickle.loads(pickle.dumps(view))
        assert view.options[name] == value and again.options[name] == value, name
        assert again.num_rows == view.num_rows == 54
    both = zreplay.open(stored, column_cache_bytes=0, chunk_cache_bytes=12345)
    engine = pickle.loads(pickle.dumps(both)).core.engine  # and they reach the reader
    assert (engine.column_cache_bytes, engine.chunk_cache_bytes) == (0, 12345)


def test_an_unknown_reader_option_is_refused_naming_the_declared_ones(stored):
    with pytest.raises(TypeError, match="chunk_cache_byte.*column_cache_bytes"):
        zreplay.open(stored, chunk_cache_byte=1)


def test_the_facades_share_one_lifecycle_and_read_base(stored, tmp_path):
    view = zreplay.open(stored)
    rl = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "r"))
    swm = zreplay.ReplayBuffer(max_steps=100, path=tmp_path / "s")
    assert isinstance(view, Facade) and not isinstance(view, WritableFacade)
    assert isinstance(rl, WritableFacade) and isinstance(swm, WritableFacade)
    shared = ("close", "closed", "schema", "sampler", "num_episodes", "episode_table")
    shared += ("update_priorities", "priorities", "refresh")
    for facade in (type(view), type(rl), type(swm)):
        for name in ("update_priorities", "priorities", "episode_table", "num_episodes"):
            assert name not in vars(facade), (facade, name)  # declared once, in the base
        for name in shared:
            assert hasattr(facade, name)
    np.testing.assert_array_equal(
        view.episode_table()["length"], zreplay.open(stored).episode_table()["length"]
    )
    with rl, swm:
        assert not rl.closed and not swm.closed and rl.refresh() is False
    assert rl.closed and not swm.closed  # swm's ``with`` only commits (its Writer protocol)
    swm.close()
    assert swm.closed


def _count_as_int(monkeypatch) -> list[str]:
    """Every call of ``zreplay.numbers.as_int``, wherever a module imported it: the names
    of the arguments it checked."""
    import sys

    import zreplay.numbers

    real, seen = zreplay.numbers.as_int, []

    def counting(value, name, *a, **k):
        seen.append(name)
        return real(value, name, *a, **k)

    for mod in list(sys.modules.values()):
        if (
            getattr(mod, "__name__", "").startswith("zreplay")
            and getattr(mod, "as_int", None) is real
        ):
            monkeypatch.setattr(mod, "as_int", counting)
    return seen


SPEC_FIELDS = {"history_len", "frameskip", "n", "frame_stack"}  # what a ClipSpec / NStepSpec checks


def test_each_sample_argument_is_checked_once_at_the_facade(stored, tmp_path, monkeypatch):
    rl = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(stored), seed=0)
    view = zreplay.open(stored)
    swm = zreplay.ReplayBuffer(max_steps=100, history_len=2, path=tmp_path / "s")
    z = np.zeros
    swm.write_episode(
        {"obs": z((6, 3), np.float32), "action": z((6, 2), np.float32), "reward": z(6)}
    )
    seen = _count_as_int(monkeypatch)
    calls = [
        (lambda: rl.sample(np.int64(8)), ["num_chunks"]),
        (lambda: rl.sample_clips(np.int64(4), 2), ["num_clips"]),
        (lambda: view.sample(np.int64(8)), ["n"]),
        (lambda: view.sample_clips(np.int64(4), 2), ["batch_size"]),
        (lambda: swm.sample(np.int64(4)), ["batch_size"]),
        (lambda: swm.sample(np.int64(4), step=np.int64(3)), ["batch_size", "step"]),
        (lambda: swm.sample_nstep(np.int64(4), n=2), ["batch_size"]),
    ]
    for call, names in calls:
        seen.clear()
        call()
        # Each argument once (a clip or n-step spec checks its own), the count in the
        # facade's words, and nothing below the facade checks it again.
        assert len(seen) == len(set(seen)) and set(names) <= set(seen), (names, seen)
        assert set(seen) - set(names) <= SPEC_FIELDS, (names, seen)
    rl.close(), swm.close()


def test_a_bad_count_names_the_facades_own_argument(stored, tmp_path):
    rl = zreplay.TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(stored))
    view = zreplay.open(stored)
    swm = zreplay.ReplayBuffer(max_steps=100, path=tmp_path / "s")
    for call, name in [
        (lambda: rl.sample(2.5), "num_chunks"),
        (lambda: rl.sample_clips(0, 2), "num_clips"),
        (lambda: view.sample(2.5), "n"),
        (lambda: view.sample_clips(0, 2), "batch_size"),
        (lambda: view.sample_nstep(2.5), "batch_size"),
        (lambda: swm.sample(2.5), "batch_size"),
        (lambda: swm.sample(0), "batch_size"),
    ]:
        with pytest.raises((TypeError, ValueError), match=f"^{name} must be"):
            call()
    assert rl.core.stream.step == 0 and view.core.stream.step == 0  # nothing was drawn
    rl.close(), swm.close()


def test_a_rate_limited_sample_passes_the_gate_once(stored, monkeypatch):
    from zreplay.core.rate import RateGate

    view = zreplay.open(stored, rate_limiter=zreplay.MinSize(1), learner_id="l")
    entered = []
    for name in ("sampling", "before_sample", "sampled"):
        real = getattr(RateGate, name)

        def spy(self, *a, _name=name, _real=real, **k):
            entered.append(_name)
            return _real(self, *a, **k)

        monkeypatch.setattr(RateGate, name, spy)
    view.sample(4)
    assert entered[0] == "sampling" and entered.count("sampling") == 1
    assert entered.count("before_sample") == entered.count("sampled") == 1
    entered.clear()
    view.sample_clips(4, 2)
    assert entered[0] == "sampling" and entered.count("sampling") == 1
    assert entered.count("before_sample") == entered.count("sampled") == 1
    view.close()
