"""The buffer root: a Zarr v3 group whose ``zreplay`` attribute holds schema and layout.

```
<root>/zarr.json                 attrs["zreplay"] = {format, schema, layout, created, ...}
<root>/segments/<writer_id>/     one per writer (see segment.py)
```
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import zarr

from ..errors import CorruptBufferError, FormatError, SchemaError
from ..schema import Schema, check_key_component
from .commit import FORMAT_VERSION
from .layout import KeyLayout

ATTR = "zreplay"


def is_buffer(path: str | Path) -> bool:
    """True if ``path`` holds a zreplay buffer root."""
    meta = Path(path) / "zarr.json"
    if not meta.is_file():
        return False
    try:
        return ATTR in json.loads(meta.read_text()).get("attributes", {})
    except ValueError:
        return False


def _make_root(path: Path, info: dict) -> None:
    zarr.open_group(str(path), mode="a", zarr_format=3, attributes={ATTR: info})
    zarr.open_group(str(path / "segments"), mode="a", zarr_format=3)


class BufferRoot:
    """Read and write the root group's metadata; list segments."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def segments_dir(self) -> Path:
        return self.path / "segments"

    def segment_dir(self, writer_id: str) -> Path:
        check_key_component(writer_id, "segments")
        return self.segments_dir / writer_id

    # -- metadata -------------------------------------------------------------------

    def read_meta(self) -> dict:
        meta = self.path / "zarr.json"
        try:
            text = meta.read_text()
        except FileNotFoundError:
            raise FormatError(
                f"{self.path} is not a zreplay buffer (no zarr.json); create one with "
                "TrajectoryReplayBuffer(auto_save=True, auto_save_path=...)"
            ) from None
        try:
            attrs = json.loads(text).get("attributes", {})
        except ValueError as e:
            raise CorruptBufferError(f"{meta} is not valid JSON ({e})") from None
        if ATTR not in attrs:
            raise FormatError(f"{self.path} is a Zarr group but not a zreplay buffer")
        info = attrs[ATTR]
        if info.get("format") != FORMAT_VERSION:
            raise FormatError(
                f"{self.path}: zreplay format {info.get('format')} is not supported "
                f"(this version reads format {FORMAT_VERSION})"
            )
        return info

    def create(self, extra: Mapping | None = None) -> dict:
        """Create the root group if absent; returns its zreplay metadata."""
        if is_buffer(self.path) or (self.path / "zarr.json").is_file():
            return self.read_meta()  # or the specific error of a damaged or foreign root
        if self.path.exists() and any(self.path.iterdir()):
            raise FormatError(
                f"{self.path} exists, is not empty and is not a zreplay buffer; refusing to "
                "write into it. Pick an empty or new directory"
            )
        info = {"format": FORMAT_VERSION, "created": time.time(), "schema": None, "layout": None}
        info.update(extra or {})
        # Built beside and renamed into place: writers starting together on a new path
        # (the ranks of a job) never see a half-made root; one rename wins, the others
        # then find a complete buffer.  (A rename replaces an empty directory; through a
        # symlink, the directory it points to.)
        target = self.path.resolve()
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.creating")
        try:
            _make_root(tmp, info)
            os.rename(tmp, target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if is_buffer(target):
                return self.read_meta()  # another writer's rename won
            if target.exists() and any(target.iterdir()):
                raise
            # A parent we may not write in, or a mount point: build in place.
            _make_root(target, info)
        return info

    def schema(self) -> tuple[Schema | None, dict[str, KeyLayout] | None]:
        info = self.read_meta()
        if not info.get("schema"):
            return None, None
        schema = Schema.from_json(info["schema"])
        layouts = {k: KeyLayout(**v) for k, v in info["layout"].items()}
        return schema, layouts

    def set_schema(self, schema: Schema, layouts: Mapping[str, KeyLayout]) -> None:
        """Fix the schema once; a different schema already on disk is an error."""
        current, _ = self.schema()
        if current is not None:
            if current != schema:
                raise SchemaError(
                    f"{self.path} already has a different schema: {current.to_json()}"
                )
            return
        self.replace_schema(schema, layouts)

    def replace_schema(
        self, schema: Schema | None, layouts: Mapping[str, KeyLayout] | None
    ) -> None:
        """Overwrite the schema (or reset it to None); only when no other segment has data."""
        g = zarr.open_group(str(self.path), mode="r+", zarr_format=3)
        info = dict(g.attrs[ATTR])
        info["schema"] = schema.to_json() if schema is not None else None
        info["layout"] = {k: vars(v) for k, v in layouts.items()} if layouts else None
        g.attrs[ATTR] = info

    # -- segments -------------------------------------------------------------------

    def writer_ids(self) -> list[str]:
        """Segments present on disk (those with a zarr.json), sorted by name."""
        try:
            entries = sorted(self.segments_dir.iterdir())
        except FileNotFoundError:
            return []
        return [p.name for p in entries if (p / "zarr.json").is_file()]

    def remove_segment_data(self, writer_id: str) -> None:
        """Delete a segment's arrays and commit (its writer, under its lock, only)."""
        d = self.segment_dir(writer_id)
        for child in ("commit.json",):
            try:
                (d / child).unlink()
            except FileNotFoundError:
                pass
        for child in ("data", "offsets", "traj", "episodes"):
            shutil.rmtree(d / child, ignore_errors=True)
