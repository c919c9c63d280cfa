"""Where a buffer lives: a local directory (``pathlib.Path``) or an object-store prefix.

The store layer is written against the small part of ``pathlib.Path`` it needs
(``/``, ``name``, ``parent``, ``read_text``, ``is_file``, ``iterdir``, ``mkdir``,
``unlink``).  A local buffer uses ``Path`` itself, so nothing changes for it; an
``s3://bucket/prefix`` URL (or any fsspec URL) becomes a :class:`RemotePath` offering the
same methods over an fsspec filesystem (s3fs for S3).  The few operations whose
guarantees differ (atomic publish, exclusive create, recursive delete, copy) are functions
here that pick the right primitive:

* **publish** (``commit.json``): temp file + fsync + rename locally; one PUT on S3, which
  is atomic (a reader sees the old object or the new one, never a torn one);
* **exclusive create** (writer lock, writer numbers): ``O_EXCL`` locally; a conditional
  PUT (``If-None-Match: *``) on S3, which S3 and moto honour.

``storage_options`` (e.g. ``{"endpoint_url": ..., "key": ..., "secret": ...}``) are passed
to fsspec; without them s3fs reads the usual AWS environment variables and config files.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

# Filesystems that cache directory listings unless told not to.
_LISTING_CACHES = ("s3", "s3a", "gs", "gcs", "az", "abfs")


class RemotePath:
    """A path inside an fsspec filesystem with the ``pathlib.Path`` subset zreplay uses.

    ``str()`` gives the full URL (``s3://bucket/prefix/...``), which zarr and fsspec accept
    together with :attr:`storage_options`.
    """

    def __init__(self, fs, path: str, protocol: str, storage_options: Mapping[str, Any]):
        self.fs = fs
        self.key = path.strip("/")
        self.protocol = protocol
        self.storage_options = dict(storage_options)

    # -- pathlib-like surface --------------------------------------------------------

    def _with(self, key: str) -> RemotePath:
        return RemotePath(self.fs, key, self.protocol, self.storage_options)

    def __truediv__(self, name: str) -> RemotePath:
        return self._with(f"{self.key}/{str(name).strip('/')}")

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def parent(self) -> RemotePath:
        return self._with(self.key.rsplit("/", 1)[0] if "/" in self.key else self.key)

    def with_name(self, name: str) -> RemotePath:
        return self.parent / name

    def __str__(self) -> str:
        return f"{self.protocol}://{self.key}"

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RemotePath) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __lt__(self, other: RemotePath) -> bool:
        return str(self) < str(other)

    def resolve(self) -> RemotePath:
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

    def iterdir(self) -> Iterator[RemotePath]:
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


Location = Path | RemotePath


def is_url(path: Any) -> bool:
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def location(path: str | os.PathLike | RemotePath, storage_options: Mapping | None = None):
    """``path`` as a :class:`Path` (local) or :class:`RemotePath` (an fsspec URL)."""
    if isinstance(path, (Path, RemotePath)):
        return path
    if isinstance(path, str) and path.startswith("file://"):
        return Path(path[len("file://") :])
    if is_url(path):
        protocol = path.split("://", 1)[0]
        options = dict(storage_options or {})
        if protocol in _LISTING_CACHES:
            # Other processes add segments and commits: a cached listing would hide them.
            options.setdefault("use_listings_cache", False)
        import fsspec  # only object stores need it (with s3fs: pip install zreplay[s3])

        fs, key = fsspec.core.url_to_fs(path, **options)
        return RemotePath(fs, key, protocol, options)
    return Path(path)


def is_remote(loc: Location) -> bool:
    return isinstance(loc, RemotePath)


def url_of(loc: Location) -> str:
    """A string that names ``loc`` for zarr / fsspec (a local path or a URL)."""
    return str(loc)


def options_of(loc: Location) -> dict:
    """fsspec ``storage_options`` needed to reach ``loc`` again (empty for local paths)."""
    return dict(loc.storage_options) if isinstance(loc, RemotePath) else {}


def zarr_store(loc: Location, read_only: bool = False):
    """A zarr store (or local path) rooted at ``loc``."""
    if isinstance(loc, RemotePath):
        from zarr.storage import FsspecStore

        return FsspecStore.from_url(
            str(loc), storage_options=loc.storage_options, read_only=read_only
        )
    return str(loc)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``: a write that runs into a full disk or a file size limit
    stores only part of it and returns the short count (the next one raises OSError)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def create_exclusive(loc: Location, data: bytes) -> bool:
    """Create ``loc`` holding ``data`` only if nothing is there; False if something is.

    Nobody ever sees the file without its content.  Local: a temp file, fsync'd, then
    hard-linked to the name (``link`` fails if the name exists; atomic on local
    filesystems and NFS).  Remote: a conditional PUT.
    """
    if isinstance(loc, RemotePath):
        try:
            loc.fs.pipe_file(loc.key, data, mode="create")
        except FileExistsError:
            return False
        return True
    tmp = loc.with_name(f"{loc.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        _write_synced(tmp, data, os.O_EXCL)
        try:
            os.link(tmp, loc)
        except FileExistsError:
            return False
        except OSError:  # no hard links on this filesystem: O_EXCL (a brief empty window)
            try:
                _write_synced(loc, data, os.O_EXCL)
            except FileExistsError:
                return False
            except OSError:
                loc.unlink(missing_ok=True)  # never leave it half-written
                raise
    except OSError as e:
        if isinstance(e, FileExistsError):
            raise
        raise OSError(e.errno, e.strerror, str(loc)) from e
    finally:
        tmp.unlink(missing_ok=True)
    return True


def _write_synced(path: Path, data: bytes, flags: int = 0) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_tree(loc: Location) -> None:
    """Delete ``loc`` and everything under it; a missing ``loc`` is not an error."""
    if isinstance(loc, RemotePath):
        try:
            loc.fs.rm(loc.key, recursive=True)
        except FileNotFoundError:
            pass
        loc.fs.invalidate_cache(loc.key)
        return
    shutil.rmtree(loc, ignore_errors=True)


def walk_files(loc: Location) -> Iterator[tuple[str, Location]]:
    """Every file under ``loc`` as ``(relative path with '/', location)``."""
    if isinstance(loc, RemotePath):
        try:
            found = loc.fs.find(loc.key, withdirs=False)
        except FileNotFoundError:
            return
        for key in sorted(found):
            rel = key.strip("/")[len(loc.key) + 1 :]
            if rel:
                yield rel, loc._with(key)
        return
    for dirpath, _dirs, files in os.walk(loc):
        for name in files:
            p = Path(dirpath) / name
            yield p.relative_to(loc).as_posix(), p


def copy_file(src: Location, dst: Location) -> None:
    """Copy one file, server-side when both ends are in the same object store."""
    if isinstance(src, RemotePath) and isinstance(dst, RemotePath) and src.fs is dst.fs:
        src.fs.copy(src.key, dst.key)
    elif isinstance(src, Path) and isinstance(dst, Path):
        shutil.copy2(src, dst)
    else:
        if isinstance(dst, Path):
            dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(src.read_bytes())
