"""Image codecs for uint8 camera frames, as Zarr v3 array -> bytes codecs.

A chunk of ``[rows, H, W]`` or ``[rows, H, W, C]`` uint8 (C in 1, 3, 4) is stored frame by
frame: ``uint32 n`` (little-endian, = rows), ``uint32 size[n]``, then the ``n`` encoded
frames back to back (see FORMAT.md, "Image codecs").  Each frame is encoded on its own
(one row per chunk is the default layout for images, and every format has a largest
image side that a tiled chunk would run into).  zreplay's own ``rowdiff`` (:class:`RowDiff`,
the default for camera frames) codes a whole chunk as one zstd frame instead.

:class:`FrameCodec` is the codec as zreplay's own shard reader uses it (pure bytes and
numpy, via imagecodecs); the ``*Codec`` classes wrap it for zarr-python (registered here
and through the ``zarr.codecs`` entry points in pyproject.toml, so plain ``zarr`` reads a
buffer once zreplay is installed).

A buffer is untrusted data: a codec's JSON configuration is checked (known parameters,
values in range), the frame size is bounded before anything is allocated, and each frame
decodes into an array of the shape the array's metadata declares (imagecodecs checks the
image's header against it before decoding), so a crafted frame cannot make a reader
allocate more than the chunk.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..errors import MissingCodecError

try:  # optional: a faster rowdiff encoder (zstd_compressor); frames are the same format
    import zstandard
except ImportError:
    zstandard = None

# Codec name prefix in zarr.json; "zreplay.<format>".
PREFIX = "zreplay."
# The largest frame side and frame a reader accepts (16383: WebP's limit).
MAX_SIDE = 16383
MAX_FRAME_BYTES = 256 << 20
MAX_FRAMES = 1 << 16


class ImageCodecError(ValueError):
    """A frame or chunk that does not encode or decode, or a codec configuration no
    writer could have recorded."""


@dataclass(frozen=True)
class _Param:
    kind: type
    low: float = 0
    high: float = 0
    choices: tuple = ()  # the values a str parameter takes


@dataclass(frozen=True)
class Format:
    """One image format: its parameters (name -> type and range), the channel counts it
    takes, and whether it is lossless for every configuration (``lossless`` parameter
    otherwise).  ``optional``: the parameters a configuration may leave out (added after
    buffers were written without them), each with the value its absence means."""

    name: str
    params: dict = field(default_factory=dict)
    channels: tuple = (1, 3, 4)
    optional: dict = field(default_factory=dict)


FORMATS = {
    "png": Format("png", {"level": _Param(int, 0, 9)}),
    "webp": Format(
        "webp",
        {
            "lossless": _Param(bool, 0, 1),
            "quality": _Param(int, 0, 100),
            "method": _Param(int, 0, 6),
        },
        channels=(3, 4),
    ),
    "jpegxl": Format(
        "jpegxl",
        {
            "lossless": _Param(bool, 0, 1),
            "effort": _Param(int, 1, 9),
            "distance": _Param(float, 0.0, 25.0),
        },
    ),
    "avif": Format("avif", {"quality": _Param(int, 0, 100), "speed": _Param(int, 0, 10)}),
    # libjpeg-turbo; chroma subsampling 4:2:0 unless the configuration says 4:4:4 (which
    # photos need for 40 dB), Huffman tables optimized per frame when it says so
    "jpeg": Format(
        "jpeg",
        {
            "quality": _Param(int, 1, 100),
            "subsampling": _Param(str, choices=("420", "444")),
            "optimize": _Param(bool, 0, 1),
        },
        channels=(1, 3),
        optional={"subsampling": "420", "optimize": False},
    ),
    "qoi": Format("qoi", {}, channels=(3, 4)),
    # zreplay's own lossless codec (see RowDiff): zstd's level
    "rowdiff": Format("rowdiff", {"level": _Param(int, 1, 22)}),
}


def check_config(fmt: str, config: Any) -> dict:
    """``config`` checked against format ``fmt``'s parameters: every one present, known,
    of its type and in range (ImageCodecError otherwise)."""
    spec = FORMATS.get(fmt)
    if spec is None:
        raise ImageCodecError(f"unknown image codec {fmt!r}; known: {sorted(FORMATS)}")
    if not isinstance(config, dict):
        raise ImageCodecError(f"codec {PREFIX}{fmt}: configuration {config!r} is not an object")
    required = set(spec.params) - set(spec.optional)
    if not required <= set(config) <= set(spec.params):
        also = f" (optional: {sorted(spec.optional)})" if spec.optional else ""
        raise ImageCodecError(
            f"codec {PREFIX}{fmt}: parameters {sorted(config)}, expected exactly "
            f"{sorted(required)}{also} (a damaged or crafted zarr.json, or a newer zreplay's)"
        )
    # only the parameters given: a configuration is recorded as it was written
    return {name: _checked(fmt, name, spec.params[name], v) for name, v in config.items()}


def _checked(fmt: str, name: str, p: _Param, v: Any):
    if p.kind is str:
        if not isinstance(v, str) or v not in p.choices:
            raise ImageCodecError(
                f"codec {PREFIX}{fmt}: {name}={v!r}, expected one of {list(p.choices)}"
            )
        return v
    ok = isinstance(v, bool) if p.kind is bool else not isinstance(v, bool)
    ok = ok and isinstance(v, (int, float) if p.kind is float else p.kind)
    if not ok or not p.low <= v <= p.high:
        raise ImageCodecError(
            f"codec {PREFIX}{fmt}: {name}={v!r}, expected {p.kind.__name__} in [{p.low}, {p.high}]"
        )
    return p.kind(v)


def check_frame_shape(fmt: str, frame: tuple, dtype) -> None:
    """ImageCodecError unless uint8 frames of shape ``frame`` (``(H, W)`` or ``(H, W, C)``)
    suit format ``fmt``."""
    spec = FORMATS[fmt]
    channels = 1 if len(frame) == 2 else frame[-1] if len(frame) == 3 else None
    if np.dtype(dtype) != np.uint8 or channels is None:
        raise ImageCodecError(
            f"image codec {fmt!r} takes uint8 frames [H, W] or [H, W, C], got "
            f"{np.dtype(dtype)} rows of shape {tuple(frame)}"
        )
    if channels not in spec.channels:
        hint = (
            "choose png or jpegxl, which take 1, 3 or 4"
            if channels in (1, 3, 4)
            else "no image codec takes that many: store the key with codec 'zstd'"
        )
        raise ImageCodecError(
            f"image codec {fmt!r} takes {spec.channels} channels, got {channels} (shape "
            f"{tuple(frame)}); {hint}"
        )
    if not (1 <= frame[0] <= MAX_SIDE and 1 <= frame[1] <= MAX_SIDE):
        raise ImageCodecError(
            f"image codec {fmt!r}: frame sides {frame[:2]} not in [1, {MAX_SIDE}]"
        )
    if int(np.prod(frame)) > MAX_FRAME_BYTES:
        raise ImageCodecError(
            f"image codec {fmt!r}: frames of {frame} above {MAX_FRAME_BYTES} bytes"
        )


# imagecodecs' codec of each format: ``imagecodecs.<NAME>.available`` is False in a
# build without it (its functions are then stubs that raise when called).
_BUILD_NAMES = {
    "png": "PNG",
    "webp": "WEBP",
    "jpegxl": "JPEGXL",
    "avif": "AVIF",
    "jpeg": "JPEG8",
    "qoi": "QOI",
    "rowdiff": "ZSTD",  # and imagecodecs' delta, built into every wheel
}


def _imagecodecs(fmt: str):
    """imagecodecs, checked to have format ``fmt``: a reader without it must learn so
    before it reads a frame, not take the frames it cannot decode for damage."""
    try:
        import imagecodecs  # a hard dependency; imported on first use (about 30 ms)
    except ImportError as e:
        raise MissingCodecError(PREFIX + fmt, f"imagecodecs is not installed: {e}") from None
    try:
        has = getattr(imagecodecs, _BUILD_NAMES[fmt]).available is True
    except Exception:  # noqa: BLE001 - an older or odd build: whatever it raises
        has = False
    if not has:
        version = getattr(imagecodecs, "__version__", "?")
        raise MissingCodecError(
            PREFIX + fmt, f"imagecodecs {version} was built without {_BUILD_NAMES[fmt]}"
        )
    return imagecodecs


def _encoder(fmt: str, cfg: dict):
    ic = _imagecodecs(fmt)
    if fmt == "png":
        return lambda a: ic.png_encode(a, level=cfg["level"])
    if fmt == "webp":
        return lambda a: ic.webp_encode(
            a, level=cfg["quality"], lossless=cfg["lossless"], method=cfg["method"]
        )
    if fmt == "jpegxl":
        if cfg["lossless"]:
            return lambda a: ic.jpegxl_encode(a, lossless=True, effort=cfg["effort"], numthreads=1)
        return lambda a: ic.jpegxl_encode(
            a, distance=cfg["distance"], effort=cfg["effort"], numthreads=1
        )
    if fmt == "avif":
        return lambda a: ic.avif_encode(a, level=cfg["quality"], speed=cfg["speed"], numthreads=1)
    if fmt == "jpeg":
        cfg = FORMATS["jpeg"].optional | cfg
        return lambda a: ic.jpeg8_encode(
            a, level=cfg["quality"], subsampling=cfg["subsampling"], optimize=cfg["optimize"]
        )
    return ic.qoi_encode


def _decoder(fmt: str):
    ic = _imagecodecs(fmt)
    return {
        "png": ic.png_decode,
        "webp": ic.webp_decode,
        "jpegxl": lambda b, out: ic.jpegxl_decode(b, numthreads=1, out=out),
        "avif": lambda b, out: ic.avif_decode(b, numthreads=1, out=out),
        "jpeg": ic.jpeg8_decode,
        "qoi": ic.qoi_decode,
    }[fmt]


def _chunk_block(fmt: str, block, chunk_shape: tuple) -> np.ndarray:
    """``block`` as the uint8 array of shape ``chunk_shape`` a chunk of format ``fmt``
    encodes (ImageCodecError for anything else)."""
    block = np.asarray(block)
    if block.dtype != np.uint8 or block.shape != chunk_shape:
        raise ImageCodecError(
            f"image codec {fmt!r}: a chunk of {block.dtype} {block.shape}, "
            f"expected uint8 {chunk_shape}"
        )
    return block


class FrameCodec:
    """Chunks ``[rows, *frame]`` of uint8 frames <-> bytes in format ``fmt`` (see the
    module docstring for the byte layout)."""

    # (milliseconds a frame, GIL released: readers decode several chunks at once)
    decodes_slowly = True

    def __init__(self, fmt: str, config: Any, chunk_shape: tuple):
        self.fmt = fmt
        self.config = check_config(fmt, config)
        self.chunk_shape = tuple(int(x) for x in chunk_shape)
        if not 1 <= self.chunk_shape[0] <= MAX_FRAMES:
            raise ImageCodecError(f"image codec {fmt!r}: chunks of {self.chunk_shape[0]} rows")
        check_frame_shape(fmt, self.chunk_shape[1:], np.uint8)
        # imagecodecs takes and gives [H, W] for one channel
        self._plane = self.chunk_shape[1:3] if self.chunk_shape[3:] in ((), (1,)) else None
        self._encode = _encoder(fmt, self.config)
        self._decode = _decoder(fmt)

    def encode(self, block: np.ndarray) -> bytes:
        """One chunk ``uint8 [rows, *frame]`` as bytes."""
        block = _chunk_block(self.fmt, block, self.chunk_shape)
        frames = [
            bytes(
                self._encode(
                    np.ascontiguousarray(f if self._plane is None else f.reshape(self._plane))
                )
            )
            for f in block
        ]
        head = struct.pack(f"<{len(frames) + 1}I", len(frames), *map(len, frames))
        return b"".join([head, *frames])

    def decode(self, data) -> np.ndarray:
        """The chunk ``uint8 [rows, *frame]`` that ``data`` holds (ImageCodecError for
        bytes that are not one: wrong counts or sizes, a frame that does not decode into
        the declared frame shape)."""
        out = np.empty(self.chunk_shape, np.uint8)
        self.unpack(data, out)
        return out

    def unpack(self, data, out: np.ndarray) -> None:
        """Decode the chunk ``data`` into ``out`` (uint8 ``[rows, *frame]``, C order):
        each frame straight into its rows (see :meth:`decode`)."""
        if out.shape != self.chunk_shape or not out.flags.c_contiguous:  # (a caller's bug)
            raise ValueError(f"{self.fmt}: unpack into {out.shape}, expected {self.chunk_shape}")
        mv = memoryview(data).cast("B")
        n = self.chunk_shape[0]
        head = 4 * (n + 1)
        if len(mv) < head or struct.unpack_from("<I", mv)[0] != n:
            raise ImageCodecError(f"image codec {self.fmt!r}: a chunk without its {n}-frame header")
        sizes = np.frombuffer(mv[4:head], "<u4").astype(np.int64)
        ends = head + np.cumsum(sizes)
        if ends[-1] != len(mv):
            raise ImageCodecError(
                f"image codec {self.fmt!r}: frames of {int(ends[-1] - head)} bytes in a chunk "
                f"of {len(mv) - head}"
            )
        starts = ends - sizes
        for i in range(n):
            target = out[i] if self._plane is None else out[i].reshape(self._plane)
            try:
                got = self._decode(mv[int(starts[i]) : int(ends[i])], out=target)
            except ImportError as e:  # a stub of a build without it: not damage
                raise MissingCodecError(PREFIX + self.fmt, f"{type(e).__name__}: {e}") from None
            except Exception as e:  # noqa: BLE001 - imagecodecs raises its own per format
                raise ImageCodecError(
                    f"image codec {self.fmt!r}: frame {i} does not decode ({type(e).__name__}: {e})"
                ) from None
            if got is not target and not np.shares_memory(got, target):
                target[...] = got

    def undo_filters(self, chunks: np.ndarray) -> None:
        """Nothing: :meth:`unpack` leaves whole frames (the batch step of :class:`RowDiff`)."""


# Bytes of one pixel row across a batch of frames from which RowDiff.undo_filters adds
# each pixel row to the next in all frames with one numpy call (a call per pixel row)
# rather than imagecodecs' running sum (a call per batch, frame by frame inside): 2x
# faster on 256 frames of 64x64x3, 3-4.5x on 128 of 224x224x3 or 32 of 480x640x3, slower
# on fewer than about 8 KiB a call (measured, one core).
_ROW_SUM_BYTES = 8192


_PER_THREAD = threading.local()  # zstd contexts: one per thread and level


def zstd_compressor(level: int) -> Callable[[np.ndarray], bytes]:
    """A function from a C-contiguous uint8 array to one zstd frame of its bytes at
    ``level``, for this thread.  With the ``zstandard`` package, a context made once per
    thread and reused (imagecodecs makes one per call: on 12 KB frames about a fifth of
    the time, measured); imagecodecs' otherwise."""
    if zstandard is None:
        return partial(_imagecodecs("rowdiff").zstd_encode, level=level)
    kept = getattr(_PER_THREAD, "zstd", None)
    if kept is None:
        kept = _PER_THREAD.zstd = {}
    compress = kept.get(level)
    if compress is None:
        compress = kept[level] = zstandard.ZstdCompressor(level=level).compress
    return compress


