"""The local-filesystem backend: POSIX files, TensorStore arrays.

* publish: temp file + fsync + rename (+ directory fsync);
* exclusive create: a temp file, fsync'd, hard-linked to the name (``link`` fails if the
  name exists; atomic on local filesystems and NFS), ``O_EXCL`` where links are missing;
* copies: hard links (files are replaced atomically, never modified in place, so a link
  keeps today's bytes forever), ``copy2`` across filesystems;
* arrays: TensorStore over the Zarr files (zarr-python's per-call overhead, 35-250 ms for
  256 random rows, measured, must never sit on the sampling path), except in a process
  forked from another, where TensorStore aborts and zarr-python reads instead, and for
  arrays with an image codec, which TensorStore refuses: zreplay's own shard reader and
  writer read and write those (:mod:`zreplay.store.localarray`).

TensorStore refuses relative paths with ``..``; array paths are made absolute here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import mmap
import os
import re
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PosixPath

from ..errors import CorruptBufferError, ZReplayError, warn_caller
from ..forks import forked
from ..threads import Deferral, deferred_interrupts, import_whole
from . import liveness, localswap
from .arrays import ZarrArray
from .backend import MAX_READ_BYTES, Backend, max_copy_bytes, too_big_to_copy, too_big_to_read
from .format import is_temp_name
from .layout import shard_number


class LocalPath(PosixPath):
    """A ``pathlib.Path`` that knows its backend (``.backend``)."""

    @property
    def backend(self) -> LocalBackend:
        return LOCAL

    def read_bytes(self) -> bytes:
        return read_regular(self)

    def read_text(self, encoding: str | None = None, errors: str | None = None) -> str:
        return read_regular(self).decode(encoding or "utf-8", errors or "strict")


def _not_regular(path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if stat.S_ISLNK(mode):
        raise _a_link(path)
    if not stat.S_ISREG(mode):
        raise CorruptBufferError(
            f"{path} is not a regular file (a FIFO, socket or device where a buffer keeps a "
            "file); zreplay does not read it, since reading it could block forever or never "
            "end. Remove it, or restore the buffer from a checkpoint"
        )


def _a_link(path) -> CorruptBufferError:
    return CorruptBufferError(
        f"{path} is a symbolic link where a buffer keeps a file; zreplay does not follow it, "
        "since it may lead out of the buffer. Replace it with the file it names, or restore "
        "the buffer from a checkpoint"
    )


def open_regular(path, follow: bool = True) -> tuple[int, os.stat_result]:
    """``(descriptor, fstat)`` of the regular file ``path``, opened read-only, without
    blocking and close-on-exec (the caller closes it): a buffer may come from a stranger,
    and a FIFO or a device in place of a file would block a reader or never end.  A
    directory is IsADirectoryError (as ``open`` says); anything else not a regular file is
    CorruptBufferError, found before it is opened (and again on the open descriptor, for
    a file swapped meanwhile); so is a symbolic link unless ``follow``."""
    _not_regular(path, (os.stat if follow else os.lstat)(path).st_mode)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:  # a link put there since the lstat
            raise _a_link(path) from None
        raise
    try:
        st = os.fstat(fd)
        _not_regular(path, st.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path, data: bool = False) -> bytes:
    """The bytes of the regular file ``path``: a record, at most ``MAX_READ_BYTES`` of
    them, or with ``data`` a data file copied whole to another store (at most
    :func:`~zreplay.store.backend.max_copy_bytes`, never through a symbolic link: what it
    points to would be copied out of the buffer).  A buffer may come from a stranger,
    and a FIFO or a device in place of a file would block a reader or never end.  A
    directory is IsADirectoryError (as ``open`` says); anything else not a regular file
    is CorruptBufferError (see :func:`open_regular`)."""
    fd, st = open_regular(path, follow=not data)
    bound = max_copy_bytes() if data else MAX_READ_BYTES
    try:
        parts, size = [], st.st_size
        while size <= bound:  # e.g. a sparse file: KBs on disk, GBs in memory
            part = os.read(fd, max(st.st_size, 1 << 16))
            if not part:
                return b"".join(parts)
            parts.append(part)
            size = sum(map(len, parts))  # (a file that grows meanwhile)
        if data:
            raise too_big_to_copy(path, size, bound)
        raise too_big_to_read(path, size, MAX_READ_BYTES)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``: a write that runs into a full disk or a file size limit
    stores only part of it and returns the short count (the next one raises OSError)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_synced(path: Path, data: bytes, flags: int = 0, sync: bool = True) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o644)
    try:
        write_all(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _flock_within(fd: int, timeout: float | None, deferral: Deferral | None = None) -> None:
    """An exclusive flock on ``fd``, waiting at most ``timeout`` seconds (None: as long
    as it takes); ``TimeoutError`` after that.  No flock here (some network
    filesystems): nothing to wait for.  With Ctrl-C held back (``deferral``, in the
    main thread) it polls, so that a Ctrl-C still ends the wait."""
    deadline = None if timeout is None else time.monotonic() + timeout
    poll = deadline is not None or deferral is not None
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if poll else 0))
            return
        except BlockingIOError:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"the guard was held for more than {timeout:g} s") from None
            if deferral is not None:
                deferral.check()
            time.sleep(0.01)
        except OSError:
            return


def fsync_dir(path: Path) -> None:
    """Make a rename or a new name in directory ``path`` durable (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _named(e: OSError, loc) -> OSError:
    """``e`` naming ``loc`` (``os.write`` errors carry no file name)."""
    return OSError(e.errno, e.strerror, str(loc)) if e.filename is None else e


def _all_chunks_stored(array_dir: Path) -> bool:
    try:
        meta = json.loads((array_dir / "zarr.json").read_bytes())
        return meta["attributes"]["zreplay"]["all_chunks_stored"] is True
    except (OSError, ValueError, KeyError, TypeError):
        return False  # opening reports a missing or damaged zarr.json


# One byte of memory shared with every process forked from this one (and theirs): the
# zarr-python warning below is printed by the first forked reader of a program, not once
# per DataLoader worker.
_FORK_WARNED = mmap.mmap(-1, 1)


# A temp file of publish/create_exclusive: ``<name>.<process tag>.<hex>.tmp`` (the tag's
# dots made underscores, so the name parses; before this, ``<name>.<pid>.<hex>.tmp``,
# which names no host and is never judged dead).
_TEMP_NAME = re.compile(r".+\.(?P<tag>[^.]+-[0-9a-fx]{16}-[0-9]+)\.[0-9a-f]+\.tmp")


def _temp_tag() -> str:
    return liveness.process_tag().replace(".", "_")


class LocalBackend(Backend):
    is_local = True
    # For the shard reader of image arrays (localarray, which this module imports)
    open_regular = staticmethod(open_regular)

    def file_stamps(self, files) -> list[tuple[int, int, int] | None]:
        out = []
        for f in files:
            try:
                st = os.stat(f)
            except OSError:
                out.append(None)
            else:
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return out

    def forget_pages(self, files) -> None:
        for f in files:
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue  # reclaimed meanwhile
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except (OSError, AttributeError):
                pass
            finally:
                os.close(fd)

    @property
    def storage_options(self) -> dict:
        return {}

    # -- files --------------------------------------------------------------------

    def publish(self, loc, data: bytes, durable: bool) -> None:
        tmp = loc.with_name(f"{loc.name}.{_temp_tag()}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            _write_synced(tmp, data, os.O_EXCL, sync=durable)
            os.replace(tmp, loc)
        except BaseException as e:
            tmp.unlink(missing_ok=True)  # a full disk must not also collect temp files
            if isinstance(e, OSError):
                raise _named(e, loc) from e
            raise
        if durable:
            fsync_dir(loc.parent)

    def create_exclusive(self, loc, data: bytes) -> bool:
        tmp = loc.with_name(f"{loc.name}.{_temp_tag()}.{uuid.uuid4().hex[:8]}.tmp")
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

    def remove_tree(self, loc) -> None:
        shutil.rmtree(loc, ignore_errors=True)

    def move_tree(self, src, dst) -> None:
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)

    def remove_file(self, loc, up_to) -> None:
        loc.unlink(missing_ok=True)
        d = loc.parent
        while d != up_to and up_to in d.parents:
            try:
                d.rmdir()
            except OSError:  # not empty (or gone): stop
                return
            d = d.parent

    def walk_files(self, loc) -> Iterator[tuple[str, LocalPath]]:
        for dirpath, _dirs, files in os.walk(loc):
            for name in files:
                p = LocalPath(dirpath) / name
                yield p.relative_to(loc).as_posix(), p

    def read_data(self, loc) -> bytes:
        return read_regular(loc, data=True)

    def import_file(self, src, dst, link: bool = True) -> bool:
        if src.backend is not self:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.backend.read_data(src))
            return False
        if os.path.islink(src):  # (linked or copied, what it names would come along)
            raise _a_link(src)
        if link:
            try:
                os.link(src, dst, follow_symlinks=False)
                return True
            except FileNotFoundError:
                raise
            except OSError:
                pass  # another filesystem: copy
        shutil.copy2(src, dst, follow_symlinks=False)
        return False

    def import_tree(self, src, dst, skip) -> tuple[int, int]:
        if src.backend is not self:
            return super().import_tree(src, dst, skip)
        # scandir recursion and plain os calls on str paths (no Path objects, no lstat
        # per directory as os.walk does): a few hundred shard files link in a few ms.
        # Directories are made only where a file goes (an empty directory would confuse
        # zarr's hierarchy walk).
        counts = [0, 0, True]  # linked, copied, links work here
        d0 = os.fspath(dst)
        os.makedirs(os.path.dirname(d0), exist_ok=True)
        _link_dir(os.fspath(src), d0, skip, counts)
        return counts[0], counts[1]

    def confine(self, root, loc) -> None:
        # A buffer directory may come from a stranger: a symbolic link in it (even one
        # that stays inside) would have a writer create, rename and delete files through
        # it, so the path must resolve to itself.  The root itself may be a link.
        rel = os.path.relpath(os.path.abspath(loc), os.path.abspath(root))
        real = os.path.realpath(loc)
        if rel.startswith("..") or real != os.path.normpath(
            os.path.join(os.path.realpath(root), rel)
        ):
            raise CorruptBufferError(
                f"{loc} is or lies under a symbolic link (it resolves to {real}); "
                f"zreplay refuses links inside a buffer ({root}), since writes and "
                "deletions through them would land elsewhere. Replace the link with the "
                "directory it names, or restore the buffer from a checkpoint"
            )

    def check_files(self, loc) -> None:
        # TensorStore opens chunk files itself and would wait forever on a FIFO.
        try:
            with os.scandir(loc) as it:
                entries = list(it)
        except (FileNotFoundError, NotADirectoryError):
            return
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                self.check_files(e.path)
            elif e.is_symlink() or not e.is_file(follow_symlinks=False):
                if not os.path.lexists(e.path):
                    continue  # a temp file renamed away while we listed
                kind = "a symbolic link" if e.is_symlink() else "not a regular file"
                raise CorruptBufferError(
                    f"{e.path} is {kind} (a FIFO, socket, device or link where a buffer "
                    "keeps a chunk file); zreplay does not read it, since reading it could "
                    "block forever or leave the buffer. Remove it, or restore the buffer "
                    "from a checkpoint"
                )

    def remove_dead_temps(self, loc) -> list:
        removed = []
        try:
            entries = list(os.scandir(loc))
        except (FileNotFoundError, NotADirectoryError):
            return removed
        for e in entries:
            m = _TEMP_NAME.fullmatch(e.name)
            if m is None or not e.is_file(follow_symlinks=False):
                continue
            if liveness.tag_is_dead(m["tag"]):
                try:
                    os.unlink(e.path)
                    removed.append(LocalPath(e.path))
                except FileNotFoundError:
                    pass
        return removed

    def remove_temps(self, loc, committed_shards: Mapping[str, int] | None = None) -> list:
        skip = {os.path.normpath(k): v for k, v in (committed_shards or {}).items()}
        removed = []
        for dirpath, dirnames, filenames in os.walk(loc):
            limit = skip.get(os.path.normpath(dirpath))
            if limit is not None:  # shards c/<n>/ (before format 5), or files c.<n>...
                dirnames[:] = [d for d in dirnames if not d.isdigit() or int(d) >= limit]
            for name in filenames:
                shard = None if limit is None else shard_number(name)
                if shard is not None and shard < limit:
                    continue
                if is_temp_name(name):
                    p = LocalPath(dirpath) / name
                    try:
                        p.unlink()
                        removed.append(p)
                    except FileNotFoundError:
                        pass
        return removed

    def guard_file(self, loc):
        return loc.with_name(loc.name + ".guard")

    @contextlib.contextmanager
    def guard(self, loc, timeout: float | None = None) -> Iterator[None]:
        # Ctrl-C held back from opening the fd to closing it (a Ctrl-C landing between
        # the two would leave the flock held by this process for good); the block is
        # short (a commit, a lock's judgement), and the wait for the flock polls for it.
        with deferred_interrupts() as deferral:
            try:
                fd = liveness.open_tracked(self.guard_file(loc), os.O_RDWR | os.O_CREAT)
            except OSError:
                yield  # read-only or odd filesystem: go on without the guard
                return
            try:  # closed at the end (releasing it), and in a fork
                _flock_within(fd, timeout, deferral if self._interruptible() else None)
                yield
            finally:
                liveness.close_tracked(fd)

    @staticmethod
    def _interruptible() -> bool:
        return threading.current_thread() is threading.main_thread()

    def hold(self, loc):
        return liveness.hold(loc)

    def probe(self, loc) -> bool | None:
        return liveness.probe(loc)

    def staged_tree(self, dest) -> contextlib.AbstractContextManager:
        return localswap.staged(dest)  # beside dest, swapped in with one exchange

    def recover_tree(self, loc) -> bool:
        return localswap.restore(loc)

    def du(self, loc) -> int:
        if loc.is_file():
            return loc.stat().st_size
        return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(loc) for f in fs)

    # -- arrays -------------------------------------------------------------------

    def zarr_store(self, loc, read_only: bool = False):
        return str(loc)

    def array_context(self, durable: bool, cache_bytes: int = 0):
        ts = import_whole("tensorstore")  # a Ctrl-C in its first import: see there

        # By default no decoded-chunk cache (the RAM tier and the column cache are
        # zreplay's); a reader may ask for one (hot image chunks: measured 4x faster
        # clips once they are cached).  Data files fsync'd if durable.
        pool = {"total_bytes_limit": max(0, int(cache_bytes))}
        tsc = ts.Context({"cache_pool": pool, "file_io_sync": bool(durable)})
        return LocalContext(tsc, bool(durable), max(0, int(cache_bytes)), {})

    def open_array(self, loc, writable: bool, context) -> tuple[object, bool]:
        if forked():
            _check_forked(writable)
            return ZarrArray(loc, writable=False), True
        image = _image_array_meta(loc)
        if image is not None:  # TensorStore refuses image codecs: zreplay's shard code
            from .localarray import open_files_array

            cache = context.caches.get(str(loc))
            if cache is None:
                cache = context.caches[str(loc)] = _shard_cache(context.cache_bytes)
            return open_files_array(loc, image, writable, self, context.durable, cache)
        ts = import_whole("tensorstore")

        # Every chunk is stored, zeros included, so a chunk missing below the commit is
        # damage (a read error), not rows of zeros.  Arrays made before this was so lack
        # the attribute and keep zarr's fill-value reads.
        fills = not _all_chunks_stored(loc)
        spec = {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": os.path.abspath(loc) + "/"},
            "store_data_equal_to_fill_value": True,
            "fill_missing_data_reads": fills,
        }
        return ts.open(spec, read=True, write=writable, context=context.ts).result(), fills

    def write_held(self, store, start: int, rows, context) -> object:
        sel = store[start : start + len(rows)]
        if hasattr(store, "spec") and not context.cache_bytes:
            # TensorStore copies a source into fresh memory before encoding it (RLinf's
            # ingest: 600 MB of copies and page faults; measured 0.2 s less system time
            # per 295 MB without them); rows held unchanged until the write is done may
            # be encoded in place.  Only without a
            # chunk cache: written chunks then leave TensorStore with the write, none can
            # keep pointing at rows the caller reuses afterwards.
            return sel.write(rows, can_reference_source_data_indefinitely=True)
        return sel.write(rows)

    def widened(self, store, rows: int, context) -> object:
        if not hasattr(store, "spec"):  # a forked process's reader, an image array's
            return super().widened(store, rows, context)
        ts = import_whole("tensorstore")

        spec = store.spec(retain_context=False).to_json()
        spec.pop("transform", None)
        spec["metadata"]["shape"][0] = int(rows)
        return ts.open(spec, read=True, context=context.ts, assume_metadata=True).result()

    def observe_commit(self, context, n_rows: int, reclaimed_below: int, same_rows: bool) -> None:
        for cache in list(context.caches.values()):  # image arrays' (see open_array)
            cache.seen(n_rows, reclaimed_below, same_rows)


