"""What a :class:`~zreplay.torchrl.ZarrStorage` holds, as TorchRL's tensor storages do:
TensorDicts, tensorclasses, plain tensors and pytrees (dicts, lists and tuples of
tensors), and how each becomes flat zreplay columns and comes back.

A :class:`Form` is recorded with the buffer (``facade_state["form"]``) by the first
extend; every later extend must have the same one.

* TensorDicts (and tensorclasses, whose TensorDict is stored): one column per leaf,
  ``("next", "obs") -> "next/obs"``; ``batches`` records the batch dims after the first
  of every (nested) TensorDict so reads rebuild the same structure.  Tensorclasses (the
  data itself or nested in it) are recorded by import name, ``module:qualname``; a read
  never imports that name (a buffer is data, possibly from a stranger): it rebuilds the
  class only if the user passed it (``tensorclasses=``) or this process has already
  imported its module, else its rows come back as a TensorDict, with a warning.
* Tensors and pytrees (dicts with str/int keys, lists, tuples): leaf ``i`` in order is
  column ``"i"``; the tree's structure is recorded as JSON.

Column names: a key component that is not a safe zreplay name (``"c"``, ``"a b"``,
``"zarr.json"``) or that starts with ``"_."`` is stored as ``"_."`` + the hex of its
UTF-8 bytes; reads give back the user's name.
"""

from __future__ import annotations

import json
import sys
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
from tensordict import (
    LazyStackedTensorDict,
    TensorDict,
    is_non_tensor,
    is_tensor_collection,
    is_tensorclass,
)
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten

from ..errors import KeyNameError, SchemaError, StackError
from ..schema import as_numpy, check_key_component, safe_component

ESCAPE = "_."  # a stored name starting with it is the hex of the user's name
ITEM = ESCAPE + "item"  # not hex: item i of a ragged lazy stack is stored under _.item<i>/


def disk_name(part) -> str:
    """The stored name of TensorDict key component ``part`` (see module)."""
    if not isinstance(part, str):
        raise KeyNameError(f"key component {part!r}: TensorDict keys are str")
    if safe_component(part) and not part.startswith(ESCAPE):
        return part
    name = ESCAPE + part.encode().hex()
    try:
        return check_key_component(name)
    except KeyNameError:
        raise KeyNameError(
            f"key {part[:40]!r}: stored as {name[:40]!r}... it is longer than a zreplay "
            "name may be (128 characters: 63 bytes of a name that needs escaping); "
            "shorten it"
        ) from None


def user_name(name: str) -> str:
    """The TensorDict key component stored as ``name`` (inverse of :func:`disk_name`)."""
    if not name.startswith(ESCAPE):
        return name
    try:
        return bytes.fromhex(name[len(ESCAPE) :]).decode()
    except ValueError:  # not an escaped name: one of ours (_.item<i>)
        return name


def disk_path(key: tuple[str, ...]) -> str:
    return "/".join(disk_name(p) for p in key)


