"""The buffer root: a Zarr v3 group whose ``zreplay`` attribute holds schema and layout.

```
<root>/zarr.json                 attrs["zreplay"] = {format, schema, layout, created, ...}
<root>/segments/<writer_id>/     one per writer (see segment.py)
<root>/zreplay/writers/<n>       writer number n, claimed once by the writer id it holds
```
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

from ..errors import CorruptBufferError, FormatError, SchemaError
from ..schema import Schema, check_key_component
from .format import (
    ATTR,
    FORMAT_VERSION,
    META,
    READABLE_FORMATS,
    SEGMENT_CHILDREN,
    SEGMENTS,
    claims_dir,
    commit_path,
    legacy_claims_dir,
    legacy_commit_path,
    meta_node_json,
)
from .layout import KeyLayout
from .location import Location, locate


def is_buffer(path: str | Path | Location, storage_options: Mapping | None = None) -> bool:
    """True if ``path`` (a directory or an ``s3://`` URL) holds a zreplay buffer root."""
    meta = locate(path, storage_options) / "zarr.json"
    try:
        return ATTR in json.loads(meta.read_text()).get("attributes", {})
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, ValueError):
        return False


class BufferRoot:
    """Read and write the root group's metadata; list segments."""

    def __init__(self, path: str | Path | Location, storage_options: Mapping | None = None):
        self.path = locate(path, storage_options)
        self.backend = self.path.backend

    @property
    def segments_dir(self) -> Location:
        return self.path / SEGMENTS

    def segment_dir(self, writer_id: str) -> Location:
        check_key_component(writer_id, "segments")
        return self.segments_dir / writer_id

    # -- metadata -------------------------------------------------------------------

    def read_meta(self) -> dict:
        meta = self.path / "zarr.json"
        try:
            text = meta.read_text()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
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
        if info.get("format") not in READABLE_FORMATS:
            raise FormatError(
                f"{self.path}: zreplay format {info.get('format')} is not supported "
                f"(this version reads formats {list(READABLE_FORMATS)}); upgrade zreplay"
            )
        return info

    def create(self, extra: Mapping | None = None) -> dict:
        """Create the root group if absent; returns its zreplay metadata.

        Several writers may create the same buffer at once (in other processes, on other
        hosts): the root's ``zarr.json`` appears complete in one exclusive create, and
        the losers of that race read the winner's.
        """
        meta = self.path / "zarr.json"
        if meta.is_file():
            return self.read_meta()  # or the specific error of a damaged or foreign root
        if (
            self.path.exists()
            and any(True for _ in self.path.iterdir())
            and not meta.is_file()  # another writer may have created it just now
        ):
            raise FormatError(
                f"{self.path} exists, is not empty and is not a zreplay buffer; refusing to "
                "write into it. Pick an empty or new directory"
            )
        info = {"format": FORMAT_VERSION, "created": time.time(), "schema": None, "layout": None}
        info.update(extra or {})
        # The root's zarr.json is the first object, so whoever sees anything here sees a
        # complete buffer root.
        self.path.mkdir(parents=True, exist_ok=True)
        won = self.backend.create_exclusive(meta, group_json({ATTR: info}))
        self.segments_dir.mkdir(exist_ok=True)
        self.backend.create_exclusive(self.segments_dir / "zarr.json", group_json({}))
        self.create_meta_node(self.path)
        return info if won else self.read_meta()

    def create_meta_node(self, parent: Location) -> None:
        """The ``zreplay`` array node under ``parent`` (the root, or a segment) that holds
        zreplay's own files where Zarr does not look (if it is not there yet)."""
        node = parent / META
        node.mkdir(parents=True, exist_ok=True)
        if not (node / "zarr.json").is_file():
            self.backend.create_exclusive(node / "zarr.json", meta_node_json())

    def upgrade(self) -> None:
        """Make a format-2 root format 3 (its writer moves its own files on open; readers
        read either place), so older zreplay versions refuse it rather than miss them."""
        info = self.read_meta()
        if info.get("format") == FORMAT_VERSION:
            return
        self.create_meta_node(self.path)
        old = legacy_claims_dir(self.path)
        for p in _entries(old):
            holder = _claim_holder(p)
            if p.name.isdigit() and holder is not None:
                claims = claims_dir(self.path)
                claims.mkdir(parents=True, exist_ok=True)
                self.backend.create_exclusive(claims / p.name, holder.encode())
        self._set_attr(format=FORMAT_VERSION)
        self.backend.remove_tree(old)

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
        self._set_attr(
            schema=schema.to_json() if schema is not None else None,
            layout={k: vars(v) for k, v in layouts.items()} if layouts else None,
        )

    def _set_attr(self, **fields) -> None:
        # The root's zarr.json replaced whole, atomically (a reader sees the old schema
        # or the new one, never a torn file), without a zarr-python round trip.
        meta = self.path / "zarr.json"
        self.read_meta()  # the specific error of a damaged or foreign root
        doc = json.loads(meta.read_text())
        doc["attributes"][ATTR] = {**doc["attributes"][ATTR], **fields}
        self.backend.publish(meta, json.dumps(doc, indent=2).encode(), durable=True)

    # -- segments -------------------------------------------------------------------

    def writer_ids(self) -> list[str]:
        """Segments present on disk (those with a zarr.json), sorted by name."""
        try:
            entries = sorted(self.segments_dir.iterdir())
        except FileNotFoundError:
            return []
        return [p.name for p in entries if (p / "zarr.json").is_file()]

    def writer_number(self, writer_id: str) -> int:
        """The buffer-wide number of ``writer_id``, claimed on first use.

        Claims are files ``writers/<n>`` created exclusively (``O_EXCL``, or a conditional
        PUT in an object store) holding the writer id, so two writers starting at once
        never get the same number, and a writer that crashed before its first commit finds
        its claim again.
        """
        check_key_component(writer_id, "segments")
        d = claims_dir(self.path)
        d.mkdir(parents=True, exist_ok=True)
        taken = set()
        for p in [*_entries(d), *_entries(legacy_claims_dir(self.path))]:
            if not p.name.isdigit():
                continue
            taken.add(int(p.name))
            if _claim_holder(p) == writer_id:
                return int(p.name)
        n = 0
        while True:
            if n not in taken:
                if self.backend.create_exclusive(d / str(n), writer_id.encode()):
                    return n
                if _claim_holder(d / str(n)) == writer_id:
                    return n
            n += 1

    def remove_segment_data(self, writer_id: str) -> None:
        """Delete a segment's arrays and commit (its writer, under its lock, only)."""
        d = self.segment_dir(writer_id)
        commit_path(d).unlink(missing_ok=True)
        legacy_commit_path(d).unlink(missing_ok=True)
        for child in SEGMENT_CHILDREN:
            self.backend.remove_tree(d / child)


def _entries(d: Location) -> list:
    try:
        return sorted(d.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _claim_holder(p: Location) -> str | None:
    try:
        return p.read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return None


def group_json(attributes: Mapping) -> bytes:
    """A Zarr v3 group's ``zarr.json`` (what ``zarr.open_group`` writes)."""
    meta = {"zarr_format": 3, "node_type": "group", "attributes": dict(attributes)}
    return json.dumps(meta, indent=2).encode()
