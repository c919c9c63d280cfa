"""Episodes out of any buffer or view: ``dump(src, path, format="hdf5" | "zarr", mode=...)``.

HDF5: one file (layout in :mod:`zreplay.compat.hdf5`).  Zarr: a zreplay buffer directory
holding one trajectory ``[L, 1]`` per episode, as :class:`~zreplay.ReplayBuffer` writes
them (its random stream and clip sampling resume on it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ..core import BufferCore, Prepared, RamPolicy, RandomStream
from ..core.records import BATCH_BYTES
from ..store.guard import check_apart, new_tree
from ..store.location import locate
from ..store.root import is_buffer
from .hdf5 import MODES, write_hdf5

# RAM kept decoded while a Zarr dump is written (as ReplayBuffer's default).
DUMP_RAM_BYTES = 1 << 30
# Formats and the writer a FileExistsError names (stable-worldmodel's HDF5 one).
FORMATS = {"hdf5": "HDF5Writer: ", "zarr": ""}


def episode_batches(
    core: BufferCore, progress=None, batch_bytes: int = BATCH_BYTES
) -> Iterator[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """Every visible episode, oldest first, in batches read together (one range read per
    key where the episodes' rows are contiguous): ``(columns [steps, ...], {"length",
    "terminated", "truncated"})``; ``progress(k)`` after each batch of ``k`` episodes."""
    n, e = core.num_episodes, 0
    order = column_order(core)
    while e < n:
        cols, table = core.episodes_from(e, batch_bytes=batch_bytes)
        cols = {k: cols[k] for k in order if k in cols}
        k = len(table["length"])
        e += k
        if progress is not None:
            progress(k)
        yield cols, table


def column_order(core: BufferCore) -> list[str]:
    """The stored columns in the order the buffer's facade keeps them (a
    ``ReplayBuffer``'s: its first episode's), else in stored order."""
    keys = core.keys
    if core.writable:
        order = core.facade_state.get("columns")
    else:  # a view: what the writers' commits say
        saved = [
            (c.sampler or {}).get("facade", {}).get("columns") for _, c in core.engine.segments()
        ]
        order = next((o for o in saved if o), None)
    if not order:
        return keys
    return [k for k in order if k in keys] + [k for k in keys if k not in order]


def dump(
    src,
    path: str | Path,
    format: str = "hdf5",
    mode: str = "overwrite",
    *,
    progress: Callable[[int], None] | None = None,
    **kw,
) -> None:
    """Write every visible episode of ``src`` (a buffer, a view or a ``BufferCore``; of a
    ``ZarrStorage``, what a view of it shows: no row its ring overwrote) to ``path``: ``format="hdf5"`` (one file; ``kw``: ``compression``, ``level``) or
    ``"zarr"`` (a buffer directory; ``kw``: ``layout``, ``durable``, ...).  ``mode``:
    ``"overwrite"`` (written aside and swapped in whole; for Zarr, only over a zreplay
    buffer without a live writer), ``"append"`` (same columns) or
    ``"error"`` (refuse an existing path).  ``progress(k)`` after each batch of ``k``
    episodes is read (episodes are read ~64 MiB at a time and written in whole chunks)."""
    # stable-worldmodel's messages, word for word.
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; available: {list(FORMATS)}")
    if mode not in MODES:
        raise ValueError(f"write mode must be one of {MODES}, got {mode!r}")
    path = Path(path)
    if mode == "error" and path.exists():
        raise FileExistsError(
            f"{FORMATS[format]}'{path}' already exists. Pass mode='overwrite' to replace it "
            "or mode='append' to extend it."
        )
    core = getattr(src, "core", src)
    check_apart(locate(path), core.path, "dump")
    core.flush()
    view = None
    if core.writable and core.view_rows is not None:
        # A writer that keeps rows views must not show (a ZarrStorage's overwritten ring
        # slots) is dumped as a view of what it committed shows it.
        view = core = BufferCore.reader(
            core.path, storage_options=core.path.backend.storage_options
        )
    try:
        if format == "hdf5":
            write_hdf5(episode_batches(core, progress), path, mode, **kw)
        else:
            _dump_zarr(core, path, mode, progress, **kw)
    finally:
        if view is not None:
            view.close()


def _dump_zarr(core: BufferCore, path: Path, mode: str, progress=None, **kw) -> None:
    loc = locate(path)
    if mode == "append" and is_buffer(loc):
        _write_episodes(core, loc, BufferCore.reader(loc).num_rows, progress, **kw)
        return
    with new_tree(loc, "dump", sources=[core.path]) as tmp:  # all or nothing
        _write_episodes(core, tmp, 0, progress, **kw)


def _write_episodes(core: BufferCore, path, existing: int, progress, **kw) -> None:
    need = existing + int(core.episodes().length.sum())
    dst = BufferCore.writer(
        path,
        stream=RandomStream(tag="swm"),
        capacity=max(1, need),
        ram=RamPolicy(enabled=True, trajectories=None, max_bytes=DUMP_RAM_BYTES),
        **kw,
    )
    if existing:
        dst.keep_saved_state()  # appended rows: the target's stream and priorities stay
    else:
        dst.facade_state["columns"] = list(column_order(core))  # stable-worldmodel's order
    try:
        for cols, table in episode_batches(core, progress):
            ends = np.cumsum(table["length"])
            items = []
            for a, b in zip(ends - table["length"], ends, strict=True):
                n = int(b - a)
                one = {k: v[a:b, None] for k, v in cols.items()}
                items.append(Prepared(one, n, 1, split_episodes=False))
            dst.add(items)
    finally:
        dst.close()