@dataclass(frozen=True)
class Form:
    """How rows are shaped for TorchRL (see module): ``kind`` ``"td"`` (``batches``;
    ``classes``: stored td path -> tensorclass ``module:qualname``, ``""`` for the data
    itself), ``"tree"`` (``spec``: the pytree's structure) or ``"lazy"`` (a ragged lazy
    stack: ``spec`` holds its stack dim and item count, see :func:`_ragged`)."""

    kind: str = "td"
    batches: Mapping[str, list[int]] = field(default_factory=lambda: {"": []})
    spec: str | None = None
    classes: Mapping[str, str] = field(default_factory=dict)

    @property
    def cls(self) -> str | None:
        """The data's own tensorclass, if it is one."""
        return self.classes.get("")

    def to_state(self) -> dict:
        return {
            "kind": self.kind,
            "batches": dict(self.batches),
            "spec": self.spec,
            "classes": dict(self.classes),
        }

    @classmethod
    def from_state(cls, state: Mapping | None, batches: Mapping | None = None) -> Form | None:
        """The recorded form (``None``: nothing written yet; buffers written before forms
        were recorded hold TensorDicts, their ``batches`` recorded apart)."""
        if state is None:
            return None if batches is None else cls("td", dict(batches))
        classes = dict(state.get("classes") or {})
        return cls(state["kind"], dict(state["batches"]), state.get("spec"), classes)

    def differs(self, other: Form) -> str | None:
        """Why rows of ``other`` cannot join rows of this form (``None``: they can)."""
        if self.kind != other.kind or dict(self.classes) != dict(other.classes):
            return f"the storage holds {self.describe()}, the data is {other.describe()}"
        if self.spec != other.spec:
            if self.kind == "lazy":
                return f"the data is a lazy stack {other.spec}, the storage holds {self.spec}"
            return "the data's pytree structure differs from the storage's"
        if dict(self.batches) != dict(other.batches):
            return (
                f"the data's TensorDict batch shapes {dict(other.batches)} differ from the "
                f"storage's {dict(self.batches)} (per row, after the first dim)"
            )
        return None

    def describe(self) -> str:
        if self.kind == "tree":
            return "tensors or pytrees of tensors"
        if self.kind == "lazy":
            return "lazy stacks of TensorDicts that differ in shape"
        return f"tensorclass {self.cls}" if self.cls else "TensorDicts"

    # -- reading --------------------------------------------------------------------

    def build(
        self,
        flat: Mapping[str, np.ndarray | torch.Tensor],
        lead: tuple[int, ...],
        device: torch.device,
        resolve: Callable[[str], type | None] = lambda name: None,
    ):
        """The rows ``flat`` (``{column: [prod(lead), *row]}``) as the data they were:
        a TensorDict or tensorclass ``[*lead, *batch]``, a tensor or a pytree
        (``resolve``: a recorded tensorclass name -> the class, ``None``: a TensorDict)."""

        def tensor(value) -> torch.Tensor:
            t = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
            t = t.reshape((*lead, *t.shape[1:]))
            return t if device.type == "cpu" else t.to(device)

        if self.kind == "tree":
            leaves = iter([tensor(flat[str(i)]) for i in range(len(flat))])
            return _rebuild(json.loads(self.spec), leaves)
        if self.kind == "lazy":  # see _ragged
            meta = json.loads(self.spec)
            items = []
            for i in range(meta["items"]):
                p = f"{ITEM}{i}"
                form = Form("td", _under(self.batches, p), None, _under(self.classes, p))
                items.append(form.build(_under(flat, p), lead, device, resolve))
            return LazyStackedTensorDict(*items, stack_dim=meta["stack_dim"] + len(lead) - 1)
        tree: dict = {}
        for path, value in flat.items():
            node = tree
            *parents, leaf = path.split("/")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = tensor(value)

        def make(prefix: str, node: dict):
            items = {
                user_name(k): make(f"{prefix}/{k}" if prefix else k, v)
                if isinstance(v, dict)
                else v
                for k, v in node.items()
            }
            td = TensorDict(items, batch_size=[*lead, *self.batches.get(prefix, [])])
            tc = resolve(self.classes[prefix]) if prefix in self.classes else None
            return td if tc is None else tc.from_tensordict(td)

        out = make("", tree)
        return out if device.type == "cpu" else out.to(device)  # as TorchRL's storages do


def find_class(name: str, allowed: Mapping[str, type]) -> type | None:
    """The tensorclass recorded as ``module:qualname``: one of ``allowed`` (recorded name
    -> class), else one whose module this process has already imported.  A buffer is
    data, possibly from a stranger: nothing it names is ever imported (a module that
    sits next to it on ``sys.path`` would run).  ``None``, with a warning, for any other
    name: its rows come back as TensorDicts."""
    if name in allowed:
        return allowed[name]
    module, _, qualname = name.partition(":")
    obj = sys.modules.get(module)
    for part in qualname.split(".") if obj is not None else ():
        obj = getattr(obj, part, None) if part.isidentifier() else None
    if isinstance(obj, type) and is_tensorclass(obj):
        return obj
    warnings.warn(
        f"ZarrStorage holds tensorclass {name[:200]!r}, which cannot be imported from a "
        "buffer's record (zreplay never imports a module a buffer names, and this process "
        "has not imported it); its rows come back as TensorDicts: import the class's "
        "module before reading, pass ZarrStorage(..., tensorclasses=[cls]), or wrap them: "
        "cls.from_tensordict(td)",
        RuntimeWarning,
        stacklevel=4,
    )
    return None


def class_names(classes) -> dict[str, type]:
    """``{recorded name: class}`` of the tensorclasses a user allows (``tensorclasses=``);
    ``TypeError`` for anything that is not a tensorclass."""
    out = {}
    for cls in classes or ():
        if not (isinstance(cls, type) and is_tensorclass(cls)):
            raise TypeError(f"tensorclasses: {cls!r} is not a tensorclass")
        name, _ = _named(cls)
        out[name] = cls
    return out