@dataclass(frozen=True)
class LocalContext:
    """The arrays of one segment share: TensorStore's context (``ts``), whether writes
    are fsync'd, the decoded-chunk budget, and the shard caches of the arrays zreplay
    reads itself (image codecs; array path -> ShardCache)."""

    ts: object
    durable: bool
    cache_bytes: int
    caches: dict


def _shard_cache(cache_bytes: int):
    from .objectarray import ShardCache

    return ShardCache(cache_bytes)


def _image_array_meta(loc):
    """The parsed metadata of the array at ``loc`` if it uses an image codec, else None
    (opening reports a missing or damaged zarr.json)."""
    from .imagecodec import uses_image_codec
    from .shards import ArrayMeta, UnsupportedArray

    try:
        raw = (loc / "zarr.json").read_bytes()
        if not uses_image_codec(json.loads(raw)):
            return None
    except (OSError, ValueError):
        return None
    try:
        return ArrayMeta.parse(raw, str(loc))
    except UnsupportedArray as e:
        raise CorruptBufferError(
            f"{loc / 'zarr.json'}: an image array zreplay cannot read ({e})"
        ) from None


def _link_dir(s_dir: str, d_dir: str, skip, counts: list) -> int:
    """Link the files under ``s_dir`` into ``d_dir`` (made here); returns how many went
    in.  A directory that got none is removed again (an empty directory would confuse
    zarr's hierarchy walk)."""
    try:
        os.mkdir(d_dir)
    except FileExistsError:
        pass
    n = 0
    try:
        with os.scandir(s_dir) as it:
            entries = list(it)
    except FileNotFoundError:
        entries = []
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            n += _link_dir(e.path, d_dir + "/" + e.name, skip, counts)
        elif skip(e.name):
            continue
        elif e.is_symlink():  # a hard link or a copy would take in what it names
            raise _a_link(e.path)
        else:
            n += _link_file(e.path, d_dir + "/" + e.name, counts)
    if not n:
        try:
            os.rmdir(d_dir)
        except OSError:
            pass  # something else is there
    return n


