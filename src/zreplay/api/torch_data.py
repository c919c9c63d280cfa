"""PyTorch data pipelines over buffers and views.

* ``DataLoader(view, ...)`` works directly: a :class:`~zreplay.BufferView` is a map-style
  dataset of transitions, a :class:`~zreplay.ReplayBuffer` one of clips.  Worker
  processes reopen the store read-only (never a forked copy of the parent's memory), so
  data committed after they started becomes visible after ``refresh()`` (views) or, for
  a ``ReplayBuffer``, with the next item (each item comes from the newest commit).
* :class:`ClipDataset`: clips of a buffer directory as a map-style dataset.
* :class:`ReplayDataset`: RLinf's ``ReplayBufferDataset``: an endless iterable of ready
  batches drawn on a background thread, optionally mixing a second (demo) buffer.
* :func:`rank_loader` / :class:`RankShard`: one rank's share of a buffer directory (its
  contiguous block of trajectories) as a DataLoader / map-style dataset.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

from ..conventions import ACTION_KEYS
from ..core.ranks import distributed, rank_block, resolve_rank
from ..core.waits import Interrupted, pause
from ..errors import BufferClosedError, StaleViewError
from ..numbers import as_int, as_positions
from .batches import index_tree
from .prefetch import Prefetcher
from .view import BufferView

RETRIES = 5  # reads of an item a writer's commits kept replacing before it gives up


class ClipDataset(torch.utils.data.Dataset):
    """Clips ``{key: [history_len, ...]}`` (plus ``is_pad`` when padded) of a buffer
    directory; ``len`` = valid clips at the last ``refresh()``.  Safe to hand to
    DataLoader workers (each reopens the directory).  An index past the end refreshes;
    ``wait_s`` > 0 keeps refreshing that long for a commit the caller knows is coming.
    ``follow``: every item comes from the newest commit (the view refreshes whenever a
    writer committed since, which a ``stat`` per segment tells), as the writer's own
    ``len`` counts them: what persistent DataLoader workers of a buffer being written
    need; otherwise items come from the snapshot of the last ``refresh()`` until a
    writer removes its rows (then the view refreshes)."""

    def __init__(
        self,
        path: str | Path | BufferView,
        history_len: int = 1,
        frameskip: int = 1,
        pad: str | None = None,
        keys: list[str] | None = None,
        action_keys: tuple[str, ...] = ACTION_KEYS,
        transform: Callable | None = None,
        wait_s: float = 0.0,
        follow: bool = False,
    ):
        self.view = path if isinstance(path, BufferView) else BufferView(path)
        self.args = (history_len, frameskip, pad)
        self.keys, self.action_keys, self.transform = keys, tuple(action_keys), transform
        self.wait_s, self.follow = wait_s, bool(follow)

    def refresh(self) -> bool:
        return self.view.refresh()

    def __len__(self) -> int:
        return self.view.num_clips(*self.args)

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = as_int(i, "index")
        for _ in range(RETRIES):
            if self.follow and self.view.core.stale():
                self.view.refresh()
            try:
                return self._item(i)
            except StaleViewError:
                # A commit removed the rows (a clear, eviction) since the view's refresh:
                # items are indices of the newest commit then, as past the end.
                self.view.refresh()
        raise StaleViewError(
            f"{self.view.path}: its writer kept replacing the rows while item {i} was "
            "read; read it again"
        )

    def _item(self, i: int) -> dict[str, Any]:
        n = len(self)
        if not -n <= i < n:
            deadline = time.monotonic() + (self.wait_s if i >= 0 else 0.0)
            while True:
                self.view.refresh()  # the parent may have seen newer commits
                n = len(self)
                if -n <= i < n:
                    break
                if time.monotonic() >= deadline:
                    raise IndexError(i)
                time.sleep(0.01)
        h, fs, pad = self.args
        clip = self.view.clips(
            [int(i) % n], h, frameskip=fs, pad=pad, keys=self.keys, action_keys=self.action_keys
        )
        clip = index_tree(clip, 0)
        return self.transform(clip) if self.transform is not None else clip


class ReplayDataset(torch.utils.data.IterableDataset):
    """Endless batches ``sample(buffer, batch_size)`` computed ``prefetch`` ahead on a
    background thread.  Use it with ``DataLoader(ds, batch_size=None, num_workers=0)``
    (the buffer lives in this process; the thread overlaps sampling with training).

    ``demo`` (another buffer or view) is mixed in: each batch holds
    ``round(batch_size * demo_ratio)`` demo samples after the replay samples, as RLinf's
    ``ReplayBufferDataset`` does with 50/50.  Iteration waits until the buffer holds
    ``min_size`` and the demo ``min_demo_size`` (``len()`` of each; trajectories for a
    ``TrajectoryReplayBuffer``, as in RLinf).
    """

    def __init__(
        self,
        buffer,
        batch_size: int,
        demo=None,
        demo_ratio: float = 0.5,
        min_size: int = 1,
        min_demo_size: int = 1,
        prefetch: int = 2,
        sample: Callable[[Any, int], Any] | None = None,
        poll_s: float = 0.05,
    ):
        batch_size = as_int(batch_size, "batch_size", minimum=1)
        if not 0.0 <= demo_ratio <= 1.0:
            raise ValueError(f"demo_ratio must lie in [0, 1], got {demo_ratio}")
        self.buffer, self.demo = buffer, demo
        self.batch_size, self.demo_ratio = int(batch_size), float(demo_ratio)
        self.min_size, self.min_demo_size = min_size, min_demo_size
        self.prefetch, self.poll_s = prefetch, poll_s
        self.sample = sample or (lambda buf, n: buf.sample(n))

    def _ready(self) -> bool:
        if len(self.buffer) < self.min_size:
            return False
        return self.demo is None or len(self.demo) >= self.min_demo_size

    def _batch(self) -> Any:
        while not self._ready():
            closing = [b.core.closing for b in (self.buffer, self.demo) if _has_core(b)]
            if any(e.is_set() for e in closing):
                raise BufferClosedError(
                    "ReplayDataset: its buffer was closed while it waited for "
                    f"min_size={self.min_size} (demo: {self.min_demo_size}); nothing to draw"
                )
            try:  # ends when the prefetcher running this, or a buffer, is closed
                pause(self.poll_s, *closing)
            except Interrupted as e:
                if e.event not in closing:
                    raise
            for b in (self.buffer, self.demo):
                if isinstance(b, BufferView):
                    b.refresh()
        if self.demo is None:
            return self.sample(self.buffer, self.batch_size)
        k = int(round(self.batch_size * self.demo_ratio))
        parts = []
        if self.batch_size - k:
            parts.append(self.sample(self.buffer, self.batch_size - k))
        if k:
            parts.append(self.sample(self.demo, k))
        return concat_batches(parts)

    def __iter__(self) -> Iterator[Any]:
        with Prefetcher(self._batch, self.prefetch) as it:
            yield from it


class RankShard(torch.utils.data.Dataset):
    """The rows of rank ``rank``'s share of a buffer: its contiguous block of the visible
    trajectories (RLinf's split, as ``load_checkpoint(is_distributed=True)`` makes), fixed
    when the shard is made.  ``rank``/``world_size`` default to the ``torch.distributed``
    process group's.

    Item ``i`` is one row (a nested dict of numpy arrays); a list of indices is one batched
    read, ``[len, ...]`` per key (what :func:`rank_loader` asks for).  Rows are named by
    segment and row number, not by position, so DataLoader workers (which reopen the
    directory) read the same rows even after more commits.
    """

    def __init__(
        self,
        source: str | Path | BufferView,
        rank: int | None = None,
        world_size: int | None = None,
        keys: list[str] | None = None,
    ):
        self.view = source if isinstance(source, BufferView) else BufferView(source)
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.keys = keys
        n = self.view.num_trajectories
        self.trajectories = rank_block(n, self.rank, self.world_size)
        self.ranges = self.view.segment_rows(*self.trajectories)
        sizes = np.array([hi - lo for _, lo, hi in self.ranges], np.int64)
        self._ends = np.cumsum(sizes)
        self._starts = self._ends - sizes
        # Every rank's share of the same snapshot, in rows (for equal-length epochs).
        self.rows_per_rank = [
            sum(hi - lo for _, lo, hi in self.view.segment_rows(*rank_block(n, r, self.world_size)))
            for r in range(self.world_size)
        ]

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def _positions(self, idx) -> np.ndarray:
        """View positions (as of the view's last refresh) of shard rows ``idx`` (as numpy
        indexes an array of ``len(self)``)."""
        idx = as_positions(idx, len(self), "shard row indices")
        which = np.searchsorted(self._ends, idx, side="right")
        pos = np.empty(len(idx), np.int64)
        for r in np.unique(which):
            wid, lo, _ = self.ranges[r]
            sel = which == r
            pos[sel] = self.view.positions_of(wid, lo + idx[sel] - self._starts[r])
        return pos

    def __getitem__(self, i) -> dict[str, Any]:
        if np.ndim(i) == 0:
            one = [as_int(i, "index")]
            return index_tree(self.view.rows(self._positions(one), self.keys), 0)
        return self.view.rows(self._positions(i), self.keys)


def rank_loader(
    source: str | Path | BufferView,
    rank: int | None = None,
    world_size: int | None = None,
    batch_size: int = 256,
    *,
    shuffle: bool = True,
    drop_last: bool = False,
    even: bool = True,
    seed: int = 0,
    keys: list[str] | None = None,
    **loader_kwargs,
) -> torch.utils.data.DataLoader:
    """A DataLoader over rank ``rank``'s share (a :class:`RankShard`) of a buffer, in
    batches of ``batch_size`` rows (nested dicts of ``[batch, ...]`` tensors), each read
    in one batched read per key.

    ``rank``/``world_size`` default to the ``torch.distributed`` process group's; then the
    call is collective and checks that every rank sees the same commits (a buffer still
    being written can differ between ranks: then it raises rather than overlap shares).
    ``even``: every rank's epoch has as many rows as the smallest share (shares differ by
    a trajectory and by trajectory lengths; a rank's surplus rows sit out that epoch, a
    different subset each epoch when shuffling), so DDP ranks take the same number of
    steps.  ``shuffle`` draws a new order
    per epoch from ``seed`` and the rank.  ``loader_kwargs`` go to DataLoader
    (``num_workers``, ``pin_memory``, ``multiprocessing_context``, ...).
    """
    defaulted = rank is None or world_size is None
    shard = RankShard(source, rank, world_size, keys)
    if defaulted and distributed() and shard.world_size > 1:
        import torch.distributed as dist

        seen = [None] * shard.world_size
        dist.all_gather_object(seen, shard.view.segment_rows())
        if any(s != seen[0] for s in seen):
            raise RuntimeError(
                f"ranks see different commits of {shard.view.path} (it is still being "
                "written?); open the same snapshot on every rank, e.g. a save_checkpoint() "
                "directory, or wait for the writers"
            )
    n = min(shard.rows_per_rank) if even else len(shard)
    if shuffle and n:  # (an empty share: torch's RandomSampler refuses num_samples=0)
        gen = torch.Generator().manual_seed(int(seed) * 1000003 + shard.rank)
        order = torch.utils.data.RandomSampler(shard, num_samples=n, generator=gen)
    else:
        order = range(n)
    batches = torch.utils.data.BatchSampler(order, batch_size, drop_last)
    return torch.utils.data.DataLoader(shard, batch_size=None, sampler=batches, **loader_kwargs)


def concat_batches(parts: list[Any]) -> Any:
    """Concatenate nested dicts of tensors/arrays along the batch axis."""
    first = parts[0]
    if isinstance(first, dict):
        return {k: concat_batches([p[k] for p in parts]) for k in first}
    if isinstance(first, torch.Tensor):
        return torch.cat(parts, 0)
    return np.concatenate(parts, 0)


def _has_core(buffer) -> bool:
    """Whether ``buffer`` is one of zreplay's buffers or views (it has a core whose
    ``closing`` event says it was closed)."""
    try:
        return getattr(getattr(buffer, "core", None), "closing", None) is not None
    except Exception:  # noqa: BLE001 - a replica core in a worker refuses every attribute
        return False