def encode(data, single: bool) -> tuple[Form, dict[str, np.ndarray], dict[str, type]]:
    """``(form, {column: [n, *row]}, {recorded name: tensorclass})`` of what a writer passes to
    ``set``: a TensorDict, tensorclass, tensor or pytree with the rows along dim 0, a
    list of items (stacked, as TorchRL's storages do), or one item (``single``: the
    cursor was an int).  ``SchemaError`` for what cannot be stored."""
    if isinstance(data, list):
        data = _stack_items(data)
    if is_tensor_collection(data):
        if single:
            data = data.unsqueeze(0)
        if isinstance(data, LazyStackedTensorDict):
            try:
                data = data.contiguous()
            except RuntimeError as e:  # its items differ in shape
                return _ragged(data, e)
        cols, batches, classes = _td_columns(data)
        names = {path: name for path, (name, _) in classes.items()}
        return Form("td", batches, None, names), cols, dict(classes.values())
    leaves: list[torch.Tensor] = []
    text = json.dumps(_structure(data, leaves))
    if not leaves:
        raise SchemaError("ZarrStorage: the data holds no tensors")
    cols = {}
    for i, leaf in enumerate(leaves):
        leaf = leaf.unsqueeze(0) if single else leaf
        if leaf.dim() == 0:
            raise SchemaError(f"ZarrStorage: pytree leaf {i} is a scalar; rows need a first dim")
        cols[str(i)] = np.ascontiguousarray(as_numpy(leaf, str(i)))
    lengths = {len(v) for v in cols.values()}
    if len(lengths) != 1:
        raise SchemaError(
            f"ZarrStorage: the pytree's leaves have {sorted(lengths)} rows; every leaf needs "
            "the same first dim"
        )
    return Form("tree", {"": []}, text), cols, {}


def leading(rows) -> int | None:
    """Rows along dim 0 of a TensorDict, tensorclass, tensor or pytree (0: no batch dim)."""
    if rows is None:
        return None
    if is_tensor_collection(rows):
        return int(rows.shape[0]) if rows.batch_dims else 0
    leaves = tree_leaves(rows)
    return int(leaves[0].shape[0]) if leaves and leaves[0].dim() else 0


def take(rows, index):
    """``rows[index]`` of a TensorDict, tensorclass, tensor or pytree (leaf by leaf)."""
    if is_tensor_collection(rows):
        return rows[index]
    return tree_map(lambda x: x[index], rows)


def _structure(x, leaves: list):
    """JSON of pytree ``x`` (dicts with str/int keys, lists, tuples; ``None`` marks a
    leaf), its tensors appended to ``leaves`` in order.  Our own record, not
    ``treespec_dumps``: libraries register list subclasses under ``builtins.list``, so
    a structure read back that way can hold another type."""
    if isinstance(x, torch.Tensor):
        leaves.append(x)
        return None
    if type(x) is dict:
        for k in x:
            if type(k) not in (str, int):
                raise SchemaError(
                    f"ZarrStorage: a pytree key {k!r} ({type(k).__name__}) cannot be recorded "
                    "with the buffer; use str or int keys, or a TensorDict"
                )
        return {"dict": [[k, _structure(v, leaves)] for k, v in x.items()]}
    if type(x) in (list, tuple):
        return {type(x).__name__: [_structure(v, leaves) for v in x]}
    raise SchemaError(
        "ZarrStorage stores TensorDicts, tensorclasses, tensors and pytrees of tensors "
        f"(dicts, lists, tuples); got {type(x).__name__} in {type(x).__module__}"
    )


def _rebuild(s, leaves):
    """The pytree recorded by :func:`_structure`, its leaves taken from ``leaves``."""
    if s is None:
        return next(leaves)
    ((kind, items),) = s.items()
    if kind == "dict":
        return {k: _rebuild(v, leaves) for k, v in items}
    built = [_rebuild(v, leaves) for v in items]
    return tuple(built) if kind == "tuple" else built


