"""What the on-disk format needs from the place a buffer lives: the store backend seam.

A *location* is a path inside one backend with the small ``pathlib.Path`` surface the
store layer uses (``/``, ``name``, ``parent``, ``with_name``, ``relative_to``,
``read_bytes``, ``read_text``, ``write_bytes``, ``is_file``, ``is_dir``, ``exists``,
``iterdir``, ``mkdir``, ``unlink``, ``resolve``) plus ``.backend``, the :class:`Backend`
it belongs to.  Local buffers use :class:`~zreplay.store.backend_local.LocalPath` (a
``pathlib.Path``); every object store (S3, other fsspec stores) uses
:class:`ObjectLocation` (``scheme://bucket/key``: ``pathlib``'s arithmetic on the key,
its I/O through the :class:`ObjectBackend` it names).  :func:`zreplay.store.location.locate`
is the one place that picks a backend for a path or URL.

Every operation whose guarantee differs between backends is a method here; nothing above
the backends asks which backend it has.  A new backend (GCS through obstore) is one new file.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from functools import partial
from operator import attrgetter
from pathlib import PurePosixPath
from typing import Any

from ..errors import CorruptBufferError
from .memory import physical_memory


class Backend(ABC):
    """Operations of one kind of store (see the module docstring)."""

    #: True for a local filesystem (paths usable with ``open``, ``os``, h5py).
    is_local: bool = False

    @property
    @abstractmethod
    def storage_options(self) -> dict:
        """Options that reach this store again (fsspec ``storage_options``; {} locally)."""

    # -- files --------------------------------------------------------------------

    @abstractmethod
    def publish(self, loc, data: bytes, durable: bool) -> None:
        """Atomically replace ``loc`` with ``data``: a reader sees the old content or the
        new, never a torn file (temp + fsync + rename locally; one PUT in S3).  An
        ``OSError`` names ``loc``; on failure nothing is left behind."""

    @abstractmethod
    def create_exclusive(self, loc, data: bytes) -> bool:
        """Create ``loc`` holding ``data`` only if nothing is there (False if something
        is).  Nobody ever sees the file without its content."""

    @abstractmethod
    def remove_tree(self, loc) -> None:
        """Delete ``loc`` and everything under it; a missing ``loc`` is not an error."""

    @abstractmethod
    def move_tree(self, src, dst) -> None:
        """Move the tree ``src`` to ``dst`` (absent; same store): a rename where the store
        has one, else copies then removal of ``src``.  Interrupted, ``src`` is still
        whole, so doing it again finishes it."""

    @abstractmethod
    def remove_file(self, loc, up_to) -> None:
        """Delete the file ``loc`` (missing is fine) and every directory between it and
        ``up_to`` that it leaves empty (object stores have none)."""

    @abstractmethod
    def walk_files(self, loc) -> Iterator[tuple[str, Any]]:
        """Every file under ``loc`` as ``(relative path with '/', location)``."""

    @abstractmethod
    def read_data(self, loc) -> bytes:
        """The bytes of the data file ``loc`` (a shard), copied whole between stores by
        :meth:`import_file`: bounded by :func:`max_copy_bytes`, not as records are (a
        layout may make shards larger than any record), never through a symbolic link;
        ``FileNotFoundError`` if it is gone."""

    @abstractmethod
    def import_file(self, src, dst) -> bool:
        """Make ``dst`` (in this backend) hold the bytes of ``src`` (any backend): a hard
        link or server-side copy where possible; returns True if it was linked (shares
        storage with ``src``).  ``FileNotFoundError`` if ``src`` is gone."""

    def import_tree(self, src, dst, skip) -> tuple[int, int]:
        """:meth:`import_file` every file under ``src`` (any backend) whose name
        ``skip(name)`` rejects not, to the same relative path under ``dst``; returns
        ``(linked, copied)``.  Files that vanish meanwhile (evicted shards) are passed."""
        linked = copied = 0
        made = set()
        for rel, s in src.backend.walk_files(src):
            if skip(rel.rsplit("/", 1)[-1]):
                continue
            d = dst / rel
            if d.parent not in made:
                d.parent.mkdir(parents=True, exist_ok=True)
                made.add(d.parent)
            try:
                if self.import_file(s, d):
                    linked += 1
                else:
                    copied += 1
            except FileNotFoundError:
                continue
        return linked, copied

    def confine(self, root, loc) -> None:
        """CorruptBufferError unless ``loc`` (a path zreplay built under the buffer
        ``root``) is where its name says, inside ``root``: nothing zreplay writes, deletes
        or walks may resolve elsewhere.  Object stores have no links: nothing to check."""
        return None

    def check_files(self, loc) -> None:
        """CorruptBufferError if anything under ``loc`` is neither a directory nor a
        regular file (a FIFO an array reader would block on, a device, a link).  Object
        stores hold objects only: nothing to check."""
        return None

    def remove_dead_temps(self, loc) -> list:
        """Delete the temp files (``*.tmp``) directly in the directory ``loc`` whose
        writing process is known to be dead (its tag in the name, see
        :func:`~zreplay.store.liveness.tag_is_dead`): what a writer killed while writing
        the root's shared files leaves (they take no segment lock, so only their writer's
        death says they are orphans).  Object stores write objects whole: none there."""
        return []

    @abstractmethod
    def remove_temps(self, loc, committed_shards: Mapping[str, int] | None = None) -> list:
        """Delete temp files a killed writer left under ``loc`` (recovery); see
        :func:`zreplay.store.commit.remove_orphans`."""

    @abstractmethod
    def guard(self, loc, timeout: float | None = None) -> contextlib.AbstractContextManager:
        """An exclusive cross-process guard named after ``loc`` (a flock beside it), or a
        no-op where the store has none; ``TimeoutError`` if it cannot be had within
        ``timeout`` seconds (None: wait as long as it takes)."""

    def guard_file(self, loc) -> Any:
        """The file :meth:`guard` makes for ``loc`` (to leave a tree as it found it), or
        None where it makes none."""
        return None

    def hold(self, loc) -> Any:
        """Keep an ``flock`` on the file ``loc`` for as long as this process lives (or
        until the returned object's ``release()``): how other processes on this kernel
        tell its owner is alive (:mod:`~zreplay.store.liveness`).  None where the store
        has no such lock."""
        return None

    def probe(self, loc) -> bool | None:
        """Whether a live process on this kernel holds :meth:`hold` on ``loc`` (True or
        False), or None where the store cannot tell."""
        return None

    @abstractmethod
    def staged_tree(self, dest) -> contextlib.AbstractContextManager:
        """Build a new directory tree that replaces ``dest`` in one step: yields the
        location to build in; on a clean exit it replaces ``dest``, on an exception it is
        removed.  A crash leaves ``dest`` as it was or (after ``recover_tree``) the new
        tree (a rename exchange locally, :mod:`~zreplay.store.objectswap` in object
        stores).  The caller writes the root's ``zarr.json`` last."""

    @abstractmethod
    def recover_tree(self, loc) -> bool:
        """Finish or undo a replacement of the tree at ``loc`` (``staged_tree``) that a
        crash interrupted, so ``loc`` is the old tree or the new; True if there was one."""

    @abstractmethod
    def du(self, loc) -> int:
        """Bytes of the files under ``loc`` (a file's own size for a file)."""

    # -- arrays -------------------------------------------------------------------

    @abstractmethod
    def zarr_store(self, loc, read_only: bool = False):
        """What ``zarr.open_group``/``open_array`` take to reach ``loc``."""

    @abstractmethod
    def array_context(self, durable: bool, cache_bytes: int = 0) -> Any:
        """Shared state of the arrays of one segment (opaque; passed to open_array);
        ``cache_bytes``: a cache of decoded chunks that size, where the backend has one."""

    @abstractmethod
    def open_array(self, loc, writable: bool, context: Any) -> tuple[Any, bool]:
        """Open the Zarr array at ``loc`` for reading (and writing): returns ``(handle,
        fills_missing)`` where ``handle`` offers ``shape``, ``[sel].read()`` and
        ``[sel].write(v)`` returning futures, and ``resize(exclusive_max=...)``;
        ``fills_missing`` says a missing chunk reads as fill values instead of failing."""

    def write_held(self, store, start: int, rows: Any, context) -> Any:
        """Start writing ``rows`` at row ``start`` of ``store`` (opened with ``context``);
        returns the write's future.  The caller leaves ``rows`` unchanged until that
        future is done, so a backend may write straight from them instead of copying."""
        return store[start : start + len(rows)].write(rows)

    def widened(self, store, rows: int, context) -> Any:
        """A read-only handle on the array of ``store`` taken as ``rows`` rows long,
        without reading or writing its metadata (a reader's headroom: it reads committed
        rows only).  zreplay's own array classes widen themselves; a backend whose
        ``open_array`` returns other handles says how."""
        return store.widened(rows)

    def file_stamps(self, files) -> list[tuple[int, int, int] | None]:
        """For each of ``files`` (of one directory tree), what changes whenever it is
        written, replaced or restored from a copy (locally: inode, mtime in ns, size; in
        S3: its ETag and size), for caches of its contents kept elsewhere to prove they
        are still its contents; None where a file is missing or the store cannot tell
        cheaply (such a cache is then not trusted: its rows are read again)."""
        return [None] * len(files)

    def tree_stamps(self, loc) -> dict[str, tuple[int, int, int]] | None:
        """``{path relative to loc: stamp}`` (see :meth:`file_stamps`) of every file under
        the directory ``loc``, in one listing where the store lists cheaper than it looks
        files up one by one; None where it does not."""
        return None

    def forget_pages(self, files) -> None:
        """Tell the OS that ``files`` will not be read again soon (their rows were
        decoded elsewhere: the column cache file), so its page cache keeps what will be;
        no-op where there is no such page cache."""
        return None

    def observe_commit(self, context, n_rows: int, reclaimed_below: int, same_rows: bool) -> None:
        """The arrays opened with ``context`` belong to a segment whose commit of
        ``n_rows`` rows was just read (``same_rows``: it continues the rows of the commit
        seen before; False after the segment was cleared or replaced).  A backend that
        caches what it read of committed rows keeps or drops it here; no-op otherwise."""
        return None

    #: Fraction of the RAM tier one commit may cover (the committer's job size): small
    #: commits release adds waiting for room early; an object store, where every commit
    #: re-uploads the shards it touches and the index chunks, takes everything published.
    commit_tier_share: float = 0.25


# The largest file or object read whole as one (JSON records and metadata: commit.json,
# zarr.json, lock files, learners' progress; data is read by TensorStore or the shard
# reader, not here): a buffer may come from a stranger, and a record gigabytes long would
# be read into memory before anything could refuse it.
MAX_READ_BYTES = 256 << 20


class TooBigToRead(CorruptBufferError):
    """A record (or, copied between stores, a data file) larger than zreplay reads whole;
    ``size``: the bytes it holds, or at least."""

    def __init__(self, message: str, size: int):
        super().__init__(message)
        self.size = size


def max_copy_bytes() -> int:
    """The largest data file copied whole between a disk and an object store (one read,
    then one write): half the memory this process may have.  A shard any layout makes is
    far below; a file planted larger (sparse: KBs on disk) is refused before it is read."""
    return physical_memory() // 2


def too_big_to_copy(where, size: int, limit: int) -> TooBigToRead:
    return TooBigToRead(
        f"{where} is {size:,} bytes or more, more than the {limit:,} (half the memory this "
        "process may have) a copy between a disk and an object store holds at once: the "
        "buffer is damaged or was crafted. Restore it from a checkpoint",
        size,
    )


def too_big_to_read(where, size: int, limit: int) -> TooBigToRead:
    return TooBigToRead(
        f"{where} is {size:,} bytes or more, more than any file zreplay reads whole (its "
        f"records and metadata; at most {limit:,}): the buffer is damaged or "
        "was crafted. Restore it from a checkpoint",
        size,
    )


def _normal(key: str) -> str:
    """``key`` as ``PurePosixPath`` spells it, relative: no empty or ``.`` parts."""
    return "/".join(p for p in key.split("/") if p and p != ".")


class _Request:
    """An :class:`ObjectLocation` file method that is its backend's request of that name
    with the location first (``loc.read_bytes()`` is ``loc.backend.read_object(loc)``):
    the ``pathlib.Path`` name is the whole of what the location adds."""

    def __init__(self, request: str):
        self.request = request

    def __set_name__(self, owner: type, name: str) -> None:
        self.__doc__ = f"``Path.{name}``: the backend's ``{self.request}(loc, ...)``."

    def __get__(self, loc: ObjectLocation | None, owner: type | None = None) -> Any:
        return self if loc is None else partial(getattr(loc.backend, self.request), loc)


class ObjectLocation:
    """A key in a bucket of an object store, ``scheme://bucket/key``, with the
    ``pathlib.Path`` subset zreplay uses (see the module docstring).

    Its arithmetic (``/``, ``name``, ``parent``, ``with_name``, ``relative_to``) is
    ``PurePosixPath``'s on the key, the bucket being the root (``parent`` never leaves
    it); it does no I/O.  Its file methods are its backend's (:class:`ObjectBackend`).
    ``str()`` is the URL, which zarr, fsspec and :func:`~zreplay.store.location.locate`
    take back (with the backend's ``storage_options``)."""

    __slots__ = ("backend", "bucket", "key")

    def __init__(self, backend: ObjectBackend, bucket: str, key: str):
        self.backend = backend
        self.bucket = bucket
        self.key = _normal(key)

    scheme = property(attrgetter("backend.protocol"), doc="The URL scheme: the backend's protocol.")

    @property
    def path(self) -> str:
        """``bucket/key``: the object's path as fsspec filesystems name it."""
        return f"{self.bucket}/{self.key}" if self.key else self.bucket

    # -- arithmetic (no I/O) ----------------------------------------------------------

    def __truediv__(self, name) -> ObjectLocation:
        return ObjectLocation(self.backend, self.bucket, f"{self.key}/{name}")

    @property
    def name(self) -> str:
        return self.key.rpartition("/")[2]

    @property
    def parent(self) -> ObjectLocation:
        return ObjectLocation(self.backend, self.bucket, self.key.rpartition("/")[0])

    def with_name(self, name: str) -> ObjectLocation:
        return self.parent / name

    def relative_to(self, other: ObjectLocation) -> PurePosixPath:
        """This key below ``other``'s (``ValueError`` if it is not below it)."""
        same = isinstance(other, ObjectLocation) and (other.scheme, other.bucket) == (
            self.scheme,
            self.bucket,
        )
        if same and (not other.key or self.key == other.key):
            return PurePosixPath(self.key[len(other.key) :].lstrip("/"))
        if same and self.key.startswith(other.key + "/"):
            return PurePosixPath(self.key[len(other.key) + 1 :])
        raise ValueError(f"{self} is not under {other}")

    def resolve(self) -> ObjectLocation:
        return self  # no links in an object store

    def __str__(self) -> str:
        if self.key or self.backend.slash_at_bucket:
            return f"{self.scheme}://{self.bucket}/{self.key}"
        return f"{self.scheme}://{self.bucket}"

    def __repr__(self) -> str:
        return f"ObjectLocation({str(self)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ObjectLocation) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __lt__(self, other: ObjectLocation) -> bool:
        return str(self) < str(other)

    # -- files (the backend's requests) -------------------------------------------------

    read_bytes = _Request("read_object")
    write_bytes = _Request("write_object")
    is_file = _Request("is_object")
    is_dir = _Request("is_prefix")
    exists = _Request("exists")

    def read_text(self) -> str:
        return self.read_bytes().decode()

    def iterdir(self) -> Iterator[ObjectLocation]:
        return iter([self / n for n in self.backend.child_names(self)])

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Object stores have no directories: a prefix exists once an object is under it."""

    def unlink(self, missing_ok: bool = False) -> None:
        """``Path.unlink`` (its default too): the backend's ``unlink_object``."""
        self.backend.unlink_object(self, missing_ok)


class ObjectBackend(Backend):
    """An object store: no directories, links, flocks or temp files; every write is a
    whole object, and a tree is replaced by :mod:`~zreplay.store.objectswap`.  A
    subclass says how to reach one object (its requests) and names its locations."""

    protocol: str
    #: ``str()`` of a bucket's root location ends with ``/`` (``s3://bucket/``).
    slash_at_bucket: bool = True

    # -- one object (what ObjectLocation's file methods do) ---------------------------

    @abstractmethod
    def read_object(self, loc: ObjectLocation) -> bytes:
        """The bytes of the object ``loc`` (a record: at most ``MAX_READ_BYTES``, else
        CorruptBufferError before its body is read); ``FileNotFoundError`` if there is
        none."""

    @abstractmethod
    def write_object(self, loc: ObjectLocation, data: bytes) -> None:
        """Store ``data`` as the object ``loc`` (one PUT)."""

    @abstractmethod
    def is_object(self, loc: ObjectLocation) -> bool:
        """Whether an object is stored at ``loc``."""

    @abstractmethod
    def is_prefix(self, loc: ObjectLocation) -> bool:
        """Whether objects are stored below ``loc`` (a "directory")."""

    def exists(self, loc: ObjectLocation) -> bool:
        return self.is_object(loc) or self.is_prefix(loc)

    @abstractmethod
    def child_names(self, loc: ObjectLocation) -> list[str]:
        """Names of the objects and prefixes one level below ``loc``, sorted."""

    @abstractmethod
    def unlink_object(self, loc: ObjectLocation, missing_ok: bool) -> None:
        """Delete the object ``loc`` (``FileNotFoundError`` if it is missing, unless
        ``missing_ok``)."""

    @abstractmethod
    def copy_object(self, src: ObjectLocation, dst: ObjectLocation) -> None:
        """Copy the object ``src`` to ``dst`` in this store (server-side)."""

    # -- what every object store does alike ---------------------------------------------

    def move_tree(self, src, dst) -> None:
        for rel, s in self.walk_files(src):  # no rename: server-side copies, then removal
            self.copy_object(s, dst / rel)
        self.remove_tree(src)

    def remove_file(self, loc, up_to) -> None:
        loc.unlink(missing_ok=True)  # no directories to leave behind

    def import_file(self, src, dst, link: bool = True) -> bool:
        if src.backend is self:
            self.copy_object(src, dst)
        else:
            dst.write_bytes(src.backend.read_data(src))
        return False

    def remove_temps(self, loc, committed_shards: Mapping[str, int] | None = None) -> list:
        return []  # objects appear whole: no temp files are ever left

    def guard(self, loc, timeout: float | None = None) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def staged_tree(self, dest) -> contextlib.AbstractContextManager:
        from . import objectswap

        return objectswap.staged(dest)  # no rename: staged, then rolled forward

    def recover_tree(self, loc) -> bool:
        from . import objectswap

        return objectswap.recover(loc)
