"""Learner progress files: how far each learner that declared itself has sampled.

Rate limiting between writers and learners (``zreplay.SampleToInsertRatio``) needs two
counts every party can read without a server: rows inserted (the segments' commit
records already say it: ``inserted`` counts every row a segment's adds committed) and
samples drawn by each learner.  A learner publishes the latter as a small JSON file of
its own, ``<root>/zreplay/learners/<learner_id>.json`` (inside the root's ``zreplay``
node, beside the writer claims; never on the data path), replaced atomically like a
commit record.  See FORMAT.md "Learner progress".
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import asdict, dataclass, field

from ..errors import CorruptBufferError
from ..schema import check_key_component
from .commit import read_commit
from .format import learner_path, learners_dir
from .location import Location

log = logging.getLogger("zreplay")


@dataclass
class LearnerProgress:
    """One learner's published progress.

    ``samples``: units (rows, clips, n-step transitions) it has drawn; ``baseline``: rows
    inserted before it joined that it is not asked to sample (see ``core/rate.py``);
    ``seq``: grows on every publish, so a reader sees the learner is alive without
    comparing clocks across hosts; ``closed``: the learner said it stopped; ``limits``:
    the rate limiter it declared (writers hold it to its own numbers).
    """

    learner_id: str
    samples: int = 0
    baseline: int = 0
    seq: int = 0
    closed: bool = False
    limits: dict = field(default_factory=dict)
    host: str = ""
    pid: int = 0
    time: float = 0.0

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


def publish_progress(root: Location, p: LearnerProgress) -> None:
    """Atomically replace ``p.learner_id``'s progress file (no fsync: losing the last
    few counts to a power cut only makes writers wait a little longer)."""
    check_key_component(p.learner_id, "learners")
    p.host, p.pid, p.time = socket.gethostname(), os.getpid(), time.time()
    path = learner_path(root, p.learner_id)
    try:
        # Not parents=True: the root's zreplay node is there unless the buffer is being
        # removed (overwrite=True), and a publish must not bring back what it removes.
        path.parent.mkdir(exist_ok=True)
        path.backend.publish(path, p.to_json(), durable=False)
    except FileNotFoundError:
        log.info("zreplay: %s is gone (the buffer was removed); progress not published", path)


def _parse(path: Location) -> LearnerProgress | None:
    try:
        text = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    try:
        d = json.loads(text)
        return LearnerProgress(**{k: d[k] for k in LearnerProgress.__dataclass_fields__ if k in d})
    except (ValueError, TypeError, KeyError) as e:
        raise CorruptBufferError(
            f"{path}: learner progress file is unreadable ({e}); delete it and restart that learner"
        ) from None


def read_progress(root: Location, learner_id: str) -> LearnerProgress | None:
    """``learner_id``'s progress, or None if it never published."""
    check_key_component(learner_id, "learners")
    return _parse(learner_path(root, learner_id))


def read_all_progress(root: Location) -> list[LearnerProgress]:
    """Every learner's progress (temp files of a publish in flight skipped)."""
    try:
        entries = sorted(learners_dir(root).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for p in entries:
        if p.name.endswith(".json"):
            got = _parse(p)
            if got is not None:
                out.append(got)
    return out


def committed_rows(root, skip: str | None = None) -> tuple[int, int]:
    """``(inserted, visible)`` rows over the committed segments of the buffer whose
    :class:`~zreplay.store.root.BufferRoot` is ``root`` (except segment ``skip``):
    ``inserted`` sums the commits' ``inserted`` (rows ever added: not the row numbers a
    clear skips, nor rows a loaded checkpoint brought), ``visible`` the rows kept."""
    inserted = visible = 0
    for seg_dir in root.segment_dirs():  # no zarr.json check: one without a commit adds 0
        if seg_dir.name == skip:
            continue
        c = read_commit(seg_dir)
        if c is not None:
            inserted += c.inserted
            visible += c.n_rows - c.low_row
    return inserted, visible