def _stack_items(items: list):
    """A list of items as one batch (TorchRL's storages stack a list)."""
    if not items:
        raise SchemaError("ZarrStorage: an empty list holds no rows")
    try:
        return _stacked(items)
    except RuntimeError as e:  # torch's: the items differ in shape
        raise StackError(
            "Stacking the elements of the list resulted in an error (ZarrStorage, as "
            f"TorchRL's storages, stacks a list of items: {str(e).splitlines()[0]}); pass "
            "items of one shape, or a tuple (a pytree whose leaves already hold the batch)"
        ) from None


def _stacked(items: list):
    if all(is_tensor_collection(x) for x in items):
        return torch.stack(items)
    flat = [tree_flatten(x) for x in items]
    if not all(isinstance(leaf, torch.Tensor) for leaves, _ in flat for leaf in leaves):
        kinds = sorted({type(leaf).__name__ for leaves, _ in flat for leaf in leaves})
        raise SchemaError(
            "ZarrStorage stores TensorDicts, tensorclasses, tensors and pytrees of tensors; "
            f"got a list of items with leaves of type {kinds}"
        )
    if any(spec != flat[0][1] for _, spec in flat):
        raise SchemaError("ZarrStorage: the items of the list differ in structure")
    stacks = [
        torch.stack(list(group)) for group in zip(*(leaves for leaves, _ in flat), strict=True)
    ]
    return tree_unflatten(stacks, flat[0][1])


def _ragged(ltd: LazyStackedTensorDict, error: RuntimeError):
    """``encode`` of a lazy stack whose items differ in shape: stacked along a dim after
    the first, each item is stored as TensorDict rows of its own under ``_.item<i>/``
    (``_.`` + non-hex never names a user's key) and read back as the same lazy stack.
    Items that are rows (``stack_dim=0``) cannot be columns: SchemaError."""
    if ltd.stack_dim == 0:
        raise SchemaError(
            "ZarrStorage stores rows of one shape per key; this LazyStackedTensorDict's "
            f"rows differ ({str(error).splitlines()[0]}): pad them to one shape, or store "
            "them as separate keys"
        )
    cols, batches, names, found = {}, {}, {}, {}
    for i, item in enumerate(ltd.tensordicts):
        c, b, cl = _td_columns(item)
        p = f"{ITEM}{i}"
        cols.update({f"{p}/{k}": v for k, v in c.items()})
        batches.update({f"{p}/{k}" if k else p: v for k, v in b.items()})
        names.update({f"{p}/{k}" if k else p: name for k, (name, _) in cl.items()})
        found.update(dict(cl.values()))
    spec = json.dumps({"stack_dim": ltd.stack_dim, "items": len(ltd.tensordicts)})
    return Form("lazy", batches, spec, names), cols, found


def _under(mapping: Mapping[str, object], prefix: str) -> dict:
    """The entries of ``mapping`` at or under path ``prefix``, keyed relative to it."""
    n = len(prefix) + 1
    return {k[n:]: v for k, v in mapping.items() if k == prefix or k.startswith(prefix + "/")}


def _td_columns(td) -> tuple[dict[str, np.ndarray], dict[str, list[int]], dict]:
    """``({"a/b": [n, *row] array}, {stored td path: extra batch dims}, {stored td path:
    (recorded name, tensorclass)})`` of a TensorDict or tensorclass."""
    cols: dict[str, np.ndarray] = {}
    classes = {"": _named(type(td))} if is_tensorclass(td) else {}
    batches = {"": [int(d) for d in td.batch_size[1:]]}
    for key, value in td.items(include_nested=True, leaves_only=False):
        key = (key,) if isinstance(key, str) else tuple(key)
        path = disk_path(key)
        if is_non_tensor(value):
            raise SchemaError(
                f"ZarrStorage: key {key} holds {type(value).__name__}; only tensors are "
                "stored (drop non-tensor entries before extend)"
            )
        if is_tensor_collection(value):
            if is_tensorclass(value):
                classes[path] = _named(type(value))
            batches[path] = [int(d) for d in value.batch_size[1:]]
        elif isinstance(value, torch.Tensor):
            cols[path] = np.ascontiguousarray(as_numpy(value.detach(), str(key)))
        else:
            raise SchemaError(
                f"ZarrStorage: key {key} holds {type(value).__name__}; only tensors are "
                "stored (drop non-tensor entries before extend)"
            )
    if not cols:
        raise SchemaError("ZarrStorage: the TensorDict holds no tensors")
    return cols, batches, classes


def _named(cls: type) -> tuple[str, type]:
    return f"{cls.__module__}:{cls.__qualname__}", cls
