"""Keys, dtypes and per-row shapes of a buffer, and the checks that guard them.

A trajectory is a (possibly nested) dict of arrays shaped ``[T, B, *row_shape]``.  Nested
dicts become ``/``-joined key paths (``curr_obs/main_images``), which are also the Zarr
array paths under ``data/``.  The schema is fixed by the first trajectory a buffer sees;
every later trajectory must have exactly the same keys, dtypes and row shapes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import KeyNameError, SchemaError

# A path component must be a plain file name on every filesystem and object store we
# support: no separators, no dot-only names, no control characters, nothing hidden.
_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
_RESERVED = {"zarr.json", "c"}

SUPPORTED_DTYPES = {
    np.dtype(t)
    for t in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
}

# Elements per row above which we refuse a key: a typo'd shape should fail loudly, not
# allocate terabytes.  2**28 elements is a 16k x 16k RGB frame.
MAX_ROW_ELEMENTS = 1 << 28
# Key paths become directories under <buffer>/segments/<writer>/data/: bounded well below
# PATH_MAX (4096) so a long nesting fails here, before anything is written.
MAX_KEY_PATH = 512
MAX_KEY_DEPTH = 16


# What names a component other than a data key (``where`` given as one of these).
_NAMED = {"segments": "writer_id", "learners": "learner_id"}


def safe_component(name: str) -> bool:
    """Whether ``name`` may be one Zarr path component of a buffer (see below)."""
    return bool(_COMPONENT.fullmatch(name)) and name not in _RESERVED and not name.endswith(".")


def check_key_component(name: Any, where: str = "") -> str:
    """Return ``name`` if it is safe as one Zarr path component, else raise KeyNameError
    (naming a writer or learner id as such when ``where`` is ``segments``/``learners``)."""
    what = _NAMED.get(where)
    label = f"{what} {name!r}" if what else f"key {f'{where}/{name}' if where else repr(name)!r}"
    if not isinstance(name, str):
        raise KeyNameError(f"{label}: names must be str, got {type(name).__name__}")
    if not safe_component(name):
        nest = "" if what else " (nest dicts instead)"
        raise KeyNameError(
            f"{label} is not a safe name: use 1-128 characters from [A-Za-z0-9_.-], "
            f"not starting with '.' or '-', with no '/'{nest}, and not one of "
            f"{sorted(_RESERVED)}"
        )
    return name


def flatten(nested: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts into ``{"a/b": value}``; every component is name-checked, and
    whole paths are bounded (they become directories under the buffer)."""
    out: dict[str, Any] = {}
    for name, value in nested.items():
        check_key_component(name, prefix)
        path = f"{prefix}/{name}" if prefix else name
        _check_path_size(path)
        if isinstance(value, Mapping):
            if not value:
                continue
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out


def _check_path_size(path: str) -> None:
    if len(path) > MAX_KEY_PATH or path.count("/") >= MAX_KEY_DEPTH:
        raise KeyNameError(
            f"key path {path[:80]!r}... is {len(path)} characters, {path.count('/') + 1} "
            f"levels deep; at most {MAX_KEY_PATH} characters and {MAX_KEY_DEPTH} levels "
            "(each becomes a directory of the buffer): shorten names or nest less"
        )


