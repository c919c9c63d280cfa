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
