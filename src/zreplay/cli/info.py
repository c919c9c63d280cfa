"""``zreplay info PATH``: schema, counts, bytes on disk per key, chunk layout and codec
per key, reward and return statistics, last commit.

For a buffer directory: per key its dtype, row shape, chunk and shard rows, codec (an
image codec for camera frames: ``webp level 0``), raw bytes (visible rows x row bytes)
and the bytes of the files under ``segments/*/data/<key>/``, also per visible row; their
quotient is the compression ratio (approximate: files may still hold evicted, not yet
reclaimed rows).  Rewards (``rewards`` or ``reward``, see
:mod:`zreplay.cli.rewards`): mean, std, min, max per step and per episode.  The last
commit time is the newest ``commit.json`` ``time`` over the segments.  For an HDF5 episode
file (zreplay's or stable-worldmodel's) the same per column, from h5py's storage sizes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorruptBufferError, FormatError
from .output import EXIT_OK, Result, ratio, size, table, when
from .paths import buffer_dir, du, existing, is_hdf5
from .rewards import buffer_rewards, hdf5_rewards, reward_key, summary


def run(args) -> Result:
    path = existing(args.path)
    if path.is_file() and not is_hdf5(path):
        raise FormatError(f"{path} is neither a zreplay buffer directory nor an HDF5 file")
    info = hdf5_file_info(path) if is_hdf5(path) else buffer_info(buffer_dir(path))
    return EXIT_OK, info, text(info)


def buffer_info(path: Path) -> dict[str, Any]:
    import zreplay

    from ..store.commit import read_commit
    from ..store.lock import WriterLock

    view = zreplay.open(path)
    segments = []
    for wid in view.root.writer_ids():
        seg_dir = view.root.segment_dir(wid)
        c = read_commit(seg_dir)
        segments.append(
            {
                "writer_id": wid,
                "trajectories": 0 if c is None else c.n_traj - c.low_traj,
                "rows": 0 if c is None else c.n_rows - c.low_row,
                "last_commit": None if c is None else c.time,
                "writer_lock": WriterLock(seg_dir).holder() is not None
                or (seg_dir / "writer.lock").exists(),
            }
        )
    keys = {}
    _, layouts = view.root.schema()
    for key in view.keys():
        spec, lay = view.schema.specs[key], layouts[key]
        raw = view.num_rows * spec.row_bytes
        disk = sum(du(view.root.segment_dir(s["writer_id"]) / "data" / key) for s in segments)
        codec = "none" if lay.codec == "none" else f"{lay.codec} level {lay.level}"
        chunk = {"chunk_rows": lay.chunk_rows, "shard_rows": lay.shard_rows, "codec": codec}
        keys[key] = {**_key(str(spec.dtype), spec.row_shape, raw, disk), **chunk}
        # (approximate, as disk_bytes: evicted rows not yet reclaimed count too)
        keys[key]["disk_bytes_per_row"] = round(disk / view.num_rows, 1) if view.num_rows else None
    episodes = view.episode_table()
    key = reward_key(view.keys())
    times = [s["last_commit"] for s in segments if s["last_commit"] is not None]
    return {
        "path": str(path),
        "kind": "zreplay",
        "format": view.root.read_meta()["format"],
        "keys": keys,
        "trajectories": view.num_trajectories,
        **_episodes(episodes["length"], episodes["terminated"], episodes["truncated"]),
        "rows": view.num_rows,
        "segments": segments,
        **_totals(keys, du(path)),
        "last_commit": max(times, default=None),
        "rewards": _buffer_rewards(view, key) if key else None,
    }


def _buffer_rewards(view, key: str) -> dict[str, Any]:
    try:
        return _rewards(key, *buffer_rewards(view, key))
    except CorruptBufferError as e:  # the rest of info still helps: say it, go on
        return {"key": key, "error": str(e)}


def hdf5_file_info(path: Path) -> dict[str, Any]:
    import h5py

    from ..compat.hdf5 import episode_flags, hdf5_info

    meta = hdf5_info(path)
    keys = {}
    with h5py.File(path, "r") as f:
        for c, name in zip(meta["columns"], meta["datasets"], strict=True):
            ds = f[name]
            raw = int(ds.size) * ds.dtype.itemsize
            keys[c] = {
                **_key(str(ds.dtype), ds.shape[1:], raw, int(ds.id.get_storage_size())),
                "chunk_rows": ds.chunks[0] if ds.chunks else None,
                "codec": _hdf5_codec(ds),
            }
        lengths = f["ep_len"][:] if "ep_len" in f else np.zeros(0, np.int64)
        terminated, truncated = episode_flags(f, meta["columns"], meta["datasets"])
        key = reward_key(meta["columns"])
        names = dict(zip(meta["columns"], meta["datasets"], strict=True))
        rewards = _rewards(key, *hdf5_rewards(f, names[key])) if key else None
    return {
        "path": str(path),
        "kind": "hdf5",
        "keys": keys,
        **_episodes(lengths, terminated, truncated),
        "rows": meta["steps"],
        **_totals(keys, du(path)),
        "rewards": rewards,
    }


def _hdf5_codec(ds) -> str:
    if not ds.compression:
        return "none"
    level = f" level {ds.compression_opts}" if ds.compression_opts is not None else ""
    return f"{ds.compression}{level}" + (" + shuffle" if ds.shuffle else "")


def _rewards(key: str, per_step, lengths, returns) -> dict[str, Any]:
    """Per-step reward and per-episode return statistics (``summary``: mean, std, min,
    max; None without steps)."""
    return {"key": key, "per_step": summary(per_step), "returns": summary(returns)}


def _key(dtype: str, row_shape, raw: int, disk: int) -> dict[str, Any]:
    return {
        "dtype": dtype,
        "row_shape": [int(d) for d in row_shape],
        "raw_bytes": int(raw),
        "disk_bytes": int(disk),
        "compression_ratio": ratio(raw, disk),
    }


def _episodes(length, terminated, truncated) -> dict[str, int]:
    return {
        "episodes": len(length),
        "episodes_terminated": int(np.sum(terminated)),
        "episodes_truncated": int(np.sum(truncated)),
        "max_episode_length": int(np.max(length, initial=0)),
    }


def _totals(keys: dict, disk: int) -> dict[str, Any]:
    raw = sum(k["raw_bytes"] for k in keys.values())
    return {"raw_bytes": raw, "disk_bytes": disk, "compression_ratio": ratio(raw, disk)}


def text(info: dict[str, Any]) -> str:
    """``info`` for a human: a header, then one line per key."""
    episodes = (
        f"episodes {info['episodes']} ({info['episodes_terminated']} terminated, "
        f"{info['episodes_truncated']} truncated, longest {info['max_episode_length']})"
    )
    if info["kind"] == "zreplay":
        segs = ", ".join(
            f"{s['writer_id']} ({s['trajectories']} trajectories, {s['rows']} rows"
            + (", writer lock present)" if s["writer_lock"] else ")")
            for s in info["segments"]
        )
        lines = [
            f"{info['path']}: zreplay buffer (format {info['format']})",
            f"  trajectories {info['trajectories']}, {episodes}, rows {info['rows']}",
            f"  segments {len(info['segments'])}: {segs or '-'}",
            f"  last commit {when(info['last_commit'])}",
        ]
    else:
        lines = [
            f"{info['path']}: zreplay HDF5 episode file",
            f"  {episodes}, steps {info['rows']}",
        ]
    r = info["compression_ratio"]
    lines.append(
        f"  {size(info['disk_bytes'])} on disk for {size(info['raw_bytes'])} of rows"
        + (f" ({r:.1f}x)" if r else "")
    )
    rw = info.get("rewards")
    if rw and "error" in rw:
        lines.append(f"  {rw['key']}: unreadable: {rw['error']}")
    for what, label in (("per_step", "per step"), ("returns", "per episode (return)")):
        st = rw and rw.get(what)
        if st:
            lines.append(
                f"  {rw['key']} {label}: mean {st['mean']:.4g}, std {st['std']:.4g}, "
                f"min {st['min']:.4g}, max {st['max']:.4g}"
            )
    if not info["keys"]:
        return "\n".join([*lines, "  no schema yet (nothing written)"])
    head = [
        "key",
        "dtype",
        "row shape",
        "chunk rows",
        "codec",
        "on disk",
        "per row",
        "raw",
        "ratio",
    ]
    rows = [head]
    for k, v in info["keys"].items():
        r = v["compression_ratio"]
        chunk = v.get("chunk_rows")
        if v.get("shard_rows"):
            chunk = f"{chunk} (shard {v['shard_rows']})"
        rows.append(
            [
                k,
                v["dtype"],
                str(v["row_shape"]),
                str(chunk if chunk is not None else "-"),
                v["codec"],
                size(v["disk_bytes"]),
                size(round(v["disk_bytes_per_row"])) if v.get("disk_bytes_per_row") else "-",
                size(v["raw_bytes"]),
                f"{r:.1f}x" if r else "-",
            ]
        )
    return "\n".join([*lines, "", *("  " + line for line in table(rows, right={5, 6, 7, 8}))])
