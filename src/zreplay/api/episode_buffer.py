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
* DataLoader workers reopen the store read-only instead of using a forked copy, and
  (persistent workers too) serve every item from the newest commit: once ``flush()``
  returns, items come from what it committed (cleared episodes never again);
* n-step returns, padded clips (``pad="zero" | "repeat"`` with an ``is_pad`` mask) and
  ``dump(..., format="hdf5" | "zarr")``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Unpack

import numpy as np
import torch.utils.data

from ..compat.dumps import dump
from ..compat.swm_episode import (
    EPISODE_DATA_KEY,
    ReplicaCore,
    UniformClips,
    as_trajectory,
    check_columns,
    check_length,
    episode_columns,
    positive,
    sample_error,
    warn_episode_data,
)
from ..core import BufferCore, RamPolicy, RandomStream
from ..core.options import StoreOptions, store_options
from ..errors import CorruptBufferError, EmptyBufferError
from ..forks import Origin
from ..numbers import as_int, as_optional_float
from ..samplers import Sampler
from ..sampling.clips import ClipSpec
from ..sampling.nstep import NStepSpec
from ..schema import flatten, unflatten
from .facade import Of, WritableFacade
from .view import BufferView

WORKER_WAIT_S = 10.0  # how long a worker waits for an episode the parent has not committed


