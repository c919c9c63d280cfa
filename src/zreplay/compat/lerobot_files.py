"""The files of a LeRobot v3.0 dataset as LeRobot 0.4.4 writes them, for
:mod:`zreplay.compat.lerobot_export`: the data parquet files (``datasets``' column types
and schema metadata, PNG images), the AV1 mp4 files of a camera, the ``meta/episodes``
files, ``meta/tasks.parquet``; each kind rolls over to a new file between episodes
(:class:`Rollover`).  The layout's facts (path templates, feature kinds, the default
encoding) are :mod:`.lerobot_format`'s; pyarrow, PyAV and Pillow are imported when
first needed (:func:`~.lerobot_format.need`)."""

from __future__ import annotations

import io
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .lerobot_format import (
    IMAGE,
    V30_DATA_PATH,
    V30_EPISODES_PATH,
    V30_VIDEO_PATH,
    VIDEO,
    VIDEO_CODEC,
    VIDEO_OPTIONS,
    VIDEO_PIX_FMT,
    Feature,
    need,
)

PNG_LEVEL = 1  # LeRobot's own (image_writer.write_image); PNG is lossless at any level
MB = 1 << 20
EPISODES_PER_FILE = 1000  # rows of a meta/episodes file
VIDEO_COLUMNS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")


def hf_feature(f: Feature) -> dict:
    """``datasets``' serialized feature type of a data column (LeRobot 0.4.4's
    ``get_hf_features_from_features``: an image is ``Image()``, a one-element row a
    ``Value``, a vector a fixed-length ``List``, a row of 2 to 5 axes an ``Array2D`` to
    ``Array5D``)."""
    if f.kind == IMAGE:
        return {"_type": "Image"}
    if len(f.shape) > 1:
        shape = [int(d) for d in f.shape]
        return {"shape": shape, "dtype": f.dtype.name, "_type": f"Array{len(shape)}D"}
    value = {"dtype": f.dtype.name, "_type": "Value"}
    if f.shape == (1,):
        return value
    return {"feature": value, "length": int(f.shape[0]), "_type": "List"}


# -- frames -------------------------------------------------------------------------


def png(frame: np.ndarray) -> bytes:
    """A uint8 ``[H, W, 3]`` frame as PNG bytes (lossless)."""
    image = need("PIL.Image")
    buf = io.BytesIO()
    image.fromarray(np.ascontiguousarray(frame)).save(buf, format="PNG", compress_level=PNG_LEVEL)
    return buf.getvalue()


