"""Replacing a tree in an object store, where nothing renames.

A new tree for ``dest`` (a checkpoint, an import) is built under
``dest/zreplay/staged-<process tag>-<hex>/``, inside the root's meta node where Zarr never
looks.  Publishing the intent ``dest/zreplay/swap.json`` (one PUT) commits the
replacement; the tree is then rolled forward: the old root ``zarr.json`` is deleted (the
half-swapped tree is no buffer), every staged object is copied to its place, objects the
new tree lacks are deleted (but the buffer's own writer lock, held by the replacement
throughout), the new root ``zarr.json`` is copied last, and the intent and
the staged tree are removed.  Every step is idempotent, so a crash anywhere leaves the old
tree (no intent yet) or a committed intent that the next open of ``dest`` rolls forward
(:func:`recover`), giving the new tree; two processes rolling forward at once only repeat
each other's copies.  A build that died before its intent leaves a staged tree that the
next replace of ``dest`` removes (its process is dead in this PID namespace), and that makes a
destination that held nothing else count as empty.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator

from ..errors import CorruptBufferError
from ..threads import deferred_interrupts
from .format import LOCK_NAME, META
from .liveness import process_tag, tag_is_dead

INTENT = "swap.json"
STAGED = "staged-"


def is_staging_name(name: str) -> bool:
    return name.startswith(STAGED) or name == INTENT


def _dead_staging(name: str) -> bool:
    """An object store keeps no flock: its builder is judged by pid, and only when it
    ran in this PID namespace of this kernel (its name says; see ``process_tag``)."""
    tag, _, hexpart = name[len(STAGED) :].rpartition("-")
    return bool(tag and hexpart) and tag_is_dead(tag)


def _read_intent(dest) -> str | None:
    try:
        return json.loads((dest / META / INTENT).read_bytes())["staged"]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None  # never published half (one PUT); unreadable means not ours


def _internal(rel: str) -> bool:
    """Paths under ``dest`` that belong to a replacement, not to the tree: its staged
    trees and intent, and the buffer's own writer lock it holds throughout (a writer
    opening the buffer meanwhile finds it there: ``guard.TreeWatch``)."""
    head, _, rest = rel.partition("/")
    name = rest.split("/", 1)[0]
    return head == META and (is_staging_name(name) or rest.startswith(LOCK_NAME))


def roll_forward(dest, name: str) -> None:
    """Make the staged tree ``name`` the tree at ``dest`` (see the module docstring)."""
    backend = dest.backend
    staged = dest / META / name
    new = dict(backend.walk_files(staged))
    if "zarr.json" not in new:
        if _read_intent(dest) != name:
            return  # another process finished this swap and removed the staged tree
        raise CorruptBufferError(
            f"{dest / META / INTENT} names the staged tree {staged}, which has no root "
            "zarr.json; delete both to keep the tree at "
            f"{dest} as it is"
        )
    try:
        (dest / "zarr.json").unlink(missing_ok=True)
        for rel, src in new.items():
            if rel != "zarr.json":
                backend.import_file(src, dest / rel, link=False)
        stale = [
            loc for rel, loc in backend.walk_files(dest) if rel not in new and not _internal(rel)
        ]
        for loc in stale:
            loc.unlink(missing_ok=True)
        backend.import_file(new["zarr.json"], dest / "zarr.json", link=False)
    except FileNotFoundError:
        if _read_intent(dest) != name:
            return  # another process finished this swap and removed the staged tree
        raise
    (dest / META / INTENT).unlink(missing_ok=True)
    backend.remove_tree(staged)


def recover(dest) -> bool:
    """Finish a committed replacement of ``dest`` that was interrupted; True if one was."""
    name = _read_intent(dest)
    if name is None:
        return False
    roll_forward(dest, name)
    return True


def remove_dead_builds(dest) -> None:
    """Remove staged trees of ``dest`` whose builder died on this host."""
    try:
        entries = list((dest / META).iterdir())
    except FileNotFoundError:
        return
    current = _read_intent(dest)
    for entry in entries:
        if entry.name.startswith(STAGED) and entry.name != current and _dead_staging(entry.name):
            dest.backend.remove_tree(entry)


def only_dead_builds(dest) -> bool:
    """True if ``dest`` holds nothing but staged trees (of builds that died or go on)."""
    if (dest / "zarr.json").is_file():
        return False
    children = list(dest.iterdir())
    if [c.name for c in children] != [META]:
        return False
    return all(c.name.startswith(STAGED) for c in (dest / META).iterdir())


@contextlib.contextmanager
def staged(dest) -> Iterator:
    """Yield where to build the new tree of ``dest``; on a clean exit it replaces
    ``dest`` (see the module docstring), on an exception it is removed."""
    recover(dest)
    remove_dead_builds(dest)
    name = f"{STAGED}{process_tag()}-{uuid.uuid4().hex[:8]}"
    tmp = dest / META / name
    try:
        yield tmp
    except BaseException:
        dest.backend.remove_tree(tmp)
        raise
    # Ctrl-C held back from the intent to the end of the roll forward: a committed
    # replacement is finished here, not left half rolled for the next open to finish
    # (plain Zarr and a bucket listing would see the half-swapped tree until then).
    with deferred_interrupts():
        dest.backend.publish(dest / META / INTENT, json.dumps({"staged": name}).encode(), True)
        roll_forward(dest, name)
