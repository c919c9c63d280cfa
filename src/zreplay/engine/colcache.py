"""Small columns, uncompressed, in a local file the page cache serves: the newest
committed rows of every key whose rows are at most :data:`SMALL_ROW_BYTES` (flags,
rewards, actions, state vectors), shared by every process on the machine that reads the
same segment.

Drawing rows at random from a compressed store costs, per row and key, a chunk lookup and
the decoding of a whole inner chunk (up to 1,024 rows) for one row: at 30M rows of state
data that was 100x a memory map.  A segment's :class:`ColumnCache` keeps those columns
decoded for rows ``[lo, hi)`` in a ring (global row ``r`` in slot ``r % slots``), so a
read of them is one numpy fancy index into mapped memory, as fast as a memory map of the
same rows; images and other large rows are still read from the store.

**Where**: one file per segment contents under the cache directory (``ZREPLAY_CACHE_DIR``,
else ``$XDG_CACHE_HOME/zreplay/columns``, else ``~/.cache/zreplay/columns``), named by a
hash of the segment's location, its contents id (new at every clear, loaded checkpoint or
replacement, so rows never change under a name) and the cached keys' names, dtypes and
shapes.  Every process that reads the segment (the writer's own ``sample``, views,
DataLoader workers, a notebook) maps the same file, so the rows are decoded once per
machine and held once by the page cache, which evicts them under memory pressure like any
file (nothing is pinned in RAM).  Where the directory cannot be written, or for segments
written before contents ids (format <= 3), the ring is anonymous memory of this process.
Those names follow from facts anyone can read, so the directory must be one no other
user can put files in: made mode 0700 if missing, and used only while it is a directory
(not a link) of this user's that nobody else can write; else the rows stay in each
process's memory, with a warning.  Its files are opened without following links, and one
that is not this user's regular file is never mapped.

**Filling**: it follows the commit, not the add path: :meth:`ColumnCache.cover` extends
the ring with one range read per key of the committed rows it lacks (under an exclusive
``flock`` of the file's lock file; readers take no lock).  It is filled only when a read
needs it (the first read of a cached key below the writer's RAM tier, or any read of a
view), so a buffer that never reads old small rows pays nothing, and a second process or
a reopened view finds the rows already there.  The header publishes ``lo`` and ``hi``:
a filler raises ``lo`` *before* it overwrites the slots of rows below it and raises ``hi``
only after the rows are written and checked against the commit (rows a writer evicted and
deleted meanwhile read as zeros; they are never published), so a reader that finds ``lo``
unchanged after its gather read only valid rows, and one that does not reads them from the
store instead.  A filler killed mid-way publishes nothing; the file records the boot it was
written in, and one from an earlier boot (whose pages may never have reached the disk) is
made anew.  A buffer restored in place from an older copy keeps its path, inode, row
numbers and contents id, so the name proves nothing about the rows: a filler first
appends the stamps of the shard files it reads (locally inode, mtime and size; in S3
ETag and size from one listing, of complete shards) to the file's ``.stamps`` log; a
process serves a file it did not fill only after checking, under the lock, that every
shard file of the rows held still has the stamp recorded; from the first that does not
on, rows are read again (so a process that opens a file after the writer appended to the
shard of its last rows reads that shard's rows again).  The ring grows by doubling into
a new file that replaces the old under the lock (processes holding the old one see it
marked superseded and map the new one); a cache whose contents went (a clear, a loaded checkpoint) removes its file.  When a new file is made,
:func:`_prune` removes the files whose buffer is gone (each records its owner beside it:
a local segment's path, directory inode and contents id, looked up again), files
untouched for :data:`PRUNE_AGE_S` (all a buffer in S3 gets), then the least recently used
until the directory fits in :func:`max_dir_bytes` (``ZREPLAY_CACHE_MAX_BYTES``), each
under its lock, not waited for; and the lock files of cache files gone (each under its
own lock, and only the file locked: see :func:`_prune_lock`).  A file starts at the rows
its buffer has (and a quarter more), not at a fixed minimum.

**Budget**: ``column_cache_bytes`` per segment (``zreplay.open(path, column_cache_bytes=...)``
for views, ``RamPolicy(column_cache_bytes=...)`` for writers; 0 turns it off).  The
default, :func:`default_budget`, is the machine's RAM: more than that the page cache cannot
serve anyway.  A file never takes the cache directory's free space below a tenth of its
disk (or :data:`RESERVE_BYTES`, 8 GiB, where that is less): it holds fewer (the newest)
rows instead, and older ones are read from the store.
Its blocks are allocated when it is made (``posix_fallocate``): a store into a mapped page
of a sparse file on a full disk would kill the process; where that fails, the process's
memory is used instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import mmap
import os
import shutil
import stat
import threading
import time
import warnings
from pathlib import Path

import numpy as np

from ..errors import CorruptBufferError, FormatError
from ..forks import at_fork
from ..index.coords import CacheSlots, GlobalRow, GlobalRows
from ..schema import Schema
from ..store.commit import read_commit

# Keys with rows up to this size are cached: flags, rewards, actions, state vectors
# (RLinf's actions f32[28] are 112 B, a SAC observation f32[64] 256 B; a 64x64x3 frame
# is 12 KiB and is not).
SMALL_ROW_BYTES = 1024
# Rows are read in pieces of at most this many bytes (all keys together), so filling a
# large cache never holds a second copy of it.
_FILL_BYTES = 32 << 20
_PAGE = 4096
_HUGE_PAGE = 2 << 20
# A file starts with the rows it needs and a quarter more (at least this many), and grows
# by copying into a larger one: a 100-row buffer does not take 65,536 rows of disk.
MIN_SLOTS = 256
PRUNE_AGE_S = 7 * 86400
FORGET_AFTER_ROWS = 1 << 20
_RETRY_ROOM_S = 60.0  # a ring that cannot hold older rows asks again after this
RESERVE_BYTES = 8 << 30  # a file leaves a tenth of its disk free, or this much if less
_MAGIC, _VERSION = 0x5A52434F4C53, 1  # "ZRCOLS"
# Beside each file, its stamp log: records of int64 [key index, a shard's first row,
# *its stamp], appended before rows are read from the shard (ColumnCache._record).
_STAMPS, _STAMP_FIELDS = ".stamps", 5
# Beside each file, its owner: the contents ident it was made for (a local segment's
# path, its dev:inode, its contents id), so a prune can tell its buffer is gone.
_OWNER = ".owner"
_SIDECARS = (_STAMPS, _OWNER)
_STAMPS_COMPACT = 1 << 20  # a log larger than this keeps only records of live shards
_STAMPS_SPAN = 1 << 16  # (the largest shard: rows of shards below the first row held)
# Header: int64 fields of the first page.
_H_MAGIC, _H_VERSION, _H_SLOTS, _H_LO, _H_HI, _H_SUPERSEDED, _H_BOOT = range(7)


class StaleRead(Exception):
    """Rows read to fill the cache may not be the snapshot's any more (the commit says
    they are gone): nothing was published; draw again from a fresh snapshot."""


def small_keys(schema: Schema) -> list[str]:
    """The keys a column cache holds for ``schema`` by default."""
    return [s.path for s in schema if s.row_bytes <= SMALL_ROW_BYTES]


def large_keys(schema: Schema) -> list[str]:
    """The other keys (images): a view keeps them in a second column cache of their own,
    with a budget of its own (see :class:`~zreplay.engine.reader.BufferReader`)."""
    return [s.path for s in schema if s.row_bytes > SMALL_ROW_BYTES]


def contents_ident(location, contents: str) -> str | None:
    """What names a segment's rows for a cache file: its location (a local one resolved)
    and its contents id; None for segments written before contents ids (their rows may
    be renumbered under one name, so they are not shared).  A buffer restored in place
    from an older copy keeps all of these: the rows are proven by the stamps of their
    shard files instead (see :meth:`ColumnCache.cover`)."""
    if not contents:
        return None
    if not isinstance(location, os.PathLike):
        return f"{location}\0{contents}"
    where = os.path.realpath(location)
    try:  # a directory saved over or restored from a backup is another inode
        st = os.stat(where)
        where = f"{where}\0{st.st_dev}:{st.st_ino}"
    except OSError:
        pass
    return f"{where}\0{contents}"


def default_budget() -> int:
    """Bytes per segment by default: the machine's physical RAM."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def cache_dir() -> Path:
    """Where cache files go: ``ZREPLAY_CACHE_DIR``, else ``$XDG_CACHE_HOME/zreplay/columns``,
    else ``~/.cache/zreplay/columns``."""
    env = os.environ.get("ZREPLAY_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zreplay" / "columns"


def _private_dir(d: Path) -> None:
    """Make the cache directory ``d`` (mode 0700) if missing, and check that it is one
    no other user can put files in: a directory (not a link) of this user's, writable by
    nobody else.  Its files' names follow from facts anyone can read (a buffer's path and
    contents id), so in a directory others can write one could plant rows for readers to
    serve; OSError (PermissionError) names what is wrong."""
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{d} is not a directory (a link is not followed there)")
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{d} belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o022:
        raise PermissionError(
            f"{d} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}): they could"
            " plant rows there"
        )


def _ours(st: os.stat_result) -> bool:
    """A regular file of this user's (not one another user planted)."""
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()


def _create(path: Path) -> int:
    """A new file of ours at ``path`` (a temporary name: one left by a killed process
    with the same pid is replaced; a link there is never followed)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        return os.open(path, flags, 0o600)
    except FileExistsError:
        os.unlink(path)
        return os.open(path, flags, 0o600)


def max_dir_bytes() -> int:
    """The most bytes the cache directory's files may take together:
    ``ZREPLAY_CACHE_MAX_BYTES``, else the machine's RAM (more than the page cache can
    serve); the least recently used files go first when a new one would pass it."""
    env = os.environ.get("ZREPLAY_CACHE_MAX_BYTES")
    if env:
        try:
            value = int(env)
            if value >= 0:
                return value
        except ValueError:
            pass
        _warn_once(
            f"max:{env}",
            f"zreplay: ZREPLAY_CACHE_MAX_BYTES={env!r} is not a number of bytes (>= 0); "
            "the column cache directory is capped at the machine's RAM instead",
            stacklevel=9,
        )
    return default_budget()


def _boot_id() -> int:
    try:
        text = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return 0
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "little")


_BOOT = _boot_id()
_warned: set = set()
# Lock files this process holds an flock on: a forked child shares the open file
# description, and so the lock, until it closes its copy (else it outlives the parent's
# fill and every other process waits on it for good).
_HELD: set[int] = set()


def _close_held_in_child() -> None:
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


at_fork(_close_held_in_child)


def _round_up(n: int) -> int:
    return -(-n // _PAGE) * _PAGE


def _ask_huge_pages(mm: mmap.mmap) -> None:
    """Ask for 2 MiB pages for a ring that fits in half the machine's memory.

    A draw touches a few random rows of each key all over the ring; with 4 KiB pages
    each is a TLB miss and, in a process that did not fill the file, a page fault.
    Without the hint the kernel made 2 MiB pages of only part of a 30M-row ring (how
    much depends on how fragmented memory is when the fill runs), and a process
    mapping it afterwards took 3x the faults and 4-6x the time for its first draws.
    With it the fill makes them (compacting memory if needed) and every process maps
    them whole.  A larger ring keeps the kernel's defaults: a draw there may fault pages
    back from disk, and a huge page would read 2 MiB for one row."""
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if advise is None or len(mm) < _HUGE_PAGE or len(mm) > default_budget() // 2:
        return
    with contextlib.suppress(OSError, ValueError):  # (a kernel without THP says EINVAL)
        mm.madvise(advise)


class _Ring:
    """A mapped ring: the header page, then one page-aligned region of ``slots`` rows per
    key.  ``path`` is the file (None: anonymous memory of this process)."""

    def __init__(self, mm: mmap.mmap, specs: dict, slots: int, path: Path | None):
        self.mm, self.slots, self.path = mm, slots, path
        _ask_huge_pages(mm)
        self.header = np.frombuffer(mm, np.int64, count=8)
        self.arrays: dict[str, np.ndarray] = {}
        off = _PAGE
        for k, s in specs.items():
            count = slots * math.prod(s.row_shape)
            arr = np.frombuffer(mm, s.dtype, count=count, offset=off)
            self.arrays[k] = arr.reshape(slots, *s.row_shape)
            off += _round_up(slots * s.row_bytes)

    @staticmethod
    def nbytes(specs: dict, slots: int) -> int:
        return _PAGE + sum(_round_up(slots * s.row_bytes) for s in specs.values())

    @classmethod
    def make(cls, specs: dict, slots: int, path: Path | None) -> _Ring:
        """A new empty ring (a file at ``path``, its blocks allocated, made in full before
        anyone can map it under that name: the caller renames it there)."""
        size = cls.nbytes(specs, slots)
        if path is None:
            mm = mmap.mmap(-1, size)
        else:
            fd = _create(path)
            try:
                # Blocks reserved now: a store into a mapped page the disk has no room
                # for would kill the process (SIGBUS), not raise.
                os.posix_fallocate(fd, 0, size)
                mm = mmap.mmap(fd, size)
            except BaseException:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
            os.close(fd)
        ring = cls(mm, specs, slots, path)
        h = ring.header
        h[_H_MAGIC], h[_H_VERSION], h[_H_SLOTS], h[_H_BOOT] = _MAGIC, _VERSION, slots, _BOOT
        return ring

    @classmethod
    def open(cls, path: Path, specs: dict) -> _Ring | None:
        """The ring in ``path`` if it is one of these keys, of this boot; else None."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:  # none, or a link someone put there: not followed
            return None
        try:
            st = os.fstat(fd)
            size = st.st_size
            if size < _PAGE or not _ours(st):  # another user's file is no cache of ours
                return None
            mm = mmap.mmap(fd, size)
            with contextlib.suppress(OSError):
                os.utime(fd)  # in use: not pruned
        except OSError:  # no address space or memory for the mapping (ENOMEM)
            return None
        finally:
            os.close(fd)
        h = np.frombuffer(mm, np.int64, count=8)
        slots = int(h[_H_SLOTS])
        ok = h[_H_MAGIC] == _MAGIC and h[_H_VERSION] == _VERSION and h[_H_BOOT] == _BOOT
        if not ok or slots <= 0 or size != cls.nbytes(specs, slots) or h[_H_SUPERSEDED]:
            return None
        return cls(mm, specs, slots, path)

    @property
    def lo(self) -> int:
        return int(self.header[_H_LO])

    @property
    def hi(self) -> int:
        return int(self.header[_H_HI])

    def put(self, key: str, start: int, rows: np.ndarray) -> None:
        ring, cap = self.arrays[key], self.slots
        n, a = len(rows), start % cap
        first = min(n, cap - a)
        ring[a : a + first] = rows[:first]
        if first < n:
            ring[: n - first] = rows[first:]


