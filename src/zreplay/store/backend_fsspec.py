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

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from . import objectswap
from .arrays import ZarrArray
from .backend import Backend

# Filesystems that cache directory listings unless told not to.
_LISTING_CACHES = ("s3", "s3a", "gs", "gcs", "az", "abfs")


class ObjectPath:
    """A key prefix in an fsspec filesystem with the ``pathlib.Path`` subset zreplay uses.

    ``str()`` gives the full URL (``s3://bucket/prefix/...``), which zarr and fsspec accept
    together with the backend's ``storage_options``.
    """

    def __init__(self, backend: FsspecBackend, key: str):
        self.backend = backend
        self.key = key.strip("/")

    @property
    def fs(self):
        return self.backend.fs

    def _with(self, key: str) -> ObjectPath:
        return ObjectPath(self.backend, key)

    def __truediv__(self, name: str) -> ObjectPath:
        return self._with(f"{self.key}/{str(name).strip('/')}")

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> ObjectPath:
        return self._with(self.key.rsplit("/", 1)[0] if "/" in self.key else self.key)

    def with_name(self, name: str) -> ObjectPath:
        return self.parent / name

    def __str__(self) -> str:
        return f"{self.backend.protocol}://{self.key}"

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ObjectPath) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __lt__(self, other: ObjectPath) -> bool:
        return str(self) < str(other)

    def resolve(self) -> ObjectPath:
        return self

    def read_bytes(self) -> bytes:
        return self.fs.cat_file(self.key)

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def write_bytes(self, data: bytes) -> None:
        self.fs.pipe_file(self.key, data)

    def is_file(self) -> bool:
        try:
            return self.fs.info(self.key).get("type") == "file"
        except FileNotFoundError:
            return False

    def exists(self) -> bool:
        self.fs.invalidate_cache(self.key)
        return self.fs.exists(self.key)

    def is_dir(self) -> bool:
        return self.exists() and not self.is_file()

    def iterdir(self) -> Iterator[ObjectPath]:
        try:
            names = self.fs.ls(self.key, detail=False, refresh=True)
        except FileNotFoundError:
            return iter(())
        return iter(self._with(n) for n in sorted(names) if n.strip("/") != self.key)

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Object stores have no directories: a prefix exists once an object is under it."""

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise


class FsspecBackend(Backend):
    """One fsspec filesystem, reached with ``storage_options``."""

    def __init__(self, fs, protocol: str, storage_options: Mapping[str, Any]):
        self.fs = fs
        self.protocol = protocol
        self._options = dict(storage_options)

    @classmethod
    def for_url(cls, url: str, storage_options: Mapping | None) -> ObjectPath:
        protocol = url.split("://", 1)[0]
        options = dict(storage_options or {})
        if protocol in _LISTING_CACHES:
            # Other processes add segments and commits: a cached listing would hide them.
            options.setdefault("use_listings_cache", False)
        import fsspec  # only object stores need it (with s3fs: pip install zreplay[s3])

        fs, key = fsspec.core.url_to_fs(url, **options)
        return ObjectPath(cls(fs, protocol, options), key)

    @property
    def storage_options(self) -> dict:
        return dict(self._options)

    # -- files --------------------------------------------------------------------

    def publish(self, loc, data: bytes, durable: bool) -> None:
        loc.write_bytes(data)

    def create_exclusive(self, loc, data: bytes) -> bool:
        try:
            self.fs.pipe_file(loc.key, data, mode="create")
        except FileExistsError:
            return False
        return True

    def remove_tree(self, loc) -> None:
        try:
            self.fs.rm(loc.key, recursive=True)
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache(loc.key)

    def move_tree(self, src, dst) -> None:
        for rel, s in self.walk_files(src):
            self.import_file(s, dst / rel)
        self.remove_tree(src)

    def remove_file(self, loc, up_to) -> None:
        loc.unlink(missing_ok=True)  # no directories to leave behind

    def walk_files(self, loc) -> Iterator[tuple[str, ObjectPath]]:
        try:
            found = self.fs.find(loc.key, withdirs=False)
        except FileNotFoundError:
            return
        for key in sorted(found):
            rel = key.strip("/")[len(loc.key) + 1 :]
            if rel:
                yield rel, loc._with(key)

    def import_file(self, src, dst, link: bool = True) -> bool:
        if src.backend is self:
            self.fs.copy(src.key, dst.key)
        else:
            dst.write_bytes(src.read_bytes())
        return False

    def remove_temps(self, loc, committed_shards: Mapping[str, int] | None = None) -> list:
        return []  # object stores publish whole objects: no temp files are ever left

    def guard(self, loc, timeout: float | None = None) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def staged_tree(self, dest) -> contextlib.AbstractContextManager:
        return objectswap.staged(dest)  # no rename: staged, then rolled forward

    def recover_tree(self, loc) -> bool:
        return objectswap.recover(loc)

    def du(self, loc) -> int:
        return int(self.fs.du(loc.key)) if loc.exists() else 0

    # -- arrays -------------------------------------------------------------------

    def zarr_store(self, loc, read_only: bool = False):
        from zarr.storage import FsspecStore

        return FsspecStore.from_url(str(loc), storage_options=self._options, read_only=read_only)

    def array_context(self, durable: bool, cache_bytes: int = 0):
        return None  # zarr-python keeps no decoded chunks

    def open_array(self, loc, writable: bool, context) -> tuple[object, bool]:
        # zarr-python reads a missing chunk as fill values.
        return ZarrArray(loc, writable), True