def zstd_decode_into(data, out: np.ndarray) -> int:
    """Decode the one zstd frame ``data`` into ``out`` (a 1-d C-contiguous uint8 array)
    and return the bytes it held; a frame declaring more than ``out`` holds, extra bytes
    after it or a damaged frame raise (zstandard's or imagecodecs' own error).  With the
    ``zstandard`` package, a context kept per thread (imagecodecs makes one per call: on
    one-frame chunks of 64x64x3 most of the zstd time, measured); imagecodecs' otherwise,
    and for a frame that does not declare its size."""
    if zstandard is not None:
        size = zstandard.frame_content_size(data)
        if size > out.nbytes:
            raise ValueError(
                f"the frame declares {size} bytes, more than the {out.nbytes} expected"
            )
        if size >= 0:
            d = getattr(_PER_THREAD, "unzstd", None)
            if d is None:
                d = _PER_THREAD.unzstd = zstandard.ZstdDecompressor()
            got = d.decompress(data, max_output_size=out.nbytes, allow_extra_data=False)
            out[: len(got)] = np.frombuffer(got, np.uint8)
            return len(got)
    return len(_imagecodecs("rowdiff").zstd_decode(data, out=out))


class RowDiff:
    """Chunks ``[rows, *frame]`` of uint8 frames <-> bytes by zreplay's own lossless
    transform: green subtracted from red and blue, each pixel row less the row above,
    one zstd frame (FORMAT.md, "Image codecs").

    Byte layout: a 16-byte header of four little-endian uint32 (rows, height, width,
    channels), then one zstd frame of ``rows * height * width * channels`` bytes: the
    chunk in its own C order (frames, pixel rows, pixels, channels interleaved), where
    pixel row 0 of a frame is stored as is and every later pixel row as itself minus the
    pixel row above, channel by channel, and then (3 or 4 channels) the first channel
    less the second and the third less the second (R - G, G, B - G, A); all mod 256.

    Why this and not PNG: subtracting green decorrelates the colours, and the row-above
    predictor is the one PNG filter whose inverse is a running sum down each column,
    which runs vectorized over whole rows where PNG's per-row adaptive filters decode
    pixel by pixel; zstd-1 then codes the residuals about as tightly as deflate and
    decodes several times faster.  Channels stay interleaved: planar storage measured as
    small on photos but twice the bytes on Atari and rendered frames, where one zstd
    match then covers a pixel's three channels instead of three matches one each.
    """

    # (a fraction of a millisecond a frame, the GIL released in zstd and the sums)
    decodes_slowly = True

    def __init__(self, config: Any, chunk_shape: tuple):
        self.fmt = "rowdiff"
        self.config = check_config("rowdiff", config)
        self.chunk_shape = tuple(int(x) for x in chunk_shape)
        if not 1 <= self.chunk_shape[0] <= MAX_FRAMES:
            raise ImageCodecError(f"image codec 'rowdiff': chunks of {self.chunk_shape[0]} rows")
        check_frame_shape("rowdiff", self.chunk_shape[1:], np.uint8)
        rows, h, w = self.chunk_shape[:3]
        channels = self.chunk_shape[3] if len(self.chunk_shape) == 4 else 1
        self.header = struct.pack("<4I", rows, h, w, channels)
        self._colour = channels >= 3
        # pixel rows of a frame as rows of bytes, and the channels as the last axis
        self._rows = (rows, h, w * channels)
        self._pixels = (rows * h * w, channels)
        self._ic = _imagecodecs("rowdiff")  # at open: a reader without it learns so first

    def encode(self, block: np.ndarray) -> bytes:
        """One chunk ``uint8 [rows, *frame]`` as bytes."""
        return self.encode_run(_chunk_block(self.fmt, block, self.chunk_shape))[0]

    def encode_run(self, rows: np.ndarray) -> list[bytes]:
        """Consecutive chunks ``uint8 [k * chunk_rows, *frame]`` as the ``k`` chunks'
        bytes: the residuals of all ``k`` in one numpy pass, then one zstd frame each
        (a commit's frames are thousands of 1-row chunks: the transform took 17 us a
        64x64x3 frame chunk by chunk, 6 us in one pass, measured)."""
        cr = self.chunk_shape[0]
        rows = np.asarray(rows)
        if rows.dtype != np.uint8 or rows.shape[1:] != self.chunk_shape[1:] or len(rows) % cr:
            raise ImageCodecError(
                f"image codec 'rowdiff': a run of {rows.dtype} {rows.shape}, expected uint8 "
                f"[k * {cr}, {', '.join(map(str, self.chunk_shape[1:]))}]"
            )
        k = len(rows) // cr
        if not k:
            return []
        pix = rows.reshape(len(rows), *self._rows[1:])
        # numpy's subtract into a second buffer: several times faster here than
        # imagecodecs.delta_encode (measured), and in place it would copy for the overlap
        res = np.empty(pix.shape, np.uint8)
        res[:, 0] = pix[:, 0]
        np.subtract(pix[:, 1:], pix[:, :-1], out=res[:, 1:])
        if self._colour:  # linear mod 256, so after the row differences is the same
            px = res.reshape(-1, self._pixels[1])
            px[:, 0] -= px[:, 1]
            px[:, 2] -= px[:, 1]
        res = res.reshape(k, -1)
        compress = zstd_compressor(self.config["level"])
        return [self.header + compress(r) for r in res]

    def decode(self, data) -> np.ndarray:
        """The chunk ``uint8 [rows, *frame]`` that ``data`` holds (ImageCodecError for
        bytes that are not one: a header that disagrees with the array's metadata, a zstd
        frame that does not hold exactly the chunk's bytes)."""
        out = np.empty(self.chunk_shape, np.uint8)
        self.unpack(data, out)
        self.undo_filters(out[None])
        return out

    def unpack(self, data, out: np.ndarray) -> None:
        """The first half of :meth:`decode`: the zstd frame of chunk ``data``, checked,
        into ``out`` (uint8 ``[rows, *frame]``, C order), still filtered.  A reader
        unpacks every chunk of a read into its rows of one array and then undoes the
        filters of them all in one :meth:`undo_filters` (a few numpy calls a read, not a
        few a frame)."""
        mv = memoryview(data).cast("B")
        if len(mv) < 16 or bytes(mv[:16]) != self.header:
            got = struct.unpack_from("<4I", mv) if len(mv) >= 16 else "a short chunk"
            raise ImageCodecError(
                f"image codec 'rowdiff': chunk header {got}, expected (rows, height, width, "
                f"channels) {struct.unpack('<4I', self.header)} as the array's metadata says"
            )
        if out.shape != self.chunk_shape or not out.flags.c_contiguous:  # (a caller's bug)
            raise ValueError(f"rowdiff: unpack into {out.shape}, expected {self.chunk_shape}")
        flat = out.reshape(-1)
        try:
            # into the chunk's own rows: a frame declaring more cannot make us allocate
            got = zstd_decode_into(mv[16:], flat)
        except Exception as e:  # noqa: BLE001 - zstandard and imagecodecs raise their own kinds
            raise ImageCodecError(
                f"image codec 'rowdiff': the zstd frame does not decode ({type(e).__name__}: {e})"
            ) from None
        if got != flat.nbytes:
            raise ImageCodecError(
                f"image codec 'rowdiff': the zstd frame holds {got} bytes, the chunk {flat.nbytes}"
            )

    def undo_filters(self, chunks: np.ndarray) -> None:
        """The second half of :meth:`decode`, in place over any number of unpacked
        chunks ``uint8 [n, rows, *frame]`` (C order): green added back to red and blue,
        then a running sum down each column of every frame.  Both are linear mod 256 and
        act on different axes, so one pass over all frames equals one per frame."""
        if self._colour:
            px = chunks.reshape(-1, self._pixels[1])
            px[:, 0] += px[:, 1]
            px[:, 2] += px[:, 1]
        rows = chunks.reshape(-1, *self._rows[1:])
        if rows.shape[0] * rows.shape[2] < _ROW_SUM_BYTES:
            self._ic.delta_decode(rows, axis=1, out=rows)  # a running sum down each column
            return
        for y in range(1, rows.shape[1]):  # pixel row y of every frame at once
            np.add(rows[:, y], rows[:, y - 1], out=rows[:, y])


