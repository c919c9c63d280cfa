"""Rate limiting between writers and learners of a shared buffer, without a server.

Reverb's rate limiters keep off-policy training stable when actors and learners run at
different speeds: ``MinSize(n)`` holds learners back until ``n`` rows are stored;
``SampleToInsertRatio(samples_per_insert, min_size_to_sample, error_buffer)`` keeps each
learner's samples within ``error_buffer`` of ``samples_per_insert`` times the rows
inserted, making learners wait when they are ahead and writers when they are.

Here the counts come from files every party can read (local disk, NFS, S3):

* rows inserted: the segments' commit records (``inserted`` counts every row a
  segment's adds committed, not the row numbers a clear skips; a writer adds the rows
  it has not committed yet);
* samples: each learner publishes its own count in a progress file
  (:mod:`zreplay.store.progress`), at most every ``publish_every_s`` and whenever it is
  about to wait.

For learner ``i``, ``diff = (inserted - baseline_i) * samples_per_insert - samples_i``
(Reverb's ``inserts * spi - samples``; ``baseline`` forgives the rows inserted before
it first declared itself, beyond ``min_size_to_sample``, so a learner joining a full
buffer starts at the centre).  A learner may draw ``n`` when the buffer holds
``min_size_to_sample`` rows and ``diff - n >= min_diff``; a writer may insert ``k`` rows
when the buffer is below ``min_size_to_sample`` or, for every live learner,
``diff + k * spi <= max_diff``.  A call too large for the error buffer goes through once
``diff`` is back at the centre, so writers and learners never wait for each other at
the same time.  Counts are read as published, so both sides err on the side of waiting;
concurrent writers may together overshoot by what they add between two checks.

A learner is live while its progress file changes (``seq``) at least every
``learner_timeout_s`` of the writer's own clock (no clocks compared across hosts) and
it has not closed.  Its count survives restarts: a learner reopened with the same
``learner_id`` continues from its file.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import threading
import time
import weakref
from collections.abc import Iterator

from ..errors import BufferClosedError, RateLimitTimeout
from ..forks import Origin
from ..numbers import as_float, as_int, as_optional_float
from ..schema import check_key_component
from ..store.progress import (
    LearnerProgress,
    committed_rows,
    publish_progress,
    read_all_progress,
    read_progress,
)
from .waits import Interrupted, pause

log = logging.getLogger("zreplay")

# Learners of this process by (buffer, learner_id): a writer here reads their counts as
# they are, not as last published (a loop that adds and samples in one thread would
# otherwise wait for a publish that only its own next sample makes).
_LOCAL: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

# Learners of this process about to be closed on a thread of their own (their view was
# dropped): a learner declared again under the same name waits for that close first, so
# its count resumes from the final one and no late "stopped" lands after it.
_PENDING: dict[tuple[str, str], threading.Event] = {}
_PENDING_LOCK = threading.Lock()
PENDING_WAIT_S = 30.0


@atexit.register
def _close_live_learners() -> None:
    # A learner still open when the program ends publishes its count and that it stopped
    # (a close started on a thread by a finalizer at exit would not be waited for).
    for gate in list(_LOCAL.values()):
        try:
            gate.close()
        except Exception as e:  # noqa: BLE001 - best effort at exit
            log.error("zreplay: closing learner %s at exit failed: %r", gate.learner_id, e)


__all__ = ["MinSize", "RateGate", "RateLimiter", "SampleToInsertRatio"]


class RateLimiter:
    """Reverb's rate limiter: bounds on ``diff = inserted * samples_per_insert -
    samples`` (see the module docstring); ``None`` bounds are open.

    Options: ``timeout_s`` (how long a call waits before ``RateLimitTimeout``; None:
    forever), ``poll_s`` (first re-check interval, growing to 10x), ``learner_timeout_s``
    (a learner whose progress file did not change for this long is ignored by writers),
    ``publish_every_s`` (how often a learner publishes its count while sampling).
    """

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        min_diff: float | None,
        max_diff: float | None,
        *,
        timeout_s: float | None = None,
        poll_s: float = 0.05,
        learner_timeout_s: float = 60.0,
        publish_every_s: float = 0.5,
    ):
        samples_per_insert = as_float(samples_per_insert, "samples_per_insert")
        if not samples_per_insert > 0:
            raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert}")
        min_size_to_sample = as_int(min_size_to_sample, "min_size_to_sample (rows)", minimum=1)
        min_diff = as_optional_float(min_diff, "min_diff")
        max_diff = as_optional_float(max_diff, "max_diff")
        if min_diff is not None and max_diff is not None and not min_diff < max_diff:
            raise ValueError(f"min_diff {min_diff} must be below max_diff {max_diff}")
        poll_s = as_float(poll_s, "poll_s")
        learner_timeout_s = as_float(learner_timeout_s, "learner_timeout_s")
        for name, v in (("poll_s", poll_s), ("learner_timeout_s", learner_timeout_s)):
            if not v > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {v}")
        timeout_s = as_optional_float(timeout_s, "timeout_s")
        if timeout_s is not None and not timeout_s >= 0:
            raise ValueError(f"timeout_s must be >= 0 seconds or None, got {timeout_s}")
        publish_every_s = as_float(publish_every_s, "publish_every_s")
        if not publish_every_s >= 0:
            raise ValueError(f"publish_every_s must be >= 0 seconds, got {publish_every_s}")
        self.samples_per_insert = samples_per_insert
        self.min_size_to_sample = min_size_to_sample
        self.min_diff, self.max_diff = min_diff, max_diff
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self.learner_timeout_s = learner_timeout_s
        self.publish_every_s = publish_every_s

    def limits(self) -> dict:
        """The numbers a learner publishes (writers hold it to them)."""
        keys = ("samples_per_insert", "min_size_to_sample", "min_diff", "max_diff")
        return {k: getattr(self, k) for k in keys}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.limits()})"


class MinSize(RateLimiter):
    """Learners wait until the buffer holds ``min_size`` rows; nobody else ever waits."""

    def __init__(self, min_size: int, **options):
        super().__init__(1.0, min_size, None, None, **options)


class SampleToInsertRatio(RateLimiter):
    """Each learner draws ``samples_per_insert`` samples per inserted row, within
    ``error_buffer`` samples either way, once ``min_size_to_sample`` rows are stored
    (Reverb's limiter of the same name: ``diff`` is kept in
    ``spi * min_size_to_sample -/+ error_buffer``)."""

    def __init__(
        self,
        samples_per_insert: float,
        min_size_to_sample: int,
        error_buffer: float,
        **options,
    ):
        error_buffer = as_float(error_buffer, "error_buffer")
        if not error_buffer > 0:
            raise ValueError(f"error_buffer must be > 0 samples, got {error_buffer}")
        centre = as_float(samples_per_insert, "samples_per_insert") * as_int(
            min_size_to_sample, "min_size_to_sample (rows)", minimum=1
        )
        super().__init__(
            samples_per_insert,
            min_size_to_sample,
            centre - error_buffer,
            centre + error_buffer,
            **options,
        )


def can_sample(lim: dict, visible: int, diff: float, n: int) -> bool:
    if visible < lim["min_size_to_sample"]:
        return False
    lo = lim["min_diff"]
    centre = lim["samples_per_insert"] * lim["min_size_to_sample"]
    return lo is None or diff - n >= lo or diff >= centre


def can_insert(lim: dict, visible: int, diff: float, k: int) -> bool:
    hi = lim.get("max_diff")
    if hi is None or visible + k <= lim["min_size_to_sample"]:
        return True
    spi = lim["samples_per_insert"]
    return diff + k * spi <= hi or diff <= spi * lim["min_size_to_sample"]


def check_rate_options(limiter, learner_id) -> None:
    """Refuse a ``rate_limiter`` that is not one and a ``learner_id`` that is not a safe
    name (it names the learner's progress file), before anything uses them."""
    if limiter is not None and not isinstance(limiter, RateLimiter):
        raise TypeError(
            f"rate_limiter must be a zreplay rate limiter (zreplay.MinSize, "
            f"zreplay.SampleToInsertRatio), got {type(limiter).__name__}"
        )
    if learner_id is not None:
        if not isinstance(learner_id, str):
            raise TypeError(f"learner_id must be a str, got {type(learner_id).__name__}")
        check_key_component(learner_id, "learners")


class RateGate:
    """A limiter bound to one buffer core: ``before_sample`` / ``sampled`` for learners
    (the count is published when ``learner_id`` is given), ``before_insert`` for
    writers."""

    def __init__(self, limiter: RateLimiter, core, learner_id: str | None = None):
        self.limiter, self.core, self.learner_id = limiter, core, learner_id
        self.root = core.engine.root
        self._seen: dict[str, tuple[int, float]] = {}  # learner -> (seq, when it changed)
        self._published = -math.inf
        self._closing = core.closing  # set by the core's close(): waits end at once
        self._origin = Origin()  # a forked copy is no learner
        self.me: LearnerProgress | None = None
        self._buffer = self._buffer_id()
        if learner_id is not None:
            key = (str(self.root.path), learner_id)
            pending = _PENDING.get(key)
            if pending is not None:
                pending.wait(PENDING_WAIT_S)
            self._declare()
            _LOCAL[key] = self

    def _buffer_id(self):
        """Which buffer a reader reads (its root's creation time): another one made at
        the same path (``overwrite=True``) owes this learner nothing it sampled before."""
        eng = self.core.engine
        return None if eng.writable else eng.created

    def _declare(self) -> None:
        """Publish this learner's progress: resumed from its file, or new (rows already
        there beyond the minimum are not owed samples)."""
        self.root.create_meta_node(self.root.path)  # where progress files live (made if missing)
        got = read_progress(self.root.path, self.learner_id)
        if got is None:
            inserted, _ = self._counts(refresh=False)
            base = max(0, inserted - self.limiter.min_size_to_sample)
            got = LearnerProgress(self.learner_id, baseline=base)
        got.closed, got.limits = False, self.limiter.limits()
        self.me = got
        self.publish()

    # -- counts ---------------------------------------------------------------------

    def _counts(self, refresh: bool) -> tuple[int, int]:
        """``(inserted, visible)`` rows: a reader's last refresh (re-read if
        ``refresh``), a writer's own rows plus the other segments' commits."""
        eng = self.core.engine
        if eng.writable:
            inserted, visible = committed_rows(self.root, skip=eng.writer_id)
            c = eng.commit  # its committed inserts, and the rows added since
            mine = c.inserted + eng.state.index.n_rows - c.n_rows
            return inserted + mine, visible + eng.num_rows
        if refresh:
            self.core.refresh()
        if self.me is not None and eng.created != self._buffer:
            self._buffer = eng.created  # a new buffer at the path: this learner starts over
            self._declare()
        commits = [c for _, c in eng.commits()]
        return sum(c.inserted for c in commits), sum(c.n_rows - c.low_row for c in commits)

    @staticmethod
    def diff(lim: dict, inserted: int, p: LearnerProgress) -> float:
        return max(0, inserted - p.baseline) * lim["samples_per_insert"] - p.samples

    # -- learners -------------------------------------------------------------------

    def publish(self) -> None:
        if self.me is not None and not self._origin.inherited:  # a forked copy is no learner
            self.me.seq += 1
            publish_progress(self.root.path, self.me)
            self._published = time.monotonic()

    def _sample_blocker(self, n: int, refresh: bool) -> str | None:
        inserted, visible = self._counts(refresh)
        lim = self.limiter.limits()
        if visible < lim["min_size_to_sample"]:
            return f"the buffer holds {visible} rows, fewer than min_size_to_sample={lim['min_size_to_sample']}"
        if self.me is None or can_sample(lim, visible, self.diff(lim, inserted, self.me), n):
            return None
        owed = (inserted - self.me.baseline) * lim["samples_per_insert"]
        return (
            f"learner {self.learner_id!r} has drawn {self.me.samples} samples for "
            f"{inserted - self.me.baseline} inserted rows (samples_per_insert="
            f"{lim['samples_per_insert']:g}: {owed:.0f} owed); {n} more would pass the "
            "error buffer: waiting for writers to insert"
        )

    def before_sample(self, n: int) -> None:
        """Wait until ``n`` samples are allowed (no I/O when they already are)."""
        if self._sample_blocker(n, refresh=False) is None:
            return
        self._wait(lambda: self._sample_blocker(n, refresh=True), f"sample({n})", self.publish)

    @contextlib.contextmanager
    def sampling(self, n: int) -> Iterator[None]:
        """A rate-limited sample of ``n`` units is the block: it starts once they are
        allowed, and they are counted when it ends (a block that raises counts nothing)."""
        self.before_sample(n)
        yield
        self.sampled(n)

    def sampled(self, n: int) -> None:
        if self.me is not None:
            self.me.samples += int(n)
            if time.monotonic() - self._published >= self.limiter.publish_every_s:
                self.publish()

    def close(self) -> None:
        """Publish the final count and that this learner stopped (writers stop waiting
        for it); a sample or add of this buffer waiting in another thread stops waiting
        (``BufferClosedError``)."""
        try:
            if self.me is not None and not self.me.closed:
                self.me.closed = True
                self.publish()
        finally:
            with _PENDING_LOCK:
                done = _PENDING.pop((str(self.root.path), self.learner_id), None)
            if done is not None:
                done.set()

    def closing_soon(self) -> None:
        """It is about to be closed on another thread (its view was dropped): a learner
        declared again in this process under the same name waits for that close."""
        if self.me is not None and not self.me.closed and not self._origin.inherited:
            with _PENDING_LOCK:
                _PENDING.setdefault((str(self.root.path), self.learner_id), threading.Event())

    # -- writers --------------------------------------------------------------------

    def _live(self) -> list[LearnerProgress]:
        now, out = time.monotonic(), []
        for p in read_all_progress(self.root.path):
            mine = _LOCAL.get((str(self.root.path), p.learner_id))
            if mine is not None and mine.me is not None and mine.me.seq >= p.seq:
                p = mine.me  # a learner of this process: its count as it is now
            seq, since = self._seen.get(p.learner_id, (None, now))
            if seq != p.seq:
                since = now
            self._seen[p.learner_id] = (p.seq, since)
            if not p.closed and now - since < self.limiter.learner_timeout_s and p.limits:
                out.append(p)
        return out

    def _insert_blocker(self, k: int) -> str | None:
        learners = self._live()
        if not learners:
            return None
        inserted, visible = self._counts(refresh=False)
        for p in learners:
            d = self.diff(p.limits, inserted, p)
            if not can_insert(p.limits, visible, d, k):
                since = time.monotonic() - self._seen[p.learner_id][1]
                return (
                    f"writer {self.core.engine.writer_id!r} is ahead of learner "
                    f"{p.learner_id!r} (host {p.host}, pid {p.pid}, {p.samples} samples, "
                    f"progress changed {since:.1f} s ago): {k} more rows would pass its "
                    f"samples_per_insert={p.limits['samples_per_insert']:g} by more than its "
                    "error buffer"
                )
        return None

    def before_insert(self, k: int) -> None:
        """Wait until ``k`` more rows do not run ahead of any live learner."""
        self._wait(lambda: self._insert_blocker(k), f"add of {k} rows", None)

    # -- waiting --------------------------------------------------------------------

    def _wait(self, blocker, what: str, heartbeat) -> None:
        reason = blocker()
        if reason is None:
            return
        lim = self.limiter
        start = time.monotonic()
        delay, warned = lim.poll_s, start
        if heartbeat is not None:
            heartbeat()  # writers see how far this learner got before it waits
        while True:
            if heartbeat is not None and time.monotonic() - self._published >= lim.publish_every_s:
                heartbeat()
            waited = time.monotonic() - start
            if lim.timeout_s is not None and waited >= lim.timeout_s:
                raise RateLimitTimeout(
                    f"{what} on {self.core.path} waited {waited:.1f} s (timeout_s="
                    f"{lim.timeout_s:g}): {reason}. Nothing was done; check that the other "
                    "side is running, or raise timeout_s"
                )
            if time.monotonic() - warned >= 30.0:
                log.warning("zreplay: %s has waited %.0f s: %s", what, waited, reason)
                warned = time.monotonic()
            sleep = delay if lim.timeout_s is None else min(delay, lim.timeout_s - waited)
            try:
                pause(sleep, self._closing)
            except Interrupted as e:
                if e.event is not self._closing:
                    raise  # its thread's owner (a prefetcher) was closed
                raise BufferClosedError(
                    f"{what} on {self.core.path} was waiting ({reason}) when the buffer "
                    "was closed; nothing was done"
                ) from None
            delay = min(delay * 1.5, 10 * lim.poll_s)
            reason = blocker()
            if reason is None:
                return
