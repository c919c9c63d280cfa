"""How :class:`~zreplay.torchrl.ZarrStorage` reads its slots as TorchRL indexes them:
a torch index over the slots (:func:`slot_index`), the lazy read-only view behind
``storage[:]`` and a sampler's tuple index (:class:`SlotColumns`), and the check that an
extend's columns are the storage's (:func:`check_schema`).

Which row a slot shows: :mod:`zreplay.api.torchrl_ring`; how rows become columns and come
back: :mod:`zreplay.api.torchrl_forms`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict._td import _SubTensorDict

from ..errors import SchemaError
from ..schema import Schema
from .batches import torch_dtype
from .torchrl_forms import disk_name, user_name

CACHED_ROW_BYTES = 16  # columns this small that samplers read whole stay in RAM

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


class SlotColumns:
    """The columns of a storage's ``slots`` slots as one content of it shows them, read
    on access: the lazy structure behind its views (:meth:`structure`) and its small
    columns kept in RAM in slot order.  Once the storage is emptied or loaded, or a
    read-only copy follows another commit, the storage retires it (:meth:`retire`) and
    views taken from it refuse to read.

    ``specs``: the schema's column specs; ``batches``: the form's batch dims;
    ``rows_at(slots, keys)``: the storage's rows of the slots ``slots()`` as
    ``{column: array}``; ``length()``: the storage's ``len``."""

    def __init__(
        self,
        specs: Mapping,
        batches: Mapping[str, list[int]],
        slots: int,
        rows_at: Callable[[Callable[[], np.ndarray], list[str]], dict],
        length: Callable[[], int],
    ):
        self._specs, self._batches, self._slots = specs, batches, slots
        self._rows_at, self._length = rows_at, length
        self._small: dict[str, torch.Tensor] = {}  # small columns in slot order
        self._source: tuple | None = None  # (len, lazy structure of the slots)
        self._retired = False

    def retire(self) -> None:
        self._retired = True

    def structure(self, L: int) -> _LazyColumns:
        """The structure of the first ``L`` slots with no data (kept while ``len`` is
        ``L``); its columns are read on access."""
        if self._source is None or self._source[0] != L:
            types = {k: (torch_dtype(s.dtype), s.row_shape) for k, s in self._specs.items()}
            source = lazy_source(types, self._batches, L, self._reader(L))
            self._source = (L, source)
        return self._source[1]

    def written(self, slots: torch.Tensor, cols: Mapping[str, np.ndarray]) -> None:
        """Rows ``cols`` (``{column: [len(slots), *row]}``) were written to ``slots``."""
        for key, col in self._small.items():
            col[slots] = torch.from_numpy(cols[key])

    def _small_column(self, key: str) -> torch.Tensor:
        """Small column ``key`` (trajectory ids, done flags: at most 16 bytes a row, which
        SliceSampler reads whole on every sample), ``[slots, ...]`` in slot order
        (valid below len), kept in RAM and updated by every append."""
        col = self._small.get(key)
        if col is None:
            spec, L = self._specs[key], self._length()
            col = torch.zeros((self._slots, *spec.row_shape), dtype=torch_dtype(spec.dtype))
            if L:
                col[:L] = torch.from_numpy(self._rows_at(lambda: np.arange(L), [key])[key])
            self._small[key] = col
        return col

    def _reader(self, L: int):
        specs = self._specs
        small = {k for k, s in specs.items() if s.row_bytes <= CACHED_ROW_BYTES}

        def read(key: str, idx) -> torch.Tensor:
            if self._retired:
                raise RuntimeError(
                    "the storage was emptied or loaded since this view was taken; index "
                    "the storage again"
                )
            if isinstance(idx, tuple) and len(idx) == 1:  # how tensordict keeps an index
                idx = idx[0]
            if key in small:
                col = self._small_column(key)[:L]  # a slice of it is a view: no copy
                return col[idx] if isinstance(idx, slice) else col[slot_index(idx, L)]
            slots = slot_index(idx, L)
            got = self._rows_at(lambda: slots.reshape(-1), [key])[key]
            if self._retired:  # a copy that followed its reader: another commit's
                raise RuntimeError(
                    "the rows this view showed left the disk (a read-only copy follows its "
                    "writer's newest commit then); index the storage again"
                )
            return torch.from_numpy(got).reshape(*slots.shape, *specs[key].row_shape)

        return read


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
