"""``zreplay.open(path)``: a read-only view of a buffer directory, like opening a dataset.

A view sees the union of every writer's segment, each clamped to its last commit, and
takes no lock: writers may keep appending in other processes; :meth:`BufferView.refresh`
picks up what they have committed since.  Positions (``sample``, ``__getitem__``,
``trajectory``) run over visible rows/trajectories in segment-name order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from . import sampling
from .clips import ClipSpec
from .engine.core import Prepared
from .episodes import EpisodeView, concat_pieces
from .errors import CorruptBufferError, EmptyBufferError
from .index import TrajectoryIndex, time_major
from .nstep import NStepSpec
from .samplers import RowSpace, Sampler, as_sampler
from .samplers.base import claim
from .samplers.view import ViewSampling
from .schema import unflatten
from .store.commit import Commit, read_commit
from .store.location import options_of
from .store.root import BufferRoot
from .store.segment import Segment

_RETRIES = 5


class _SegmentState:
    def __init__(self, segment: Segment, commit: Commit, index: TrajectoryIndex, before=None):
        self.segment, self.commit, self.index = segment, commit, index
        # Same rows as the state it follows (a sampler keeps what it knows of them), or
        # rows renumbered from scratch (the writer cleared or replaced its segment).
        self.epoch = before.epoch if before is not None and _continues(before, self) else object()


def _continues(old: _SegmentState, new: _SegmentState) -> bool:
    j = old.index.n - 1
    if j < 0:
        return True
    if new.index.n <= j or new.commit.n_rows < old.commit.n_rows:
        return False
    col = "trajectory_id"
    return int(new.index.column(col)[j]) == int(old.index.column(col)[j])


class BufferView(ViewSampling):
    """Read-only access to a zreplay buffer directory (numpy in, numpy out).

    ``sampler`` (a :mod:`zreplay.samplers` sampler or a ``fn(step, view, batch_size,
    history_len)`` hook; default uniform) draws ``sample``, ``sample_clips`` and
    ``sample_nstep``.  A prioritized sampler starts from the priorities each writer saved
    with its last commit (as tree leaves; use the writer's ``alpha``/``eps``), follows
    ``refresh()`` and keeps ``update_priorities`` in this process only: a view never
    writes.
    """

    def __init__(
        self,
        path: str | Path,
        seed: int | None = None,
        sampler=None,
        storage_options: dict | None = None,
    ):
        self.root = BufferRoot(path, storage_options)
        self.path = self.root.path
        self.root.read_meta()  # fails fast on a non-buffer
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        self._pid = os.getpid()
        self._segs: dict[str, _SegmentState] = {}
        self._seg_keys: dict[str, int] = {}  # writer id -> a number the sampler keys it by
        self._sampler_arg = sampler
        self.sampler: Sampler = as_sampler(sampler)
        claim(self.sampler, self)
        self.step = 0  # batches drawn (a hook's step; a prioritized sampler's beta clock)
        self.schema = None
        self.refresh()

    # A view handed to DataLoader workers reopens the store in each worker instead of
    # using handles (and TensorStore threads) inherited from the parent.

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._segs = {}
            self.schema = None
            self._rng = np.random.default_rng()  # workers must not replay the parent's draws
            self.refresh()

    def __getstate__(self) -> dict:
        return {
            "path": str(self.path),
            "seed": self._seed,
            "sampler": self._sampler_arg,
            "options": options_of(self.path),
        }

    def __setstate__(self, state: dict) -> None:
        self.__init__(
            state["path"],
            seed=None,
            sampler=state.get("sampler"),
            storage_options=state.get("options"),
        )

    # -- discovery ------------------------------------------------------------------

    def refresh(self) -> bool:
        """Re-read every segment's commit; returns True if anything new became visible."""
        if os.getpid() != self._pid:
            self._check_process()
            return True
        changed = False
        if self.schema is None:
            self.schema, self._layouts = self.root.schema()
            if self.schema is None:
                self._rebuild()
                return False
        for wid in self.root.writer_ids():
            seg_dir = self.root.segment_dir(wid)
            commit = read_commit(seg_dir)
            if commit is None:
                continue
            st = self._segs.get(wid)
            if st is not None and st.commit.gen == commit.gen:
                continue
            seg = st.segment if st else Segment(seg_dir, self.schema, self._layouts, writable=False)
            index = TrajectoryIndex(seg.read_index(commit), low=commit.low_traj)
            self._segs[wid] = _SegmentState(seg, commit, index, before=st)
            self._seg_keys.setdefault(wid, len(self._seg_keys))
            changed = True
        self._rebuild()
        return changed

    def _rebuild(self) -> None:
        states = [self._segs[w] for w in sorted(self._segs)]
        self._order = states
        rows = [s.index.visible_rows for s in states]
        trajs = [s.index.num_visible for s in states]
        self._cum_rows = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        self._cum_traj = np.concatenate([[0], np.cumsum(trajs, dtype=np.int64)])
        self._episodes: EpisodeView | None = None
        self._rows: RowSpace | None = None

    def episodes(self) -> EpisodeView:
        """The visible episodes of every segment (rows as visible positions)."""
        if self._episodes is None:
            parts = []
            for si, st in enumerate(self._order):
                p = dict(st.index.pieces.visible())
                p["start"] = p["start"] - st.index.low_row + self._cum_rows[si]
                parts.append(p)
            self._episodes = EpisodeView(concat_pieces(parts))
        return self._episodes

    @property
    def num_episodes(self) -> int:
        return len(self.episodes())

    def episode_table(self) -> dict[str, np.ndarray]:
        """Per-episode columns (episode id, length, first_step, terminated, truncated)."""
        return sampling.episode_table(self.episodes())

    # -- shape of the data ----------------------------------------------------------

    @property
    def num_rows(self) -> int:
        """Visible transitions (rows) over all segments."""
        return int(self._cum_rows[-1])

    @property
    def num_trajectories(self) -> int:
        return int(self._cum_traj[-1])

    @property
    def writer_ids(self) -> list[str]:
        return [s.segment.writer_id for s in self._order]

    @property
    def next_trajectory_id(self) -> int:
        return max((s.commit.next_trajectory_id for s in self._order), default=0)

    def keys(self) -> list[str]:
        """Stored key paths, e.g. ``["actions", "curr_obs/main_images", ...]``."""
        return [] if self.schema is None else self.schema.keys

    def _keys(self) -> list[str]:
        return self.keys()

    def _view(self) -> EpisodeView:
        return self.episodes()

    def __len__(self) -> int:
        return self.num_rows

    def __repr__(self) -> str:
        return (
            f"<zreplay view {self.path}: {self.num_trajectories} trajectories, "
            f"{self.num_rows} rows, {len(self._order)} segment(s), keys={self.keys()}>"
        )

    # -- reads ----------------------------------------------------------------------

    def _read_positions(self, pos: np.ndarray, keys: list[str]) -> dict[str, np.ndarray]:
        self._check_process()
        seg_of = np.searchsorted(self._cum_rows, pos, side="right") - 1
        out = {
            k: np.empty((len(pos), *self.schema.specs[k].row_shape), self.schema.specs[k].dtype)
            for k in keys
        }
        pending = []
        for si in np.unique(seg_of):
            st = self._order[si]
            sel = np.nonzero(seg_of == si)[0]
            rows = st.index.low_row + (pos[sel] - self._cum_rows[si])
            uniq, inv = np.unique(rows, return_inverse=True)
            futs = {k: st.segment.read_rows(k, uniq) for k in keys}
            pending.append((st, sel, inv, int(uniq[0]), futs))
        for st, sel, inv, first, futs in pending:
            # A writer deletes evicted shards only after announcing it in its commit: if
            # that happened under us, the read failed or returned fill values.
            try:
                for k, f in futs.items():
                    out[k][sel] = f.result()[inv]
            except CorruptBufferError:
                if not _reclaimed(st, first):
                    raise
                raise _Evicted() from None
            # Where a deleted chunk fails to read (above), a read that succeeded is sound;
            # where it reads as fill values, only the commit can tell.
            if st.segment.fills_missing and _reclaimed(st, first):
                raise _Evicted()
        return out

    def _gather(self, fn) -> dict[str, np.ndarray]:
        """Sampling-module gather: ``fn(episodes) -> {name: (key, positions)}``."""
        self._check_process()
        for _ in range(_RETRIES):
            requests = fn(self.episodes())
            out = {}
            try:
                for r, members in sampling.group_requests(requests):
                    got = self._read_positions(
                        np.asarray(r, np.int64).reshape(-1), sorted({k for _, k in members})
                    )
                    for name, key in members:
                        out[name] = got[key].reshape(*r.shape, *got[key].shape[1:])
                return out
            except _Evicted:
                self.refresh()
        raise EmptyBufferError("rows kept being evicted while reading; sample again")

    def num_clips(self, history_len: int = 1, frameskip: int = 1, pad: str | None = None) -> int:
        """Valid clips of ``history_len`` frames ``frameskip`` apart (see sample_clips)."""
        return ClipSpec(history_len, frameskip, pad).num_clips(self.episodes())

    def sample_clips(self, batch_size: int, history_len: int = 1, **kw) -> dict[str, Any]:
        """``batch_size`` clips ``[batch, history_len, ...]`` drawn by the sampler over all
        valid clips (uniformly by default); never across an episode boundary.  ``kw``:
        ``frameskip``, ``pad``, ``keys``, ``action_keys`` (see :meth:`clips`)."""
        return self._clips(self._pick(batch_size), history_len, **kw)

    def clips(self, indices, history_len: int = 1, **kw) -> dict[str, Any]:
        """Clips at flat clip indices ``[0, num_clips(...))``, oldest episode first.

        ``frameskip``: frames ``frameskip`` steps apart, ``action_keys`` kept dense and
        reshaped to ``(history_len, frameskip * action_dim)``; ``pad``: ``None``,
        ``"zero"`` or ``"repeat"`` (clips may start before an episode, ``is_pad`` marks
        the padded frames); ``keys``: stored keys to return (default all)."""
        return self._clips(sampling.fixed(indices), history_len, **kw)

    def _clips(
        self,
        pick,
        history_len: int,
        frameskip: int = 1,
        pad: str | None = None,
        keys: list[str] | None = None,
        action_keys: tuple[str, ...] = ("action",),
    ) -> dict[str, Any]:
        spec = ClipSpec(history_len, frameskip, pad, action_keys)
        return sampling.as_nested(
            sampling.gather_clips(self._gather, spec, keys or self.keys(), pick)
        )

    def sample_nstep(self, batch_size: int, n: int = 1, gamma: float = 0.99, **kw) -> dict:
        """n-step transitions (see :class:`zreplay.nstep.NStepSpec` for ``kw``)."""
        keys = kw.pop("keys", None)
        spec = NStepSpec(n, gamma, **kw)
        return sampling.as_nested(
            sampling.gather_nstep(self._gather, spec, self.keys(), self._pick(batch_size), keys)
        )

    def episode(self, e: int, keys: list[str] | None = None) -> dict[str, Any]:
        """Visible steps of episode ``e`` (oldest first) as nested ``[L, ...]`` arrays."""
        return sampling.as_nested(sampling.gather_episode(self._gather, keys or self.keys(), e))

    def rows(self, positions, keys: list[str] | None = None) -> dict[str, Any]:
        """Rows at visible positions ``[0, num_rows)`` as a nested dict of numpy arrays."""
        keys = self.keys() if keys is None else list(keys)
        pos = np.asarray(positions, np.int64).reshape(-1)
        if len(pos) and (pos.min() < 0 or pos.max() >= self.num_rows):
            raise IndexError(f"row positions must lie in [0, {self.num_rows})")
        for _ in range(_RETRIES):
            try:
                return unflatten(self._read_positions(pos, keys))
            except _Evicted:
                self.refresh()
        raise EmptyBufferError("rows kept being evicted while reading; sample again")

    def sample(self, n: int, keys: list[str] | None = None) -> dict[str, Any]:
        """``n`` rows drawn with replacement by the sampler (uniformly by default), as a
        nested dict of numpy arrays; a prioritized sampler adds ``index`` (int64 ``[n]``)
        and ``weight`` (float32 ``[n]``), and ``PrioritizedClips`` makes them ``n`` clips."""
        if n <= 0:
            raise ValueError(f"n must be > 0, got {n}")
        clips = self.sampler.clips
        if clips is not None:
            return self.sample_clips(
                n,
                clips.history_len,
                frameskip=clips.frameskip,
                pad=clips.pad,
                keys=keys,
                action_keys=clips.action_keys,
            )
        step, self.step = self.step, self.step + 1
        for _ in range(_RETRIES):
            if self.num_rows == 0:
                raise EmptyBufferError(f"{self.path} holds no committed transitions")
            pos, extra = self.sampler.draw_rows(self._context(step), n)
            try:
                got = self._read_positions(np.asarray(pos, np.int64), keys or self.keys())
                return unflatten(sampling.add_extra(got, extra))
            except _Evicted:
                self.refresh()
        raise EmptyBufferError("rows kept being evicted while sampling; sample again")

    def __getitem__(self, i: int) -> dict[str, Any]:
        out = self.rows([i])
        return _map(out, lambda a: a[0])

    def segment_rows(self, start: int = 0, stop: int | None = None) -> list[tuple[str, int, int]]:
        """Visible trajectories ``[start, stop)`` as ``(writer_id, first_row, stop_row)``
        per segment.  Segment rows are never reused, so unlike positions (which shift when
        an earlier segment grows or evicts) they name the same rows after a ``refresh()``
        and in another process."""
        stop = self.num_trajectories if stop is None else stop
        if not 0 <= start <= stop <= self.num_trajectories:
            raise IndexError(f"[{start}, {stop}) is not within [0, {self.num_trajectories}]")
        out = []
        for si, st in enumerate(self._order):
            lo = max(start, int(self._cum_traj[si])) - int(self._cum_traj[si])
            hi = min(stop, int(self._cum_traj[si + 1])) - int(self._cum_traj[si])
            if hi > lo:
                off = st.index.offsets
                j0, j1 = st.index.low + lo, st.index.low + hi
                out.append((st.segment.writer_id, int(off[j0]), int(off[j1])))
        return out

    def positions_of(self, writer_id: str, rows) -> np.ndarray:
        """Current positions (for :meth:`rows`) of rows of segment ``writer_id``; an
        IndexError if any is not visible (evicted, or not yet seen by ``refresh()``)."""
        rows = np.asarray(rows, np.int64)
        for si, st in enumerate(self._order):
            if st.segment.writer_id == writer_id:
                idx = st.index
                if rows.size and (rows.min() < idx.low_row or rows.max() >= idx.n_rows):
                    raise IndexError(
                        f"rows of segment {writer_id!r} outside its visible rows "
                        f"[{idx.low_row}, {idx.n_rows}) (evicted, or refresh() first)"
                    )
                return self._cum_rows[si] + (rows - idx.low_row)
        raise IndexError(f"{self.path} has no visible segment {writer_id!r}")

    def _locate_trajectory(self, i: int) -> tuple[_SegmentState, int]:
        n = self.num_trajectories
        if not -n <= i < n:
            raise IndexError(f"trajectory {i} out of range for {n} trajectories")
        i %= n
        si = int(np.searchsorted(self._cum_traj, i, side="right") - 1)
        st = self._order[si]
        return st, st.index.low + (i - int(self._cum_traj[si]))

    def _read_trajectory_flat(self, st: _SegmentState, j: int) -> dict[str, np.ndarray]:
        idx = st.index
        lo, hi = int(idx.offsets[j]), int(idx.offsets[j + 1])
        T, B = int(idx.column("T")[j]), int(idx.column("B")[j])
        futs = {k: st.segment.read_range(k, lo, hi) for k in self.keys()}
        return {k: time_major(f.result(), T, B) for k, f in futs.items()}

    def trajectory(self, i: int) -> dict[str, Any]:
        """Visible trajectory ``i`` as nested ``[T, B, ...]`` arrays plus its metadata."""
        st, j = self._locate_trajectory(i)
        out = unflatten(self._read_trajectory_flat(st, j))
        out["trajectory_id"] = int(st.index.column("trajectory_id")[j])
        out["max_episode_length"] = int(st.index.column("max_episode_length")[j])
        out["model_weights_id"] = st.index.weights_id(j)
        return out

    def iter_prepared(self, start: int, stop: int) -> Iterator[Prepared]:
        """Trajectories ``[start, stop)`` as validated items (ids kept), for copying."""
        for i in range(start, stop):
            st, j = self._locate_trajectory(i)
            idx = st.index
            T, B = int(idx.column("T")[j]), int(idx.column("B")[j])
            yield Prepared(
                self._read_trajectory_flat(st, j),
                T,
                B,
                int(idx.column("max_episode_length")[j]),
                idx.weights_id(j),
                int(idx.column("trajectory_id")[j]),
                continues=self._continues(st, j, T, B),
            )

    @staticmethod
    def _continues(st: _SegmentState, j: int, T: int, B: int) -> np.ndarray:
        """Lanes of trajectory ``j`` that continue an episode of trajectory ``j - 1``."""
        cont = np.zeros(B, bool)
        if j <= st.index.low:
            return cont
        ends = st.index.column("piece_end")
        p = st.index.pieces
        lo, hi = int(ends[j - 1]), int(ends[j])
        start, step = p.column("start")[lo:hi], p.column("step")[lo:hi]
        rel = start - int(st.index.offsets[j])
        first = rel % T == 0
        cont[rel[first] // T] = step[first] > 0
        return cont


class _Evicted(Exception):
    pass


def _reclaimed(st: _SegmentState, row: int) -> bool:
    """Has the writer (since ``st`` was read) announced deleting the shard of ``row``?"""
    now = read_commit(st.segment.dir)
    return now is not None and now.reclaimed_below > row


def _map(tree: Any, fn) -> Any:
    if isinstance(tree, dict):
        return {k: _map(v, fn) for k, v in tree.items()}
    return fn(tree)


def index_tree(tree: Any, i: int) -> Any:
    """Item ``i`` of every array in a nested dict."""
    return _map(tree, lambda a: a[i])


def open(  # noqa: A001
    path: str | Path,
    seed: int | None = None,
    sampler=None,
    *,
    storage_options: dict | None = None,
) -> BufferView:
    """Open a buffer read-only (see :class:`BufferView`): a directory, or an object-store
    URL such as ``s3://bucket/prefix`` (``storage_options`` go to fsspec/s3fs, e.g.
    ``{"endpoint_url": ...}``; without them s3fs reads the usual AWS environment).
    ``sampler``: a :mod:`zreplay.samplers` sampler or hook for ``sample``/``sample_clips``/
    ``sample_nstep``."""
    return BufferView(path, seed=seed, sampler=sampler, storage_options=storage_options)
