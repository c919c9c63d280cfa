"""Checkpoints of :class:`~zreplay.torchrl.ZarrStorage`: its own (a zreplay buffer
snapshot, taken over by hard links) and TorchRL's (``LazyTensorStorage`` /
``LazyMemmapStorage`` dumps and state dicts: ``max_size`` rows in slot order).

Importing a TorchRL ring appends its rows oldest first: slots ``0 .. len-1`` of a ring
that is not full, else slots ``c .. max_size-1, 0 .. c-1`` where ``c`` is the writer's
next slot, with the ring's ``shift`` set to ``c``; every slot then shows what it showed in
TorchRL and the next extend lands at ``c``, where TorchRL's restored writer puts it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from copy import copy
from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ..engine.reader import segment_commits
from ..errors import FormatError
from ..store.location import locate
from ..store.root import is_buffer
from .torchrl_columns import build_td, pieces, td_columns


def slot_rows(storage, slots: np.ndarray) -> TensorDict:
    """Rows of ``slots`` (zeros for slots past ``len``) as a TensorDict ``[len(slots)]``."""
    L, schema = len(storage), storage.core.schema
    live = slots < L
    got = storage.core.rows(storage._ring.rows_of(slots[live], storage._W))
    flat = {}
    for k, spec in schema.specs.items():
        col = np.zeros((len(slots), *spec.row_shape), spec.dtype)
        col[live] = got[k]
        flat[k] = col
    return build_td(flat, (len(slots),), storage._batches, storage.device)


def state_dict_of(storage) -> dict:
    """``ZarrStorage.state_dict()``: TorchRL's layout plus ``_next_slot``."""
    if not storage.initialized:
        return {"_storage": {}, "initialized": False, "_len": 0}
    td = slot_rows(storage, np.arange(storage.max_size))
    out = {"_storage": td.state_dict(), "initialized": True, "_len": len(storage)}
    if not storage._ring_guessed:  # a guess is not exported as if it were known
        out["_next_slot"] = storage._ring.next_slot(storage._W)
    return out


def load_state_dict_into(storage, state_dict: Mapping) -> None:
    """``ZarrStorage.load_state_dict``: ours, or a TorchRL tensor storage's."""
    n = int(state_dict["_len"])
    rows = None
    if state_dict.get("initialized") and n:
        # A copy keeps the OrderedDict's _metadata (batch sizes) that dict() drops.
        rows = TensorDict().load_state_dict(copy(state_dict["_storage"]), strict=False)
        if rows.batch_dims == 0:
            rows.auto_batch_size_(batch_dims=1)
    import_rows(storage, rows, n, state_dict.get("_next_slot"))


def import_rows(
    storage, rows: TensorDictBase | None, n: int, next_slot: int | None, sync: bool = True
) -> None:
    """Replace ``storage``'s contents with the first ``n`` slots of ``rows`` (a TorchRL
    ring of ``max_size`` slots; ``None``: nothing) whose writer's next slot is
    ``next_slot`` (``None``: ``n % max_size``); ``sync``: move attached writers there."""
    M = storage.max_size
    if rows is not None and (rows.batch_dims == 0 or rows.shape[0] != M):
        size = rows.shape[0] if rows.batch_dims else 0
        raise ValueError(
            f"the checkpoint holds a ring of {size} slots; this ZarrStorage has "
            f"max_size={M} (construct it with max_size={size})"
        )
    if not 0 <= n <= M:
        raise ValueError(f"the checkpoint's len {n} is not in [0, {M}]")
    full = n == M
    c = (n if next_slot is None else int(next_slot)) % M if full else 0
    if rows is None or not n:
        storage.core.facade_state.update(shift=0, guessed=False)
        storage.core.clear()  # empty: the ring starts where the rows go on
    else:
        order = torch.cat([torch.arange(c, M), torch.arange(0, c)]) if full else torch.arange(n)
        cols, batches = td_columns(rows[order])
        ring = {"kind": "torchrl", "max_size": M, "shift": c, "batches": batches}
        # Until the restored writer's first extend says where its cursor is (ZarrStorage).
        ring["guessed"] = full and next_slot is None
        state = storage.core.state()  # read when the block ends: the ring goes in below
        try:
            with storage.core.replacing(state) as staging:  # all or nothing
                staging.add(pieces(cols, n, storage._piece))
                ring["start"] = staging.row_range[1] - n  # rows go on from the old ones
                state["facade"] = ring
        except BaseException:
            if not storage.core.closed:
                storage._open_ring()  # the ring of what the segment holds now, old or new
            raise
        storage.core.facade_state = ring
    storage._open_ring()
    storage._bump_mutation_revision()
    if sync:
        storage._sync_writers()


class TorchRLFiles:
    """``ZarrStorage.loads(path)``: which checkpoint ``path`` holds, and loading it."""

    @staticmethod
    def load(storage, path) -> None:
        options = storage.core.storage_options
        if is_buffer(path, options):
            TorchRLFiles._zreplay(storage, locate(path, options))
            return
        p = Path(path)
        meta_file = p / "storage_metadata.json"
        if not meta_file.is_file():
            raise FormatError(
                f"{path} is neither a ZarrStorage checkpoint nor a TorchRL storage "
                "checkpoint (no storage_metadata.json)"
            )
        meta = json.loads(meta_file.read_text())
        if meta.get("is_pytree"):
            raise FormatError(f"{path}: TorchRL pytree storages cannot be loaded; TensorDicts can")
        n = int(meta["len"])
        rows = TensorDict.load_memmap(p) if n else None
        writer = p.parent / "writer" / "metadata.json"
        cursor = json.loads(writer.read_text()).get("cursor") if writer.is_file() else None
        import_rows(storage, rows, n, cursor)

    @staticmethod
    def _zreplay(storage, src) -> None:
        # Every committed segment, empty ones too (a storage never extended, or emptied,
        # dumps one with nothing visible; a reader's segments() would leave it out).
        segs = segment_commits(src, storage.core.storage_options)
        found = [(w, c) for w, c in segs if (c.sampler or {}).get("facade", {}).get("kind")]
        if len(segs) != 1 or len(found) != 1:
            raise FormatError(f"{src} is not a ZarrStorage checkpoint (one segment written by it)")
        wid, commit = found[0]
        if commit.n_traj == commit.low_traj:
            import_rows(storage, None, 0, None)
            return
        state = dict(commit.sampler)
        facade = dict(state["facade"])
        if facade.get("max_size") != storage.max_size:
            raise ValueError(
                f"{src} is a ZarrStorage of max_size={facade.get('max_size')}; this one has "
                f"max_size={storage.max_size}"
            )
        try:
            storage.core.adopt(src, wid, commit.low_traj, commit.n_traj, state)
        except BaseException:
            if not storage.core.closed:
                storage._open_ring()  # the ring of what the segment holds now, old or new
            raise
        storage._open_ring(facade)
        storage.core.flush()
        storage._bump_mutation_revision()
        storage._sync_writers()