def arrow_column(pa, f: Feature, v: np.ndarray):
    if f.kind == IMAGE:
        # Pillow's encoder lets go of the GIL: frames are encoded side by side.  Imported
        # here first: threads importing it at once would see it half initialised.
        need("PIL.Image")
        with ThreadPoolExecutor(os.cpu_count() or 2, thread_name_prefix="zreplay-png") as pool:
            data = [{"bytes": b, "path": None} for b in pool.map(png, v)]
        return pa.array(data, pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    flat = pa.array(np.ascontiguousarray(v).reshape(-1))
    if f.shape == (1,):
        return flat
    if len(f.shape) > 1:
        # datasets' ArrayND storage: lists of lists (of no fixed size), innermost last.
        for d in reversed(f.shape):
            offsets = np.arange(0, len(flat) + 1, int(d), dtype=np.int32)
            flat = pa.ListArray.from_arrays(pa.array(offsets), flat)
        return flat
    return pa.FixedSizeListArray.from_arrays(flat, int(f.shape[0]))


# -- files that roll over between episodes --------------------------------------------


@dataclass
class Rollover:
    """Where the next episode of one kind of file goes: ``(chunk, file)`` moves on when
    the current file holds something and the episode would take it past ``limit``
    bytes; to the next chunk after ``chunks_size`` files (LeRobot's
    ``update_chunk_file_indices``)."""

    limit: int
    chunks_size: int
    chunk: int = 0
    file: int = 0
    used: int = 0

    def place(self, size: int) -> bool:
        """Account an episode of about ``size`` bytes; True if it starts a new file."""
        new = self.used > 0 and self.used + size > self.limit
        if new:
            self.used = 0
            if self.file == self.chunks_size - 1:
                self.chunk, self.file = self.chunk + 1, 0
            else:
                self.file += 1
        self.used += size
        return new


class DataFiles:
    """The data parquet files: one row group per episode."""

    def __init__(self, root: Path, feats: list[Feature], limit: int, chunks_size: int):
        self.pa, self.pq = need("pyarrow"), need("pyarrow.parquet")
        self.root, self.roll = root, Rollover(limit, chunks_size)
        self.feats = [f for f in feats if f.kind != VIDEO]
        hf = {"info": {"features": {f.name: hf_feature(f) for f in self.feats}}}
        self.meta = {b"huggingface": json.dumps(hf).encode()}
        self.writer = None
        self.files = 0

    def write(self, columns: dict[str, np.ndarray]) -> tuple[int, int]:
        """Write one episode's frames; its ``(chunk, file)``."""
        pa = self.pa
        arrays = [arrow_column(pa, f, columns[f.name]) for f in self.feats]
        table = pa.Table.from_arrays(arrays, names=[f.name for f in self.feats])
        table = table.replace_schema_metadata(self.meta)
        if self.roll.place(table.nbytes) or self.writer is None:
            self.close()
            path = self.root / V30_DATA_PATH.format(
                chunk_index=self.roll.chunk, file_index=self.roll.file
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = self.pq.ParquetWriter(path, table.schema, compression="snappy")
            self.files += 1
        self.writer.write_table(table)
        return self.roll.chunk, self.roll.file

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class EpisodeFiles:
    """``meta/episodes`` parquet files: one row per episode, ``per_file`` rows a file
    (rows wait in RAM until their file is written)."""

    def __init__(self, root: Path, per_file: int, chunks_size: int):
        self.pa, self.pq = need("pyarrow"), need("pyarrow.parquet")
        self.root, self.per_file = root, per_file
        self.roll = Rollover(per_file, chunks_size)
        self.rows: list[dict] = []
        self.written = 0

    def add(self, row: dict) -> None:
        if self.roll.place(1):
            self.flush()
        row.update(
            {
                "meta/episodes/chunk_index": self.roll.chunk,
                "meta/episodes/file_index": self.roll.file,
            }
        )
        self.rows.append(row)

    def flush(self) -> None:
        if not self.rows:
            return
        first = self.rows[0]
        path = self.root / V30_EPISODES_PATH.format(
            chunk_index=first["meta/episodes/chunk_index"],
            file_index=first["meta/episodes/file_index"],
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        self.pq.write_table(self.pa.Table.from_pylist(self.rows), path, compression="snappy")
        self.written += len(self.rows)
        self.rows = []


class VideoFiles:
    """One camera's mp4 files: episodes encoded back to back in one AV1 stream per
    file, frame ``i`` of a file at ``i / fps`` seconds, so an episode spans
    ``[first / fps, (last + 1) / fps)`` of it."""

    def __init__(self, root: Path, f: Feature, fps: int, limit: int, chunks_size: int):
        self.av = need("av")
        self.root, self.f, self.fps = root, f, fps
        self.roll = Rollover(limit, chunks_size)
        self.container = self.stream = None
        self.frames = 0  # frames in the current file
        self.bytes_per_frame = f.shape[0] * f.shape[1] * 3 / 50  # until measured
        self.files = 0

    def write(self, frames: np.ndarray) -> tuple[int, int, float, float]:
        """Encode one episode; ``(chunk, file, from_timestamp, to_timestamp)``."""
        if self.roll.place(int(self.bytes_per_frame * len(frames))) or self.container is None:
            self.close()
            self._open()
        first = self.frames
        for frame in frames:
            vf = self.av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
            vf.pts = self.frames
            self.frames += 1
            self._mux(self.stream.encode(vf))
        # What the encoder has handed out so far (it holds a few frames back).
        if self.encoded:
            self.bytes_per_frame = self.encoded / self.frames
            self.roll.used = max(self.roll.used, self.encoded)
        return self.roll.chunk, self.roll.file, first / self.fps, self.frames / self.fps

    def _open(self) -> None:
        av, (h, w, _) = self.av, self.f.shape
        path = self.root / V30_VIDEO_PATH.format(
            video_key=self.f.name, chunk_index=self.roll.chunk, file_index=self.roll.file
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        self.container = av.open(str(path), "w")
        self.stream = self.container.add_stream(VIDEO_CODEC, self.fps, options=VIDEO_OPTIONS)
        self.stream.pix_fmt, self.stream.width, self.stream.height = VIDEO_PIX_FMT, w, h
        self.frames = self.encoded = 0
        self.files += 1

    def _mux(self, packets) -> None:
        for p in packets:
            self.encoded += p.size
        self.container.mux(packets)

    def close(self) -> None:
        """Flush the encoder and close the file (nothing to do when none is open)."""
        if self.container is None:
            return
        try:
            self._mux(self.stream.encode())
            if self.frames:
                self.bytes_per_frame = self.encoded / self.frames
        finally:
            self.container.close()
            self.container = self.stream = None

    def abandon(self) -> None:
        """Close without flushing (the export failed; the file is thrown away)."""
        if self.container is not None:
            try:
                self.container.close()
            except Exception:
                pass
            self.container = self.stream = None


# -- metadata -----------------------------------------------------------------------


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4, ensure_ascii=False))


def write_tasks(pa, pq, path: Path, tasks: list[str]) -> None:
    """``meta/tasks.parquet`` as pandas writes a frame indexed by task string with a
    ``task_index`` column (LeRobot reads it with ``pd.read_parquet``)."""
    pandas = {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.0",
    }
    table = pa.table(
        {
            "task_index": pa.array(np.arange(len(tasks), dtype=np.int64)),
            "__index_level_0__": pa.array(tasks, pa.string()),
        }
    ).replace_schema_metadata({b"pandas": json.dumps(pandas).encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