def check_key_path(path: Any) -> str:
    """Return the flat key ``path`` (``"a/b"``) if :func:`flatten` could have made it,
    else raise KeyNameError: the check a key passes when written, applied to keys read
    back from a buffer (each becomes directories under it, so ``..`` must never pass)."""
    if not isinstance(path, str):
        raise KeyNameError(f"key {path!r}: names must be str, got {type(path).__name__}")
    prefix = ""
    try:
        for name in path.split("/"):
            check_key_component(name, prefix)
            prefix = f"{prefix}/{name}" if prefix else name
    except KeyNameError as e:
        raise KeyNameError(f"key {path!r}: {e}") from None
    _check_path_size(path)
    return path


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`flatten`: ``{"a/b": v}`` -> ``{"a": {"b": v}}``."""
    if not any("/" in path for path in flat):
        return dict(flat)
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def as_numpy(value: Any, key: str) -> np.ndarray:
    """View a numpy array or torch tensor as a numpy array (no copy for CPU tensors).
    Anything that is not plain strided data (masked arrays, sparse, nested, quantized or
    meta tensors, dtypes numpy lacks) is a SchemaError saying how to convert it."""
    if isinstance(value, np.ndarray):
        if isinstance(value, np.ma.MaskedArray):
            raise SchemaError(
                f"key {key!r}: masked arrays are not stored (their mask would be lost); "
                "pass value.filled(fill_value), or store the mask as a key of its own"
            )
        return value if type(value) is np.ndarray else np.asarray(value)
    if type(value).__module__.startswith("torch"):
        return _tensor_as_numpy(value, key)
    raise SchemaError(
        f"key {key!r}: expected a numpy array or torch tensor shaped [T, B, ...], "
        f"got {type(value).__name__}"
    )


def _tensor_as_numpy(value: Any, key: str) -> np.ndarray:
    import torch

    if not isinstance(value, torch.Tensor):
        raise SchemaError(f"key {key!r}: expected a tensor, got {type(value).__name__}")
    fix = None
    if value.dtype == torch.bfloat16:
        fix = "bfloat16 has no numpy equivalent; convert it with .float() or .to(torch.float16)"
    elif value.is_nested:
        fix = "a nested tensor has no [T, B, ...] shape; add equal-shaped tensors"
    elif value.layout != torch.strided:
        fix = f"a {value.layout} tensor is not stored as such; convert it with .to_dense()"
    elif value.is_quantized:
        fix = "a quantized tensor is not stored as such; convert it with .dequantize()"
    elif value.device.type == "meta":
        fix = "a tensor on the meta device holds no data; materialise it first"
    if fix is not None:
        raise SchemaError(f"key {key!r}: {fix} before adding")
    try:
        return value.detach().resolve_conj().resolve_neg().cpu().numpy()
    except (RuntimeError, TypeError, NotImplementedError) as e:
        raise SchemaError(
            f"key {key!r}: a {value.dtype} tensor cannot be read as a numpy array ({e}); "
            "convert it to a supported dtype (bool, (u)int8-64, float16/32/64) first"
        ) from None


@dataclass(frozen=True)
class KeySpec:
    """One stored key: its path, dtype and the shape of one row (one transition)."""

    path: str
    dtype: np.dtype
    row_shape: tuple[int, ...]

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize

    def describe(self) -> str:
        return f"{self.dtype} [T, B{''.join(', ' + str(d) for d in self.row_shape)}]"

    def to_json(self) -> dict:
        return {"dtype": self.dtype.str, "row_shape": list(self.row_shape)}

    @classmethod
    def from_json(cls, path: str, d: Mapping) -> KeySpec:
        """The spec recorded for ``path``; ValueError for anything a writer could not
        have recorded (an unsupported dtype, a negative or oversize row shape)."""
        dtype = np.dtype(d["dtype"])
        row = d["row_shape"]
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"key {path!r}: dtype {dtype} is not one zreplay stores")
        if not isinstance(row, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in row
        ):
            raise ValueError(f"key {path!r}: row_shape {row!r} is not a list of lengths >= 1")
        if int(np.prod(row, dtype=object)) > MAX_ROW_ELEMENTS:
            raise ValueError(
                f"key {path!r}: row_shape {row} has more than {MAX_ROW_ELEMENTS} elements"
            )
        return cls(path, dtype, tuple(row))


class Schema:
    """The fixed set of keys of a buffer, in a stable (sorted) order."""

    def __init__(self, specs: Mapping[str, KeySpec]):
        self.specs: dict[str, KeySpec] = dict(sorted(specs.items()))

    def __iter__(self):
        return iter(self.specs.values())

    def __len__(self) -> int:
        return len(self.specs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.specs == other.specs

    @property
    def keys(self) -> list[str]:
        return list(self.specs)

    @property
    def row_bytes(self) -> int:
        return sum(s.row_bytes for s in self.specs.values())

    @classmethod
    def infer(cls, columns: Mapping[str, np.ndarray]) -> Schema:
        """Fix a schema from the ``[T, B, ...]`` arrays of a first trajectory."""
        specs = {}
        for path, arr in columns.items():
            dtype = np.dtype(arr.dtype)
            if dtype not in SUPPORTED_DTYPES:
                raise SchemaError(
                    f"key {path!r}: dtype {dtype} is not supported; use one of "
                    "bool, (u)int8-64, float16/32/64"
                )
            if arr.ndim < 2:
                raise SchemaError(
                    f"key {path!r}: expected an array shaped [T, B, ...], got shape "
                    f"{tuple(arr.shape)} (add the env axis B even when B == 1)"
                )
            row = tuple(int(d) for d in arr.shape[2:])
            if 0 in row:
                raise SchemaError(
                    f"key {path!r}: rows of shape {row} hold no data (an axis of length 0); "
                    "drop the key or give every axis a length >= 1"
                )
            if int(np.prod(row, dtype=np.int64)) > MAX_ROW_ELEMENTS:
                raise SchemaError(
                    f"key {path!r}: one row of shape {row} has more than "
                    f"{MAX_ROW_ELEMENTS} elements; split it or store it elsewhere"
                )
            specs[path] = KeySpec(path, dtype, row)
        if not specs:
            raise SchemaError("a trajectory needs at least one [T, B, ...] array")
        return cls(specs)

    def check(self, columns: Mapping[str, np.ndarray], T: int, B: int) -> None:
        """Raise SchemaError unless ``columns`` match this schema exactly with shape [T, B]."""
        missing = [k for k in self.specs if k not in columns]
        extra = [k for k in columns if k not in self.specs]
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"missing keys {missing}")
            if extra:
                parts.append(f"unexpected keys {extra}")
            raise SchemaError(
                f"trajectory keys differ from the buffer's schema: {'; '.join(parts)} "
                f"(schema keys: {self.keys})"
            )
        for path, spec in self.specs.items():
            arr = columns[path]
            got_row = tuple(arr.shape[2:])
            if arr.dtype != spec.dtype or got_row != spec.row_shape or arr.shape[:2] != (T, B):
                got = f"{arr.dtype} {list(arr.shape)}"
                want = f"{spec.dtype} {[T, B, *spec.row_shape]}"
                raise SchemaError(f"key {path!r}: expected {want}, got {got}")

    def to_json(self) -> dict:
        return {k: s.to_json() for k, s in self.specs.items()}

    @classmethod
    def from_json(cls, d: Mapping) -> Schema:
        """A recorded schema; KeyNameError for a key no writer could have made (a path
        out of the buffer), ValueError for a spec no writer could have recorded."""
        return cls({check_key_path(k): KeySpec.from_json(k, v) for k, v in d.items()})
