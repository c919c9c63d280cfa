"""``zreplay.ReplayBuffer``: stable-worldmodel's ``ReplayBuffer`` contract, persistent.

Same constructor, ``Writer`` protocol (``write_episode``/``write_episodes``, context
manager), ``Dataset`` protocol (``__len__`` = valid clips, ``__getitem__`` = one clip),
sampler hook ``fn(step, buffer, batch_size, history_len) -> flat clip indices`` with an
auto-incrementing step, frameskip (observation columns strided, ``action`` dense and
reshaped to ``(history_len, frameskip * action_dim)``), whole-episode FIFO eviction at
``max_steps`` and the same ``ValueError`` messages.  On top of it:

* every episode is committed to a Zarr store (``path=``; a private temporary one without);
  reopening ``path`` resumes the episodes, the step counter and the random stream;
* dtypes are checked (stable-worldmodel silently casts);
* DataLoader workers reopen the store read-only instead of using a forked copy, so
  episodes written after the workers started become visible to them;
* n-step returns, padded clips (``pad="zero" | "repeat"`` with an ``is_pad`` mask) and
  ``dump(..., format="hdf5" | "zarr")``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data

from ..compat.dumps import dump
from ..compat.swm_episode import (
    EPISODE_DATA_KEY,
    as_trajectory,
    check_columns,
    episode_columns,
)
from ..core import BufferCore, RamPolicy, RandomStream
from ..errors import SchemaError
from ..sampling.clips import ClipSpec
from ..sampling.nstep import NStepSpec
from ..sampling.samplers import Sampler
from ..schema import unflatten

DEFAULT_RAM_BYTES = 1 << 30
WORKER_WAIT_S = 10.0  # how long a worker waits for an episode the parent has not committed


class ReplayBuffer(torch.utils.data.Dataset):
    """Episode replay buffer with stable-worldmodel's API on a persistent Zarr store.

    Args (stable-worldmodel's):
        max_steps: capacity in steps; the oldest whole episodes are evicted (FIFO) so
            that at most ``max_steps`` are stored.  Reaching it exactly evicts nothing.
        history_len: frames per clip for ``__len__``/``__getitem__``/``sample``.
        frameskip: distance between a clip's frames; a clip spans
            ``history_len * frameskip`` steps and ``action`` is kept dense over it.
        sampler: ``fn(step, buffer, batch_size, history_len) -> flat clip indices``, or a
            :mod:`zreplay.samplers` sampler (``Uniform`` (default), ``Window``,
            ``Recency``, ``Prioritized``, ``PrioritizedClips``), used by ``sample`` and
            ``sample_nstep``; its state and priorities are saved with the buffer.
        transform: applied to each clip returned by ``__getitem__`` (not by ``sample``).
        key_filter: ``fn(episode_dict) -> episode_dict`` applied before writing.

    Args (zreplay's):
        path: buffer directory (Zarr v3) or ``s3://bucket/prefix``.  An existing buffer is
            resumed.  ``None``: a private temporary store removed on ``close()``.
        pad: ``None`` (clips lie inside episodes; shorter episodes give none), ``"zero"``
            or ``"repeat"``: clips may start before an episode's first step (their last
            frame is real), padded frames zeroed or repeated, ``is_pad`` marks them.
        action_keys: columns kept dense under frameskip (default ``("action",)``).
        seed: seed of the private random generator (saved with the buffer).
        ram_budget_bytes: RAM kept for decoded recent steps (the rest reads from disk).
        staging_bytes: RAM for written steps waiting for the background writer beyond
            ``ram_budget_bytes`` (default 256 MiB, at most 1/16 of RAM; then writes wait).
        overwrite: start fresh even if ``path`` holds a buffer.
        durable: fsync before each commit is published.
        storage_options: fsspec/s3fs options for an ``s3://`` path (``endpoint_url``...).
    """

    def __init__(
        self,
        max_steps: int,
        history_len: int = 1,
        frameskip: int = 1,
        sampler: Sampler | Callable | None = None,
        transform: Callable | None = None,
        key_filter: Callable | None = None,
        path: str | Path | None = None,
        *,
        pad: str | None = None,
        action_keys: Iterable[str] = ("action",),
        seed: int | None = None,
        ram_budget_bytes: int | None = DEFAULT_RAM_BYTES,
        staging_bytes: int | None = None,
        layout: Mapping[str, Mapping] | None = None,
        overwrite: bool = False,
        writer_id: str = "default",
        durable: bool = True,
        break_lock: bool = False,
        storage_options: Mapping | None = None,
    ):
        if int(max_steps) <= 0:
            raise ValueError(f"max_steps must be > 0, got {max_steps}")
        self.max_steps = int(max_steps)
        self.spec = ClipSpec(history_len, frameskip, pad, tuple(action_keys))
        self.history_len, self.frameskip, self.pad = history_len, frameskip, pad
        self.transform, self.key_filter = transform, key_filter
        self._hook = sampler
        self._warned_episode_data = False
        self._pid = os.getpid()
        self._replica = None
        self.core = BufferCore.writer(
            path,
            sampler=sampler,
            stream=RandomStream(seed, tag="swm"),
            owner=self,
            writer_id=writer_id,
            capacity=self.max_steps,
            ram=RamPolicy(enabled=True, trajectories=None, max_bytes=ram_budget_bytes),
            staging_bytes=staging_bytes,
            layout=layout,
            durable=durable,
            overwrite=overwrite,
            break_lock=break_lock,
            storage_options=storage_options,
        )
        self.path = self.core.path

    @property
    def sampler(self) -> Sampler | Callable | None:
        """What the buffer samples with: a ``fn(step, buffer, batch_size, history_len)``
        hook or a :mod:`zreplay.samplers` sampler (``None``: uniform).  Assignable."""
        return self._hook

    @sampler.setter
    def sampler(self, sampler: Sampler | Callable | None) -> None:
        if not self.core.closed:
            self.core.set_sampler(sampler)
        self._hook = sampler

    def state_dict(self) -> dict:
        """The sampler's state at this instant (step counter, seed, random generator and,
        for a prioritized sampler, every row's priority as arrays), for a training
        checkpoint (``torch.save``): the store also saves it with commits, but a commit's
        timing is the writer thread's."""
        return self.core.full_state()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (priorities of rows evicted since
        are dropped)."""
        self.core.load_full_state(state)

    def update_priorities(self, indices, priorities) -> int:
        """Set the priorities of what a batch drew (``batch["index"]``: each clip's start
        row) to ``priorities`` (one per index, or a scalar; numpy or torch); returns how
        many were applied (rows evicted since are skipped).  Needs a prioritized
        sampler (``TypeError`` otherwise)."""
        return self.core.update_priorities(indices, priorities)

    def priorities(self, indices) -> np.ndarray:
        """Tree leaves ``(p + eps) ** alpha`` (float64) of rows ``indices``."""
        return self.core.priorities(indices)

    # -- Writer protocol --------------------------------------------------------------

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc) -> None:
        if not self.core.closed:
            self.core.flush()

    def write_episodes(self, episodes: Iterable[Mapping[str, Any]]) -> None:
        for ep in episodes:
            self.write_episode(ep)

    def write_episode(self, ep: Mapping[str, Any]) -> None:
        """Append one episode: ``{column: per-step values}`` (a list of per-step arrays or
        one array with a leading step axis; nested dicts allowed).

        No-ops: an empty dict, a dict emptied by ``key_filter``, a zero-length episode.
        ``ValueError`` (nothing written): a scalar column, columns of unequal length, an
        episode longer than ``max_steps``, a column set, per-step shape or dtype that
        differs from the first episode's.
        """
        if not ep:
            return
        ep = dict(ep)
        if EPISODE_DATA_KEY in ep:
            ep.pop(EPISODE_DATA_KEY)
            if not self._warned_episode_data:
                warnings.warn(
                    "zreplay.ReplayBuffer stores per-step columns only; '_episode_data' "
                    "was dropped",
                    stacklevel=2,
                )
                self._warned_episode_data = True
        if self.key_filter is not None:
            ep = dict(self.key_filter(ep))
            if not ep:
                return
        cols, n = episode_columns(ep)
        if n == 0:
            return
        if n > self.max_steps:
            raise SchemaError(f"episode length {n} exceeds max_steps={self.max_steps}")
        check_columns(self.core.schema, cols)
        self.core.add([as_trajectory(cols, n)])

    def flush(self) -> None:
        """Wait until every written episode is committed to the store."""
        self.core.flush()

    def close(self) -> None:
        """Commit, save the step counter and release the writer lock (idempotent)."""
        self.core.close()

    # -- shape of the contents --------------------------------------------------------

    @property
    def num_steps_stored(self) -> int:
        return self.core.num_rows

    @property
    def num_episodes(self) -> int:
        """Episodes (whole or partly) in the visible data."""
        return self.core.num_episodes

    def episode_table(self) -> dict[str, np.ndarray]:
        """Per-episode columns (id, length, first_step, terminated, truncated)."""
        return self.core.episode_table()

    @property
    def lengths(self) -> np.ndarray:
        """Stored episode lengths, oldest first."""
        return self.core.episodes().length.copy()

    @property
    def offsets(self) -> np.ndarray:
        """Logical start of each stored episode (oldest = 0)."""
        ln = self.core.episodes().length
        return np.concatenate([[0], np.cumsum(ln)[:-1]]).astype(np.int64) if len(ln) else ln

    @property
    def column_names(self) -> list[str]:
        return self.core.keys

    @property
    def step(self) -> int:
        """The sampler step counter (incremented by every ``sample`` without ``step=``)."""
        return self.core.stream.step

    def num_valid_ends(self, history_len: int | None = None) -> int:
        """Number of valid clips of ``history_len`` frames (``frameskip`` apart)."""
        return self.core.num_clips(self._clip_spec(history_len))

    def _clip_spec(self, history_len: int | None) -> ClipSpec:
        h = self.spec.history_len if history_len is None else history_len
        if h == self.spec.history_len:
            return self.spec
        return ClipSpec(h, self.spec.frameskip, self.spec.pad, self.spec.action_keys)

    # -- reading ----------------------------------------------------------------------

    def sample(
        self, batch_size: int, history_len: int | None = None, step: int | None = None
    ) -> dict[str, np.ndarray]:
        """``batch_size`` clips ``{column: [batch, history_len, ...]}`` (numpy, no
        transform), chosen by the sampler (uniformly over all valid clips by default).
        A prioritized sampler adds ``index`` (int64 ``[batch]``: each clip's start row)
        and ``weight`` (float32 ``[batch]`` importance weights)."""
        spec = self._clip_spec(history_len)
        return unflatten(self.core.sample_clips(spec, _batch(batch_size), step=step))

    def sample_nstep(self, batch_size: int, n: int = 1, gamma: float = 0.99, **kw) -> dict:
        """``batch_size`` transitions with n-step returns (see ``NStepSpec``): data at
        ``t``, ``next_obs`` up to ``n`` steps ahead, ``return``, ``discount``,
        ``n_steps``, ``terminated_n``."""
        keys = kw.pop("keys", None)
        spec = NStepSpec(n, gamma, **kw)
        return unflatten(self.core.sample_nstep(spec, _batch(batch_size), keys))

    def episodes(self) -> Iterator[dict[str, list[np.ndarray]]]:
        """Stored episodes, oldest first, as ``{column: [per-step arrays]}`` (what
        ``write_episode`` accepts)."""
        for e in range(self.num_episodes):
            got = self.core.episode(e)
            yield unflatten({k: list(v) for k, v in got.items()})

    def clear(self) -> None:
        """Drop every episode (on disk too); the schema stays locked, the step counter
        and random stream go on."""
        self.core.clear()

    def dump(self, path: str | Path, format: str = "hdf5", mode: str = "overwrite", **kw) -> None:
        """Write the stored episodes to ``path`` as ``"hdf5"`` (one file) or ``"zarr"`` (a
        zreplay buffer directory).  ``mode``: ``"overwrite"`` | ``"append"`` | ``"error"``."""
        dump(self, path, format=format, mode=mode, **kw)

    # -- Dataset protocol ---------------------------------------------------------------

    def __len__(self) -> int:
        if os.getpid() != self._pid:
            return len(self._worker_dataset())
        return self.num_valid_ends()

    def __getitem__(self, idx: int) -> dict[str, Any]:
        if os.getpid() != self._pid:
            return self._worker_dataset()[int(idx)]
        n = len(self)
        if n == 0:
            raise IndexError("ReplayBuffer is empty")
        if not -n <= idx < n:
            raise IndexError(idx)
        got = self.core.clips(self.spec, [int(idx) % n])
        clip = unflatten({k: v[0] for k, v in got.items()})
        return self.transform(clip) if self.transform is not None else clip

    # DataLoader workers: never touch the parent's engine (its threads do not survive a
    # fork); read the committed store through a ClipDataset of this process, which
    # waits a little for an episode the parent has written but not yet committed.

    def _worker_dataset(self):
        if self._replica is None or self._replica[0] != os.getpid():
            from .torch_data import ClipDataset

            ds = ClipDataset(
                self.path,
                self.spec.history_len,
                frameskip=self.spec.frameskip,
                pad=self.spec.pad,
                action_keys=self.spec.action_keys,
                transform=self.transform,
                wait_s=WORKER_WAIT_S,
            )
            self._replica = (os.getpid(), ds)
        return self._replica[1]

    def refresh(self) -> bool:
        """In a DataLoader worker: pick up episodes committed since it started."""
        if os.getpid() != self._pid:
            return self._worker_dataset().refresh()
        return False

    def __getstate__(self) -> dict:
        # Pickled for spawn-started workers: a read-only replica by path.
        self.flush()
        skip = ("core", "_replica")
        state = {k: v for k, v in self.__dict__.items() if k not in skip}
        state["_pid"] = -1
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._replica = None
        self.core = _ReplicaCore(self.path)

    def __repr__(self) -> str:
        return (
            f"<zreplay.ReplayBuffer {self.path}: {self.num_episodes} episodes, "
            f"{self.num_steps_stored}/{self.max_steps} steps, columns={self.column_names}>"
        )


class _ReplicaCore:
    """Stands in for the core in an unpickled replica (read through a view only)."""

    closed = True

    def __init__(self, path):
        self.path = path

    def __getattr__(self, name):
        raise RuntimeError(
            "this ReplayBuffer is a read-only replica in a DataLoader worker; write "
            "through the original object"
        )


def _batch(batch_size: int) -> int:
    if int(batch_size) <= 0:
        raise ValueError(f"batch_size must be > 0, got {batch_size}")
    return int(batch_size)
