"""The object-store backend: any fsspec filesystem (s3fs for ``s3://``), zarr-python arrays.

* publish: one PUT, atomic in S3 (a reader sees the old object or the new one);
* exclusive create: a conditional PUT (``If-None-Match: *``), which S3 and moto honour;
* copies: server-side within one store;
* no flock (the guard is a no-op) and no temp files to recover (objects appear whole);
* arrays: zarr-python through zarr's ``FsspecStore``.

``storage_options`` (e.g. ``{"endpoint_url": ..., "key": ..., "secret": ...}``) go to
fsspec; without them s3fs reads the usual AWS environment variables and config files.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .arrays import ZarrArray
from .backend import (
    MAX_READ_BYTES,
    ObjectBackend,
    ObjectLocation,
    max_copy_bytes,
    too_big_to_copy,
    too_big_to_read,
)

# Filesystems that cache directory listings unless told not to.
_LISTING_CACHES = ("s3", "s3a", "gs", "gcs", "az", "abfs")


class FsspecBackend(ObjectBackend):
    """One fsspec filesystem, reached with ``storage_options``."""

    slash_at_bucket = False  # gs://bucket, as fsspec spells a bucket

    def __init__(self, fs, protocol: str, storage_options: Mapping[str, Any]):
        self.fs = fs
        self.protocol = protocol
        self._options = dict(storage_options)

    @classmethod
    def for_url(cls, url: str, storage_options: Mapping | None) -> ObjectLocation:
        protocol = url.split("://", 1)[0]
        options = dict(storage_options or {})
        if protocol in _LISTING_CACHES:
            # Other processes add segments and commits: a cached listing would hide them.
            options.setdefault("use_listings_cache", False)
        import fsspec  # only object stores need it (with s3fs: pip install zreplay[s3])

        fs, path = fsspec.core.url_to_fs(url, **options)
        bucket, _, key = path.strip("/").partition("/")
        return ObjectLocation(cls(fs, protocol, options), bucket, key)

    @property
    def storage_options(self) -> dict:
        return dict(self._options)

    # -- one object -------------------------------------------------------------------

    def read_object(self, loc) -> bytes:
        return self._whole(loc, MAX_READ_BYTES, too_big_to_read)

    def read_data(self, loc) -> bytes:
        return self._whole(loc, max_copy_bytes(), too_big_to_copy)

    def _whole(self, loc, limit: int, too_big) -> bytes:
        """The object ``loc`` read whole, refused (``too_big``) over ``limit`` bytes from
        the size its store reports (a store reporting none is read, then judged)."""
        size = int(self.fs.info(loc.path).get("size") or 0)
        if size > limit:
            raise too_big(loc, size, limit)
        body = self.fs.cat_file(loc.path)
        if len(body) > limit:  # (grown since its size was read)
            raise too_big(loc, len(body), limit)
        return body

    def write_object(self, loc, data: bytes) -> None:
        self.fs.pipe_file(loc.path, data)

    def is_object(self, loc) -> bool:
        try:
            return self.fs.info(loc.path).get("type") == "file"
        except FileNotFoundError:
            return False

    def exists(self, loc) -> bool:
        self.fs.invalidate_cache(loc.path)
        return self.fs.exists(loc.path)

    def is_prefix(self, loc) -> bool:
        return self.exists(loc) and not self.is_object(loc)

    def child_names(self, loc) -> list[str]:
        try:
            found = self.fs.ls(loc.path, detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(p.strip("/").rpartition("/")[2] for p in found if p.strip("/") != loc.path)

    def unlink_object(self, loc, missing_ok: bool) -> None:
        try:
            self.fs.rm_file(loc.path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def copy_object(self, src, dst) -> None:
        self.fs.copy(src.path, dst.path)

    # -- files --------------------------------------------------------------------

    def publish(self, loc, data: bytes, durable: bool) -> None:
        loc.write_bytes(data)

    def create_exclusive(self, loc, data: bytes) -> bool:
        try:
            self.fs.pipe_file(loc.path, data, mode="create")
        except FileExistsError:
            return False
        return True

    def remove_tree(self, loc) -> None:
        try:
            self.fs.rm(loc.path, recursive=True)
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache(loc.path)

    def walk_files(self, loc) -> Iterator[tuple[str, ObjectLocation]]:
        try:
            found = self.fs.find(loc.path, withdirs=False)
        except FileNotFoundError:
            return
        for key in sorted(found):
            rel = key.strip("/")[len(loc.path) + 1 :]
            if rel:
                yield rel, loc / rel

    def du(self, loc) -> int:
        return int(self.fs.du(loc.path)) if loc.exists() else 0

    # -- arrays -------------------------------------------------------------------

    def zarr_store(self, loc, read_only: bool = False):
        from zarr.storage import FsspecStore

        return FsspecStore.from_url(str(loc), storage_options=self._options, read_only=read_only)

    def array_context(self, durable: bool, cache_bytes: int = 0):
        return None  # zarr-python keeps no decoded chunks

    def open_array(self, loc, writable: bool, context) -> tuple[object, bool]:
        # zarr-python reads a missing chunk as fill values.
        return ZarrArray(loc, writable), True
