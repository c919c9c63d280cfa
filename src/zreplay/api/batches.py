"""How facades hand out what the core reads: nested dicts, torch tensors (dtypes, pinned
memory, devices), trajectories with their metadata."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..errors import warn_caller
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
        warn_caller("pin_memory=True but no CUDA device is available; returning unpinned tensors")
        _pin_warned = True
    return False


def device_problem(device) -> str | None:
    """Why ``device`` cannot receive a batch in this process (None: it can).  Facades
    check it before sampling and raise, so the error names the caller's line."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        return f"device={device!r} is not a torch device ({e})"
    if dev.type == "cuda":
        if torch.version.cuda is None:
            why = f"this torch ({torch.__version__}) was built without CUDA"
        elif not torch.cuda.is_available():
            why = "no CUDA device is visible to this process"
        elif dev.index is not None and dev.index >= torch.cuda.device_count():
            why = f"there are {torch.cuda.device_count()} CUDA devices"
        else:
            return None
        return f"device={device!r}: {why}; sample to the CPU (device=None or 'cpu')"
    if dev.type == "mps" and not torch.backends.mps.is_available():
        return f"device={device!r}: MPS is not available; sample to the CPU (device=None)"
    return None


def nested_tensors(flat: Mapping[str, np.ndarray], device=None) -> dict:
    """``{"a/b": array}`` -> ``{"a": {"b": tensor}}`` (on ``device`` if given)."""
    return unflatten({k: torch.from_numpy(v).to(device or "cpu") for k, v in flat.items()})


def trajectory_dict(rec) -> dict[str, Any]:
    """A :class:`~zreplay.core.TrajectoryRecord` as nested arrays plus its metadata."""
    out = unflatten(rec.columns)
    out["trajectory_id"] = rec.trajectory_id
    out["max_episode_length"] = rec.max_episode_length
    out["model_weights_id"] = rec.model_weights_id
    return out


def index_tree(tree: Any, i: int) -> Any:
    """Item ``i`` of every array in a nested dict."""
    if isinstance(tree, dict):
        return {k: index_tree(v, i) for k, v in tree.items()}
    return tree[i]


def tensor_alloc(pin_memory: bool) -> tuple[Any, dict[str, torch.Tensor]]:
    """``(alloc, tensors)`` for a sample handed out as tensors: with ``pin_memory``, where
    a CUDA device makes that worthwhile, ``alloc(name, shape, dtype)`` gathers rows
    straight into page-locked tensors (kept in ``tensors``); else ``(None, {})``."""
    tensors: dict[str, torch.Tensor] = {}
    if not (pin_memory and can_pin()):
        return None, tensors

    def alloc(key, shape, dtype):
        t = torch.empty(shape, dtype=torch_dtype(dtype), pin_memory=True)
        tensors[key] = t
        return t.numpy()

    return alloc, tensors


def as_tensors(got: Mapping[str, np.ndarray], tensors: dict, device=None) -> dict:
    """A flat sample as a nested dict of tensors sharing the arrays' memory (rows read
    from disk stay in the arrays the reads returned: no copy); ``tensors``: outputs
    :func:`tensor_alloc` already made (pinned: the copy to ``device`` is then
    ``non_blocking``); clips and the sampler's ``index``/``weight`` are wrapped as they
    come."""
    pin = bool(tensors)
    out = dict(tensors)
    for k, v in got.items():
        if k not in out:
            out[k] = torch.from_numpy(v)
    if device is not None:
        out = {k: t.to(device, non_blocking=pin) for k, t in out.items()}
    return unflatten(out)
