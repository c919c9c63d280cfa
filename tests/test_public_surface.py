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
    for name in zreplay.errors.__all__ if hasattr(zreplay.errors, "__all__") else exported:
        if hasattr(zreplay, name):
            assert getattr(zreplay, name) is getattr(zreplay.errors, name)
    from zreplay import CorruptBufferError, WriterLockedError  # the old paths

    assert CorruptBufferError is zreplay.errors.CorruptBufferError
    assert WriterLockedError is zreplay.errors.WriterLockedError


def test_sampler_author_types_live_in_samplers_base_and_keep_their_old_path():
    public = set(zreplay.samplers.__all__)
    assert public == {
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
