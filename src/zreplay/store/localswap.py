"""Replacing a local directory tree in one step, and cleaning up after killed replaces.

A new tree is built beside its destination as ``.<name>.partial-<host>-<pid>-<hex>`` and
swapped in with ``renameat2(RENAME_EXCHANGE)`` (Linux 3.15+, most local filesystems): at
every instant the destination is the old tree or the new one.  The old tree, now at the
staging name, is then removed.  Where the exchange is unsupported the swap is two renames
(``dest`` to ``.<name>.old-<host>-<pid>-<hex>``, then the new tree to ``dest``), and a crash
between them is repaired by the next :func:`remove_leftovers`, which puts the old tree
back.  Leftovers of processes that died on this host (still holding hard links to data a
buffer has since evicted) are removed by the next replace of the same destination.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

PARTIAL, OLD = "partial", "old"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_renameat2 = None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stage_name(dest: Path, kind: str) -> Path:
    host = socket.gethostname().replace("-", "_")
    return dest.with_name(f".{dest.name}.{kind}-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _leftover_kind(dest: Path, entry: str) -> str | None:
    """``PARTIAL``/``OLD`` if ``entry`` (a name beside ``dest``) is a staging tree of
    ``dest`` left by a dead process on this host, else None."""
    for kind in (PARTIAL, OLD):
        prefix = f".{dest.name}.{kind}-"
        if not entry.startswith(prefix):
            continue
        parts = entry[len(prefix) :].rsplit("-", 2)
        if len(parts) != 3 or not parts[1].isdigit():
            return None  # not ours to judge
        host, pid = parts[0], int(parts[1])
        if host != socket.gethostname().replace("-", "_") or pid_alive(pid):
            return None
        return kind
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
    """Restore ``dest`` (see :func:`restore`), then remove the staging trees of ``dest``
    whose process died; returns the paths removed."""
    restore(dest)
    done = []
    for name, _ in _leftovers(dest):
        shutil.rmtree(dest.parent / name, ignore_errors=True)
        done.append(dest.parent / name)
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
    if exchange(tmp, dest):
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old tree
        return
    old = stage_name(dest, OLD)
    os.rename(dest, old)
    os.rename(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)


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
    try:
        yield tmp
        swap_in(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
