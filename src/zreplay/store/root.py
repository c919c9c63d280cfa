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
from ..schema import Schema, check_key_component, safe_component
from .format import (
    ATTR,
    FORMAT_VERSION,
    META,
    SCHEMA_NAME,
    SEGMENT_CHILDREN,
    SEGMENTS,
    claims_dir,
    commit_path,
    is_temp_name,
    learners_dir,
    meta_node_json,
    old_format_error,
)
from .layout import KeyLayout
from .location import Location, locate


def is_buffer(path: str | Path | Location, storage_options: Mapping | None = None) -> bool:
    """True if ``path`` (a directory or an ``s3://`` URL) holds a zreplay buffer root."""
    loc = locate(path, storage_options)
    for _ in range(2):
        try:
            return ATTR in json.loads((loc / "zarr.json").read_text()).get("attributes", {})
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            if not _recovered(loc):
                return False
        except ValueError:
            return False
    return False


def leftover_of_buffer(path: str | Path | Location, storage_options: Mapping | None = None) -> bool:
    """True if ``path`` is no buffer (no root ``zarr.json``) but holds nothing but
    zreplay's own directories: what a removal (``overwrite=True``) leaves when a learner
    published its progress into it meanwhile, or a creation that has not finished."""
    loc = locate(path, storage_options)
    try:
        names = {p.name for p in loc.iterdir()}
    except (FileNotFoundError, NotADirectoryError):
        return False
    return bool(names) and names <= {META, SEGMENTS} and not is_buffer(loc)


def _recovered(loc: Location) -> bool:
    """True if a replacement of the tree at ``loc`` that a crash interrupted was just
    finished or undone (its root ``zarr.json`` may be there now)."""
    try:
        return loc.backend.recover_tree(loc)
    except OSError:
        return False  # e.g. read-only credentials: a writer will finish it


