"""How each key is laid out on disk: chunk rows, shard rows and codecs.

The read unit (inner chunk) is small on the row axis so that a random row decodes only a
few KB; the write unit (shard) is a few MB so that files stay few.  Every non-row axis is
whole inside a chunk.  See FORMAT.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import SchemaError
from ..schema import KeySpec

CHUNK_TARGET_BYTES = 16 << 10
SHARD_TARGET_BYTES = 4 << 20
MAX_CHUNK_ROWS = 1024
MAX_SHARD_ROWS = 1 << 16
# What a layout may ask for at most (a shard is assembled whole in memory by a writer).
LIMIT_SHARD_ROWS = 1 << 24
CODECS = ("zstd", "lz4", "none")


def _pow2_floor(x: float) -> int:
    x = max(1, int(x))
    return 1 << (x.bit_length() - 1)


def chunk_key_separator(meta) -> str | None:
    """The separator of a ``zarr.json``'s default chunk keys ("." or "/"), or None for
    anything else (another encoding, a damaged entry)."""
    try:
        keys = meta.get("chunk_key_encoding", {"name": "default"})
        sep = (keys.get("configuration") or {}).get("separator", "/")
        return sep if keys.get("name") == "default" and sep in ("/", ".") else None
    except AttributeError:
        return None


def shard_key(separator: str, shard: int, ndim: int) -> str:
    """Chunk key of shard ``shard`` of an ``ndim``-dimensional array sharded on rows."""
    return separator.join(["c", str(shard)] + ["0"] * (ndim - 1))


def shard_number(rel: str) -> int | None:
    """The shard that the file at ``rel`` (relative to its array's directory) belongs to:
    a shard file or a temp file of one, named by Zarr's default chunk keys with either
    separator (``c.<shard>.0.0``, or ``c/<shard>/0/0`` in arrays made before format 5);
    None for anything else (``zarr.json``, foreign names)."""
    parts = rel.replace("/", ".").split(".", 2)
    if len(parts) < 2 or parts[0] != "c" or not parts[1].isdigit():
        return None
    return int(parts[1])


@dataclass(frozen=True)
class KeyLayout:
    """Chunking and compression of one key. ``codec``: "zstd", "lz4" (Blosc) or "none"."""

    chunk_rows: int
    shard_rows: int
    codec: str
    level: int

    @classmethod
    def default(cls, spec: KeySpec) -> KeyLayout:
        rb = max(1, spec.row_bytes)
        chunk = min(MAX_CHUNK_ROWS, _pow2_floor(CHUNK_TARGET_BYTES / rb))
        shard = chunk * _pow2_floor(SHARD_TARGET_BYTES / (chunk * rb))
        shard = max(chunk, min(MAX_SHARD_ROWS, shard))
        # Floats compress best byte-shuffled (Blosc); images and flags with zstd.
        if spec.dtype.kind == "f":
            return cls(chunk, shard, "lz4", 5)
        return cls(chunk, shard, "zstd", 1)

    def with_overrides(self, override: Mapping) -> KeyLayout:
        fields = asdict(self)
        unknown = set(override) - set(fields)
        if unknown:
            raise SchemaError(
                f"unknown layout option(s) {sorted(unknown)}; known: {sorted(fields)}"
            )
        fields.update(override)
        out = KeyLayout(**{k: int(v) if k != "codec" else str(v) for k, v in fields.items()})
        out.validate()
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> KeyLayout:
        """A recorded layout; SchemaError for one no writer could have recorded."""
        out = cls(**d)
        if not all(isinstance(v, int) for v in (out.chunk_rows, out.shard_rows, out.level)):
            raise SchemaError(f"layout {d} has non-integer sizes")
        out.validate()
        return out

    def validate(self) -> None:
        if self.codec not in CODECS:
            raise SchemaError(f"codec {self.codec!r} is not one of {CODECS}")
        if self.chunk_rows < 1 or self.shard_rows < self.chunk_rows:
            raise SchemaError("need 1 <= chunk_rows <= shard_rows")
        if self.shard_rows > LIMIT_SHARD_ROWS:
            raise SchemaError(f"shard_rows ({self.shard_rows}) above {LIMIT_SHARD_ROWS}")
        if self.shard_rows % self.chunk_rows:
            raise SchemaError(
                f"shard_rows ({self.shard_rows}) must be a multiple of chunk_rows "
                f"({self.chunk_rows})"
            )

    def zarr_codecs(self, dtype: np.dtype) -> dict:
        """Keyword arguments for ``zarr.Group.create_array``.

        Every chunk ends with a crc32c checksum, so a flipped or truncated chunk is an
        error on read, never wrong data.
        """
        from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

        if self.codec == "zstd":
            compressors = [ZstdCodec(level=self.level)]
        elif self.codec == "lz4":
            shuffle = "shuffle" if dtype.itemsize > 1 else "bitshuffle"
            compressors = [
                BloscCodec(cname="lz4", clevel=self.level, shuffle=shuffle, typesize=dtype.itemsize)
            ]
        else:
            compressors = []
        return {"compressors": [*compressors, Crc32cCodec()]}


def layouts_for(
    specs: Mapping[str, KeySpec], overrides: Mapping[str, Mapping] | None = None
) -> dict[str, KeyLayout]:
    """Default layout per key, with user overrides by key path (``{"curr_obs/img": {...}}``)."""
    overrides = dict(overrides or {})
    out = {}
    for path, spec in specs.items():
        lay = KeyLayout.default(spec)
        if path in overrides:
            lay = lay.with_overrides(overrides.pop(path))
        out[path] = lay
    if overrides:
        raise SchemaError(f"layout given for unknown keys {sorted(overrides)}")
    return out


def check_recorded(
    specs: Mapping[str, KeySpec], recorded: Mapping[str, KeyLayout], overrides: Mapping | None
) -> None:
    """SchemaError if ``overrides`` (a writer's ``layout=``) ask for another layout than
    the buffer ``recorded`` when its schema was fixed: every segment uses that one."""
    wanted = layouts_for(specs, overrides)
    for path in overrides or {}:
        if wanted[path] != recorded[path]:
            raise SchemaError(
                f"layout for key {path!r} is {vars(wanted[path])} here but the buffer was "
                f"created with {vars(recorded[path])}; every writer of a buffer uses its "
                "layout: drop layout= for this key, or write to a new buffer"
            )
