"""Numbers and arrays a user passes, as the plain values zreplay computes with and saves.

Training loops hand zreplay numpy scalars (``np.int64(16)`` from an index computation),
0-d arrays and 0-d tensors of any dtype (``torch.tensor(3)``, a bf16 loss under mixed
precision) wherever an int or a float is expected, and tensors of dtypes numpy has no
name for (bf16, float8) wherever an array is.  Every such value is made a Python
``int``/``float`` or a numpy array here, at the API boundary, so nothing downstream
(the JSON state saved with each commit above all) ever holds a numpy or torch scalar.

:func:`check_json` is the guard for state that is persisted: it is called when the
state is set (a sampler bound to a buffer, a version passed to ``sample``), so a value
that could not be saved is refused on the caller's line, never by the background
writer later.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any

import numpy as np

__all__ = [
    "as_array",
    "as_float",
    "as_index",
    "as_int",
    "as_optional_float",
    "as_positions",
    "check_json",
]


def _scalar(value: Any) -> Any:
    """``value`` unwrapped from a 0-d numpy array or a one-element (0-d) torch tensor;
    anything else as it is."""
    if type(value).__module__.startswith("torch") and hasattr(value, "dim"):
        if value.dim() != 0:
            return value  # refused by the caller with its own message
        value = value.detach().cpu()
        if value.dtype.is_floating_point:
            return float(value.float().item())
        return value.item()
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    return value


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    what = type(value).__name__
    if shape is not None and len(tuple(shape)):
        what += f" of shape {tuple(shape)}"
    return f"{what} {value!r}" if shape is None or not len(tuple(shape)) else what


def as_int(value: Any, name: str, minimum: int | None = None) -> int:
    """``value`` (a Python int, numpy integer, or 0-d array/tensor of an integer dtype)
    as a Python ``int``; ``TypeError`` for anything else (bools and floats included),
    ``ValueError`` below ``minimum`` or outside int64 (every count, row and index zreplay
    takes is one)."""
    if type(value) is int and (minimum is None or value >= minimum) and -_I64 <= value < _I64:
        return value  # the common case, on every sample: no further checks needed
    v = _scalar(value)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {_describe(value)}")
    v = int(v)
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")
    if not -_I64 <= v < _I64:
        raise ValueError(f"{name} must fit a 64-bit integer, got {v}")
    return v


_I64 = 1 << 63


def as_index(value: Any, n: int, name: str) -> int:
    """``value`` (as :func:`as_int` takes it) as a position in a sequence of ``n``, as
    Python sequences read it: negative counts from the end; ``IndexError`` outside
    ``[-n, n)``, ``TypeError`` for a non-integer (a float is never truncated)."""
    i = as_int(value, name)
    if not -n <= i < n:
        raise IndexError(f"{name} {i} is out of range for {n} (valid: -{n} to {n - 1})")
    return i + n if i < 0 else i


def as_positions(value: Any, n: int, name: str) -> np.ndarray:
    """``value`` as flat int64 positions into ``n`` items ``[0, n)``, as numpy indexes an
    array of ``n``: integers of any integer dtype (Python, numpy or torch, scalar or
    array), negative counting from the end, or a boolean mask of length ``n`` (the items
    where it is True).  ``TypeError`` for anything else (float
    positions are never truncated), ``IndexError`` for positions outside ``[-n, n)`` or a
    mask of another length."""
    arr = as_array(value)
    if arr.dtype == np.bool_ and arr.ndim > 0:
        if arr.shape != (n,):
            raise IndexError(
                f"a boolean mask for {name} must have shape ({n},), one entry per item, "
                f"got shape {arr.shape}"
            )
        return np.flatnonzero(arr).astype(np.int64)
    if arr.size == 0 and arr.dtype != np.bool_:  # [] is float64 to numpy
        return np.empty(0, np.int64)
    if arr.dtype.kind not in "iu":
        bad = arr.reshape(-1)[:3].tolist()
        raise TypeError(
            f"{name} must be integers or a boolean mask of length {n}, got {arr.dtype} "
            f"{bad}{'...' if arr.size > 3 else ''} (cast float positions yourself)"
        )
    flat = arr.reshape(-1)
    lo, hi = int(flat.min()), int(flat.max())
    if lo < -n or hi >= n:
        raise IndexError(
            f"{name} must lie in [-{n}, {n}) (negative from the end), got {lo if lo < -n else hi}"
        )
    flat = flat.astype(np.int64, copy=False)
    if lo < 0:
        flat = np.where(flat < 0, flat + n, flat)
    return flat


def as_float(value: Any, name: str, finite: bool = True) -> float:
    """``value`` (a Python or numpy number, or a 0-d array/tensor of any numeric dtype,
    bf16 included) as a Python ``float``; ``TypeError`` for anything else (bools
    included), ``ValueError`` for NaN or infinity when ``finite``."""
    v = _scalar(value)
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a number, got {_describe(value)}")
    try:
        v = float(v)
    except OverflowError:  # an int beyond float64
        v = math.inf if v > 0 else -math.inf
    if finite and not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {v}")
    return v


def as_optional_float(value: Any, name: str) -> float | None:
    """:func:`as_float`, with ``None`` passed through."""
    return None if value is None else as_float(value, name)


def as_array(value: Any) -> np.ndarray:
    """``value`` (a numpy array, a torch tensor of any dtype on any device, a list or a
    scalar) as a numpy array.  Floating tensors numpy cannot hold (bf16, float8) become
    float32; nothing is copied that need not be."""
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype.is_floating_point and t.dtype not in _NUMPY_FLOATS:
            t = t.float()
        return t.numpy()
    return np.asarray(value)


def _numpy_floats() -> frozenset:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return frozenset()
    return frozenset({torch.float16, torch.float32, torch.float64})


_NUMPY_FLOATS = _numpy_floats()


def check_json(state: Any, what: str) -> None:
    """``TypeError`` naming the first value of ``state`` that JSON cannot hold (a numpy or
    torch scalar, an array, an object) and where it is; ``what`` names the state."""
    try:
        json.dumps(state)
    except (TypeError, ValueError) as e:
        where, bad = _first_non_json(state, what)
        if not where:
            raise TypeError(f"{what} cannot be saved with the buffer as JSON ({e})") from None
        raise TypeError(
            f"{where} is {type(bad).__name__} {bad!r}, which cannot be saved with the "
            "buffer (JSON); pass a Python int, float, str or bool"
        ) from None


def _first_non_json(obj: Any, path: str, seen: frozenset = frozenset()) -> tuple[str, Any]:
    if isinstance(obj, dict | list | tuple):
        if id(obj) in seen:
            return f"{path} (it contains itself)", obj
        seen = seen | {id(obj)}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str | int | float | bool) and k is not None:
                return f"{path} key {k!r}", k
            found = _first_non_json(v, f"{path}[{k!r}]", seen)
            if found[0]:
                return found
        return "", None
    if isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            found = _first_non_json(v, f"{path}[{i}]", seen)
            if found[0]:
                return found
        return "", None
    try:
        json.dumps(obj)
    except (TypeError, ValueError):
        return path, obj
    return "", None
