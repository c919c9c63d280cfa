"""Checkpoints of a :class:`~zreplay.torchrl.ZarrStorage`: what ``rb.dumps``/``rb.loads``
and ``rb.state_dict``/``rb.load_state_dict`` hand it, read and checked before the storage
takes anything over.

Three kinds come in: its own ``dumps`` (a zreplay buffer of one segment it wrote, taken
over by hard links or server-side copies), a ``LazyTensorStorage``/``LazyMemmapStorage``
checkpoint directory (TorchRL's ``storage_metadata.json`` and memmapped TensorDict, with
its writer's ``metadata.json`` beside it) and TorchRL's storage state dicts.  Each is data
from elsewhere: a damaged one raises :class:`~zreplay.CorruptBufferError` naming the file.
TorchRL's rows are imported in ring order (:func:`import_order`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from copy import copy
from pathlib import Path

import torch
from tensordict import TensorDict, is_tensor_collection, is_tensorclass

from ..engine.reader import segment_commits
from ..errors import AppendOnlyError, CorruptBufferError, FormatError
from ..store.root import BufferRoot
from ..store.torchrl_record import MAX_SIZE, record_problem


class OwnCheckpoints:
    """Marker: ZarrStorage's dumps/loads are its own (TorchRL's need ``_storage``)."""

    def register_save_hook(self, hook):
        raise AppendOnlyError("ZarrStorage checkpoints take no save hooks")

    register_load_hook = register_save_hook


def own_checkpoint(src, storage_options, max_size: int, ndim: int) -> tuple | None:
    """``(writer id, commit)`` of a ZarrStorage ``dumps`` at ``src`` (a located buffer)
    for a storage of ``max_size`` and ``ndim``; ``None`` if it holds no rows."""
    # Every committed segment, empty ones too (a storage never extended, or emptied,
    # dumps one with nothing visible; a reader's segments() would leave it out).
    segs = segment_commits(src, storage_options)
    found = [(w, c) for w, c in segs if (c.sampler or {}).get("facade", {}).get("kind")]
    if len(segs) != 1 or len(found) != 1:
        raise FormatError(f"{src} is not a ZarrStorage checkpoint (one segment written by it)")
    wid, commit = found[0]
    if commit.n_traj == commit.low_traj:
        return None
    facade = dict(commit.sampler["facade"])
    schema, _ = BufferRoot(src, storage_options).schema()
    why = record_problem(facade, commit.n_rows, None if schema is None else schema.keys)
    if why:  # before anything is taken over
        raise CorruptBufferError(
            f"{src}: the ZarrStorage record of its commit.json (sampler.facade) is "
            f"damaged or crafted: {why}; it cannot be loaded"
        )
    if facade.get("max_size") != max_size or facade.get("ndim", 1) != ndim:
        raise ValueError(
            f"{src} is a ZarrStorage of max_size={facade.get('max_size')}, ndim="
            f"{facade.get('ndim', 1)}; this one has max_size={max_size}, "
            f"ndim={ndim}"
        )
    return wid, commit


def torchrl_checkpoint(path, max_size: int) -> tuple:
    """``(rows, len, writer's cursor)`` of a TorchRL storage checkpoint at ``path``
    (``rb.dumps`` of a ``LazyTensorStorage``/``LazyMemmapStorage``; ``rows``: its ring
    as a TensorDict, ``None`` if empty; ``cursor``: ``None`` if no writer was saved)."""
    p = Path(path)
    meta_file = p / "storage_metadata.json"
    if not meta_file.is_file():
        raise FormatError(
            f"{path} is neither a ZarrStorage checkpoint nor a TorchRL storage "
            "checkpoint (no storage_metadata.json)"
        )
    meta = _json_object(meta_file)
    if meta.get("is_pytree"):
        raise FormatError(f"{path}: TorchRL pytree storages cannot be loaded; TensorDicts can")
    n = _checked(meta.get("len"), meta_file, "len", MAX_SIZE + 1)
    rows = TensorDict.load_memmap(p) if n else None
    writer = p.parent / "writer" / "metadata.json"
    cursor = _json_object(writer).get("cursor") if writer.is_file() else None
    if cursor is not None:
        cursor = _checked(cursor, writer, "cursor", max_size)
    return rows, n, cursor


def state_rows(state_dict: Mapping, ndim: int) -> tuple:
    """``(rows, len)`` of a storage state dict (this class's or TorchRL's tensor
    storages'; ``rows``: ``None`` if empty)."""
    n = int(state_dict["_len"])
    rows = None
    if state_dict.get("initialized") and n:
        rows = state_dict["_storage"]
        if not isinstance(rows, torch.Tensor):
            # A copy keeps the OrderedDict's _metadata (batch sizes) that dict() drops.
            rows = TensorDict().load_state_dict(copy(rows), strict=False)
            if rows.batch_dims < ndim:
                rows.auto_batch_size_(batch_dims=ndim)
    return rows, n


def rows_state(rows):
    """The ``_storage`` entry of a state dict of ``rows`` (the ring's slots as a
    TensorDict, tensorclass or tensor; pytrees have none, as in TorchRL)."""
    if is_tensorclass(rows):
        return rows._tensordict.state_dict()
    if is_tensor_collection(rows):
        return rows.state_dict()
    if not isinstance(rows, torch.Tensor):
        raise TypeError(
            "a ZarrStorage of pytrees has no state_dict (nor has TorchRL's); checkpoint "
            "it with rb.dumps(path)"
        )
    return rows


def import_order(n: int, slots: int, next_slot: int | None) -> tuple[torch.Tensor, int]:
    """``(slot order, shift)`` in which to append the first ``n`` of ``slots`` slots of a
    TorchRL ring whose writer's next slot is ``next_slot`` (``None``: ``n % slots``):
    oldest first, so every slot then shows what it showed in TorchRL and the next extend
    lands where TorchRL's restored writer puts it.  A ring that is not full is slots
    ``0 .. n-1``; a full one ``c .. slots-1, 0 .. c-1`` from its next slot ``c``, which is
    the ring's ``shift``."""
    if n < slots:
        return torch.arange(n), 0
    c = (n if next_slot is None else int(next_slot)) % slots
    return torch.cat([torch.arange(c, slots), torch.arange(0, c)]), c


def _json_object(file: Path) -> dict:
    """A TorchRL checkpoint's JSON file (CorruptBufferError, naming it, if it is not an
    object)."""
    try:
        out = json.loads(file.read_text())
    except (ValueError, OSError) as e:
        raise CorruptBufferError(
            f"{file} is not readable JSON ({e}); the checkpoint is damaged"
        ) from None
    if not isinstance(out, dict):
        raise CorruptBufferError(f"{file} is not a JSON object; the checkpoint is damaged")
    return out


def _checked(value, file: Path, name: str, stop: int) -> int:
    """``value``, field ``name`` of ``file``, if it is an int in ``[0, stop)``."""
    if type(value) is not int or not 0 <= value < stop:
        raise CorruptBufferError(
            f"{file}: {name} is {str(value)[:40]!r}, not an int in [0, {stop}); the checkpoint "
            "is damaged or was written for a storage of another size"
        )
    return value
