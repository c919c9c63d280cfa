"""A Minari dataset (HDF5 format) into a new buffer: :func:`import_minari`.

Minari 0.5's layout, read with plain h5py (no ``minari`` or ``gymnasium`` import)::

    <dataset>/data/metadata.json     data_format "hdf5", jpeg_encoding, total_episodes,
                                     observation_space / action_space (serialized JSON)
    <dataset>/data/main_data.hdf5    one group episode_{id} per episode:
        observations    T + 1 rows (the reset observation first); a Dict space is a group
                        of its keys, a Tuple space a group of _index_0, _index_1, ...
        actions         T rows (same nesting)
        rewards, terminations, truncations
                        T rows each
        infos           not imported

Each episode of ``T`` steps becomes one trajectory ``[T, 1]`` of the buffer:
``observations`` = observations[:-1], ``next_obs`` = observations[1:] (the same nesting),
``actions``, ``rewards``, ``terminated`` (terminations) and ``truncated`` (truncations).
Image spaces (a uint8 Box of 2 or 3 axes, at least 32x32, bounds 0 and 255) stored as
JPEG bytes (Minari's default, ``jpeg_encoding``) are decoded with Pillow, as Minari
itself decodes them (Pillow comes with matplotlib, a zreplay dependency).  An episode of
no steps (a reset observation only) is skipped and counted.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core import OFFLINE_WRITER, BufferCore, Prepared, RamPolicy, RandomStream, seal
from ..errors import FormatError
from ..schema import flatten
from ..store.guard import new_tree
from ..store.location import locate
from ..threads import import_whole

METADATA = "metadata.json"
MAIN_FILE = "main_data.hdf5"
STEP_DATASETS = {"rewards": "rewards", "terminations": "terminated", "truncations": "truncated"}
# RAM the writer keeps decoded while the buffer is built (as a stable-worldmodel dump's).
IMPORT_RAM_BYTES = 1 << 30
# Episodes added together (each is staged whole in RAM).
BATCH = 16


@dataclass
class MinariImport:
    """What :func:`import_minari` read: ``episodes`` and ``steps`` imported,
    ``skipped_empty`` (episodes of no steps), and the buffer ``keys``."""

    path: str
    episodes: int = 0
    steps: int = 0
    skipped_empty: int = 0
    keys: list[str] | None = None


def data_dir(src: Path) -> Path:
    """The directory holding ``metadata.json`` and ``main_data.hdf5``: ``src`` itself or
    its ``data`` directory (a Minari dataset's root)."""
    for d in (src / "data", src):
        if (d / METADATA).is_file():
            return d
    raise FormatError(
        f"{src} is not a Minari dataset: no data/{METADATA} (give the dataset's directory, "
        "e.g. ~/.minari/datasets/<namespace>/<name>-v0)"
    )


def is_minari_dataset(path: Path) -> bool:
    """A Minari dataset's directory, or its ``data`` directory (``metadata.json``
    beside ``main_data.hdf5`` or another format's files)."""
    return (
        any((d / METADATA).is_file() for d in (path / "data", path))
        and not (path / "trajectory_index.json").is_file()
    )  # an RLinf buffer directory has a metadata.json too


def read_metadata(d: Path) -> dict:
    try:
        meta = json.loads((d / METADATA).read_text())
    except ValueError as e:
        raise FormatError(f"{d / METADATA} is not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise FormatError(f"{d / METADATA} is not a JSON object")
    fmt = meta.get("data_format", "hdf5")
    if fmt != "hdf5":
        raise FormatError(
            f"{d} holds Minari's {fmt!r} format; import_minari reads the 'hdf5' one. "
            "Convert it with Minari first (minari.create_dataset_from_buffers(..., "
            "data_format='hdf5') from its episodes)"
        )
    if not (d / MAIN_FILE).is_file():
        raise FormatError(f"{d} has {METADATA} but no {MAIN_FILE}; the dataset is incomplete")
    return meta


def space(meta: dict, name: str) -> dict | None:
    """A serialized space of ``metadata.json`` as a dict (None when it is not there)."""
    value = meta.get(name)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise FormatError(f"metadata.json: {name} is not a serialized space") from None
    return value if isinstance(value, dict) else None


def is_image_space(sp: dict | None) -> bool:
    """Minari's ``is_image_space`` on a serialized Box."""
    if not sp or sp.get("type") != "Box" or sp.get("dtype") != "uint8":
        return False
    shape = sp.get("shape") or []
    if len(shape) not in (2, 3) or shape[0] < 32 or shape[1] < 32:
        return False
    return bool(
        np.all(np.asarray(sp.get("low")) == 0) and np.all(np.asarray(sp.get("high")) == 255)
    )


def subspace(sp: dict | None, name: str) -> dict | None:
    if not sp:
        return None
    subs = sp.get("subspaces")
    if sp.get("type") == "Dict" and isinstance(subs, dict):
        return subs.get(name)
    if sp.get("type") == "Tuple" and isinstance(subs, list) and name.startswith("_index_"):
        i = name[len("_index_") :]
        return subs[int(i)] if i.isdigit() and int(i) < len(subs) else None
    return None


def child(group, name: str, where: str):
    """``group[name]``, refusing what would make h5py read another file (the dataset is
    untrusted data): external and soft links, virtual datasets, external raw storage."""
    import h5py

    link = group.get(name, getlink=True)
    if link is None:
        raise FormatError(f"{where} has no {name!r}; not Minari's HDF5 layout")
    if not isinstance(link, h5py.HardLink):
        raise FormatError(
            f"{where}/{name} is a {type(link).__name__}; Minari writes plain groups and "
            "datasets, and import_minari reads nothing outside the file"
        )
    node = group[name]
    if isinstance(node, h5py.Dataset) and (node.is_virtual or node.external):
        raise FormatError(
            f"{where}/{name} keeps its data outside the file (a virtual dataset or external "
            "storage); import_minari reads nothing outside the file"
        )
    return node


def read_node(node, sp: dict | None, jpeg: bool, where: str) -> Any:
    """A dataset as an array, a group as ``{name: ...}``; JPEG frames decoded."""
    import h5py

    if isinstance(node, h5py.Group):
        return {
            k: read_node(child(node, k, where), subspace(sp, k), jpeg, f"{where}/{k}") for k in node
        }
    dt = node.dtype
    vlen = h5py.check_vlen_dtype(dt)
    if (jpeg and is_image_space(sp)) or (vlen is not None and vlen == np.uint8):
        return decode_jpegs(node[()], where)
    if dt.kind not in "biuf":
        raise FormatError(
            f"{where}: {dt} data (text or objects) is not something a zreplay buffer "
            "stores; import_minari reads numeric, boolean and image spaces"
        )
    return node[()]


def decode_jpegs(frames, where: str) -> np.ndarray:
    """JPEG byte strings (rows of uint8) as uint8 frames ``[N, H, W(, C)]``."""
    image = import_whole("PIL.Image")
    out = None
    for i, data in enumerate(frames):
        try:
            frame = np.asarray(
                image.open(io.BytesIO(np.asarray(data, np.uint8).tobytes())), np.uint8
            )
        except Exception as e:
            raise FormatError(f"{where}: frame {i} is not a readable JPEG ({e})") from None
        if out is None:
            out = np.empty((len(frames), *frame.shape), np.uint8)
        elif frame.shape != out.shape[1:]:
            raise FormatError(f"{where}: frame {i} is {frame.shape}, frame 0 {out.shape[1:]}")
        out[i] = frame
    return out if out is not None else np.zeros((0,), np.uint8)


def episode_ids(f, meta: dict, path: Path) -> list[int]:
    """Episode ids in order: the ``episode_{id}`` groups, numerically."""
    ids = []
    for name in f:
        suffix = name[len("episode_") :] if name.startswith("episode_") else ""
        if not suffix.isdigit():
            raise FormatError(f"{path}: {name!r} is not an episode_<id> group")
        ids.append(int(suffix))
    ids.sort()
    total = meta.get("total_episodes")
    if isinstance(total, int) and total != len(ids):
        raise FormatError(
            f"{path}: metadata.json says {total} episodes, the file holds {len(ids)}; the "
            "dataset is incomplete"
        )
    return ids


def rows_of(tree: Any) -> set[int]:
    if isinstance(tree, dict):
        return set().union(*(rows_of(v) for v in tree.values())) if tree else set()
    return {len(tree)}


def read_episode(group, spaces: tuple, jpeg: bool, where: str) -> tuple[dict, int]:
    """One episode as nested ``{key: [T, ...]}`` columns and its ``T``."""
    nodes = {
        name: child(group, name, where) for name in ("observations", "actions", *STEP_DATASETS)
    }
    obs = read_node(nodes["observations"], spaces[0], jpeg, f"{where}/observations")
    actions = read_node(nodes["actions"], spaces[1], jpeg, f"{where}/actions")
    steps = {
        new: read_node(nodes[old], None, jpeg, f"{where}/{old}")
        for old, new in STEP_DATASETS.items()
    }
    T = {len(v) for v in steps.values()} | rows_of(actions)
    if len(T) != 1:
        raise FormatError(
            f"{where}: actions, rewards, terminations and truncations have different "
            f"lengths ({sorted(T)})"
        )
    (n,) = T
    if rows_of(obs) != {n + 1}:
        raise FormatError(
            f"{where}: observations have {sorted(rows_of(obs))} rows for {n} steps; Minari "
            "stores one more (the reset observation)"
        )
    cols = {
        "observations": _cut(obs, 0, n),
        "next_obs": _cut(obs, 1, n + 1),
        "actions": actions,
        **{k: v.astype(bool) if k != "rewards" else v for k, v in steps.items()},
    }
    return cols, n


def _cut(tree, a: int, b: int):
    if isinstance(tree, dict):
        return {k: _cut(v, a, b) for k, v in tree.items()}
    return tree[a:b]


def import_minari(
    src: str | Path,
    dst: str | Path,
    *,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    **options,
) -> MinariImport:
    """Read a Minari dataset (HDF5 format; ``src``: its directory or its ``data``
    directory) into a new zreplay buffer at ``dst``: one trajectory ``[T, 1]`` per
    episode with ``observations`` and ``next_obs`` (nested like the observation space),
    ``actions``, ``rewards``, ``terminated`` and ``truncated`` (see
    :mod:`zreplay.compat.minari`).  Open the result with ``zreplay.open(dst)`` or
    ``zreplay.ReplayBuffer(..., path=dst)``.  ``progress(1)`` after each episode;
    ``options`` go to the buffer's writer (``layout``, ``durable``, ...).  All or
    nothing: the buffer is built aside and appears at ``dst`` whole; an existing buffer
    there is replaced only with ``overwrite=True``.  FormatError for a layout it does not
    read (Minari's arrow format, missing datasets, observations not one row longer than
    the actions).  Returns a :class:`MinariImport` report."""
    import h5py

    src = Path(src)
    d = data_dir(src)
    meta = read_metadata(d)
    jpeg = bool(meta.get("jpeg_encoding", True))
    spaces = (space(meta, "observation_space"), space(meta, "action_space"))
    path = d / MAIN_FILE
    report = MinariImport(str(dst))
    with h5py.File(path, "r") as f:
        ids = episode_ids(f, meta, path)
        episodes = [child(f, f"episode_{i}", str(path)) for i in ids]
        for i, g in zip(ids, episodes, strict=True):
            if not isinstance(g, h5py.Group):
                raise FormatError(f"{path}: episode_{i} is not a group; not Minari's layout")
        # Capacity for every step (no eviction); each episode's rewards say how many.
        total = sum(
            int(child(g, "rewards", f"{path}:episode_{i}").shape[0])
            for i, g in zip(ids, episodes, strict=True)
        )
        out = locate(dst, options.get("storage_options"))
        options.setdefault("writer_id", OFFLINE_WRITER)  # sealed: the buffer's offline part
        with new_tree(out, "import_minari", overwrite=overwrite, sources=[locate(src)]) as tmp:
            core = BufferCore.writer(
                tmp,
                stream=RandomStream(tag="swm"),
                capacity=max(1, total),
                ram=RamPolicy(enabled=True, trajectories=None, max_bytes=IMPORT_RAM_BYTES),
                **options,
            )
            try:
                _add_episodes(core, episodes, ids, spaces, jpeg, path, report, progress)
                report.keys = list(core.keys)
            finally:
                core.close()
            seal(tmp, options["writer_id"], options.get("storage_options"))
    return report


def _add_episodes(core, episodes, ids, spaces, jpeg, path, report, progress) -> None:
    batch: list[Prepared] = []
    for i, group in zip(ids, episodes, strict=True):
        cols, n = read_episode(group, spaces, jpeg, f"{path}:episode_{i}")
        if progress is not None:
            progress(1)
        if n == 0:
            report.skipped_empty += 1
            continue
        flat = {k: np.ascontiguousarray(v)[:, None] for k, v in flatten(cols).items()}
        if not core.facade_state.get("columns"):
            core.facade_state["columns"] = list(flat)  # stable-worldmodel's order
        batch.append(Prepared(flat, n, 1, split_episodes=False))
        report.episodes += 1
        report.steps += n
        if len(batch) >= BATCH:
            core.add(batch)
            batch = []
    core.add(batch)
