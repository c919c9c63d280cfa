"""The ring of :class:`~zreplay.torchrl.ZarrStorage`: TorchRL's ``max_size`` slots over
zreplay's append-only rows, and the record of it a storage keeps in its commit.

The storage appends every row it is given (global rows of its segment, never reused;
the ring's rows are ``[start, W)``, ``start`` being where it was last emptied or loaded)
and never overwrites one.  Row ``g`` belongs to slot ``(g - start + shift) % max_size``
and a slot shows the newest row that belongs to it, so the storage holds
``min(W - start, max_size)`` slots exactly as TorchRL's round-robin writer fills
``LazyTensorStorage`` (wrap-around and oversized extends included).  ``shift`` is 0
except after importing a TorchRL checkpoint of a full ring, whose rows are appended
oldest first starting at the writer's cursor.

Rows are appended as zreplay trajectories of at most a piece (:func:`pieces`), and the
segment keeps a piece less one row more than the ring's slots: whole old trajectories are
evicted on disk once every row in them has been overwritten.

The record (``sampler.facade`` of the segment's commit, FORMAT.md; bounded when read by
:func:`zreplay.store.torchrl_record.record_problem`) holds the ring, the storage's dims
and the form of its data.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from ..core import Prepared
from ..errors import CorruptBufferError, FormatError, SchemaError
from ..numbers import as_int
from ..store.torchrl_record import KIND, MAX_SIZE, record_problem
from .torchrl_forms import Form

MAX_PIECE_ROWS = 4096  # rows of one zreplay trajectory (an extend is cut into pieces)


@dataclass(frozen=True)
class Ring:
    """Slots of TorchRL's ring over an append-only run of rows ``[start, W)`` (see
    module doc): row ``g`` is slot ``(g - start + shift) % max_size``."""

    max_size: int
    start: int = 0
    shift: int = 0

    def length(self, W: int) -> int:
        return min(W - self.start, self.max_size)

    def next_slot(self, W: int) -> int:
        """The slot the writer's next row goes to (TorchRL's writer ``_cursor``)."""
        return (W - self.start + self.shift) % self.max_size

    def expected(self, W: int, n: int) -> torch.Tensor:
        """The cursor TorchRL's round-robin writer passes for ``n`` more rows."""
        return (torch.arange(n, dtype=torch.int64) + self.next_slot(W)) % self.max_size

    def rows_of(self, slots: np.ndarray, W: int) -> np.ndarray:
        """Global row shown in each slot (``0 <= slot < length(W)``)."""
        return W - 1 - (W - 1 - self.start + self.shift - slots) % self.max_size


