"""Replacing a local directory tree in one step, and cleaning up after killed replaces.

A new tree is built beside its destination as ``.<name>.partial-<tag>-<hex>`` (the tag
names its process: host, PID namespace, pid), holding an ``flock`` on it while it lives, and
swapped in with ``renameat2(RENAME_EXCHANGE)`` (Linux 3.15+, most local filesystems): at
every instant the destination is the old tree or the new one.  The old tree, now at the
staging name, is then removed.  Where the exchange is unsupported the swap is two renames
(``dest`` to ``.<name>.old-<tag>-<hex>``, then the new tree to ``dest``), and a crash
between them is repaired by the next :func:`remove_leftovers`, which puts the old tree
back.  Leftovers of processes that died (still holding hard links to data a buffer has
since evicted) are removed by the next replace of the same destination; a process is
judged dead by its ``flock`` (or its pid, within this PID namespace), never by a pid seen
from another namespace (:mod:`~zreplay.store.liveness`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from ..threads import deferred_interrupts
from .liveness import hold, process_tag, tag_is_dead

PARTIAL, OLD = "partial", "old"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_renameat2 = None


def stage_name(dest: Path, kind: str) -> Path:
    """``.<name>.<kind>-<process tag>-<hex>`` beside ``dest`` (see
    :func:`~zreplay.store.liveness.process_tag`)."""
    return dest.with_name(f".{dest.name}.{kind}-{process_tag()}-{uuid.uuid4().hex[:8]}")


def _leftover_kind(dest: Path, entry: str) -> str | None:
    """``PARTIAL``/``OLD`` if ``entry`` (a name beside ``dest``) is a staging tree (or
    file) of ``dest`` whose process is gone, else None.  Gone is judged by the ``flock``
    its maker keeps on it while it lives, whatever PID namespace it runs in (its pid
    only within ours): a live maker's staging is never removed."""
    for kind in (PARTIAL, OLD):
        prefix = f".{dest.name}.{kind}-"
        if not entry.startswith(prefix):
            continue
        tag, _, hexpart = entry[len(prefix) :].rpartition("-")
        if not tag or not hexpart or tag.count("-") > 2:
            # not ours to judge: a process tag has at most two dashes (its host's are
            # made "_"), so ".d.old-x.partial-<tag>-<hex>" is a staging tree of "d.old-x"
            return None
        # a staging tree is made, then held; an old tree was held before it moved aside
        dead = tag_is_dead(tag, dest.parent / entry, made_then_held=kind == PARTIAL)
        return kind if dead else None
    return None


def _leftovers(dest: Path) -> list[tuple[str, str]]:
    try:
        names = os.listdir(dest.parent)
    except FileNotFoundError:
        return []
    return [(n, k) for n in names if (k := _leftover_kind(dest, n)) is not None]


def restore(dest: Path) -> bool:
    """If ``dest`` is missing because a process died between the two renames of a
    fallback swap, put the old tree back; True if it did."""
    if os.path.lexists(dest):
        return False
    olds = [n for n, k in _leftovers(dest) if k == OLD]
    if not olds:
        return False
    try:
        os.rename(dest.parent / olds[0], dest)
    except FileNotFoundError:
        return os.path.lexists(dest)  # another process restored it
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return True  # another process restored it or built a new one
        raise
    return True


def remove_leftovers(dest: Path) -> list[Path]:
    """Restore ``dest`` (see :func:`restore`), then remove the staging trees (or files)
    of ``dest`` whose process died; returns the paths removed."""
    restore(dest)
    done = []
    for name, _ in _leftovers(dest):
        p = dest.parent / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        done.append(p)
    return done


def exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically; False where the system or filesystem cannot."""
    global _renameat2
    if _renameat2 is None:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
        except (AttributeError, OSError):
            fn = False
        else:
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
            fn.argtypes += [ctypes.c_uint]
            fn.restype = ctypes.c_int
        _renameat2 = fn
    if not _renameat2:
        return False
    rc = _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def swap_in(tmp: Path, dest: Path) -> None:
    """Make the tree at ``tmp`` appear at ``dest`` (replacing what is there) in one step,
    then remove the old tree."""
    if not os.path.lexists(dest):
        os.rename(tmp, dest)
        return
    # Past the swap, the old tree's removal runs with Ctrl-C held back: a KeyboardInterrupt
    # inside rmtree can make it close one directory descriptor twice (EBADF, or another
    # thread's file), and the replacement is done anyway.
    if exchange(tmp, dest):
        with deferred_interrupts():
            shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old tree
        return
    old = stage_name(dest, OLD)
    held = hold(dest)  # moves with it: the old tree is ours until it is removed
    try:
        os.rename(dest, old)
        os.rename(tmp, dest)
        with deferred_interrupts():
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if held is not None:
            held.release()


@contextlib.contextmanager
def staged(dest: Path) -> Iterator[Path]:
    """Yield a new directory beside ``dest`` to build in; on a clean exit it replaces
    ``dest`` in one step, on an exception it is removed."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(dest)
    if dest.is_dir() and not any(dest.iterdir()):
        dest.rmdir()
    tmp = stage_name(dest, PARTIAL)
    tmp.mkdir()
    held = hold(tmp)  # while it lives, no other process takes it for a leftover
    try:
        yield tmp
        swap_in(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if held is not None:
            held.release()