class BufferRoot:
    """Read and write the root group's metadata; list segments."""

    def __init__(self, path: str | Path | Location, storage_options: Mapping | None = None):
        self.path = locate(path, storage_options)
        self.backend = self.path.backend
        # zreplay's own files of the root (writer claims, schema marker, learners) and
        # the segments are written and deleted under these: never through a link.
        for d in (META, claims_dir(self.path), learners_dir(self.path), SEGMENTS):
            self.backend.confine(self.path, self.path / d if isinstance(d, str) else d)

    @property
    def segments_dir(self) -> Location:
        return self.path / SEGMENTS

    def segment_dir(self, writer_id: str) -> Location:
        check_key_component(writer_id, "segments")
        seg = self.segments_dir / writer_id
        self.backend.confine(self.path, seg / META)  # its commit record, lock, staging
        return seg

    # -- metadata -------------------------------------------------------------------

    def read_meta(self) -> dict:
        """The root's zreplay metadata (``{format, schema, layout, created}``); a root of
        another format version is a FormatError (an older one says to upgrade it)."""
        info = self.stored_meta()
        if info.get("format") != FORMAT_VERSION:
            raise old_format_error(self.path, info.get("format"))
        return info

    def stored_meta(self) -> dict:
        """The root's zreplay metadata as stored, whatever its format version (for
        store/upgrade.py; everything else reads :meth:`read_meta`)."""
        meta = self.path / "zarr.json"
        try:
            try:
                text = meta.read_text()
            except FileNotFoundError:
                if not _recovered(self.path):
                    raise
                text = meta.read_text()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            if leftover_of_buffer(self.path):
                raise FormatError(
                    f"{self.path} holds zreplay's files but no zarr.json: a buffer being "
                    "created or removed (overwrite=True) right now; open it again in a "
                    "moment (if it stays so, a removal was interrupted: start it afresh "
                    "with overwrite=True)"
                ) from None
            raise FormatError(
                f"{self.path} is not a zreplay buffer (no zarr.json); a writable buffer "
                "made with this path creates one"
            ) from None
        try:
            attrs = json.loads(text).get("attributes", {})
        except ValueError as e:
            raise CorruptBufferError(f"{meta} is not valid JSON ({e})") from None
        if ATTR not in attrs:
            raise FormatError(f"{self.path} is a Zarr group but not a zreplay buffer")
        if not isinstance(attrs[ATTR], dict):
            raise CorruptBufferError(f"{meta}: attributes.{ATTR} is not an object")
        return attrs[ATTR]

    def recover(self) -> bool:
        """Finish (or undo) a replacement of this buffer's tree that a crash interrupted
        (a checkpoint saved over it): anything that opens a buffer calls this first, so
        it sees the old tree or the new, never a committed replacement left undone."""
        return _recovered(self.path)

    def create(self, extra: Mapping | None = None) -> dict:
        """Create the root group if absent; returns its zreplay metadata.

        Several writers may create the same buffer at once (in other processes, on other
        hosts): the root's ``zarr.json`` appears complete in one exclusive create, and
        the losers of that race read the winner's.
        """
        self.recover()
        meta = self.path / "zarr.json"
        if meta.is_file():
            info = self.read_meta()  # or the specific error of a damaged or foreign root
            self._complete()  # a creation killed after the root's zarr.json: finished now
            return info
        # Temp files are another writer's zarr.json on its way in (written aside, then
        # linked into place): the buffer is being created, not foreign.
        if (
            self.path.exists()
            and any(not is_temp_name(p.name) for p in self.path.iterdir())
            and not meta.is_file()  # another writer may have created it just now
        ):
            if leftover_of_buffer(self.path):
                raise FormatError(
                    f"{self.path} holds zreplay's files but no zarr.json: a buffer whose "
                    "removal was interrupted (or being made right now); start it afresh "
                    "with overwrite=True"
                )
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
        self._complete()
        return info if won else self.read_meta()

    def _complete(self) -> None:
        """Make the root's other nodes (``segments/zarr.json``, the ``zreplay`` meta node)
        if absent.  A writer killed between the root's ``zarr.json`` and these leaves a
        buffer plain Zarr cannot open and checkpoints fail on, so every writer that opens
        it finishes them; each is one exclusive create, so writers racing here agree."""
        self.segments_dir.mkdir(exist_ok=True)
        # A writer killed while writing one of the root's shared files left its temp file
        # (plain Zarr warns on it): the root, segments/ and zreplay/ take no segment lock,
        # so a temp there goes only once its writer is known dead.
        for d in (self.path, self.segments_dir, self.path / META, claims_dir(self.path)):
            self.backend.remove_dead_temps(d)
        if not (self.segments_dir / "zarr.json").is_file():
            self.backend.create_exclusive(self.segments_dir / "zarr.json", group_json({}))
        self.create_meta_node(self.path)

    def unfinished(self) -> list[Location]:
        """The nodes of the root a creation makes after its ``zarr.json`` that are missing
        (a writer killed while creating the buffer; the next writer makes them)."""
        nodes = [self.segments_dir / "zarr.json", self.path / META / "zarr.json"]
        return [n for n in nodes if not n.is_file()]

    def create_meta_node(self, parent: Location) -> None:
        """The ``zreplay`` array node under ``parent`` (the root, or a segment) that holds
        zreplay's own files where Zarr does not look (if it is not there yet)."""
        node = parent / META
        node.mkdir(parents=True, exist_ok=True)
        if not (node / "zarr.json").is_file():
            self.backend.create_exclusive(node / "zarr.json", meta_node_json())

    def schema(
        self, info: Mapping | None = None
    ) -> tuple[Schema | None, dict[str, KeyLayout] | None]:
        """The schema and layouts the root records (``info``: its metadata as just read
        by :meth:`read_meta`, else read now)."""
        info = self.read_meta() if info is None else info
        if not info.get("schema"):
            return None, None
        return _schema_record(info, self.path / "zarr.json", keys_match=True)

    def set_schema(self, schema: Schema, layouts: Mapping[str, KeyLayout]) -> dict[str, KeyLayout]:
        """Fix the schema once and return the layouts every segment uses: this writer's,
        or those of the writer that fixed the schema first (writers of a new buffer may
        race: an exclusive create of ``zreplay/schema.json`` picks one).  A different
        schema already fixed is a SchemaError."""
        current, recorded = self.schema()
        if current is None:
            marker = self.path / META / SCHEMA_NAME
            mine = {"schema": schema.to_json(), "layout": {k: vars(v) for k, v in layouts.items()}}
            if not self.backend.create_exclusive(marker, json.dumps(mine).encode()):
                mine = None  # another writer fixed it first
            current, recorded = self._recorded(marker, mine)
            if current == schema:
                self.replace_schema(current, recorded)  # the same for every writer
        if current != schema:
            raise SchemaError(f"{self.path} already has a different schema: {current.to_json()}")
        return recorded

    def _recorded(self, marker: Location, mine: dict | None) -> tuple[Schema, dict]:
        """The schema and layouts of ``mine`` (this writer's record) or, if None, of the
        record at ``marker`` that another writer made, checked as a root's are."""
        try:
            doc = json.loads(marker.read_bytes()) if mine is None else mine
        except ValueError as e:
            raise CorruptBufferError(
                f"{marker}: the recorded schema or layout is invalid ({e}); the buffer's "
                "root metadata is damaged (restore it from a checkpoint)"
            ) from None
        return _schema_record(doc, marker, keys_match=False)

    def replace_schema(
        self, schema: Schema | None, layouts: Mapping[str, KeyLayout] | None
    ) -> None:
        """Overwrite the schema (or reset it to None); only when no other segment has data."""
        marker = self.path / META / SCHEMA_NAME
        if schema is None:
            marker.unlink(missing_ok=True)
        elif marker.is_file():
            record = {
                "schema": schema.to_json(),
                "layout": {k: vars(v) for k, v in layouts.items()},
            }
            self.backend.publish(marker, json.dumps(record).encode(), durable=True)
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

    def schema_guard(self):
        """Held while a writer reads the recorded schema and layout and creates its
        arrays in them, and while a load checks them and replaces them: a writer joining
        during a load's swap creates its arrays in the layout the load leaves (a flock
        locally and on NFS; nothing where the store has no locks)."""
        return self.backend.guard(self.path / META / SCHEMA_NAME)

    # -- segments -------------------------------------------------------------------

    def segment_dirs(self) -> list[Location]:
        """Every directory of ``segments/`` that may be a segment, sorted by name (hidden
        staging trees of a replace skipped).  Their names become paths, so a name no
        writer id can have (``..``, a separator, a control character) is
        CorruptBufferError, and so is a link (see ``Backend.confine``)."""
        try:
            entries = sorted(self.segments_dir.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for p in entries:
            if p.name.startswith(".") or p.name == "zarr.json" or is_temp_name(p.name):
                continue  # a replace's .<w>.partial-... trees, the group's own files
            if not p.is_dir():  # (fsspec's is_dir is a guess: never asked of zarr.json)
                continue
            if not safe_component(p.name):
                raise CorruptBufferError(
                    f"{self.segments_dir}: entry {p.name!r} is not a name a writer id can "
                    "have (1-128 characters from [A-Za-z0-9_.-]); the buffer was made or "
                    "changed by something other than zreplay. Remove or rename it"
                )
            out.append(self.segment_dir(p.name))
        return out

    def writer_ids(self) -> list[str]:
        """Segments present on disk (those with a zarr.json), sorted by name."""
        return [p.name for p in self.segment_dirs() if (p / "zarr.json").is_file()]

    def committed_ids(self) -> list[str]:
        """Segments with a commit record, sorted by name: those of :meth:`writer_ids`,
        and one that committed before it had arrays (a buffer emptied or never added to,
        whose commit carries its sampler and facade state)."""
        return [
            p.name
            for p in self.segment_dirs()
            if (p / "zarr.json").is_file() or commit_path(p).is_file()
        ]

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
        for p in _entries(d):
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
        """Delete a segment's arrays (its writer, under its lock, only; its commit record
        says first that none of their rows are visible)."""
        d = self.segment_dir(writer_id)
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


def _schema_record(doc, where: Location, keys_match: bool) -> tuple[Schema, dict]:
    """The schema and key layouts a record (``{"schema": ..., "layout": ...}``) at
    ``where`` holds, checked as names and numbers read from disk are (CorruptBufferError
    naming ``where``); ``keys_match``: a layout for exactly the schema's keys."""
    try:
        schema = Schema.from_json(doc["schema"])
        layouts = {k: KeyLayout.from_json(v) for k, v in doc["layout"].items()}
        if keys_match and set(layouts) != set(schema.keys):
            raise ValueError(f"layouts for {sorted(layouts)}, keys {schema.keys}")
    except (ValueError, TypeError, KeyError, AttributeError, SchemaError) as e:
        raise CorruptBufferError(
            f"{where}: the recorded schema or layout is invalid ({e}); the buffer's "
            "root metadata is damaged (restore it from a checkpoint)"
        ) from None
    return schema, layouts