def _link_file(src: str, dst: str, counts: list) -> int:
    """Hard-link ``src`` to ``dst`` (replacing it), or copy it once links fail; 0 if
    ``src`` vanished (an evicted shard deleted while we walked)."""
    try:
        if counts[2]:
            try:
                os.link(src, dst, follow_symlinks=False)  # (a link swapped in: copied as one)
            except FileExistsError:
                os.unlink(dst)
                os.link(src, dst, follow_symlinks=False)
            counts[0] += 1
            return 1
    except FileNotFoundError:
        return 0
    except OSError:
        counts[2] = False  # another filesystem: copy from now on
    try:
        shutil.copy2(src, dst, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    counts[1] += 1
    return 1


def _check_forked(writable: bool) -> None:
    if writable:
        raise ZReplayError(
            "a buffer cannot be written from a forked child process (TensorStore does "
            "not survive fork); start writer processes with the 'spawn' or "
            "'forkserver' multiprocessing context"
        )
    if not _FORK_WARNED[0]:
        _FORK_WARNED[0] = 1
        warn_caller(
            "zreplay: reading in a forked process through zarr-python (slower); pass "
            "multiprocessing_context='spawn' or 'forkserver' to DataLoader for "
            "TensorStore-speed reads in workers"
        )


LOCAL = LocalBackend()
