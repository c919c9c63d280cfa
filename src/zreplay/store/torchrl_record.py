"""The record a ``zreplay.torchrl.ZarrStorage`` keeps in its segment's commit
(``sampler.facade``, FORMAT.md): TorchRL's ring over the segment's rows and the form of
its data.  Read from disk, it is data, possibly crafted: :func:`record_problem` bounds
every number in it by what the commit and the schema can hold, for the storage that
opens it and for ``zreplay.verify`` alike (nothing here needs torch).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping

KIND = "torchrl"
# Row numbers are int64 and go on after the ring wraps: a ring this size leaves them 2**15
# times its size to grow (TorchRL's own storages allocate max_size rows up front).
MAX_SIZE = 1 << 48
MAX_NDIM = 64  # storage dims and TensorDict batch dims (torch allows 64 dims)
MAX_BATCH_ELEMENTS = 1 << 28  # schema.MAX_ROW_ELEMENTS: batch dims are part of a row
_ITEM = re.compile(r"_\.item(\d+)/")


def record_problem(
    facade: Mapping, n_rows: int, columns: Collection[str] | None = None
) -> str | None:
    """Why ``facade`` (a ZarrStorage record of a segment whose commit holds ``n_rows``
    rows; ``columns``: the schema's keys, ``None`` while it has none) cannot be what a
    ZarrStorage wrote, naming the field; ``None`` if it can."""
    if not isinstance(facade, Mapping):
        return f"the record is {type(facade).__name__}, not an object"
    max_size = facade.get("max_size")
    if not _int(max_size) or not 1 <= max_size <= MAX_SIZE:
        return f"max_size is {_shown(max_size)}, not a size in [1, 2**48]"
    ndim = facade.get("ndim", 1)
    if not _int(ndim) or not 1 <= ndim <= MAX_NDIM:
        return f"ndim is {_shown(ndim)}, not in [1, {MAX_NDIM}]"
    dims = facade.get("dims")
    per = 1
    if dims is not None:
        if (
            not isinstance(dims, list)
            or len(dims) != ndim - 1
            or not all(_int(d) and 1 <= d <= MAX_SIZE for d in dims)
            or math.prod(dims) > MAX_SIZE
        ):
            return f"dims is {_shown(dims)}, not {ndim - 1} storage dims of at most 2**48 elements"
        per = math.prod(dims)
    slots = -(-max_size // per)
    start = facade.get("start", 0)
    if not _int(start) or not 0 <= start <= n_rows:
        return f"start is {_shown(start)}, not a row in [0, {n_rows}] (the commit's rows)"
    shift = facade.get("shift", 0)
    if not _int(shift) or not 0 <= shift < slots:
        return f"shift is {_shown(shift)}, not a slot in [0, {slots})"
    if not isinstance(facade.get("guessed", False), bool):
        return f"guessed is {_shown(facade.get('guessed'))}, not true or false"
    form = facade.get("form")
    if form is None:
        batches = facade.get("batches")  # written before forms were recorded
        return None if batches is None else _batches_problem(batches, "batches")
    return _form_problem(form, columns)


def _form_problem(form, columns: Collection[str] | None) -> str | None:
    if not isinstance(form, Mapping):
        return f"form is {_shown(form)}, not an object"
    kind = form.get("kind")
    if kind not in ("td", "tree", "lazy"):
        return f"form.kind is {_shown(kind)}, not td, tree or lazy"
    why = _batches_problem(form.get("batches"), "form.batches")
    if why:
        return why
    classes = form.get("classes") or {}
    if not isinstance(classes, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and len(v) <= 1024 for k, v in classes.items()
    ):
        return "form.classes is not an object of tensorclass names (module:qualname)"
    spec = form.get("spec")
    if kind == "td":
        return None
    if not isinstance(spec, str):
        return f"form.spec is {_shown(spec)}, not the JSON text of a {kind} form"
    try:
        parsed = json.loads(spec)
    except (ValueError, RecursionError):
        return "form.spec is not JSON"
    if kind == "lazy":
        return _lazy_problem(parsed, form["batches"], columns)
    try:
        leaves = _leaves(parsed, 0)
    except (ValueError, RecursionError):
        return "form.spec is not a pytree structure (dict, list, tuple, null leaves)"
    if columns is not None and leaves != len(columns):
        return f"form.spec has {leaves} leaves, the schema {len(columns)} columns"
    return None


def _lazy_problem(spec, batches: Mapping, columns: Collection[str] | None) -> str | None:
    if not isinstance(spec, Mapping):
        return "form.spec of a lazy stack is not an object"
    items, stack_dim = spec.get("items"), spec.get("stack_dim")
    # Every item is stored as columns of its own (_.item<i>/...): the schema bounds them.
    stored = None
    if columns is not None:
        found = {int(m.group(1)) for c in columns if (m := _ITEM.match(c))}
        stored = len(found) if found == set(range(len(found))) else -1
    if not _int(items) or items < 1 or (stored is not None and items != stored):
        held = "" if stored is None else f" (the schema holds {max(stored, 0)})"
        return f"form.spec items is {_shown(items)}, not the lazy stack's stored items{held}"
    first = batches.get("_.item0")
    most = 1 + (len(first) if isinstance(first, list) else MAX_NDIM - 1)
    if not _int(stack_dim) or not 1 <= stack_dim <= most:
        return f"form.spec stack_dim is {_shown(stack_dim)}, not a dim in [1, {most}]"
    return None


def _batches_problem(batches, name: str) -> str | None:
    if not isinstance(batches, Mapping) or not all(
        isinstance(k, str)
        and isinstance(v, list)
        and len(v) < MAX_NDIM
        and all(_int(d) and 0 <= d <= MAX_BATCH_ELEMENTS for d in v)
        and math.prod(v) <= MAX_BATCH_ELEMENTS
        for k, v in batches.items()
    ):
        return f"{name} is not an object of TensorDict paths and their batch dims"
    return None


def _leaves(s, depth: int) -> int:
    """Leaves of a recorded pytree structure (``ValueError`` if it is not one)."""
    if depth > 1000:
        raise ValueError("too deep")
    if s is None:
        return 1
    if not isinstance(s, dict) or len(s) != 1:
        raise ValueError("not a node")
    ((kind, items),) = s.items()
    if kind not in ("dict", "list", "tuple") or not isinstance(items, list):
        raise ValueError("not a node")
    if kind == "dict":
        if not all(isinstance(p, list) and len(p) == 2 for p in items):
            raise ValueError("not a dict node")
        if not all(type(p[0]) in (str, int) for p in items):
            raise ValueError("not a dict key")
        return sum(_leaves(p[1], depth + 1) for p in items)
    return sum(_leaves(v, depth + 1) for v in items)


def _int(v) -> bool:
    return type(v) is int


def _shown(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