def chunk_codec(fmt: str, config: Any, chunk_shape: tuple) -> FrameCodec | RowDiff:
    """The codec of chunks ``[rows, *frame]`` of image format ``fmt`` (ImageCodecError
    for a configuration or shape it does not take)."""
    if fmt == "rowdiff":
        return RowDiff(config, chunk_shape)
    return FrameCodec(fmt, config, chunk_shape)


def format_of(codec_name: str) -> str | None:
    """The format of a zarr.json codec name ("zreplay.png" -> "png"), None for others."""
    if isinstance(codec_name, str) and codec_name.startswith(PREFIX):
        return codec_name[len(PREFIX) :]
    return None


def uses_image_codec(meta: Any) -> bool:
    """Does the parsed ``zarr.json`` ``meta`` of an array use one of these codecs (at the
    top or inside its sharding codec)?"""
    try:
        chain = meta["codecs"]
        if len(chain) == 1 and chain[0]["name"] == "sharding_indexed":
            chain = chain[0]["configuration"]["codecs"]
        return any(format_of(c.get("name")) is not None for c in chain)
    except (KeyError, TypeError, IndexError, AttributeError):
        return False


# -- zarr-python ---------------------------------------------------------------------

from zarr.abc.codec import ArrayBytesCodec  # noqa: E402
from zarr.core.common import parse_named_configuration  # noqa: E402


