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
# Layout codecs: general-purpose ones, and image codecs for uint8 frames [H, W] or
# [H, W, C] (see IMAGE_CODECS and FORMAT.md, "Image codecs").
CODECS = ("zstd", "lz4", "none")
# codec -> (format, the meaning of ``level``, its default and range, fixed parameters);
# level is the format's effort or quality knob, so one integer chooses a trade-off.
IMAGE_CODECS = {
    # lossless
    "png": ("png", "level", 3, (0, 9), {}),
    "webp": ("webp", "quality", 0, (0, 100), {"lossless": True, "method": 0}),
    # effort 1 (libjxl 0.11's fast-lossless path) is not lossless: 4 of 648 small
    # camera frames came back changed (measured; tests/test_image_codecs.py)
    "jpegxl": ("jpegxl", "effort", 2, (2, 9), {"lossless": True, "distance": 0.0}),
    "qoi": ("qoi", None, 0, (0, 0), {}),
    # zreplay's own: green subtracted, row-above residuals, zstd at this level
    "rowdiff": ("rowdiff", "level", 1, (1, 22), {}),
    # lossy: level is the quality, 0-100
    "webp-lossy": ("webp", "quality", 90, (0, 100), {"lossless": False, "method": 4}),
    "jpegxl-lossy": ("jpegxl", "quality", 90, (30, 100), {"lossless": False, "effort": 3}),
    "avif": ("avif", "quality", 80, (0, 100), {"speed": 8}),
    "jpeg": ("jpeg", "quality", 90, (1, 100), {}),
    # chroma kept whole (4:2:0 halves it, which holds photos below 40 dB at any quality),
    # Huffman tables optimized: at 94, 0.16x raw at 40.7 dB on 224x224 camera frames,
    # 0.4 ms a frame to decode (benchmarks/README.md, "Camera frames")
    "jpeg-444": ("jpeg", "quality", 94, (1, 100), {"subsampling": "444", "optimize": True}),
}
# Lossy ones store one frame per chunk unless a layout names chunk_rows: rows appended
# to a partly filled chunk after a reopen re-encode the chunk's earlier frames, which
# loses quality a second time.
LOSSY_IMAGE_CODECS = ("webp-lossy", "jpegxl-lossy", "avif", "jpeg", "jpeg-444")
# The codec of uint8 image-like keys (see image_like) unless a layout says otherwise
# (None: zstd over raw pixels).  rowdiff, by measurement (benchmarks/bench_frames.py,
# benchmarks/README.md "Camera frames"): on camera frames it takes 0.93-0.97x PNG's
# bytes where zstd takes 1.3-1.8x, sample(256) from disk costs 0.18-0.42x decoding the
# same frames from PNG (84x84 to 480x640, a loaded machine), and it encodes in 1.3-1.4x
# zstd-1's time (1.0-2.2x under heavier load; 2.5x on flat Atari frames, 0.09 ms) where
# PNG, WebP and JPEG-XL lossless take milliseconds; on Atari frames it is 0.65x PNG.
# DQN's 84x84 luma is smaller with zstd (0.74x PNG, rowdiff 1.0x): name it per key.
# Reading it from the store is slower than zstd's through TensorStore (zreplay's own
# shard reader, a read's chunks decoded as one batch per core: 0.8-1.5x zstd-1's time on
# 4096 contiguous rows, 1.1-3.3x on 256 random rows, a loaded run of
# benchmarks/bench_image_reads.py), but a local view serves clips and samples from its
# decoded image cache file, so that costs the first fill only.
# A key's codec is recorded in its array's metadata: buffers written with zstd keep it.
DEFAULT_IMAGE_CODEC: str | None = "rowdiff"
# ... and of frames the default codec does not take.
DEFAULT_GRAY_CODEC = "png"
# Frames at least this large on both sides count as images for the default.
MIN_IMAGE_SIDE = 16


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
        # Floats compress best byte-shuffled (Blosc); camera frames with an image codec;
        # other integers and flags with zstd.
        if spec.dtype.kind == "f":
            return cls(chunk, shard, "lz4", 5)
        if DEFAULT_IMAGE_CODEC is not None and image_like(spec):
            codec = DEFAULT_IMAGE_CODEC
            if codec not in accepted_image_codecs(spec):
                codec = DEFAULT_GRAY_CODEC
            return cls(chunk, shard, codec, IMAGE_CODECS[codec][2])
        return cls(chunk, shard, "zstd", 1)

    def with_overrides(self, override: Mapping) -> KeyLayout:
        fields = asdict(self)
        unknown = set(override) - set(fields)
        if unknown:
            raise SchemaError(
                f"unknown layout option(s) {sorted(unknown)}; known: {sorted(fields)}"
            )
        codec = override.get("codec")
        if codec in IMAGE_CODECS and "level" not in override:
            fields["level"] = IMAGE_CODECS[codec][2]  # its own default, not zstd's
        if codec in LOSSY_IMAGE_CODECS:
            # (a layout that names chunk_rows gets it: a buffer made so before keeps
            # opening with the layout it was made with)
            fields["chunk_rows"] = 1
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
        if self.codec not in CODECS and self.codec not in IMAGE_CODECS:
            raise SchemaError(f"codec {self.codec!r} is not one of {CODECS + tuple(IMAGE_CODECS)}")
        if self.codec in IMAGE_CODECS:
            lo, hi = IMAGE_CODECS[self.codec][3]
            if not lo <= self.level <= hi:
                raise SchemaError(
                    f"codec {self.codec!r}: level {self.level} not in [{lo}, {hi}] "
                    f"({IMAGE_CODECS[self.codec][1] or 'no level'})"
                )
        if self.chunk_rows < 1 or self.shard_rows < self.chunk_rows:
            raise SchemaError("need 1 <= chunk_rows <= shard_rows")
        if self.shard_rows > LIMIT_SHARD_ROWS:
            raise SchemaError(f"shard_rows ({self.shard_rows}) above {LIMIT_SHARD_ROWS}")
        if self.shard_rows % self.chunk_rows:
            raise SchemaError(
                f"shard_rows ({self.shard_rows}) must be a multiple of chunk_rows "
                f"({self.chunk_rows})"
            )

    def check_spec(self, path: str, spec: KeySpec) -> None:
        """SchemaError if this layout's codec cannot store ``spec``'s rows (an image
        codec for anything but uint8 frames it takes), before anything is written."""
        if self.codec in IMAGE_CODECS and self.codec not in accepted_image_codecs(spec):
            from .imagecodec import ImageCodecError, check_frame_shape

            try:
                check_frame_shape(IMAGE_CODECS[self.codec][0], spec.row_shape, spec.dtype)
            except ImageCodecError as e:
                raise SchemaError(f"key {path!r}: {e}") from None

    def image_config(self) -> tuple[str, dict] | None:
        """``(format, configuration)`` of this layout's image codec; None for others."""
        if self.codec not in IMAGE_CODECS:
            return None
        fmt, knob, _, _, fixed = IMAGE_CODECS[self.codec]
        config = dict(fixed)
        if knob == "quality" and self.codec == "jpegxl-lossy":
            # libjxl's own mapping of a JPEG-like quality (30-100) to a distance
            config["distance"] = round(0.1 + (100 - self.level) * 0.09, 4)
        elif knob is not None:
            config[knob] = self.level
        return fmt, config

    def zarr_codecs(self, dtype: np.dtype) -> dict:
        """Keyword arguments for ``zarr.Group.create_array``.

        Every chunk ends with a crc32c checksum, so a flipped or truncated chunk is an
        error on read, never wrong data.
        """
        from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

        image = self.image_config()
        if image is not None:
            from .imagecodec import ZARR_CODECS

            return {"serializer": ZARR_CODECS[image[0]](**image[1]), "compressors": [Crc32cCodec()]}
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


