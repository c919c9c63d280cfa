"""Priorities a writer saved with its commits, read from outside it (views, other
processes).  A writer rewrites the copy its commit does *not* name, so a copy read while
the commit still names it (same ``seq`` before and after the read) is consistent."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import EmptyBufferError
from ..store.commit import Commit, read_commit
from ..store.priority import PriorityArrays
from .base import Persisted

_RETRIES = 5


def stored_priorities(seg_dir: Path, commit: Commit) -> Persisted | None:
    """``(meta, read(lo, hi))`` of the priorities saved with ``commit`` (``None`` if the
    writer saved none); ``read`` returns the newest saved leaves of rows ``[lo, hi)``."""
    meta = (commit.sampler or {}).get("priority")
    if not meta:
        return None
    arrays = PriorityArrays(seg_dir, writable=False)
    bounded = {**meta, "high": min(meta["high"], commit.n_rows)}

    def read(lo: int, hi: int) -> np.ndarray:
        m = meta
        for _ in range(_RETRIES):
            if not (m["low"] <= lo and hi <= m["high"]):
                break
            leaves = arrays.read(m["slot"], lo, hi)
            now = (read_commit(seg_dir) or commit).sampler.get("priority") or {}
            if now.get("seq") == m["seq"]:
                return leaves
            m = now  # the writer saved again (and may be rewriting what we read): retry
        raise EmptyBufferError(
            f"{seg_dir}: the writer kept replacing its saved priorities while they were "
            "read; sample again"
        )

    return bounded, read
