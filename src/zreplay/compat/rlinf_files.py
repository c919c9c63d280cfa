"""RLinf 0.3's on-disk layout, both ways, and checkpoint loading.

RLinf directory layout (what ``export_rlinf`` writes and ``import_rlinf`` reads)::

    trajectory_{trajectory_id}_{model_weights_id}.pt   torch.save of {field: [T, B, ...] tensor
                                                      or nested dict, max_episode_length,
                                                      model_weights_id}   (.pkl: pickle)
    metadata.json          {"trajectory_format", "size", "total_samples",
                            "trajectory_counter", "seed"}
    trajectory_index.json  {"trajectory_index": {"<id>": {"num_samples", "trajectory_id",
                            "max_episode_length", "shape", "model_weights_id"}},
                            "trajectory_id_list": [...]}
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core import BufferCore
from ..core.ranks import rank_block
from ..errors import CorruptBufferError, DestinationError, FormatError, PickleRefusedError
from ..schema import unflatten
from ..store.commit import VIEW_ROWS
from ..store.guard import check_apart, check_target, new_tree, relation
from ..store.location import locate
from ..store.root import is_buffer
from .rlinf_trajectory import prepare

# Trajectories added at once while loading (each batch is staged whole in RAM).
BATCH = 8
# RLinf files an export has written ahead of the last one finished (bounded memory).
WRITES_AHEAD = 4


def trajectory_file(directory: Path, tid: int, weights_id: str, ext: str) -> Path:
    """RLinf's ``trajectory_{id}_{model_weights_id}.{ext}`` in ``directory``; a weights id
    that would lead out of it (a path separator, NUL) is refused."""
    name = f"trajectory_{tid}_{weights_id}.{ext}"
    if not isinstance(weights_id, str) or any(c in weights_id for c in "/\\\0"):
        raise FormatError(
            f"model_weights_id {weights_id!r} of trajectory {tid} cannot be part of a file "
            f"name in {directory} (RLinf names files trajectory_<id>_<model_weights_id>); "
            "use ids without '/', '\\' or NUL"
        )
    return directory / name


def check_trajectory_format(fmt: str) -> None:
    if fmt not in ("pt", "pkl"):
        raise ValueError(
            f"trajectory_format must be 'pt' or 'pkl', got {fmt!r} (RLinf writes any value "
            "other than 'pt' as .pkl pickles: say 'pkl' for that)"
        )


def _write_synced(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _to_torch(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _to_torch(v) for k, v in tree.items()}
    if isinstance(tree, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(tree))
    return tree


# -- export ---------------------------------------------------------------------------


def export_rlinf(
    core: BufferCore, out, fmt: str, seed: int, progress: Callable[[int], None] | None = None
) -> int:
    """Write every visible trajectory of ``core`` in RLinf 0.3's layout to the local
    directory ``out`` (``seed``: RLinf's metadata field); ``progress(1)`` after each
    trajectory.  All or nothing: built beside ``out`` and swapped in whole, replacing an
    earlier RLinf export there; any other non-empty ``out``, or one inside or around the
    buffer, is refused before anything is written."""
    check_trajectory_format(fmt)
    out = locate(out)
    if not out.backend.is_local:
        raise DestinationError(
            f"export writes RLinf's files to a local directory; {out} is not one"
        )
    check_target(out, "export", sources=[core.path], replaces=is_rlinf_dir, kind=RLINF_DIR)
    core.flush()
    with new_tree(out, "export", sources=[core.path], replaces=is_rlinf_dir, kind=RLINF_DIR) as tmp:
        return _write_rlinf(core, tmp, fmt, seed, progress)


def _write_rlinf(core: BufferCore, out: Path, fmt: str, seed: int, progress) -> int:
    index: dict[str, dict] = {}
    id_list: list[int] = []
    total = 0
    # Trajectories are read in large batches; files are written (and fsync'd) on a
    # small pool meanwhile, at most WRITES_AHEAD in flight so memory stays bounded.
    with ThreadPoolExecutor(2, thread_name_prefix="zreplay-export") as pool:
        pending: list = []
        for rec in core.trajectories():
            tid, wid = rec.trajectory_id, rec.model_weights_id
            traj = unflatten(rec.columns)
            traj["max_episode_length"] = rec.max_episode_length
            traj["model_weights_id"] = wid
            shape_src = traj.get("prev_logprobs", traj.get("rewards"))
            if shape_src is None:
                shape_src = next(v for v in traj.values() if isinstance(v, np.ndarray))
            T, B = shape_src.shape[:2]
            path = trajectory_file(out, tid, wid, fmt)
            payload = _to_torch(traj)
            dump = torch.save if fmt == "pt" else pickle.dump
            pending.append(pool.submit(_write_synced, path, partial(dump, payload)))
            while len(pending) > WRITES_AHEAD:
                pending.pop(0).result()
            index[str(tid)] = {
                "num_samples": int(T * B),
                "trajectory_id": int(tid),
                "max_episode_length": int(rec.max_episode_length),
                "shape": [int(d) for d in shape_src.shape],
                "model_weights_id": wid,
            }
            id_list.append(int(tid))
            total += int(T * B)
            if progress is not None:
                progress(1)
        for fut in pending:
            fut.result()
    meta = {
        "trajectory_format": fmt,
        "size": len(id_list),
        "total_samples": total,
        "trajectory_counter": core.engine.next_trajectory_id,
        "seed": seed,
    }
    idx = {"trajectory_index": index, "trajectory_id_list": id_list}
    _write_synced(out / "trajectory_index.json", lambda f: f.write(json.dumps(idx).encode()))
    _write_synced(out / "metadata.json", lambda f: f.write(json.dumps(meta).encode()))
    return len(id_list)


# -- import ---------------------------------------------------------------------------


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FormatError(f"{path} is missing; not an RLinf buffer directory") from None
    except ValueError as e:
        raise CorruptBufferError(f"{path} is not valid JSON ({e})") from None


def read_rlinf_index(src: Path) -> tuple[dict, list[int], dict]:
    meta = _read_json(src / "metadata.json")
    idx = _read_json(src / "trajectory_index.json")
    where = src / "trajectory_index.json"
    try:
        entries = idx.get("trajectory_index", {}).items()
        index = {int(k): dict(v) for k, v in entries}
        ids = [int(i) for i in idx.get("trajectory_id_list", sorted(index))]
    except (TypeError, ValueError, AttributeError) as e:
        raise CorruptBufferError(
            f"{where}: trajectory ids must be integers and entries objects ({e})"
        ) from None
    # A buffer keeps one trajectory per id: found here, the file is named, not the
    # import's hidden destination where the second add would be found damaged.
    for what, seen in (
        ("trajectory_index", [int(k) for k, _ in entries]),
        ("trajectory_id_list", ids),
    ):
        twice = _repeated(seen)
        if twice is not None:
            raise CorruptBufferError(
                f"{where}: trajectory id {twice} appears twice in {what}; an RLinf buffer "
                "holds one trajectory per id. Fix or regenerate the index (nothing was "
                "imported)"
            )
    return meta, ids, index


def _repeated(ids: list[int]) -> int | None:
    seen: set[int] = set()
    for i in ids:
        if i in seen:
            return i
        seen.add(i)
    return None


def load_rlinf_file(path: Path, allow_pickle: bool) -> dict:
    """One RLinf trajectory file as a dict; ``.pt`` with ``weights_only=True``."""
    if path.suffix == ".pt":
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise
        except Exception as e:
            raise CorruptBufferError(f"{path}: cannot load with weights_only=True ({e})") from None
    if not allow_pickle:
        raise PickleRefusedError(
            f"{path} is a pickle, which can run arbitrary code when loaded; pass "
            "allow_pickle=True only if you trust its source"
        )
    with open(path, "rb") as f:
        return pickle.load(f)


def rlinf_files(
    src: Path, ids: list[int], index: dict, fmt: str, allow_pickle: bool
) -> list[tuple[int, dict, Path]]:
    """``(id, index entry, file)`` of each listed trajectory, checked before anything is
    loaded: every entry and file must exist, and pickles need ``allow_pickle``."""
    ext = "pt" if fmt == "pt" else "pkl"
    if ext == "pkl" and ids and not allow_pickle:
        raise PickleRefusedError(
            f"{src} holds pickles (trajectory_format={fmt!r}), which can run arbitrary code "
            "when loaded; pass allow_pickle=True only if you trust its source"
        )
    out = []
    for tid in ids:
        entry = index.get(tid)
        if entry is None:
            raise CorruptBufferError(f"{src}: trajectory {tid} is listed but has no index entry")
        path = trajectory_file(src, tid, entry.get("model_weights_id", ""), ext)
        if not path.is_file():
            raise CorruptBufferError(
                f"{src}: trajectory {tid} is indexed but its file {path.name} is missing"
            )
        out.append((tid, entry, path))
    return out


def iter_rlinf(
    files: list[tuple[int, dict, Path]], allow_pickle: bool, progress=None, continues=False
):
    """The trajectories of RLinf files, prepared (ids and ``max_episode_length`` kept;
    ``continues``: each one's lanes continue the previous one's episodes, as
    ``add_trajectories(continues=)``)."""
    for tid, entry, path in files:
        item = prepare(load_rlinf_file(path, allow_pickle))
        item.trajectory_id = tid
        item.continues = continues
        if "max_episode_length" in entry and not item.max_episode_length:
            item.max_episode_length = int(entry["max_episode_length"])
        if progress is not None:
            progress(1)
        yield item


def _add_batched(core: BufferCore, items) -> None:
    batch = []
    for it in items:
        batch.append(it)
        if len(batch) >= BATCH:
            core.add(batch)
            batch = []
    core.add(batch)


RLINF_DIR = "an RLinf buffer directory (metadata.json + trajectory_index.json)"


def is_rlinf_dir(path) -> bool:
    """RLinf 0.3's buffer directory: ``metadata.json`` + ``trajectory_index.json``."""
    return (path / "metadata.json").is_file() and (path / "trajectory_index.json").is_file()


def checkpoint_kind(path) -> str:
    """``"zreplay"`` or ``"rlinf"``; ``FormatError`` for anything else."""
    if is_buffer(path):
        return "zreplay"
    if is_rlinf_dir(path):
        return "rlinf"
    raise FormatError(
        f"{path} is neither a zreplay buffer nor an RLinf checkpoint directory "
        "(metadata.json + trajectory_index.json)"
    )


def load_into(
    core: BufferCore,
    src,
    rank: int,
    world: int,
    distributed: bool,
    allow_pickle: bool = False,
    progress=None,
    continues=False,
) -> None:
    """RLinf's ``load_checkpoint``: fill the writable ``core`` with rank ``rank``'s block
    of the trajectories at ``src`` (an RLinf directory or a zreplay buffer location; the
    whole of it unless ``distributed``).  Loading a buffer's own directory is a no-op (it
    resumed it when it opened)."""
    if distributed and not 0 <= rank < world:
        raise ValueError(f"local_rank {rank} is outside [0, {world})")
    if not distributed:
        rank, world = 0, 1
    rel = None if core.engine.temporary else relation(src, core.path)
    if rel not in (None, "same"):
        check_apart(core.path, src, "load_checkpoint")
    if rel == "same":
        if distributed and world > 1:
            raise ValueError(
                f"{src} is this buffer's own directory; a rank's share must be loaded into "
                "another buffer (give each rank its own auto_save_path)"
            )
        return
    if checkpoint_kind(src) == "rlinf":
        meta, ids, index = read_rlinf_index(src)
        start, stop = rank_block(len(ids), rank, world)
        fmt = meta.get("trajectory_format", "pt")
        # Refuse (missing files, pickles) before anything is staged.
        files = rlinf_files(src, ids[start:stop], index, fmt, allow_pickle)
        core.stream.reseed(int(meta.get("seed", core.stream.seed)), rank if distributed else None)
        with core.replacing() as staging:  # all or nothing: a bad file leaves the buffer as it was
            _add_batched(staging, iter_rlinf(files, allow_pickle, progress, continues))
            staging.engine.reserve_trajectory_ids(
                max(int(meta.get("trajectory_counter", 0)), max(ids, default=-1) + 1)
            )
        return

    options = src.backend.storage_options
    # The trajectories a view of src shows (not rows a ZarrStorage ring overwrote).
    view = BufferCore.reader(src, storage_options=options)
    segs = view.engine.visible_trajectories()
    start, stop = rank_block(sum(c.n_traj - low for _, c, low in segs), rank, world)
    if len(segs) == 1:  # a restore: hard links, the source's rows, ids and priorities
        wid, c, low = segs[0]
        # This buffer shows what it adopts: no cut of the source's writer applies.
        state = {k: v for k, v in c.sampler.items() if k != VIEW_ROWS}
        if distributed:
            core.stream.reseed(int(c.sampler.get("seed", core.stream.seed)), rank)
            # the block keeps the source's sampler state (priorities) with a rank's stream
            state = {**state, **core.stream.state()}
        core.adopt(src, wid, low + start, low + stop, state)
        return
    # Several writers' segments: copy the rank's block, numbered after this buffer's rows.
    core.stream.reseed(core.stream.seed, rank if distributed else None)
    with core.replacing() as staging:
        _add_batched(staging, (rec.prepared() for rec in view.trajectories(start, stop)))
        staging.engine.reserve_trajectory_ids(view.engine.next_trajectory_id)
