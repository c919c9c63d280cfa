"""Targets of operations that write or replace a whole tree (``save_checkpoint``,
``export``, ``dump``, ``overwrite=True``) and sources of ``load_checkpoint``, checked
before anything is touched.

A target is refused when it is the source, lies inside it or holds it (replacing it would
delete the source), is a buffer with a live writer, is a file, or is a non-empty
directory that is not what the operation replaces.  While a target buffer is replaced,
:func:`holding_writer_locks` holds the buffer's own writer lock (the root's
``zreplay/writer.lock``: the mark of a replacement in progress, taken before the segments
are listed) and the writer lock of each of its segments, so no writer opens it half way
through: a writer that opens a segment the listing missed finds the mark
(:class:`TreeWatch`) and refuses with WriterLockedError instead of writing into a tree
that is being swapped out (or reading half of each).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator

from ..errors import DestinationError, WriterLockedError
from ..threads import deferred_interrupts
from .format import META
from .location import Location, locate
from .lock import WriterLock
from .objectswap import only_dead_builds
from .root import BufferRoot, is_buffer


def _identity(loc: Location) -> tuple[str, str]:
    """What two locations compare by: the real path locally (symlinks resolved), else the
    URL with ``s3a://`` read as ``s3://``."""
    if loc.backend.is_local:
        return "file", os.path.realpath(loc)
    url = str(loc).rstrip("/")
    scheme, rest = url.split("://", 1)
    return ("s3" if scheme == "s3a" else scheme), rest


def relation(a: Location, b: Location) -> str | None:
    """``"same"``, ``"inside"`` (``a`` lies inside ``b``), ``"holds"`` (``b`` lies inside
    ``a``), or None when they are apart."""
    (sa, pa), (sb, pb) = _identity(locate(a)), _identity(locate(b))
    if sa != sb:
        return None
    if pa == pb:
        return "same"
    if pa.startswith(pb.rstrip("/") + "/"):
        return "inside"
    if pb.startswith(pa.rstrip("/") + "/"):
        return "holds"
    return None


def check_apart(target: Location, source: Location, what: str) -> None:
    """DestinationError unless ``target`` and ``source`` are apart."""
    rel = relation(target, source)
    if rel == "same":
        raise DestinationError(
            f"{what}: the target {target} is the source buffer itself; pick another path"
        )
    if rel == "inside":
        raise DestinationError(
            f"{what}: the target {target} lies inside the source {source}; pick a path outside it"
        )
    if rel == "holds":
        raise DestinationError(
            f"{what}: the source {source} lies inside the target {target}, which would "
            "delete it; pick a path outside it"
        )


def live_writer(path: Location) -> tuple[str, dict] | None:
    """``(writer_id, holder)`` of a segment of the buffer at ``path`` whose writer may
    still be running, or None (also when ``path`` is no buffer)."""
    for seg in _segment_dirs(path):
        info = WriterLock(seg).live_holder()
        if info is not None:
            return seg.name, info
    return None


def _segment_dirs(path: Location) -> list[Location]:
    """Every segment directory of the buffer at ``path``, also one whose writer has
    opened it but not added yet (no ``zarr.json``); [] when ``path`` is no buffer."""
    if not is_buffer(path):
        return []
    return BufferRoot(path).segment_dirs()


def _locked_error(what: str, path: Location, found: tuple[str, dict]) -> WriterLockedError:
    wid, info = found
    return WriterLockedError(
        f"{what}: segment {wid!r} of {path} is being written by pid {info.get('pid')} on "
        f"host {info.get('host')!r}; close that writer first, or pick another path"
    )


def is_empty_dir(loc: Location) -> bool:
    """An empty directory, or one holding only the staged trees of builds that died
    (object stores build a replacement inside the destination)."""
    return loc.is_dir() and (not any(True for _ in loc.iterdir()) or only_dead_builds(loc))


def check_target(
    target: Location,
    what: str,
    *,
    sources: Iterable[Location] = (),
    replaces: Callable[[Location], bool] = is_buffer,
    kind: str = "a zreplay buffer",
) -> None:
    """Refuse ``target`` of the operation ``what`` (see the module docstring): a
    DestinationError, or a WriterLockedError for a live writer.  ``replaces(target)``
    says whether an existing non-empty ``target`` is ``kind``, what ``what`` replaces."""
    for source in sources:
        check_apart(target, source, what)
    if target.is_file():
        raise DestinationError(f"{what}: {target} is a file; pick a directory path")
    found = live_writer(target)
    if found is not None:
        raise _locked_error(what, target, found)
    if target.exists() and not is_empty_dir(target) and not replaces(target):
        raise DestinationError(
            f"{what}: {target} is a non-empty directory and not {kind}; refusing to "
            "overwrite it. Delete it yourself or pick another path"
        )


def _replacing_error(what: str, path: Location, info: dict) -> WriterLockedError:
    return WriterLockedError(
        f"{what}: {path} is being replaced by pid {info.get('pid')} on host "
        f"{info.get('host')!r} (an import, checkpoint save, upgrade, recode or "
        "overwrite=True over it); "
        "wait until that is done, or pick another path. If no such process runs, remove "
        f"{WriterLock(path).path} (a lock it left)"
    )