class ReplayBuffer(WritableFacade, torch.utils.data.Dataset):
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
        **store: the store options every writable buffer takes (:class:`zreplay.StoreOptions`:
            ``writer_id``, ``durable``, ``overwrite``, ``break_lock``, ``layout``,
            ``storage_options``, ``ram_budget_bytes`` (default 1 GiB of recent steps),
            ``staging_bytes``, ``rate_limiter``, ``learner_id``).
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
        **store: Unpack[StoreOptions],
    ):
        opts = store_options("ReplayBuffer", store)
        ram_budget_bytes = opts.pop("ram_budget_bytes")
        for name, value in (("max_steps", max_steps), ("history_len", history_len)):
            positive(name, value)
        positive("frameskip", frameskip)
        self.max_steps = int(max_steps)
        self.history_len = int(history_len)
        self.num_steps = self.history_len  # stable-worldmodel: "Dataset's num_steps"
        self.frameskip = int(frameskip)
        self.span = self.num_steps * self.frameskip
        self.spec = ClipSpec(self.history_len, self.frameskip, pad, tuple(action_keys))
        self.pad = pad
        self.transform, self.key_filter = transform, key_filter
        self._hook = None if isinstance(sampler, UniformClips) else sampler
        self._warned_episode_data = False
        # Which process owns the writer (None in an unpickled replica): anywhere else
        # (a forked or spawned DataLoader worker) reads through a replica of its own.
        self._origin: Origin | None = Origin()
        self._replica = None
        self.core = BufferCore.writer(
            path,
            sampler=sampler,
            stream=RandomStream(seed, tag="swm"),
            owner=self,
            capacity=self.max_steps,
            ram=RamPolicy(enabled=True, trajectories=None, max_bytes=ram_budget_bytes),
            **opts,
        )
        self.path = self.core.path
        try:  # a refusal here must not leave the writer lock held by a half-made buffer
            # Columns in the first episode's order (stable-worldmodel's), kept with commits.
            self._order = _saved_order(self.core.facade_state.get("columns"), self.path)
        except BaseException:
            self.core.close()
            raise

    @property
    def sampler(self) -> Sampler | Callable:
        """What the buffer samples with: a ``fn(step, buffer, batch_size, history_len)``
        hook or a :mod:`zreplay.samplers` sampler; by default a :class:`UniformClips`
        hook (stable-worldmodel's uniform sampler).  Assignable (``None``: uniform)."""
        return UniformClips() if self._hook is None else self._hook

    @sampler.setter
    def sampler(self, sampler: Sampler | Callable | None) -> None:
        if isinstance(sampler, UniformClips):
            sampler = None  # the default, drawn by zreplay's vectorized Uniform
        if not self.core.closed:
            self.core.set_sampler(sampler)
        self._hook = sampler

    state_dict = Of(
        "core",
        "full_state",
        doc="The sampler's state at this instant (step counter, seed, random generator "
        "and, for a prioritized sampler, every row's priority as arrays), for a training "
        "checkpoint (torch.save): the store also saves it with commits, but a commit's "
        "timing is the writer thread's.",
    )
    load_state_dict = Of(
        "core",
        "load_full_state",
        doc="Restore what state_dict() returned (priorities of rows evicted since are dropped).",
    )

    # -- Writer protocol --------------------------------------------------------------

    def __exit__(self, exc_type, *exc) -> None:
        """Commit what was written and stay open: stable-worldmodel's ``World.collect``
        enters and leaves its writer on every call (``close()`` releases the buffer).  On
        an exception nothing is waited for (a failed commit must not hide it)."""
        if exc_type is None and not self.core.closed:
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
            self._warned_episode_data = self._warned_episode_data or warn_episode_data()
        if self.key_filter is not None:
            ep = self.key_filter(ep)
            if not ep:  # None or empty: a no-op (stable-worldmodel's ``if not ep_data``)
                return
            ep = dict(ep)
        cols, n = episode_columns(ep)
        if n == 0:
            return
        check_length(n, self.max_steps)
        check_columns(self.core.schema, cols)
        if self.core.schema is None:
            self._order = self.core.facade_state["columns"] = list(cols)
        self.core.add([as_trajectory(cols, n)])

    num_steps_stored = Of("core.engine", "num_rows", doc="Steps (rows) stored.")

    @property
    def lengths(self) -> np.ndarray:
        """Stored episode lengths, oldest first (int32, as stable-worldmodel)."""
        return self.core.episodes().length.astype(np.int32)

    @property
    def offsets(self) -> np.ndarray:
        """Logical start of each stored episode (oldest = 0)."""
        ln = self.core.episodes().length
        return np.concatenate([[0], np.cumsum(ln)[:-1]]).astype(np.int64) if len(ln) else ln

    @property
    def column_names(self) -> list[str]:
        """Column key paths in the first episode's order."""
        keys = self.core.keys
        return [k for k in self._order if k in keys] if self._order else keys

    def _ordered(self, flat: dict) -> dict:
        """``flat`` columns in :attr:`column_names` order (extras last), nested."""
        return self._in_order(flat, self.column_names)

    @staticmethod
    def _in_order(flat: dict, names) -> dict:
        first = {k: flat[k] for k in names or () if k in flat}
        return unflatten({**first, **{k: v for k, v in flat.items() if k not in first}})

    step = Of(
        "core.stream",
        doc="The sampler step counter (incremented by every sample() without step=).",
    )

    def num_valid_ends(self, history_len: int | None = None) -> int:
        """Number of valid clips of ``history_len`` frames (``frameskip`` apart)."""
        return self._clip_spec(history_len).num_clips(self.core.episodes())

    def _clip_spec(self, history_len: int | None) -> ClipSpec:
        h = self.spec.history_len if history_len is None else history_len
        if h == self.spec.history_len:
            return self.spec
        return ClipSpec(h, self.spec.frameskip, self.spec.pad, self.spec.action_keys)

    # -- reading ----------------------------------------------------------------------

    def sample(
        self,
        batch_size: int,
        history_len: int | None = None,
        step: int | None = None,
        version: float | None = None,
    ) -> dict[str, np.ndarray]:
        """``batch_size`` clips ``{column: [batch, history_len, ...]}`` (numpy, no
        transform), chosen by the sampler (uniformly over all valid clips by default).
        A prioritized sampler adds ``index`` (int64 ``[batch]``: each clip's start row)
        and ``weight`` (float32 ``[batch]`` importance weights); ``version``: the policy
        version being trained (for ``Staleness``)."""
        positive("batch_size", batch_size)  # stable-worldmodel's check, then the type
        n = as_int(batch_size, "batch_size")
        h = self.history_len if history_len is None else history_len
        positive("history_len", h)
        spec = self._clip_spec(int(h))
        step = None if step is None else as_int(step, "step")
        version = as_optional_float(version, "version")
        try:
            got = self.core.sample_clips(spec, n, step=step, version=version)
        except (EmptyBufferError, ValueError, IndexError) as e:
            sample_error(e, self, spec.history_len)
            raise
        return self._ordered(got)

    def sample_nstep(self, batch_size: int, n: int = 1, gamma: float = 0.99, **kw) -> dict:
        """``batch_size`` transitions with n-step returns (see ``NStepSpec``): data at
        ``t``, ``next_obs`` up to ``n`` steps ahead, ``return``, ``discount``,
        ``n_steps``, ``terminated_n``."""
        keys = kw.pop("keys", None)
        version = as_optional_float(kw.pop("version", None), "version")
        spec = NStepSpec(n, gamma, **kw)
        positive("batch_size", batch_size)
        got = self.core.sample_nstep(spec, as_int(batch_size, "batch_size"), keys, version=version)
        return self._ordered(got)

    def episodes(self) -> Iterator[dict[str, list[np.ndarray]]]:
        """Stored episodes, oldest first, as ``{column: [per-step arrays]}`` (what
        ``write_episode`` accepts)."""
        for e in range(self.num_episodes):
            got = self.core.episode(e)
            yield self._ordered({k: list(v) for k, v in got.items()})

    def dump(self, path: str | Path, format: str = "hdf5", mode: str = "overwrite", **kw) -> None:
        """Write the stored episodes to ``path`` as ``"hdf5"`` (one file in
        stable-worldmodel's layout: its ``load_dataset`` reads it) or ``"zarr"`` (a
        zreplay buffer directory).  ``mode``: ``"overwrite"`` | ``"append"`` | ``"error"``."""
        dump(self, path, format=format, mode=mode, **kw)

    # -- Dataset protocol ---------------------------------------------------------------

    @property
    def _in_worker(self) -> bool:
        return self._origin is None or self._origin.inherited

    def __len__(self) -> int:
        if self._in_worker:
            return len(self._worker_dataset())
        return self.num_valid_ends()

    def __getitem__(self, idx: int) -> dict[str, Any]:
        # Indices and their IndexErrors are stable-worldmodel's (tests/test_swm_protocol.py
        # compares them with its own buffer's), not numpy's as a view's are.  A float or a
        # bool is refused: stable-worldmodel's buffer would truncate it to some clip.
        idx = as_int(idx, "index")
        if self._in_worker:  # a DataLoader worker: columns in the same order
            clip = self._in_order(flatten(self._worker_dataset()[idx]), self._order)
            return self.transform(clip) if self.transform is not None else clip
        n = len(self)
        if n == 0:
            raise IndexError("ReplayBuffer is empty")
        if idx < 0:
            idx += n
        if not 0 <= idx < n:
            raise IndexError(idx)
        got = self.core.clips(self.spec, [idx])
        clip = self._ordered({k: v[0] for k, v in got.items()})
        return self.transform(clip) if self.transform is not None else clip

    # DataLoader workers: never touch the parent's engine (its threads do not survive a
    # fork); read the committed store through a ClipDataset of this process, which
    # waits a little for an episode the parent has written but not yet committed.

    def _worker_dataset(self):
        if self._replica is None or self._replica[0].inherited:
            from .torch_data import ClipDataset

            options = self.__dict__.get("_storage_options")  # reaches the store (S3)
            ds = ClipDataset(
                BufferView(self.path, storage_options=options),
                self.spec.history_len,
                frameskip=self.spec.frameskip,
                pad=self.spec.pad,
                action_keys=self.spec.action_keys,
                wait_s=WORKER_WAIT_S,
                follow=True,  # persistent workers outlive clear(), writes and flush()
            )
            self._replica = (Origin(), ds)
        return self._replica[1]

    def refresh(self) -> bool:
        """In a DataLoader worker: pick up episodes committed since it started."""
        if self._in_worker:
            return self._worker_dataset().refresh()
        return False

    def __getstate__(self) -> dict:
        # Pickled for spawn-started DataLoader workers: stable-worldmodel's Dataset API
        # over a read-only replica that reopens the store by path.  A temporary store
        # goes too: the workers live no longer than this process.
        skip = ("core", "_replica")
        state = {k: v for k, v in self.__dict__.items() if k not in skip}
        state["_origin"] = None  # a replica
        if not self.core.closed:
            h = self.core.handoff(
                "ReplayBuffer", "a read-only replica", allow_temporary=True, sampler=False
            )
            state["_storage_options"] = h.storage_options
        if not self.path.backend.is_local:  # an object-store path holds its client
            state["path"] = str(self.path)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._replica = None
        self.core = ReplicaCore(self.path)

    def __repr__(self) -> str:
        if self.core.closed:
            return f"ReplayBuffer(closed, path={self.path})"
        return (
            f"ReplayBuffer(episodes={self.num_episodes}, steps={self.num_steps_stored}/"
            f"{self.max_steps}, history_len={self.history_len}, frameskip={self.frameskip}, "
            f"columns=[{', '.join(self.column_names) or '-'}], path={self.path})"
        )

    # -- stable-worldmodel's Dataset methods (load_episode/load_chunk for World.evaluate and
    # its video helpers; like its own ReplayBuffer: numpy, every step, no transform) -----

    def _load_slice(self, ep_idx: int, start: int, end: int) -> dict[str, Any]:
        """Steps ``[start, end)`` of stored episode ``ep_idx`` (oldest = 0) as
        ``{column: [end - start, ...]}`` numpy arrays: every step (no frameskip stride,
        no action reshape, no transform), as stable-worldmodel's buffer."""
        if not 0 <= ep_idx < self.num_episodes:
            raise IndexError(ep_idx)
        return self._ordered(self.core.episode(int(ep_idx), None, int(start), int(end)))

    def load_episode(self, episode_idx: int) -> dict[str, Any]:
        """Every step of stored episode ``episode_idx`` (``[L, ...]`` per column)."""
        return self._load_slice(episode_idx, 0, self.lengths[episode_idx])

    def load_chunk(self, episodes_idx, start, end) -> list[dict[str, Any]]:
        """``_load_slice(e, s, t)`` for each ``(e, s, t)``, its action columns reshaped to
        ``((t - s) // frameskip, -1)`` (stable-worldmodel's ``Dataset.load_chunk``)."""
        chunk = []
        for ep, s, e in zip(episodes_idx, start, end, strict=False):  # swm: plain zip
            steps = self._load_slice(ep, s, e)
            for key in self.spec.action_keys:
                if key in steps:
                    steps[key] = steps[key].reshape((e - s) // self.frameskip, -1)
            chunk.append(steps)
        return chunk

    def get_col_data(self, col: str) -> np.ndarray:
        raise NotImplementedError  # as stable-worldmodel's ReplayBuffer

    def get_row_data(self, row_idx) -> dict:
        raise NotImplementedError

    def get_dim(self, col: str) -> int:
        raise NotImplementedError

    def merge_col(self, source, target: str, dim: int = -1) -> None:
        raise NotImplementedError


def _saved_order(columns, path) -> list[str] | None:
    """The column order a commit record saved (read from disk: a list of strings, or
    nothing); CorruptBufferError for anything else."""
    if columns is None or (isinstance(columns, list) and all(isinstance(c, str) for c in columns)):
        return columns
    raise CorruptBufferError(
        f"{path}: the column order saved in its commit record is damaged ({str(columns)[:80]}; "
        "expected a list of column names); restore the buffer from a checkpoint"
    )
