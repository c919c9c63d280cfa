"""The public surface: what ``zreplay`` exports, where the exceptions and the
sampler-author types live, the old import paths that keep working, and the contract a
prioritized sampler declares."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import zreplay
import zreplay.errors
import zreplay.samplers
import zreplay.samplers.base
from zreplay import TrajectoryReplayBuffer
from zreplay.samplers.base import PrioritySampler, Sampler


def test_the_package_exports_at_most_twenty_names_and_each_exists():
    assert len(zreplay.__all__) <= 20, zreplay.__all__
    for name in zreplay.__all__:
        assert hasattr(zreplay, name), name
    assert len(set(zreplay.__all__)) == len(zreplay.__all__)


def test_exceptions_live_in_errors_and_keep_their_old_import_path():
    exported = [
        n
        for n, v in vars(zreplay.errors).items()
        if inspect.isclass(v) and issubclass(v, Exception) and v.__module__ == "zreplay.errors"
    ]
    assert "CorruptBufferError" in exported and "WriterLockedError" in exported
    for name in exported:
        assert name not in zreplay.__all__, name
    for name in exported:  # every one importable from zreplay too (docs/errors.md says so)
        assert getattr(zreplay, name, None) is getattr(zreplay.errors, name), name
    from zreplay import CorruptBufferError, WriterLockedError  # the old paths

    assert CorruptBufferError is zreplay.errors.CorruptBufferError
    assert WriterLockedError is zreplay.errors.WriterLockedError


def test_sampler_author_types_live_in_samplers_base_and_keep_their_old_path():
    public = set(zreplay.samplers.__all__)
    assert public == {
        "Mixed",
        "Prioritized",
        "PrioritizedClips",
        "Recency",
        "Staleness",
        "Uniform",
        "Window",
    }
    for name in zreplay.samplers.base.__all__:
        assert name not in public
        assert getattr(zreplay.samplers, name) is getattr(zreplay.samplers.base, name), name
    assert issubclass(zreplay.samplers.Prioritized, PrioritySampler)


class _Untyped(Sampler):
    """Says it has priorities without implementing what a buffer calls for them."""

    prioritized = True

    def draw_rows(self, ctx, n):
        return np.zeros(n, np.int64), {}


def test_a_sampler_claiming_priorities_must_be_a_priority_sampler():
    with pytest.raises(TypeError, match="PrioritySampler"):
        TrajectoryReplayBuffer(sampler=_Untyped())


def test_reading_priorities_of_a_sampler_without_them_says_what_to_use():
    buf = TrajectoryReplayBuffer()
    with pytest.raises(TypeError, match="Prioritized"):
        buf.priorities(np.array([0]))


def test_one_prioritized_sampler_serves_one_buffer():
    s = zreplay.samplers.Prioritized()
    a = TrajectoryReplayBuffer(sampler=s)
    with pytest.raises(ValueError, match="its own sampler"):
        TrajectoryReplayBuffer(sampler=s)
    a.close()
    TrajectoryReplayBuffer(sampler=s).close()  # the first is closed: free again


def _facades(tmp_path):
    from zreplay.torchrl import ZarrStorage

    return {
        "TrajectoryReplayBuffer": lambda p, **kw: TrajectoryReplayBuffer(
            auto_save=True, auto_save_path=p, **kw
        ),
        "ReplayBuffer": lambda p, **kw: zreplay.ReplayBuffer(1000, path=p, **kw),
        "ZarrStorage": lambda p, **kw: ZarrStorage(100, p, **kw),
    }


def test_every_writable_facade_takes_the_same_store_options(tmp_path):
    """Declared once (zreplay.StoreOptions), reaching each facade the same way: a name
    that is not one is refused naming them all; each one given reaches the store."""
    from zreplay.store.location import locate
    from zreplay.store.progress import read_progress

    for name, make in _facades(tmp_path).items():
        with pytest.raises(TypeError, match="StoreOptions") as e:
            make(str(tmp_path / f"{name}-bad"), rate_limitter=None)
        assert "rate_limitter" in str(e.value) and "learner_id" in str(e.value)
        assert not (tmp_path / f"{name}-bad").exists()  # refused before anything is made
        path = str(tmp_path / name)
        learner = {} if name == "ZarrStorage" else {"learner_id": "L"}  # see below
        buf = make(
            path,
            writer_id="w2",
            durable=False,
            ram_budget_bytes=1 << 20,
            staging_bytes=1 << 20,
            rate_limiter=zreplay.MinSize(1),
            storage_options=None,
            layout=None,
            **learner,
        )
        buf.close()
        assert (tmp_path / name / "segments" / "w2").is_dir(), name
        if learner:
            assert read_progress(locate(path), "L") is not None, name
        first = make(path, writer_id="w2")
        try:
            with pytest.raises(zreplay.errors.WriterLockedError):
                make(path, writer_id="w2")  # one writer per segment, whichever facade
        finally:
            first.close()
        make(path, writer_id="w2", overwrite=True, break_lock=False).close()


def test_a_refused_sampler_leaves_nothing_behind(tmp_path):
    """A sampler the buffer cannot use is refused before the writer is made: no store on
    disk, no lock held (the path opens at once afterwards)."""
    s = zreplay.samplers.Prioritized()
    first = TrajectoryReplayBuffer(sampler=s)
    for bad, error in ((_Untyped(), TypeError), (s, ValueError)):
        path = tmp_path / type(bad).__name__
        with pytest.raises(error):
            TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(path), sampler=bad)
        assert not path.exists()
    first.close()
    TrajectoryReplayBuffer(auto_save=True, auto_save_path=str(tmp_path / "_Untyped")).close()


def test_bad_rate_options_are_refused_before_an_overwrite_removes_anything(tmp_path):
    path = str(tmp_path / "e")
    with zreplay.ReplayBuffer(100, path=path) as rb:
        rb.write_episode({"obs": np.zeros((5, 2), np.float32), "action": np.zeros((5, 1))})
    rb.close()
    for bad, error in (
        ({"rate_limiter": zreplay.MinSize(1), "learner_id": "a/b"}, zreplay.errors.KeyNameError),
        ({"rate_limiter": "fast"}, TypeError),
        ({"learner_id": 3}, TypeError),
    ):
        with pytest.raises(error):
            zreplay.ReplayBuffer(100, path=path, overwrite=True, **bad)
        with pytest.raises(error):
            zreplay.ReplayBuffer(100, path=str(tmp_path / "fresh"), **bad)
        assert not (tmp_path / "fresh").exists()
    with zreplay.ReplayBuffer(100, path=path) as rb:
        assert rb.num_episodes == 1  # nothing was removed
    rb.close()
    with pytest.raises(TypeError, match="rate_limiter"):  # views check them the same way
        zreplay.open(path, rate_limiter="fast")


def test_a_torchrl_storage_refuses_to_be_a_learner(tmp_path):
    """TorchRL's samplers draw its batches, which a rate limiter never counts: declared
    a learner, its own extends would wait on a count that never moves."""
    from zreplay.torchrl import ZarrStorage

    with pytest.raises(ValueError, match="cannot be a learner"):
        ZarrStorage(10, str(tmp_path / "z"), rate_limiter=zreplay.MinSize(1), learner_id="L")
    assert not (tmp_path / "z").exists()


def test_dataset_imports_are_top_level_names_outside_all():
    """``zreplay.import_lerobot`` (beside ``upgrade``: ``__all__`` holds 20 names) is the
    compat module's function; importing zreplay never imports LeRobot."""
    import sys

    import zreplay.compat.lerobot

    assert zreplay.import_lerobot is zreplay.compat.lerobot.import_lerobot
    assert "import_lerobot" not in zreplay.__all__
    assert zreplay.seal is zreplay.core.seal and "seal" not in zreplay.__all__
    assert "lerobot" not in sys.modules