class _ZarrImageCodec(ArrayBytesCodec):
    """An image format as a Zarr v3 array -> bytes codec (one subclass per format)."""

    fmt: str = ""
    is_fixed_size = False

    def __init__(self, **config):
        object.__setattr__(self, "config", check_config(self.fmt, config))

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.config == self.config

    def __hash__(self) -> int:
        return hash((self.fmt, tuple(sorted(self.config.items()))))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"

    @classmethod
    def from_dict(cls, data):
        _, config = parse_named_configuration(data, PREFIX + cls.fmt, require_configuration=False)
        try:
            return cls(**(config or {}))
        except TypeError as e:
            raise ImageCodecError(f"codec {PREFIX}{cls.fmt}: {e}") from None

    def to_dict(self):
        return {"name": PREFIX + self.fmt, "configuration": dict(self.config)}

    def evolve_from_array_spec(self, array_spec):
        return self

    def validate(self, *, shape, dtype, chunk_grid) -> None:
        check_frame_shape(self.fmt, tuple(shape[1:]), dtype.to_native_dtype())

    def _codec(self, chunk_spec) -> FrameCodec | RowDiff:
        return chunk_codec(self.fmt, self.config, tuple(chunk_spec.shape))

    async def _decode_single(self, chunk_bytes, chunk_spec):
        block = self._codec(chunk_spec).decode(chunk_bytes.as_numpy_array())
        return chunk_spec.prototype.nd_buffer.from_ndarray_like(block)

    async def _encode_single(self, chunk_array, chunk_spec):
        body = self._codec(chunk_spec).encode(chunk_array.as_numpy_array())
        return chunk_spec.prototype.buffer.from_bytes(body)

    def compute_encoded_size(self, input_byte_length: int, _chunk_spec) -> int:
        raise NotImplementedError  # variable size (is_fixed_size is False)


class PngCodec(_ZarrImageCodec):
    fmt = "png"


class WebpCodec(_ZarrImageCodec):
    fmt = "webp"


class JpegxlCodec(_ZarrImageCodec):
    fmt = "jpegxl"


class AvifCodec(_ZarrImageCodec):
    fmt = "avif"


class JpegCodec(_ZarrImageCodec):
    fmt = "jpeg"


class QoiCodec(_ZarrImageCodec):
    fmt = "qoi"


class RowdiffCodec(_ZarrImageCodec):
    fmt = "rowdiff"


ZARR_CODECS = {
    c.fmt: c
    for c in (PngCodec, WebpCodec, JpegxlCodec, AvifCodec, JpegCodec, QoiCodec, RowdiffCodec)
}


def _register() -> None:
    # In this process even where zreplay is not installed (a source checkout on
    # PYTHONPATH): the entry points make plain zarr find them everywhere else.
    from zarr.registry import register_codec

    for fmt, cls in ZARR_CODECS.items():
        register_codec(PREFIX + fmt, cls)


_register()