def ring_slots(max_size: int, dims: tuple[int, ...] | None) -> tuple[int, int]:
    """``(slots along dim 0, elements per slot)`` of a storage of ``max_size`` elements
    whose dims after the first are ``dims`` (``None``: one element a slot)."""
    per = math.prod(dims) if dims else 1
    return -(-max_size // per), per


def checked_max_size(value) -> int:
    """``max_size`` as a user passes it, checked (at most 2**48 rows)."""
    max_size = as_int(value, "max_size (rows)", minimum=1)
    if max_size > MAX_SIZE:
        raise ValueError(
            f"max_size {max_size} is more rows than a ZarrStorage can hold (at most 2**48: "
            "its row numbers are int64 and keep growing after the ring wraps); pass a "
            "smaller max_size"
        )
    return max_size


def dims_after_first(form: Form, cols: Mapping[str, np.ndarray], ndim: int) -> tuple:
    """The storage dims after the first (TorchRL's ``shape[1:ndim]``) of the first
    extend of an ``ndim > 1`` storage."""
    if form.kind == "lazy":
        raise SchemaError(
            f"ZarrStorage(ndim={ndim}) does not store lazy stacks whose items differ in "
            "shape; pad them to one shape"
        )
    if form.kind == "td":
        batch = form.batches[""]
        if len(batch) < ndim - 1:
            raise SchemaError(
                f"ZarrStorage(ndim={ndim}) stores TensorDicts with at least {ndim} batch "
                f"dims; got batch dims {[len(next(iter(cols.values()))), *batch]}"
            )
        return tuple(batch[: ndim - 1])
    shapes = {v.shape[1:ndim] for v in cols.values()}
    if len(shapes) != 1 or any(len(v.shape) < ndim for v in cols.values()):
        raise SchemaError(
            f"ZarrStorage(ndim={ndim}): every leaf needs the same first {ndim} dims; got "
            f"{sorted({v.shape[:ndim] for v in cols.values()})}"
        )
    return tuple(int(d) for d in shapes.pop())


def pieces(cols: Mapping[str, np.ndarray], n: int, P: int) -> list[Prepared]:
    """``n`` rows as zreplay trajectories ``[<= P, 1]``, the first one the shortest.
    Their episodes are TorchRL's: the rows are one stream, cut after every row whose ``("next", "done")`` (or
    ``terminated``/``truncated``) is set, as TorchRL's own samplers read them, so the
    clips and n-step windows of a zreplay view never cross one of its episode ends."""
    # Cut from the end: the last piece holds an extend's newest P rows, so once an extend
    # of at least P = slots rows fills the ring, its live rows are exactly one piece,
    # which a view (that shows whole pieces only: view_rows) shows whole.
    ends = list(range(n, 0, -P))[::-1]
    out = [
        Prepared({k: v[a:b, None] for k, v in cols.items()}, b - a, 1)
        for a, b in zip([0, *ends[:-1]], ends, strict=True)
    ]
    for p in out:
        p.continues = True  # the stream goes on across extends until a flag ends it
    return out


def record(
    max_size: int,
    ndim: int,
    dims: tuple[int, ...] | None,
    ring: Ring,
    guessed: bool,
    form: Form | None,
) -> dict:
    """The record a storage of ``max_size`` elements and ``ndim`` dims keeps in its
    commit (FORMAT.md, ``sampler.facade``): its ring, dims and form; ``guessed``: the
    writer's next slot is not known yet (a TorchRL state dict of a full ring)."""
    return {
        "kind": KIND,
        "max_size": max_size,
        "ndim": ndim,
        "dims": None if dims is None else list(dims),
        "start": ring.start,
        "shift": ring.shift,
        "guessed": guessed,
        "form": None if form is None else form.to_state(),
    }


def check_record(
    saved: Mapping,
    path,
    *,
    has_rows: bool,
    n_rows: int,
    columns: Collection[str] | None,
    max_size: int,
    ndim: int,
) -> None:
    """Refuse a segment at ``path`` whose record ``saved`` (``{}``: none) is not a
    ZarrStorage's of ``max_size`` and ``ndim`` (``has_rows``: the segment holds rows;
    ``n_rows``: its commit's rows; ``columns``: its schema's keys, ``None`` if none)."""
    if (has_rows or saved) and saved.get("kind") != KIND:
        raise FormatError(
            f"{path} holds a zreplay buffer not written by ZarrStorage; "
            "open it with zreplay.open() or pick another path"
        )
    if saved.get("kind") == KIND:
        why = record_problem(saved, n_rows, columns)
        if why:
            raise CorruptBufferError(
                f"{path}: the ZarrStorage record of its commit.json "
                f"(sampler.facade) is damaged or crafted: {why}; restore the buffer from "
                "a checkpoint, or run zreplay.verify() for details"
            )
    for name, mine in (("max_size", max_size), ("ndim", ndim)):
        theirs = saved.get(name, 1 if name == "ndim" and saved else mine)
        if theirs != mine:
            raise ValueError(
                f"{path} is a ZarrStorage of {name}={theirs}, not {mine}; pass "
                f"{name}={theirs} (or overwrite=True)"
            )