class ColumnCache:
    """Rows ``[lo, hi)`` of a segment's small keys, decoded, in a ring shared through a
    file (see the module docstring).  ``max_rows`` = the budget over the cached keys' row
    bytes.  Not thread-safe: its owner calls it under :attr:`lock` (one thread of a
    process at a time; other processes coordinate through the file).  ``wait=False`` (a
    writer, which reads under its own lock): a fill never waits for another process's
    fill of the file; the rows are read from the store meanwhile.  ``keys``: the keys it
    holds (default :func:`small_keys`); caches of other keys of one segment are other
    files (a file is named by its keys too)."""

    def __init__(
        self, schema: Schema, budget_bytes: int, wait: bool = True, keys: list[str] | None = None
    ):
        if keys is None:
            keys = small_keys(schema)
        self.keys = list(keys) if budget_bytes > 0 else []
        self._specs = {k: schema.specs[k] for k in self.keys}
        self.row_bytes = sum(s.row_bytes for s in self._specs.values())
        self.max_rows = int(budget_bytes // self.row_bytes) if self.keys and self.row_bytes else 0
        if not self.max_rows:
            self.keys = []
        self.key_set = frozenset(self.keys)  # (read by the gather's fast path)
        self._ring: _Ring | None = None
        self._ident: str | None = None
        self._private = False  # the cache directory failed: this process's memory
        self._named: tuple = (None, None)  # (ident, its file)
        self._capped = 0.0  # until then, the disk had no room for more rows: do not ask
        self._trusted: _Ring | None = None  # the ring whose rows this process proved
        self.last_read: int | None = None  # first row the last cover() read, if any
        self.lock = threading.Lock()
        self._wait = wait

    def holds(self, key: str) -> bool:
        return key in self.key_set

    @property
    def lo(self) -> int:
        return self._ring.lo if self._ring is not None else 0

    @property
    def hi(self) -> int:
        return self._ring.hi if self._ring is not None else 0

    @property
    def capacity(self) -> int:
        return self._ring.slots if self._ring is not None else 0

    @property
    def nbytes(self) -> int:
        return self.capacity * self.row_bytes

    @property
    def path(self) -> Path | None:
        """The file the rows are in (None: this process's memory, or none yet)."""
        return self._ring.path if self._ring is not None else None

    # -- which ring ------------------------------------------------------------------

    def _file(self, ident: str | None) -> Path | None:
        if ident is None or self._private:
            return None
        if self._named[0] != ident:
            d = cache_dir()
            try:
                _private_dir(d)
            except OSError as e:
                self._go_private(d, e)
                return None
            sig = repr([(k, s.dtype.str, tuple(s.row_shape)) for k, s in self._specs.items()])
            digest = hashlib.sha256(f"{ident}\0{sig}".encode()).hexdigest()[:40]
            self._named = (ident, d / f"{digest}.cols")
        return self._named[1]

    def _bind(self, ident: str | None) -> Path | None:
        """Use the ring of contents ``ident`` from now on (a change of contents removes
        the old contents' file: its rows are nobody's any more); returns its file (None:
        this process's memory)."""
        if ident != self._ident:
            old = self._file(self._ident)
            self._ident, self._ring = ident, None
            if old is not None:
                for f in (old, *(old.with_suffix(x) for x in _SIDECARS)):
                    with contextlib.suppress(OSError):
                        f.unlink()
        path = self._file(ident)
        r = self._ring
        if path is None:
            if r is not None and r.path is not None:
                self._ring = None  # the directory failed meanwhile
        elif r is None or r.path is None or r.header[_H_SUPERSEDED]:
            self._ring = _Ring.open(path, self._specs)
        return path

    def discard(self, ident: str | None = None) -> None:
        """This cache's contents (``ident``, default the ones it last read) went (a
        clear, a loaded checkpoint): remove their file."""
        with self.lock:
            if ident is not None and self._ident is None:
                self._ident = ident  # never read: its file may still be another's
            self._bind(None)

    @contextlib.contextmanager
    def _exclusive(self, path: Path | None):
        """Hold the file's lock (nothing for this process's memory); yields False when
        another process holds it and this cache does not wait (see ``wait``)."""
        fd = None
        if path is not None:
            try:
                _private_dir(path.parent)  # (the user may have removed it meanwhile)
                fd = _lock_file(path.with_suffix(".lock"), self._wait)
            except BlockingIOError:  # another process fills the file: not waited for
                yield False
                return
            except OSError as e:
                self._go_private(path.parent, e)
        if fd is None:
            yield True
            return
        try:
            yield True
        finally:
            _HELD.discard(fd)
            os.close(fd)  # releases the lock

    def _go_private(self, where: Path, e: OSError) -> None:
        """The cache directory cannot be used: keep rows in this process's memory."""
        self._private, self._ring = True, None
        _warn_once(
            str(where),
            f"zreplay: cannot keep small columns in {where} ({e}); each process keeps them"
            " in its own memory instead (set ZREPLAY_CACHE_DIR to a writable local directory"
            " of your own that no other user can write)",
            stacklevel=7,
        )

    # -- filling ----------------------------------------------------------------------

    def cover(
        self,
        read_range,
        low_row: int,
        hi: int,
        ident: str | None = None,
        live_from=None,
        forget=None,
        stamps=None,
    ):
        """Hold the newest rows of ``[low_row, hi)`` that fit, reading what is missing with
        ``read_range(key, start, stop) -> future`` with ``.result()``; returns the first
        row held (rows ``[lo, hi)`` are then in the ring).  ``ident`` names the segment's
        contents (None: not shareable, this process's memory); ``live_from()`` says
        from which row on the rows read are still the segment's (None: none are): rows
        a writer evicted meanwhile may have been read as the zeros of deleted shards, so
        only those from there on are published (:class:`StaleRead` where none are);
        ``forget(key, start, stop)``, called
        piece by piece in a fill of :data:`FORGET_AFTER_ROWS` rows or more, lets the page
        cache drop the store's chunks as they are decoded (they compete with the file for
        it otherwise: at 300M rows of state data 10 GB of chunks and the 13.5 GB file do
        not fit in 24 GB, and the file's first pages left it again before the fill
        ended).  ``stamps(key, start, stop)`` (``Segment.shard_stamps``) stamps the shard
        files rows are read from: a file records them, and rows a process did not read
        itself are served only while their shard files still carry the stamps recorded
        when they were read (a buffer restored in place from an older copy keeps its
        path, row numbers and contents id; rows from the first shard that changed on are
        read again)."""
        self.last_read = None
        hi = int(hi)
        want_lo = max(int(low_row), hi - self.max_rows)
        if hi <= want_lo:
            return hi
        path = self._bind(ident)
        r = self._ring
        if (
            r is not None
            and (r is self._trusted or r.path is None)
            and r.hi >= hi
            and (r.lo <= want_lo or time.monotonic() < self._capped)
        ):
            return r.lo  # (a ring that cannot hold older rows holds the newest it can)
        with self._exclusive(path) as locked:
            if not locked:
                return hi  # nothing held: the caller reads the store
            path = self._bind(ident)  # another process may have grown or filled it
            r = self._ring
            if r is not None and r.path is not None and r is not self._trusted:
                proven = self._proven_to(r, stamps, low_row)
                if proven < r.hi:  # rows from there on are read again
                    r.header[_H_HI] = max(proven, r.lo)
                self._trusted = r
            if r is not None and r.lo <= want_lo and r.hi >= hi:
                return r.lo
            held_lo, held_hi = (r.lo, r.hi) if r is not None else (0, 0)
            if r is None or want_lo >= held_hi or held_hi <= held_lo:
                start = keep = want_lo  # nothing held overlaps: afresh
            elif hi < held_hi:  # filled beyond these rows: newer rows took their slots
                if path is not None:
                    return held_lo
                start = keep = want_lo  # this process's ring: its rows were renumbered
            else:
                start, keep = held_hi, max(held_lo, want_lo)
            # A file's lo never goes down (a reader that saw it unchanged after its gather
            # trusts what it read): a fresh start below it takes a new file.
            renew = path is not None and r is not None and start == keep and start < r.lo
            r = self._ensure(path, r, hi - keep, keep, start, renew)
            if r is None:
                return hi
            keep = max(keep, hi - r.slots)  # a ring the disk kept small: the newest rows
            if start >= hi:  # it holds the newest rows and extends only upwards: the
                self._capped = time.monotonic() + _RETRY_ROOM_S  # fast path says so
                return r.lo
            if start <= keep:
                start = keep
                r.header[_H_LO] = start  # first: nothing below start is valid any more
                r.header[_H_HI] = start
            if r.path is not None:  # stamped before they are read: a change meanwhile
                self._record(r.path, stamps, start, hi, r.lo)  # reads them again, later
            step = max(1, _FILL_BYTES // max(1, self.row_bytes))
            for a in range(start, hi, step):
                b = min(hi, a + step)
                futs = {k: read_range(k, a, b) for k in self.keys}
                got = {k: f.result() for k, f in futs.items()}
                if b - r.slots > r.lo:
                    r.header[_H_LO] = b - r.slots  # before their slots are overwritten
                for k, rows in got.items():
                    r.put(k, a, rows)
                if forget is not None and hi - start >= FORGET_AFTER_ROWS:
                    for k in self.keys:
                        forget(k, a, b)
            if live_from is not None:
                live = live_from()
                if live is None or live >= hi:
                    raise StaleRead()
                if live > r.lo:  # what was read below it is not published
                    r.header[_H_LO] = live
            r.header[_H_HI] = hi
            self.last_read = start
            return r.lo

    def _ensure(
        self, path: Path | None, r: _Ring | None, need: int, keep: int, start: int, renew=False
    ):
        """A ring of ``need`` slots or more (fewer where the disk has no room), holding
        the rows ``[keep, start)`` that ``r`` holds (``renew``: a new empty one in any
        case); None: no room at all."""
        if r is not None and need <= r.slots and not renew:
            return r
        # A quarter more than needed (a growing buffer does not remake the file at every
        # commit; its blocks are allocated, so no more than that).
        old = r.slots if r else 0
        slots = min(self.max_rows, max(need + need // 4, old + old // 4, MIN_SLOTS))
        new = None
        if path is not None:
            try:
                du = shutil.disk_usage(path.parent)
                # (an old file stays while others map it: not counted as room)
                room = du.free - min(du.total // 10, RESERVE_BYTES)
                slots = min(slots, max(0, room - _PAGE) // max(1, self.row_bytes))
                if slots < need:  # the rows that do not fit are read from the store
                    self._capped = time.monotonic() + _RETRY_ROOM_S
                    _warn_once(
                        f"room:{path.parent}",
                        f"zreplay: the column cache in {path.parent} has disk room for "
                        f"{max(0, slots)} of the {need} rows read (it leaves a tenth of the "
                        "disk, at most 8 GiB, free); older rows of small keys are read from "
                        "the buffer, slower: free space there or set ZREPLAY_CACHE_DIR to a "
                        "disk with room",
                        stacklevel=8,
                    )
                    if r is not None and slots <= r.slots or slots < 1:
                        return r
                _prune(path.parent, keep=path, room=_Ring.nbytes(self._specs, slots))
                tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                new = _Ring.make(self._specs, slots, tmp)
            except OSError as e:
                self._go_private(path.parent, e)
                return self._ensure(None, None, need, start, start)
        else:
            try:
                new = _Ring.make(self._specs, slots, None)
            except OSError:  # no memory for it (ENOMEM): the rows are read from the store
                self._capped = time.monotonic() + _RETRY_ROOM_S
                return r
        lo = max(keep, r.lo) if r is not None and not renew else start
        try:
            if lo < start:
                step = max(1, _FILL_BYTES // max(1, self.row_bytes))
                for a in range(lo, start, step):
                    idx = np.arange(a, min(start, a + step)) % r.slots
                    for k in self.keys:
                        new.put(k, a, r.arrays[k][idx])
                new.header[_H_LO], new.header[_H_HI] = lo, start
            else:
                new.header[_H_LO] = new.header[_H_HI] = start
            if new.path is not None:
                os.replace(new.path, path)
                _write_owner(path, self._ident)
        except BaseException as e:  # a failed or interrupted copy leaves no temporary
            if new.path is not None:
                with contextlib.suppress(OSError):
                    new.path.unlink()
            if not isinstance(e, OSError) or path is None:
                raise
            self._go_private(path.parent, e)
            return self._ensure(None, None, need, start, start)
        if new.path is not None:
            new.path = path
            if r is not None and r.path is not None:
                r.header[_H_SUPERSEDED] = 1  # its holders map the new file
        self._ring = self._trusted = new  # (rows copied from a proven ring, or none)
        return new

    # -- proof of the rows held -------------------------------------------------------

    def _record(self, path: Path, stamps, start: int, stop: int, lo: int) -> None:
        """Append the stamps of the shard files rows ``[start, stop)`` are read from to
        the file's stamp log (records ``[key, first row, *stamp]``, the last one of a
        shard counting), rewritten with only the shards of rows from ``lo`` on once it
        is large.  A log that cannot be written proves nothing to other processes: they
        read those rows again."""
        if stamps is None:
            return
        with contextlib.suppress(OSError):
            self._append(path.with_suffix(_STAMPS), stamps, start, stop, lo)

    def _append(self, log: Path, stamps, start: int, stop: int, lo: int) -> None:
        recs = [
            (i, first, *st)
            for i, k in enumerate(self.keys)
            for first, st in stamps(k, start, stop)
            if st is not None
        ]
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            st = os.fstat(fd)
            if not _ours(st):
                raise PermissionError(f"{log} is not a file of this user's")
            if recs:
                os.write(fd, np.asarray(recs, np.int64).tobytes())
            big = st.st_size > _STAMPS_COMPACT
        finally:
            os.close(fd)
        if big:
            self._compact(log, lo)

    def _compact(self, log: Path, lo: int) -> None:
        """Rewrite the stamp log with the last record of each shard that may still hold
        rows from ``lo`` on (under the file's lock; a record dropped in error only costs
        a read)."""
        last = _read_stamps(log)
        keep = [(*k, *v) for k, v in last.items() if k[1] >= lo - _STAMPS_SPAN]
        tmp = log.with_name(f"{log.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        fd = _create(tmp)
        try:
            if keep:
                os.write(fd, np.asarray(keep, np.int64).tobytes())
        finally:
            os.close(fd)
        os.replace(tmp, log)

    def _proven_to(self, r: _Ring, stamps, low_row: int) -> int:
        """The first row of ``r`` (a file this process did not fill) from which its rows
        are not proven the segment's: the first shard file, of any key, whose stamp is
        not the one recorded when its rows were read (``r.hi``: all are)."""
        lo, hi = max(r.lo, int(low_row)), r.hi
        if hi <= lo:
            return hi
        if stamps is None:
            return lo
        last = _read_stamps(r.path.with_suffix(_STAMPS))
        proven = hi
        for i, k in enumerate(self.keys):
            for first, st in stamps(k, lo, hi):
                if st is None or last.get((i, first)) != tuple(st):
                    proven = min(proven, max(first, lo))
                    break
        return proven

    def holding(self, low_row: int, hi: int, ident: str | None, members) -> int | None:
        """What :meth:`cover` returns where it would find nothing to do (the ring of
        contents ``ident`` already holds every row of ``[low_row, hi)`` that fits, this
        process proved them, and no other process superseded its file), without binding
        or locking anything; None otherwise (then call :meth:`cover`), or where a key of
        ``members`` (``(name, key)`` pairs) is not cached here.  A sample's fast path."""
        r = self._ring
        if r is None or ident != self._ident or r is not self._trusted or self._private:
            return None
        h = r.header
        if r.path is None or h[_H_SUPERSEDED] or int(h[_H_HI]) < hi:
            return None
        lo = int(h[_H_LO])
        if lo > max(int(low_row), int(hi) - self.max_rows):
            return None
        for _, key in members:
            if key not in self.key_set:
                return None
        self.last_read = None
        return lo

    def kept(self, lo: int) -> bool:
        """Are the rows from ``lo`` on still in the ring (no other process reused their
        slots since :meth:`holding` or :meth:`cover` returned ``lo``)?"""
        return int(self._ring.header[_H_LO]) <= lo

    def slots(self, rows: GlobalRows, below: GlobalRow | None = None) -> CacheSlots:
        """Where rows (all within ``[lo, hi)``, and below ``below`` if given) are, for
        :meth:`gather` (as :meth:`RamTier.slots <zreplay.engine.ramtier.RamTier.slots>`:
        rows below the ring's size are their own slots, no arithmetic)."""
        n = self._ring.slots
        return rows if below is not None and below <= n else rows % n

    def gather(self, key: str, slots: CacheSlots, out: np.ndarray | None = None) -> np.ndarray:
        """Rows of ``key`` in ``slots``: one fancy index."""
        return self._ring.arrays[key].take(slots, axis=0, out=out, mode="clip")


def _read_stamps(log: Path) -> dict:
    """``{(key index, first row): stamp}`` of a stamp log, the last record of a shard
    counting ({} where it is missing or not this user's)."""
    try:
        fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return {}
    try:
        if not _ours(os.fstat(fd)):
            return {}
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    finally:
        os.close(fd)
    n = len(raw) // (8 * _STAMP_FIELDS) * _STAMP_FIELDS
    recs = np.frombuffer(raw, np.int64, count=n).reshape(-1, _STAMP_FIELDS).tolist()
    return {(r[0], r[1]): tuple(r[2:]) for r in recs}


def _warn_once(key: str, message: str, stacklevel: int) -> None:
    """A RuntimeWarning the first time ``key`` (a cache directory's trouble) is met."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=stacklevel)


def _lock_file(path: Path, wait: bool) -> int:
    """An fd holding the exclusive ``flock`` of the lock file ``path`` (made if missing);
    BlockingIOError where another process holds it and ``wait`` is False.  A lock taken
    on a file that was pruned meanwhile (:func:`_prune` unlinks unused lock files under
    their lock) guards nothing: it is taken again on the file now at ``path``."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        _HELD.add(fd)
        try:
            if not _ours(os.fstat(fd)):
                raise PermissionError(f"{path} is not a file of this user's")
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            if _same_file(fd, path):
                return fd
        except BaseException:
            _HELD.discard(fd)
            os.close(fd)
            raise
        _HELD.discard(fd)
        os.close(fd)  # pruned under us: again, on the file now at path


def _prune(directory: Path, keep: Path | None = None, room: int = 0) -> None:
    """Remove cache files whose buffer is gone (a local segment no longer there, or
    another at its path: another directory inode or contents id; see :func:`_owner_gone`),
    files untouched for :data:`PRUNE_AGE_S` (buffers in S3 are not looked up), then the
    least recently used until the files and a new one of ``room`` bytes fit in
    :func:`max_dir_bytes`; never ``keep`` (the one being made) nor a file whose lock
    another process holds.  Also stray temporaries, sidecars of files gone, and the lock
    files of cache files gone, under their lock (see :func:`_lock_file`)."""
    now, entries = time.time(), []
    with contextlib.suppress(OSError):
        entries = list(os.scandir(directory))
    names = {e.name for e in entries}
    live = []
    for entry in entries:
        with contextlib.suppress(OSError):
            st = entry.stat(follow_symlinks=False)
            old = now - st.st_mtime > PRUNE_AGE_S
            name, path = entry.name, Path(entry.path)
            if name.endswith(".cols"):
                if keep is not None and path == keep:
                    continue
                if old or _owner_gone(path.with_suffix(_OWNER)):
                    _remove_cache(path)
                else:
                    live.append((st.st_mtime, st.st_blocks * 512, path))
            elif name.endswith(".tmp"):
                if old:
                    os.unlink(entry.path)
            elif name.endswith(_SIDECARS) and name.rsplit(".", 1)[0] + ".cols" not in names:
                if old:
                    os.unlink(entry.path)
            elif old and name.endswith(".lock") and name[:-5] + ".cols" not in names:
                _prune_lock(entry.path)
    total = sum(size for _, size, _ in live) + room
    cap = max_dir_bytes()
    for _, size, path in sorted(live, key=lambda x: x[0]):
        if total <= cap:
            break
        if _remove_cache(path):
            total -= size


def _remove_cache(path: Path) -> bool:
    """Remove a cache file and its sidecars under its lock (not waited for: one another
    process fills or grows stays); a process that maps it keeps reading its rows."""
    try:
        fd = _lock_file(path.with_suffix(".lock"), wait=False)
    except OSError:  # held (BlockingIOError), or not ours
        return False
    try:
        for f in (path, path.with_suffix(_STAMPS), path.with_suffix(_OWNER)):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
    finally:
        _HELD.discard(fd)
        os.close(fd)
    return True


def _write_owner(path: Path, ident: str | None) -> None:
    """Record beside the file ``path`` what it caches (for :func:`_owner_gone`)."""
    if ident is None:
        return
    owner = path.with_suffix(_OWNER)
    with contextlib.suppress(OSError):
        fd = os.open(owner, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            if _ours(os.fstat(fd)):
                os.write(fd, ident.encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)


def _owner_gone(owner: Path) -> bool:
    """Is the buffer a cache file's owner record names gone: a local segment directory
    no longer there, another directory at its path (inode), or other contents (a
    commit with another contents id, or none)?  False where it cannot tell (no record,
    a buffer in an object store, a commit that cannot be read)."""
    try:
        fd = os.open(owner, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if not _ours(os.fstat(fd)):
            return False
        raw = os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    parts = raw.decode("utf-8", "surrogateescape").split("\0")
    if len(parts) != 3:  # (a URL and contents id: not looked up)
        return False
    where, dev_ino, contents = parts
    try:
        st = os.stat(where)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if f"{st.st_dev}:{st.st_ino}" != dev_ino:
        return True
    try:
        commit = read_commit(where)
    except (CorruptBufferError, FormatError, OSError):  # (an older format: not judged)
        return False
    return commit is None or commit.contents != contents


def _prune_lock(path: str) -> None:
    """Unlink an unused lock file while holding its lock (a filler holding it: left).
    Only the file locked: another pruner may have unlinked it between this open and
    this flock, and a filler made and locked a new one at the path since."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _same_file(fd, path):  # then only this lock's holder (us) can unlink it
            os.unlink(path)
    except BlockingIOError:
        pass
    finally:
        os.close(fd)


def _same_file(fd: int, path) -> bool:
    """Is ``fd`` the file at ``path`` (not one unlinked or replaced since)?"""
    held = os.fstat(fd)
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    return (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev)
