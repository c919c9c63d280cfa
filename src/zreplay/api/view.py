"""``zreplay.open(path)``: a read-only view of a buffer directory, like opening a dataset.

A view sees the union of every writer's segment, each clamped to its last commit, and
takes no lock: writers may keep appending in other processes; :meth:`BufferView.refresh`
picks up what they have committed since.  Positions (``sample``, ``__getitem__``,
``trajectory``) run over visible rows/trajectories in segment-name order.  A view is a
snapshot until ``refresh()`` in every method: positions of rows a writer removed since
(a clear, eviction, a loaded checkpoint) raise ``StaleViewError``, never name other rows.

Numpy nested dicts over a read-only :class:`~zreplay.core.ViewCore` (``self.core``);
the lifecycle and the reads every facade shares are :class:`~zreplay.api.facade.Facade`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Unpack

from ..conventions import ACTION_KEYS
from ..core import BufferCore
from ..core.options import ReaderOptions, reader_options
from ..numbers import as_int, as_optional_float
from ..sampling.clips import ClipSpec
from ..sampling.nstep import NStepSpec
from ..schema import unflatten
from .batches import index_tree, trajectory_dict
from .facade import Facade, Of


class BufferView(Facade):
    """Read-only access to a zreplay buffer directory (numpy in, numpy out).

    ``sampler`` (a :mod:`zreplay.samplers` sampler or a ``fn(step, view, batch_size,
    history_len)`` hook; default uniform) draws ``sample``, ``sample_clips`` and
    ``sample_nstep``.  A prioritized sampler starts from the priorities each writer saved
    with its last commit (as tree leaves; use the writer's ``alpha``/``eps``), follows
    ``refresh()`` and keeps ``update_priorities`` in this process only: a view never
    writes.  ``column_cache_bytes`` (default: the machine's RAM, per segment; 0: off):
    the newest rows of small keys (rows <= 1 KiB: flags, rewards, actions, states) kept
    decoded in a local file that every process reading the segment maps and the page
    cache serves (``ZREPLAY_CACHE_DIR``; :mod:`zreplay.engine.colcache`), so rows of
    them are drawn at memory speed and clips and n-step windows read only large rows
    (images) from disk.
    ``chunk_cache_bytes`` (default a sixteenth of the machine's RAM, per segment; 0:
    none): the other keys (images) kept decoded: for a local buffer their newest rows in
    a second column cache file, filled by the first draw of them (clips of images are
    then one fancy index per key into mapped memory: a memory map's speed; not with
    ``column_cache_bytes=0``), and decoded chunks of the rows read from the store in this
    process's memory.

    The reader options (``storage_options``, ``column_cache_bytes``, ``chunk_cache_bytes``)
    are declared once, in :class:`zreplay.core.options.ReaderOptions`; a pickled view
    carries every one of them (``options``).

    ``rate_limiter`` (``zreplay.MinSize``, ``zreplay.SampleToInsertRatio``): samples wait
    until the writers inserted enough; ``learner_id`` declares this view a learner whose
    sample count writers keep pace with (published beside the commits, resumed when a
    view with the same ``learner_id`` is opened again; one process per ``learner_id``).
    :meth:`close` tells the writers this learner stopped.
    """

    def __init__(
        self,
        path: str | Path,
        seed: int | None = None,
        sampler=None,
        storage_options: dict | None = None,
        rate_limiter=None,
        learner_id: str | None = None,
        **reader: Unpack[ReaderOptions],
    ):
        # Every reader option, declared once (ReaderOptions): what a pickled view carries.
        self.options = reader_options("BufferView", {"storage_options": storage_options, **reader})
        self.core = BufferCore.reader(path, sampler=sampler, seed=seed, owner=self, **self.options)
        self.core.set_rate_limiter(rate_limiter, learner_id)

    # Handed to DataLoader workers and Ray tasks as its location, options and sampler
    # configuration (no data): each copy reopens the store.  A learner's identity and
    # rate limiter stay in the process that declared it.

    def __getstate__(self) -> dict:
        h = self.core.handoff("BufferView", "a view")
        options = dict(self.options)
        if options["storage_options"] is None:  # a located path carries its own
            options["storage_options"] = h.storage_options
        return {"path": h.path, "sampler": h.sampler, "options": options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], sampler=state.get("sampler"), **state["options"])

    # -- what it holds ----------------------------------------------------------------

    step = Of(
        "core.stream", doc="Batches drawn (a hook's step; a prioritized sampler's beta clock)."
    )
    episodes = Of("core", doc="The visible episodes of every segment (rows as visible positions).")
    num_rows = Of("core.engine", doc="Visible transitions (rows) over all segments.")
    num_trajectories = Of("core.engine", doc="Visible trajectories over all segments.")
    writer_ids = Of("core.engine", doc="The visible segments' writer ids, in name order.")
    next_trajectory_id = Of(
        "core.engine", doc="The id after the largest any visible segment's writer handed out."
    )
    path = Of("core.engine", doc="The buffer's location (a Path, or an object-store location).")
    root = Of("core.engine", doc="The buffer's root group (zreplay.store.root.BufferRoot).")

    def keys(self) -> list[str]:
        """Stored key paths, e.g. ``["actions", "curr_obs/main_images", ...]``."""
        return self.core.keys

    def __len__(self) -> int:
        return self.num_rows

    def __repr__(self) -> str:
        return (
            f"<zreplay view {self.path}: {self.num_trajectories} trajectories, "
            f"{self.num_rows} rows, {len(self.writer_ids)} segment(s), keys={self.keys()}>"
        )

    # -- reads ------------------------------------------------------------------------

    def num_clips(self, history_len: int = 1, frameskip: int = 1, pad: str | None = None) -> int:
        """Valid clips of ``history_len`` frames ``frameskip`` apart (see sample_clips)."""
        return ClipSpec(history_len, frameskip, pad).num_clips(self.core.episodes())

    def sample_clips(self, batch_size: int, history_len: int = 1, **kw) -> dict[str, Any]:
        """``batch_size`` clips ``[batch, history_len, ...]`` drawn by the sampler over all
        valid clips (uniformly by default); never across an episode boundary.  ``kw``:
        ``frameskip``, ``pad``, ``keys``, ``action_keys`` (see :meth:`clips`), ``version``
        (the policy version being trained, for ``Staleness``)."""
        n = as_int(batch_size, "batch_size", minimum=1)
        version = as_optional_float(kw.pop("version", None), "version")
        spec, keys = _clip_args(history_len, **kw)
        return unflatten(self.core.sample_clips(spec, n, keys, version=version))

    def clips(self, indices, history_len: int = 1, **kw) -> dict[str, Any]:
        """Clips at flat clip indices ``[0, num_clips(...))``, oldest episode first.

        ``frameskip``: frames ``frameskip`` steps apart, ``action_keys`` kept dense and
        reshaped to ``(history_len, frameskip * action_dim)``; ``pad``: ``None``,
        ``"zero"`` or ``"repeat"`` (clips may start before an episode, ``is_pad`` marks
        the padded frames); ``keys``: stored keys to return (default all)."""
        spec, keys = _clip_args(history_len, **kw)
        return unflatten(self.core.clips(spec, indices, keys))

    def sample_nstep(self, batch_size: int, n: int = 1, gamma: float = 0.99, **kw) -> dict:
        """n-step transitions (see :class:`zreplay.sampling.nstep.NStepSpec` for ``kw``)."""
        batch_size = as_int(batch_size, "batch_size", minimum=1)
        keys = kw.pop("keys", None)
        version = as_optional_float(kw.pop("version", None), "version")
        spec = NStepSpec(n, gamma, **kw)
        return unflatten(self.core.sample_nstep(spec, batch_size, keys, version=version))

    def episode(self, e: int, keys: list[str] | None = None) -> dict[str, Any]:
        """Visible steps of episode ``e`` (oldest first) as nested ``[L, ...]`` arrays."""
        return unflatten(self.core.episode(as_int(e, "episode"), keys))

    def rows(self, positions, keys: list[str] | None = None) -> dict[str, Any]:
        """Rows at visible positions ``[0, num_rows)`` as a nested dict of ``[len, ...]``
        numpy arrays.  ``positions`` as numpy indexes an array of ``num_rows``: integers
        (numpy/torch too; negative from the end) or a boolean mask of ``num_rows``;
        ``IndexError`` outside, ``TypeError`` for float positions."""
        return unflatten(self.core.rows(positions, keys))

    def sample(
        self, n: int, keys: list[str] | None = None, *, version: float | None = None
    ) -> dict[str, Any]:
        """``n`` rows drawn with replacement by the sampler (uniformly by default), as a
        nested dict of numpy arrays; a prioritized sampler adds ``index`` (int64 ``[n]``)
        and ``weight`` (float32 ``[n]``), and ``PrioritizedClips`` makes them ``n`` clips.
        ``version``: the policy version being trained (``Staleness`` weighs rows by it)."""
        n = as_int(n, "n", minimum=1)
        version = as_optional_float(version, "version")
        return unflatten(self.core.sample(n, keys, version=version))

    def __getitem__(self, i: int) -> dict[str, Any]:
        """Row ``i`` (negative from the end, as a Python sequence)."""
        return index_tree(self.rows([as_int(i, "index")]), 0)

    segment_rows = Of(
        "core.engine",
        doc="Visible trajectories [start, stop) as (writer_id, first_row, stop_row) per "
        "segment.  Segment rows are never reused, so unlike positions (which shift when "
        "an earlier segment grows or evicts) they name the same rows after a refresh() "
        "and in another process.",
    )
    positions_of = Of(
        "core.engine",
        doc="Current positions (for rows()) of rows of segment writer_id; an IndexError "
        "if any is not visible (evicted, or not yet seen by refresh()).",
    )

    def trajectory(self, i: int) -> dict[str, Any]:
        """Visible trajectory ``i`` as nested ``[T, B, ...]`` arrays plus its metadata."""
        return trajectory_dict(self.core.trajectory(as_int(i, "trajectory")))


def _clip_args(
    history_len: int,
    frameskip: int = 1,
    pad: str | None = None,
    keys: list[str] | None = None,
    action_keys: tuple[str, ...] = ACTION_KEYS,
) -> tuple[ClipSpec, list[str] | None]:
    return ClipSpec(history_len, frameskip, pad, action_keys), keys


def open(  # noqa: A001
    path: str | Path,
    seed: int | None = None,
    sampler=None,
    *,
    storage_options: dict | None = None,
    rate_limiter=None,
    learner_id: str | None = None,
    **reader: Unpack[ReaderOptions],
) -> BufferView:
    """Open a buffer read-only (see :class:`BufferView`): a directory, or an object-store
    URL such as ``s3://bucket/prefix`` (``storage_options`` go to fsspec/s3fs, e.g.
    ``{"endpoint_url": ...}``; without them s3fs reads the usual AWS environment).
    ``sampler``: a :mod:`zreplay.samplers` sampler or hook for ``sample``/``sample_clips``/
    ``sample_nstep``; ``rate_limiter``, ``learner_id`` and the reader options
    (:class:`zreplay.core.options.ReaderOptions`: ``column_cache_bytes``,
    ``chunk_cache_bytes``): see :class:`BufferView`."""
    return BufferView(path, seed, sampler, storage_options, rate_limiter, learner_id, **reader)
