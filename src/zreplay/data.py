"""PyTorch data pipelines over buffers and views.

* ``DataLoader(view, ...)`` works directly: a :class:`~zreplay.BufferView` is a map-style
  dataset of transitions, a :class:`~zreplay.ReplayBuffer` one of clips.  Worker
  processes reopen the store read-only (never a forked copy of the parent's memory), so
  data committed after they started becomes visible after ``refresh()`` (views) or as
  soon as an index asks for it (``ReplayBuffer``).
* :class:`ClipDataset`: clips of a buffer directory as a map-style dataset.
* :class:`ReplayDataset`: RLinf's ``ReplayBufferDataset``: an endless iterable of ready
  batches drawn on a background thread, optionally mixing a second (demo) buffer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data

from .prefetch import Prefetcher
from .view import BufferView, index_tree


class ClipDataset(torch.utils.data.Dataset):
    """Clips ``{key: [history_len, ...]}`` (plus ``is_pad`` when padded) of a buffer
    directory; ``len`` = valid clips at the last ``refresh()``.  Safe to hand to
    DataLoader workers (each reopens the directory).  An index past the end refreshes;
    ``wait_s`` > 0 keeps refreshing that long for a commit the caller knows is coming."""

    def __init__(
        self,
        path: str | Path | BufferView,
        history_len: int = 1,
        frameskip: int = 1,
        pad: str | None = None,
        keys: list[str] | None = None,
        action_keys: tuple[str, ...] = ("action",),
        transform: Callable | None = None,
        wait_s: float = 0.0,
    ):
        self.view = path if isinstance(path, BufferView) else BufferView(path)
        self.args = (history_len, frameskip, pad)
        self.keys, self.action_keys, self.transform = keys, tuple(action_keys), transform
        self.wait_s = wait_s

    def refresh(self) -> bool:
        return self.view.refresh()

    def __len__(self) -> int:
        return self.view.num_clips(*self.args)

    def __getitem__(self, i: int) -> dict[str, Any]:
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
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
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
            time.sleep(self.poll_s)
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


def concat_batches(parts: list[Any]) -> Any:
    """Concatenate nested dicts of tensors/arrays along the batch axis."""
    first = parts[0]
    if isinstance(first, dict):
        return {k: concat_batches([p[k] for p in parts]) for k in first}
    if isinstance(first, torch.Tensor):
        return torch.cat(parts, 0)
    return np.concatenate(parts, 0)
