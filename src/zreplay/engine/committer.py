"""The background writer of an engine: published rows become commits.

Adds publish rows to the RAM tier and the in-RAM index and ask for a commit
(``request``).  This thread takes whole published trajectories, writes their rows and
index entries through the segment, and then replaces ``commit.json`` atomically; only
then may the RAM tier reuse those rows' slots.  After a commit that evicted rows it deletes
the shards holding only evicted rows, once no in-process disk read needs them.

Everything here runs under (or waits on) the engine's condition variable.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import numpy as np

from ..errors import BufferClosedError, WriteFailedError
from ..store.commit import Commit, write_commit

if TYPE_CHECKING:
    from .core import Engine

log = logging.getLogger("zreplay")

JOB_BYTES = 64 << 20


class Committer:
    def __init__(self, engine: Engine):
        self.eng = engine
        self.cond = engine._cond
        self.want = self.done = 0  # commit generations asked for / finished
        self.explicit = 0  # the last generation asked for by flush()
        self.error: BaseException | None = None
        self.reported = False  # the caller has seen self.error
        self.stopping = False
        self._disk_readers = 0
        self._reclaiming = False
        self.thread = threading.Thread(target=self._loop, name="zreplay-writer", daemon=True)
        self.thread.start()

    # -- called by the engine (condition held unless noted) -------------------------

    def request(self) -> None:
        """Ask for a commit of everything published so far."""
        self.want += 1
        self.cond.notify_all()

    def wait_committed(self, row: int) -> None:
        """Block until rows below ``row`` are committed."""
        while self.eng.commit.n_rows < row:
            self.raise_error()
            if self.stopping:
                raise BufferClosedError("buffer is closing")
            self.cond.wait(0.5)

    def raise_error(self) -> None:
        if self.error is not None:
            e, c = self.error, self.eng.commit
            self.reported = True
            raise WriteFailedError(
                f"the background writer failed ({type(e).__name__}: {e}); the last commit "
                f"(gen {c.gen}, {c.n_traj} trajectories) is intact and what was added since "
                "is held in memory, not on disk. Fix the cause (disk space, permissions); "
                "flush() retries the write (and so does the next add)"
            ) from e

    def before_add(self) -> None:
        """An add after a failed commit reports the failure once (that add adds nothing);
        later adds retry the commit, as flush() does (condition not held)."""
        with self.cond:
            if self.error is None:
                return
            if not self.reported:
                self.raise_error()
            self._retry()

    def _retry(self) -> None:
        log.info("zreplay: retrying after writer error %r", self.error)
        self.error = None
        self.request()

    def flush(self) -> None:
        """Block until everything published is committed (condition not held)."""
        with self.cond:
            if self.error is not None:
                self._retry()
            self.request()
            target = self.explicit = self.want
            while self.done < target:
                self.raise_error()
                if not self.thread.is_alive():
                    raise WriteFailedError(
                        "the writer thread is gone (interpreter shutting down?); the last "
                        f"commit (gen {self.eng.commit.gen}) is intact"
                    )
                self.cond.wait(0.5)

    def stop(self) -> None:
        """Let the thread finish (after a flush) and join it (condition not held)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join()

    def begin_disk_read(self) -> None:
        """A reader is about to read committed rows from disk: hold off shard deletion."""
        while self._reclaiming:
            self.cond.wait()
        self._disk_readers += 1

    def end_disk_read(self) -> None:
        with self.cond:
            self._disk_readers -= 1
            self.cond.notify_all()

    # -- the thread -----------------------------------------------------------------

    def _loop(self) -> None:
        eng = self.eng
        while True:
            with self.cond:
                while (self.done >= self.want or self.error) and not self.stopping:
                    self.cond.wait()
                if self.stopping and (self.done >= self.want or self.error):
                    return
                target = self.want
                job = self._snapshot_job()
            try:
                self._write(job)
            except BaseException as e:  # surfaced to the caller by flush()/add()
                log.error("zreplay writer failed: %r", e)
                with self.cond:
                    self.error, self.reported = e, False
                    self.cond.notify_all()
                continue
            with self.cond:
                eng.commit = job["commit"]
                if job["complete"]:
                    self.done = target
                if not eng.ram.enabled and eng.tier is not None:
                    eng.tier.lo = max(eng.tier.lo, eng.commit.n_rows)
                self.cond.notify_all()
            self._reclaim(job["commit"])

    def _snapshot_job(self) -> dict:
        """What the next commit covers: whole trajectories published since the last one,
        at most a quarter of the RAM tier or ``JOB_BYTES`` (but at least one trajectory),
        so adds waiting for room are released progressively and TensorStore's copies of
        the rows being written stay small."""
        eng = self.eng
        idx, old = eng.index, eng.commit
        first = min(old.n_traj, idx.n)
        stop = idx.n
        if eng.tier is not None and stop > first:
            rows = min(eng.tier.capacity // 4, JOB_BYTES // max(1, eng.schema.row_bytes))
            budget = old.n_rows + max(1, rows)
            stop = max(first + 1, int(np.searchsorted(idx.offsets, budget, side="right")) - 1)
            stop = min(stop, idx.n)
        low = min(idx.low, stop)
        columns = idx.columns_range(first, stop)
        ends = idx.column("piece_end")
        p_first = int(ends[first - 1]) if first else 0
        p_stop = int(ends[stop - 1]) if stop else 0
        p_low = int(ends[low - 1]) if low else 0
        pieces = idx.pieces.columns_range(p_first, p_stop)
        next_id, next_episode = eng.next_trajectory_id, eng.next_episode
        if stop < idx.n:  # ids of trajectories/episodes this commit does not cover stay unclaimed
            next_id = _claimed(old.next_trajectory_id, columns["trajectory_id"])
            next_episode = _claimed(old.next_episode, pieces["episode"])
        new = Commit(
            writer_id=eng.writer_id,
            gen=old.gen + 1,
            n_rows=int(idx.offsets[stop]),
            n_traj=stop,
            low_row=int(idx.offsets[low]),
            low_traj=low,
            reclaimed_below=old.reclaimed_below,
            next_trajectory_id=next_id,
            n_pieces=p_stop,
            low_piece=p_low,
            next_episode=next_episode,
            writer_number=old.writer_number,
        )
        # The sampler's saves (priorities) go with this commit; flushes always save.
        entries, persist = eng.sampler_persist(new.n_rows, self.explicit > self.done)
        new.sampler = {**eng.sampler_state(), **entries}
        return {
            "persist": persist,
            "commit": new,
            "complete": stop == idx.n,
            "rows": (old.n_rows, new.n_rows),
            "first_traj": first,
            "offsets": idx.offsets[first + 1 : stop + 1].copy(),
            "columns": columns,
            "first_piece": p_first,
            "pieces": pieces,
            "tier": eng.tier,
            "segment": eng.segment,
            "keys": eng.schema.keys if eng.schema is not None else [],
        }

    def _write(self, job: dict) -> None:
        new: Commit = job["commit"]
        seg = job["segment"]
        if seg is not None:
            start, stop = job["rows"]
            seg.ensure_capacity(new.n_rows, new.n_traj, new.n_pieces)
            futs = []
            for key in job["keys"] if stop > start else ():
                for row0, piece in job["tier"].read_range(key, start, stop):
                    futs.append(seg.write_rows(key, row0, piece))
            futs += seg.write_index(
                job["first_traj"], job["offsets"], job["columns"], job["first_piece"], job["pieces"]
            )
            for f in futs:
                f.result()
        if job["persist"] is not None:
            job["persist"]()
        write_commit(self.eng.seg_dir, new, durable=self.eng.durable)

    def _reclaim(self, commit: Commit) -> None:
        """Delete shards that hold only evicted rows, once no in-process read needs them."""
        eng = self.eng
        if eng.segment is None or commit.low_row <= commit.reclaimed_below:
            return
        shard = min(lay.shard_rows for lay in eng.layouts.values())
        target = (commit.low_row // shard) * shard
        if target <= commit.reclaimed_below:
            return
        with self.cond:
            if self._disk_readers or eng.commit.gen != commit.gen:
                return  # retried after a later commit
            # Announce first, so readers in other processes can tell their rows are gone.
            announced = Commit(**{**vars(commit), "reclaimed_below": target, "gen": commit.gen + 1})
            try:
                write_commit(eng.seg_dir, announced, durable=eng.durable)
            except OSError as e:
                log.warning("zreplay: could not announce shard reclaim: %r", e)
                return
            eng.commit = announced
            self._reclaiming = True
        try:
            eng.segment.reclaim_below(commit.reclaimed_below, target)
        except OSError as e:
            log.warning("zreplay: could not reclaim evicted shards: %r", e)
        finally:
            with self.cond:
                self._reclaiming = False
                self.cond.notify_all()


def _claimed(previous: int, ids: np.ndarray) -> int:
    """The next unused id once ``ids`` are committed after ids below ``previous``."""
    return max(previous, int(ids.max(initial=-1)) + 1)
