"""Refilling a reopened writer's RAM tier in the background.

A writer that opens an existing segment (a resumed buffer, ``load_checkpoint``'s
adoption) starts with an empty RAM tier; the newest committed rows it should hold are
read back from disk here, newest block first, on a thread of its own, so opening does
not wait for them.  Until a row is back in RAM it is read from disk like any other
committed row, so nothing a caller sees changes but speed.  Each block enters the tier
under the writer's lock only if the tier is still the one it was read for and the rows
are still visible and fit below the rows added since (``WriterState.put_preloaded``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

from ..index.coords import RowRange

log = logging.getLogger("zreplay")

BLOCK_BYTES = 32 << 20


class TierPreload:
    """One background refill of a writer's RAM tier (see the module docstring): its
    condition ``cond``, its ``state`` (a WriterState) and its ``committer`` (which holds
    off shard deletion while a block is read)."""

    def __init__(self, cond, state, committer):
        self._cond, self._state, self._committer = cond, state, committer
        self._stop = False
        self.thread: threading.Thread | None = None

    def start(self) -> TierPreload:
        """Start refilling (condition not held; a refill still running is stopped
        first); a no-op when nothing is missing.  Returns itself."""
        self.stop()
        self._stop = False
        with self._cond:
            plan = self._state.preload_rows()
        if plan is not None:
            self.thread = threading.Thread(
                target=self._run, args=plan, daemon=True, name="zreplay-preload"
            )
            self.thread.start()
        return self

    def stop(self) -> None:
        """Stop and wait for the thread (condition not held)."""
        self._stop = True
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    @contextlib.contextmanager
    def paused(self, resume: Callable[[], bool]) -> Iterator[None]:
        """No refill runs in the block (the segment's contents may change in it); one
        starts afresh after it if ``resume()`` (the writer is still open)."""
        self.stop()
        try:
            yield
        finally:
            if resume():
                self.start()

    def done(self) -> bool:
        return self.thread is None or not self.thread.is_alive()

    def _run(self, tier, missing: RowRange) -> None:
        state = self._state
        seg, schema = state.segment, state.schema
        step = max(1, BLOCK_BYTES // max(1, schema.row_bytes))
        stop = missing.stop
        try:
            while stop > missing.start and not self._stop:
                start = max(missing.start, stop - step)
                with self._cond:
                    if self._stop:
                        return
                    self._committer.begin_disk_read()  # no shard is deleted under this read
                try:
                    futs = {k: seg.read_range(k, start, stop) for k in schema.keys}
                    rows = {k: f.result() for k, f in futs.items()}
                finally:
                    self._committer.end_disk_read()
                with self._cond:
                    block = RowRange(start, stop)
                    if self._stop or not state.put_preloaded(tier, block, rows):
                        return
                stop = start
        except Exception as e:  # noqa: BLE001 - the rows stay readable from disk
            log.debug("zreplay: RAM tier refill of %s stopped: %r", seg.dir, e)
