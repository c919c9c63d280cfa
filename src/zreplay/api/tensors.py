"""numpy batches as torch tensors: dtypes, pinned memory, devices."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np
import torch

from ..schema import unflatten

_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {}


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    t = _TORCH_DTYPES.get(dtype)
    if t is None:
        t = _TORCH_DTYPES[dtype] = torch.from_numpy(np.empty(0, dtype)).dtype
    return t


_pin_warned = False


def can_pin() -> bool:
    """Whether pinned memory helps here (a CUDA device); warns once when it does not."""
    global _pin_warned
    if torch.cuda.is_available():
        return True
    if not _pin_warned:
        warnings.warn(
            "pin_memory=True but no CUDA device is available; returning unpinned tensors",
            stacklevel=4,
        )
        _pin_warned = True
    return False


def nested_tensors(flat: Mapping[str, np.ndarray], device=None) -> dict:
    """``{"a/b": array}`` -> ``{"a": {"b": tensor}}`` (on ``device`` if given)."""
    return unflatten({k: torch.from_numpy(v).to(device or "cpu") for k, v in flat.items()})
