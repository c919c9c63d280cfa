"""How :class:`~zreplay.torchrl.ZarrStorage` presents zreplay's append-only rows as
TorchRL's ring of ``max_size`` slots, and TensorDicts as flat columns.

The ring: the storage appends every row it is given (global rows of its segment, never
reused; the ring's rows are ``[start, W)``, ``start`` being where it was last emptied or
loaded) and never overwrites one.  Row ``g`` belongs to slot ``(g - start + shift) %
max_size`` and a slot shows the newest row that belongs to it, so the storage holds
``min(W - start, max_size)`` slots exactly as TorchRL's round-robin writer fills
``LazyTensorStorage`` (wrap-around and oversized extends included).  ``shift`` is 0
except after importing a TorchRL checkpoint of a full ring, whose rows are appended
oldest first starting at the writer's cursor.

How rows become columns and come back: :mod:`zreplay.api.torchrl_forms`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict._td import _SubTensorDict

from ..core import Prepared
from ..errors import AppendOnlyError, SchemaError
from ..schema import Schema
from .torchrl_forms import disk_name, user_name


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


# -- the lazy, read-only view behind storage[:] ------------------------------------------


def _read_only(self, *args, **kwargs):
    raise RuntimeError(
        "ZarrStorage is append-only: a view of it cannot be written (rb.update_, "
        "rb.set_at_ and storage[idx] = value are not supported); extend the buffer instead"
    )


class _LazyColumns(TensorDict):
    """Schema only (meta tensors ``[L, ...]``); a read of ``key`` at index ``idx`` calls
    ``read(key path, idx)``, so ``storage[:][key]`` reads that one column."""

    def _bind(self, read: Callable, prefix: tuple[str, ...]) -> _LazyColumns:
        self.__dict__["_zr_read"] = read
        self.__dict__["_zr_prefix"] = prefix
        return self

    def _zr_get(self, key: tuple[str, ...], idx, default):
        node = self._get_tuple(key, None)
        if node is None:
            return self._default_get(key, default)
        if isinstance(node, TensorDictBase):
            return _SubTensorDict(node, idx)
        path = self.__dict__["_zr_prefix"] + tuple(disk_name(p) for p in key)
        return self.__dict__["_zr_read"]("/".join(path), idx)

    def _get_at_str(self, key, idx, default, **kwargs):
        return self._zr_get((key,), idx, default)

    def _get_at_tuple(self, key, idx, default, **kwargs):
        return self._zr_get(tuple(key), idx, default)

    _set_str = _set_tuple = _set_at_str = _set_at_tuple = _stack_onto_at_ = _read_only
    _stack_onto_ = _read_only


def lazy_source(
    specs: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
    batches: Mapping[str, list[int]],
    length: int,
    read: Callable[[str, object], torch.Tensor],
) -> _LazyColumns:
    """The structure of ``length`` slots (``specs``: stored column -> dtype, row shape) with
    no data: ``_SubTensorDict(source, index)`` is ``storage[index]`` as a read-only view
    whose column ``key`` is ``read(key path, index)``, read on access."""

    def make(prefix: tuple[str, ...]) -> _LazyColumns:
        items: dict = {}
        for path, (dtype, row) in specs.items():
            parts = tuple(path.split("/"))
            if parts[: len(prefix)] != prefix or len(parts) == len(prefix):
                continue
            name = parts[len(prefix)]
            if len(parts) == len(prefix) + 1:
                items[user_name(name)] = torch.empty((length, *row), dtype=dtype, device="meta")
            elif user_name(name) not in items:
                items[user_name(name)] = make((*prefix, name))
        batch = [length, *batches.get("/".join(prefix), [])]
        return _LazyColumns(items, batch_size=batch)._bind(read, prefix)

    return make(())


def slot_index(index, L: int) -> np.ndarray:
    """The slots ``index`` names among ``L`` (torch indexing; torch's IndexError text)."""
    if isinstance(index, tuple) and len(index) == 1:
        index = index[0]
    if isinstance(index, list):  # an index tensor, as TensorDicts (and so TorchRL) read it
        index = _listed(index)
    if isinstance(index, int | np.integer) or (
        isinstance(index, torch.Tensor)
        and not index.dtype.is_floating_point
        and index.dtype != torch.bool
    ):
        idx = torch.as_tensor(index).to("cpu", torch.int64)
        bad = (idx < -L) | (idx >= L)
        if bad.any():
            raise IndexError(
                f"index {int(idx[bad].reshape(-1)[0])} is out of bounds for dimension 0 "
                f"with size {L}"
            )
        return (idx % max(L, 1)).numpy()
    if isinstance(index, slice):
        return np.arange(*index.indices(L))
    return torch.arange(L)[index].numpy()  # torch's semantics and errors


def _listed(index: list):
    """A list index as the tensor TensorDict indexing makes of it (``[[0, 1]]`` is a
    ``[1, 2]`` index, not a tuple of one); a list torch cannot make a tensor of stays."""
    try:
        t = torch.as_tensor(index)
    except (TypeError, ValueError, RuntimeError):
        return index
    if t.numel() == 0:
        return t.to(torch.int64).reshape(t.shape)
    return index if t.dtype.is_floating_point else t


class OwnCheckpoints:
    """Marker: ZarrStorage's dumps/loads are its own (TorchRL's need ``_storage``)."""

    def register_save_hook(self, hook):
        raise AppendOnlyError("ZarrStorage checkpoints take no save hooks")

    register_load_hook = register_save_hook


def check_schema(schema: Schema, cols: Mapping[str, np.ndarray]) -> None:
    missing = [k for k in schema.keys if k not in cols]
    extra = [k for k in cols if k not in schema.specs]
    if missing or extra:
        raise SchemaError(
            f"ZarrStorage: the data's keys differ from the storage's: missing "
            f"{[_shown(k) for k in missing]}, unexpected {[_shown(k) for k in extra]}"
        )
    for k, v in cols.items():
        spec = schema.specs[k]
        if v.dtype != spec.dtype or tuple(v.shape[1:]) != spec.row_shape:
            raise SchemaError(
                f"ZarrStorage: key {_shown(k)} holds {spec.dtype} rows of shape "
                f"{spec.row_shape}, got {v.dtype} rows of shape {tuple(v.shape[1:])}; "
                "ZarrStorage never casts or broadcasts: convert the data before extend"
            )


def show_slots(t: torch.Tensor) -> str:
    v = t.tolist()
    return str(v) if len(v) <= 8 else f"[{v[0]}, {v[1]}, ..., {v[-1]}] ({len(v)})"


def _shown(column: str) -> tuple[str, ...]:
    """The user's key of a stored column."""
    return tuple(user_name(p) for p in column.split("/"))