def _hold_whole(path: Location, what: str) -> tuple[WriterLock | None, Location | None]:
    """Take the writer lock of the buffer at ``path`` itself (its root's
    ``zreplay/writer.lock``); returns it (None if ``path`` is no buffer) and the guard
    file that taking it made (None if there was one), which a replacement that fails
    removes so as to leave the tree as it was; WriterLockedError while another
    replacement holds it."""
    if not is_buffer(path):
        return None, None
    meta = BufferRoot(path).path / META  # (confined: never through a link)
    meta.mkdir(parents=True, exist_ok=True)
    lock = WriterLock(path)
    made = path.backend.guard_file(lock.path)
    if made is not None and made.exists():
        made = None
    try:
        lock.acquire()
    except WriterLockedError:
        raise _replacing_error(what, path, lock.live_holder() or {}) from None
    return lock, made


@contextlib.contextmanager
def holding_writer_locks(path: Location, what: str) -> Iterator[None]:
    """Hold the buffer's own writer lock, then the writer lock of every segment of the
    buffer at ``path`` (if it is one), so no writer opens it while it is replaced;
    WriterLockedError if a writer (or another replacement) is live.  The buffer's lock
    comes first: a writer whose segment the listing misses finds it when it opens."""
    held: list[WriterLock] = []
    made = None
    kept = True  # the tree at ``path`` is the one found (the replacement failed)
    try:
        # A Ctrl-C between taking a lock and recording it would leave it held here.
        with deferred_interrupts():
            whole, made = _hold_whole(path, what)
            if whole is not None:
                held.append(whole)
        for seg in _segment_dirs(path):
            lock = WriterLock(seg)
            # A Ctrl-C between taking a lock and recording it would leave it held here.
            with deferred_interrupts():
                try:
                    lock.acquire()
                except FileNotFoundError:
                    continue  # a format-2 segment: no meta node (store/upgrade.py checks its lock)
                except WriterLockedError:
                    info = lock.live_holder() or {}
                    raise _locked_error(what, path, (seg.name, info)) from None
                held.append(lock)
        yield
        kept = False
    finally:
        with deferred_interrupts():  # every lock is released, whatever arrives meanwhile
            for lock in reversed(held):  # the buffer's own lock last
                lock.release()
            if kept and made is not None:
                made.unlink(missing_ok=True)


class TreeWatch:
    """What a writer opening the buffer at ``path`` checks, before it makes anything and
    again once it holds its segment's lock, to tell that a replacement of the whole
    buffer (:func:`new_tree`) is under way or came between:
    the buffer's own writer lock held by a live process, the tree swapped out under it
    (locally: the root's ``zreplay/zarr.json`` is another file than when the writer
    began), or its segment lock no longer there (it was in the tree swapped out).  Made
    before the writer reads or makes anything of the buffer."""

    def __init__(self, path: Location):
        self.path = path
        self.stamp = self._stamp()

    def _stamp(self):
        # Written once when the buffer is made and never rewritten (unlike the root's
        # zarr.json, whose schema a writer of another segment may fix meanwhile).
        return self.path.backend.file_stamps([self.path / META / "zarr.json"])[0]

    def restamp(self) -> None:
        """The buffer was made just now: watch the tree as it is."""
        if self.stamp is None:
            self.stamp = self._stamp()

    def replaced(self, lock: WriterLock | None = None, break_lock: bool = False) -> str | None:
        """Why the buffer is being (or was just) replaced under this writer, or None.
        ``lock``: the writer's segment lock, if it took it; ``break_lock``: the writer's
        word that no replacement runs (a lock left by one is removed)."""
        root = WriterLock(self.path)
        info = root.clear_if_gone(break_lock)
        if info is not None:
            return (
                f"by pid {info.get('pid')} on host {info.get('host')!r}; if no such "
                f"replacement runs, open it with break_lock=True or remove {root.path}"
            )
        if self.stamp is not None and self._stamp() != self.stamp:
            return "just now"
        if lock is not None and lock.held:
            info = lock.holder()
            if info is None or info.get("token") != lock.token:
                return "just now"
        return None

    def check(self, lock: WriterLock | None = None, break_lock: bool = False) -> None:
        """WriterLockedError if the buffer is being (or was just) replaced (see
        :meth:`replaced`)."""
        why = self.replaced(lock, break_lock)
        if why is not None:
            raise WriterLockedError(
                f"{self.path} is being replaced ({why}: an import, checkpoint save, upgrade, "
                "recode or overwrite=True over it) while this writer opened it; the writer "
                "added nothing. Open it again once that is done"
            )


@contextlib.contextmanager
def new_tree(
    target: Location,
    what: str,
    *,
    overwrite: bool = True,
    sources: Iterable[Location] = (),
    replaces: Callable[[Location], bool] = is_buffer,
    kind: str = "a zreplay buffer",
) -> Iterator[Location]:
    """Check ``target`` (:func:`check_target`; an existing non-empty one also needs
    ``overwrite``), then yield where to build the tree that replaces it in one step
    (``backend.staged_tree``), the writer locks of a buffer there held meanwhile."""
    if not overwrite and target.exists() and not is_empty_dir(target):
        raise DestinationError(
            f"{what}: {target} exists; pick a new path, or pass overwrite=True to replace it"
        )
    check_target(target, what, sources=sources, replaces=replaces, kind=kind)
    with holding_writer_locks(target, what), target.backend.staged_tree(target) as tmp:
        yield tmp


def copy_files(tmp: Location, files: Iterable[tuple[Location, str]]) -> None:
    """Copy each ``(source, rel)`` file to ``tmp / rel`` (a tree being built aside), each
    parent directory made once: what a rewrite keeps of the buffer it rewrites."""
    made: set[str] = set()
    for loc, rel in files:
        parent = rel.rpartition("/")[0]
        if parent and parent not in made:
            (tmp / parent).mkdir(parents=True, exist_ok=True)
            made.add(parent)
        tmp.backend.import_file(loc, tmp / rel)
