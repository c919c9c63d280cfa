"""Names and fixed numbers of the on-disk format (version 2; see FORMAT.md).

Everything that reads or writes a buffer takes its file names, array names and column
layout from here, so the format is spelled out in one place.

```
<root>/zarr.json                  group; attrs["zreplay"] = {format, schema, layout, created}
<root>/writers/<n>                writer number n, claimed once by the writer id it holds
<root>/segments/<writer_id>/      one writer's segment:
    data/<key>                    rows, shape (capacity, *row_shape), sharded
    offsets                       int64[n_traj + 1], cumulative rows per trajectory
    traj/<column>                 TRAJ_COLUMNS, one entry per trajectory
    episodes/<column>             PIECE_COLUMNS, one entry per episode piece
    priority/{0,1}                saved prioritized-replay leaves (two copies, in turn)
    commit.json                   what is visible (the only source of truth)
    writer.lock                   held by the segment's one writer
```
"""

from __future__ import annotations

FORMAT_VERSION = 2

# The root group's attribute holding zreplay's metadata.
ATTR = "zreplay"
SEGMENTS = "segments"
WRITERS = "writers"
COMMIT_NAME = "commit.json"
LOCK_NAME = "writer.lock"
# Children of a segment directory that hold its rows and index (what clear() removes).
SEGMENT_CHILDREN = ("data", "offsets", "traj", "episodes", "priority")

# Trajectory ids of writer number n start at n << ID_BITS: unique across writers without
# any coordination after the one-time claim (2**40 ids per writer, 2**23 writers).
ID_BITS = 40

WEIGHTS_ID_BYTES = 64
# Rows per chunk of the index arrays (offsets, traj/*, episodes/*).
INDEX_CHUNK = 4096

# Per-trajectory columns: name -> (dtype, row shape).
TRAJ_COLUMNS: dict[str, tuple[str, tuple[int, ...]]] = {
    "trajectory_id": ("int64", ()),
    "T": ("int64", ()),
    "B": ("int64", ()),
    "max_episode_length": ("int64", ()),
    "model_weights_id": ("uint8", (WEIGHTS_ID_BYTES,)),
    "piece_end": ("int64", ()),  # episode pieces [piece_end[i-1], piece_end[i]) are its
}

# Episode-piece columns: name -> dtype (one entry per piece; see index/episodes.py).
PIECE_COLUMNS: dict[str, str] = {
    "start": "int64",
    "length": "int64",
    "episode": "int64",
    "step": "int64",
    "terminated": "bool",
    "truncated": "bool",
}

# Array attribute of arrays whose every written chunk is stored, zeros included: a chunk
# missing below the commit is damage (a read error), not rows of fill values.
STORED_ATTRS = {"zreplay": {"all_chunks_stored": True}}

# Saved priorities: two float64 copies under priority/, written in turn.
PRIORITY_GROUP = "priority"
PRIORITY_SLOTS = (0, 1)
PRIORITY_CHUNK_ROWS = 16384


def is_temp_name(name: str) -> bool:
    """Temp files of writes in flight: zarr ``*.partial``, TensorStore ``*.__lock``, commit
    and exclusive-create temps ``*.tmp``."""
    return name.endswith((".partial", ".__lock", ".tmp"))