def image_like(spec: KeySpec) -> bool:
    """Rows that look like camera frames: uint8 ``[H, W]`` or ``[H, W, C]`` with C in 1,
    3, 4 and both sides at least MIN_IMAGE_SIDE."""
    shape = spec.row_shape
    return (
        spec.dtype == np.uint8
        and len(shape) in (2, 3)
        and (len(shape) == 2 or shape[2] in (1, 3, 4))
        and min(shape[:2]) >= MIN_IMAGE_SIDE
    )


def accepted_image_codecs(spec: KeySpec) -> tuple[str, ...]:
    """The image codecs that can store ``spec``'s rows (none for non-images)."""
    from .imagecodec import ImageCodecError, check_frame_shape

    out = []
    for name, (fmt, *_) in IMAGE_CODECS.items():
        try:
            check_frame_shape(fmt, spec.row_shape, spec.dtype)
        except ImageCodecError:
            continue
        out.append(name)
    return tuple(out)


def layouts_for(
    specs: Mapping[str, KeySpec], overrides: Mapping[str, Mapping] | None = None
) -> dict[str, KeyLayout]:
    """Default layout per key, with user overrides by key path (``{"curr_obs/img": {...}}``;
    e.g. ``{"obs/image": {"codec": "jpegxl"}}`` picks an image codec: see IMAGE_CODECS)."""
    overrides = dict(overrides or {})
    out = {}
    for path, spec in specs.items():
        lay = KeyLayout.default(spec)
        if path in overrides:
            lay = lay.with_overrides(overrides.pop(path))
            lay.check_spec(path, spec)
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
