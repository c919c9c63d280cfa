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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import CorruptBufferError, FormatError, PickleRefusedError
from ..ranks import rank_block
from ..store.commit import read_commit
from ..store.location import options_of
from ..store.root import BufferRoot
from .trajectory import prepare

if TYPE_CHECKING:
    from .buffer import TrajectoryReplayBuffer

BATCH = 64


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


def _atomic_write_bytes(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _to_torch(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _to_torch(v) for k, v in tree.items()}
    if isinstance(tree, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(tree))
    return tree


# -- export ---------------------------------------------------------------------------


def export_rlinf(buf: TrajectoryReplayBuffer, out: Path, fmt: str) -> int:
    """Write every visible trajectory of ``buf`` in RLinf 0.3's layout under ``out``."""
    if fmt not in ("pt", "pkl"):
        raise ValueError(f"format must be 'pt' or 'pkl', got {fmt!r}")
    buf.flush()
    out.mkdir(parents=True, exist_ok=True)
    index: dict[str, dict] = {}
    id_list: list[int] = []
    total = 0
    for i in range(len(buf)):
        traj = buf.trajectory(i)
        tid = traj.pop("trajectory_id")
        wid = traj["model_weights_id"]
        shape_src = traj.get("prev_logprobs", traj.get("rewards"))
        if shape_src is None:
            shape_src = next(v for v in traj.values() if isinstance(v, np.ndarray))
        T, B = shape_src.shape[:2]
        path = trajectory_file(out, tid, wid, fmt)
        payload = _to_torch(traj)
        if fmt == "pt":
            _atomic_write_bytes(path, lambda f, p=payload: torch.save(p, f))
        else:
            _atomic_write_bytes(path, lambda f, p=payload: pickle.dump(p, f))
        index[str(tid)] = {
            "num_samples": int(T * B),
            "trajectory_id": int(tid),
            "max_episode_length": int(traj["max_episode_length"]),
            "shape": [int(d) for d in shape_src.shape],
            "model_weights_id": wid,
        }
        id_list.append(int(tid))
        total += int(T * B)
    meta = {
        "trajectory_format": fmt,
        "size": len(id_list),
        "total_samples": total,
        "trajectory_counter": buf._engine.next_trajectory_id,
        "seed": buf.seed,
    }
    idx = {"trajectory_index": index, "trajectory_id_list": id_list}
    _atomic_write_bytes(out / "trajectory_index.json", lambda f: f.write(json.dumps(idx).encode()))
    _atomic_write_bytes(out / "metadata.json", lambda f: f.write(json.dumps(meta).encode()))
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
    try:
        index = {int(k): dict(v) for k, v in idx.get("trajectory_index", {}).items()}
        ids = [int(i) for i in idx.get("trajectory_id_list", sorted(index))]
    except (TypeError, ValueError, AttributeError) as e:
        raise CorruptBufferError(
            f"{src / 'trajectory_index.json'}: trajectory ids must be integers and entries "
            f"objects ({e})"
        ) from None
    return meta, ids, index


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


def iter_rlinf(files: list[tuple[int, dict, Path]], allow_pickle: bool, progress=None):
    for tid, entry, path in files:
        item = prepare(load_rlinf_file(path, allow_pickle))
        item.trajectory_id = tid
        if "max_episode_length" in entry and not item.max_episode_length:
            item.max_episode_length = int(entry["max_episode_length"])
        if progress is not None:
            progress(1)
        yield item


def _add_batched(buf: TrajectoryReplayBuffer, items) -> None:
    batch = []
    for it in items:
        batch.append(it)
        if len(batch) >= BATCH:
            buf._engine.add(batch)
            batch = []
    buf._engine.add(batch)


def load_into(
    buf: TrajectoryReplayBuffer,
    src: Path,
    rank: int,
    world: int,
    distributed: bool,
    allow_pickle: bool = False,
    progress=None,
) -> None:
    """Fill ``buf`` with rank ``rank``'s block of the trajectories at ``src``."""
    from .buffer import checkpoint_kind

    kind = checkpoint_kind(src)
    if kind == "rlinf":
        meta, ids, index = read_rlinf_index(src)
        start, stop = rank_block(len(ids), rank, world)
        fmt = meta.get("trajectory_format", "pt")
        # Refuse (missing files, pickles) before this buffer's contents are replaced.
        files = rlinf_files(src, ids[start:stop], index, fmt, allow_pickle)
        seed = int(meta.get("seed", buf.seed))
        buf._set_rank_stream(seed, rank if distributed else None)
        buf._engine.clear(reset_schema=True)
        _add_batched(buf, iter_rlinf(files, allow_pickle, progress))
        buf._engine.next_trajectory_id = max(
            buf._engine.next_trajectory_id,
            int(meta.get("trajectory_counter", 0)),
            max(ids, default=-1) + 1,
        )
        buf.flush()
        return

    root = BufferRoot(src)
    segs = []
    for wid in root.writer_ids():
        c = read_commit(root.segment_dir(wid))
        if c is not None and c.n_traj > c.low_traj:
            segs.append((wid, c))
    total = sum(c.n_traj - c.low_traj for _, c in segs)
    start, stop = rank_block(total, rank, world)
    sampler = {}
    if len(segs) == 1 and not distributed:
        sampler = segs[0][1].sampler
    if len(segs) <= 1:
        if not segs:
            buf._engine.clear(reset_schema=True)
            return
        wid, c = segs[0]
        if distributed:
            seed = int(c.sampler.get("seed", buf.seed))
            buf._set_rank_stream(seed, rank)
            # the block keeps the source's sampler state (priorities) with a rank's stream
            sampler = {**c.sampler, **buf._stream_state()}
        buf._engine.adopt(src, wid, c.low_traj + start, c.low_traj + stop, sampler)
        buf._restore_sampler(sampler)
        return
    # Several writers' segments: copy the rank's block through the normal add path.
    from ..view import open as open_view

    view = open_view(src, storage_options=options_of(src))
    buf._set_rank_stream(buf.seed, rank if distributed else None)
    buf._engine.clear(reset_schema=True)
    _add_batched(buf, view.iter_prepared(start, stop))
    buf._engine.next_trajectory_id = max(buf._engine.next_trajectory_id, view.next_trajectory_id)
    buf.flush()


def import_rlinf(
    src_dir: str,
    dst_path: str,
    *,
    allow_pickle: bool = False,
    progress: Callable[[int], None] | None = None,
    **buffer_kwargs,
) -> int:
    """Read an RLinf buffer directory into a new zreplay buffer at ``dst_path``.

    Trajectory ids, order, ``max_episode_length`` and ``model_weights_id`` are kept;
    ``.pt`` files load with ``torch.load(weights_only=True)``; ``.pkl`` files only with
    ``allow_pickle=True``.  ``progress(1)`` is called after each trajectory file is read
    (for progress bars).  Returns the number of trajectories imported.
    """
    from .buffer import TrajectoryReplayBuffer

    src = Path(src_dir)
    meta, ids, index = read_rlinf_index(src)
    # Refuse (hostile names, missing files, pickles) before anything is created.
    rlinf_files(src, ids, index, meta.get("trajectory_format", "pt"), allow_pickle)
    buf = TrajectoryReplayBuffer(
        seed=int(meta.get("seed", 1234)),
        auto_save=True,
        auto_save_path=str(dst_path),
        trajectory_format=meta.get("trajectory_format", "pt"),
        **buffer_kwargs,
    )
    try:
        load_into(buf, src, 0, 1, False, allow_pickle=allow_pickle, progress=progress)
        return len(buf)
    finally:
        buf.close()
