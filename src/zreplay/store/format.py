"""Names and fixed numbers of the on-disk format (version 5; see FORMAT.md).

Everything that reads or writes a buffer takes its file names, array names and column
layout from here, so the format is spelled out in one place.

```
<root>/zarr.json                  group; attrs["zreplay"] = {format, schema, layout, created}
<root>/zreplay/                   zero-size array node: zreplay's own files of the buffer
    writers/<n>                   writer number n, claimed once by the writer id it holds
    schema.json                   schema and layout of the writer that fixed them first
    learners/<learner_id>.json    a rate-limited learner's published progress
<root>/segments/<writer_id>/      one writer's segment:
    data/<key>                    rows, shape (n_rows, *row_shape), sharded: shard files
                                  c.<shard>.0... (arrays before format 5: c/<shard>/0/...)
    offsets                       int64[n_traj + 1], cumulative rows per trajectory
    traj/<column>                 TRAJ_COLUMNS, one entry per trajectory
    episodes/<column>             PIECE_COLUMNS, one entry per episode piece
    priority/{0,1}                saved prioritized-replay leaves (two copies, in turn)
    zreplay/                      zero-size array node: the segment's own files
        commit.json               what is visible (the only source of truth)
        writer.lock               held by the segment's one writer
        writer.lock.beat          the holder's lease, renewed while it lives
        staging/, replace.json    a replacement being built / swapped in (load_checkpoint)
```

zreplay's own files (commit records, locks, writer claims, temp files of a publish) live
inside the ``zreplay`` array nodes: Zarr never lists an array's directory, so a tree walk
with plain zarr sees a valid hierarchy and warns about nothing.  This is the only format
the read path knows; buffers of formats 2-4 are refused with :func:`old_format_error`
and rewritten by ``zreplay upgrade`` (store/upgrade.py, the one module that reads them).
"""

from __future__ import annotations

from ..errors import FormatError

FORMAT_VERSION = 5
# Formats ``zreplay upgrade`` rewrites as FORMAT_VERSION (format 2: the same arrays, own
# files beside them; format 3: commits without contents ids and insert counts; format 4:
# every data array's chunk keys nested "c/<shard>/0/...", which upgraded arrays keep).
UPGRADABLE_FORMATS = (2, 3, 4)

# Chunk-key separator of the data arrays a writer creates: shard files c.<shard>.0.0 side
# by side in the array's directory.  Arrays made before format 5 nest c/<shard>/0/0 (a
# directory per level); each array's zarr.json says which, and zreplay reads it there.
CHUNK_KEY_SEPARATOR = "."

# The root group's attribute holding zreplay's metadata.
ATTR = "zreplay"
# A segment group's attribute: [low_row, n_rows] of its last commit (for plain-zarr
# readers; zreplay reads the commit record).  Not under ATTR: that marks a buffer root.
LIVE_ROWS_ATTR = "live_rows"
SEGMENTS = "segments"
# The zero-size array node holding zreplay's own files, in the root and in each segment.
META = "zreplay"
WRITERS = "writers"
LEARNERS = "learners"
COMMIT_NAME = "commit.json"
LOCK_NAME = "writer.lock"
# Exclusive-created by the writer that fixes the schema: racing writers agree on its layout.
SCHEMA_NAME = "schema.json"
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


def meta_node_json() -> bytes:
    """``zarr.json`` of a ``zreplay`` meta node: a uint8 array of shape [0] (no chunks),
    so Zarr treats the directory as a leaf and never looks at the files in it."""
    import json

    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [0],
        "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1]}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": 0,
        "codecs": [{"name": "bytes"}],
        "attributes": {
            ATTR: "zreplay's own files (commit record, writer lock, writer claims); FORMAT.md"
        },
        "dimension_names": None,
    }
    return json.dumps(meta, indent=2).encode()


def commit_path(segment_dir):
    return segment_dir / META / COMMIT_NAME


def lock_path(segment_dir):
    return segment_dir / META / LOCK_NAME


def claims_dir(root):
    return root / META / WRITERS


def staging_root(segment_dir):
    """Where a segment's replacement is built (a buffer root of its own) before it is
    swapped in: inside the segment's meta node, so no reader ever sees it."""
    return segment_dir / META / "staging"


def intent_path(segment_dir):
    """The record that a built replacement is being swapped in (see engine/replace.py)."""
    return segment_dir / META / "replace.json"


def learners_dir(root):
    return root / META / LEARNERS


def learner_path(root, learner_id: str):
    return learners_dir(root) / f"{learner_id}.json"


def old_format_error(buffer, version, where=None) -> FormatError:
    """The error of opening the buffer at ``buffer`` written in format ``version``
    (``where``: the file that says so, if not the root): an upgradable one says how to
    upgrade it, any other is unsupported."""
    if version in UPGRADABLE_FORMATS:
        err = FormatError(
            f"{where or buffer}: this buffer is zreplay format {version}; this version "
            f"reads format {FORMAT_VERSION} only. Run `zreplay upgrade {buffer}` (or "
            f"zreplay.upgrade({str(buffer)!r})) once, then open it again"
        )
    else:
        err = FormatError(
            f"{where or buffer}: zreplay format {version!r} is not supported (this version "
            f"reads format {FORMAT_VERSION} and upgrades formats {list(UPGRADABLE_FORMATS)}); "
            "upgrade zreplay"
        )
    err.older = version in UPGRADABLE_FORMATS  # (an older zreplay's: upgradable)
    return err
