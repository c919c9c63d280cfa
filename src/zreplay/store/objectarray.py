"""Zarr arrays in an object store, read and written by byte ranges (no zarr-python).

:class:`ObjectArray` is the handle :class:`~zreplay.store.backend_s3.S3Backend` opens: the
subset of a TensorStore handle zreplay uses (``shape``, ``[sel].read()``,
``[sel].write(v)`` returning futures, ``resize``).  Every request goes through the
backend's ``get``/``put`` (see :mod:`zreplay.store.objectio`).

Reading sorted rows of a sharded array costs at most two rounds of concurrent requests:

1. the index of every touched shard that :class:`ShardCache` cannot vouch for (one
   suffix GET of ``16 * chunks + 4`` bytes each); a shard the merged ranges would span
   for the most part anyway (a small one; wanted chunks spread over half of it or more
   at most ``GAP`` bytes apart on average, as random rows are) is fetched whole instead,
   index and chunks at once;
2. the inner chunks the rows need, ranges of one shard merged where at most ``GAP``
   bytes lie between them (``GAP`` = 1 MiB: on S3 and moto the request count, not the
   bytes, sets the cost; see benchmarks/HISTORY.md).

A merged range brings back the chunks between those needed too (a sample of random rows
fetches most of every shard it touches): a reader with a chunk cache keeps their bytes,
still encoded, where its index vouches for them (complete, committed chunks), so later
reads decode them without a request.

Chunks are checksummed (crc32c) on decode.  An index taken from the cache that no longer
matches the object (its shard was rewritten, or replaced by a writer that cleared the
segment) fails that check: the read drops the cached indexes and runs again with fresh
ones (a writer may also replace a shard between a fresh index's GET and the chunks'
GETs); a failure that persists over ``RETRIES`` reads is damage.

Unsharded arrays (the index columns, saved priorities) are one object per chunk, read
whole; their writer keeps the last chunk it wrote so that appending to it needs no GET.
Sharded arrays are written by :class:`~zreplay.store.shardwriter.ShardWriter`: one PUT per
touched shard.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import partial

import numpy as np

from ..forks import at_fork
from .shards import MISSING, ArrayMeta, ChunkError, merge_ranges, parse_index
from .shardwriter import ShardWriter

GAP = 1 << 20
RETRIES = 4


class ShardCache:
    """What the readers and the writer of one segment's arrays share (the backend's
    array context): cached shard indexes, the rows known to be committed, and the
    writer's open shards.

    A shard index fetched when rows below ``known_rows`` were committed stays valid for
    every chunk wholly below that count (``covers``): committed rows never change, and a
    writer rewriting a shard keeps its complete chunks' bytes where they were.  A chunk
    that was still filling up is not covered (its bytes change when it fills).  Entries of
    shards the writer reclaimed are dropped; everything is forgotten when the segment was
    cleared or replaced (:meth:`seen`).

    Readers also keep chunks wholly below ``known_rows`` (complete and committed: they
    never change), least recently used out beyond ``chunk_bytes``: decoded ones they
    read, and the encoded bytes of the others a ranged read brought back, so a view that
    draws the same rows again, or rows near those it drew, reads nothing from the
    store."""

    def __init__(self, chunk_bytes: int = 0):
        self.lock = threading.Lock()
        self.known_rows = 0
        self.chunk_bytes = int(chunk_bytes)
        # (array, chunk) -> (decoded block, or its encoded bytes; the chunk's rows)
        self._chunks: OrderedDict[tuple[str, int], tuple[np.ndarray | bytes, int]] = OrderedDict()
        self._held = 0
        self._indexes: dict[tuple[str, int], tuple[np.ndarray, int, int]] = {}
        self.writers: dict[str, ShardWriter] = {}
        self.lanes: dict[str, Future] = {}  # the last write of each array (writes in order)
        self.tails: dict[str, tuple[int, np.ndarray]] = {}  # unsharded: last chunk written

    def seen(self, n_rows: int, reclaimed_below: int, same_rows: bool) -> None:
        """A commit of ``n_rows`` rows was read; ``same_rows``: it continues the rows seen
        before (False after a clear or replacement: forget every index)."""
        with self.lock:
            if not same_rows:
                self._indexes.clear()
                self._chunks.clear()
                self._held = 0
                self.known_rows = 0
            self.known_rows = max(self.known_rows, int(n_rows))
            gone = [k for k, v in self._indexes.items() if v[2] <= reclaimed_below]
            for k in gone:
                del self._indexes[k]
            old = [k for k, (_, cr) in self._chunks.items() if (k[1] + 1) * cr <= reclaimed_below]
            for k in old:
                self._held -= _size(self._chunks.pop(k)[0])

    def chunks(self, array: str, uniq: np.ndarray) -> list:
        """The chunks ``uniq`` of ``array`` held: a decoded block, the chunk's encoded
        bytes (``bytes``), or None."""
        if not self.chunk_bytes:
            return [None] * len(uniq)
        out = []
        with self.lock:
            for c in uniq.tolist():
                got = self._chunks.get((array, c))
                if got is not None:
                    self._chunks.move_to_end((array, c))
                out.append(None if got is None else got[0])
        return out

    def put_chunks(self, array: str, uniq, blocks, chunk_rows: int) -> None:
        """Keep the decoded ``blocks`` of chunks ``uniq`` that are complete and committed
        (in place of their encoded bytes where those were held)."""
        self._put(array, uniq, blocks, chunk_rows, replace=True)

    def put_encoded(self, array: str, chunks, bodies, chunk_rows: int) -> None:
        """Keep the encoded ``bodies`` of ``chunks`` that are complete and committed and
        not held yet (bytes a ranged read brought back beside those it needed), as the
        first to go when the budget is full."""
        self._put(array, chunks, bodies, chunk_rows, replace=False)

    def drop_chunk(self, array: str, c: int) -> None:
        """Forget chunk ``c`` of ``array`` (its held bytes did not decode)."""
        with self.lock:
            got = self._chunks.pop((array, int(c)), None)
            if got is not None:
                self._held -= _size(got[0])

    def _put(self, array: str, uniq, blocks, chunk_rows: int, replace: bool) -> None:
        if not self.chunk_bytes:
            return
        with self.lock:
            for c, b in zip(np.asarray(uniq).tolist(), blocks, strict=True):
                if (c + 1) * chunk_rows > self.known_rows:
                    continue
                old = self._chunks.get((array, c))
                if old is not None:
                    if not replace or not isinstance(old[0], bytes):
                        continue
                    self._held -= _size(old[0])
                self._chunks[(array, c)] = (b, chunk_rows)
                self._held += _size(b)
                if not replace:  # extras go first: they never push out chunks read
                    self._chunks.move_to_end((array, c), last=False)
            while self._held > self.chunk_bytes and self._chunks:
                self._held -= _size(self._chunks.popitem(last=False)[1][0])

    def index(self, array: str, shard: int, max_row: int) -> tuple[np.ndarray, int] | None:
        """The shard's cached index and the rows it vouches for, if those cover
        ``max_row``."""
        with self.lock:
            hit = self._indexes.get((array, shard))
        return hit[:2] if hit is not None and max_row < hit[1] else None

    def put_index(self, array: str, shard: int, index: np.ndarray, covers: int, end: int) -> None:
        with self.lock:
            self._indexes[(array, shard)] = (index, covers, end)

    def drop(self, array: str, shards) -> None:
        with self.lock:
            for s in shards:
                self._indexes.pop((array, int(s)), None)


SegmentCache = ShardCache  # its name until issue 34 (tests and older code import it)


def _mostly_spanned(chunks: np.ndarray, chunk_nbytes: int, stored: int, gap: int = GAP) -> bool:
    """Would the ranges of the wanted ``chunks`` (sorted, of one shard of ``stored`` bytes,
    ``chunk_nbytes`` each; sizes before compression) span most of the shard once merged
    across gaps of up to ``gap``?  True for a shard of at most ``GAP`` bytes (one request,
    not two); for a larger one, where the chunks spread over half of it or more, at most
    ``gap`` apart on average (random rows: yes; a clip or an episode: a few adjacent
    chunks, no)."""
    if stored <= GAP:
        return True
    span = (int(chunks[-1]) - int(chunks[0]) + 1) * chunk_nbytes
    gaps = (span - len(chunks) * chunk_nbytes) / max(1, len(chunks) - 1)
    return 2 * span >= stored and gaps <= gap


def _within(obj: str, off: np.ndarray, nb: np.ndarray, a: int, z: int) -> None:
    """ChunkError unless chunks at ``off`` of ``nb`` bytes lie in bytes ``[a, z)`` of
    ``obj``, those it holds: an index placing them past its end is damage, or describes
    an object since replaced (the read is retried with a fresh index)."""
    if len(off) and (int(off.min()) < a or int((off + nb).max()) > z):
        raise ChunkError(
            f"{obj}: its index places chunks outside the {z - a:,} bytes read from "
            f"[{a:,}, {z:,}) (the object ends there)"
        )


_DECODERS: ThreadPoolExecutor | None = None


def _decode_all(codec, jobs: list, blocks: np.ndarray) -> None:
    """Decode the chunks ``jobs`` (``(block number, bytes, (object, chunk))``) into
    their ``blocks`` (``[n, chunk_rows, *row_shape]``; rows of blocks no job names are
    left as they are).  Image chunks (a frame codec: the GIL released) in one batch of
    neighbouring blocks per core, each unpacked into its rows and its filters undone
    over the whole batch at once; others here (zstd over a chunk: microseconds, not
    worth a hand-off)."""
    global _DECODERS
    bodies: list = [None] * len(blocks)
    where: list = [None] * len(blocks)
    for j, body, at in jobs:
        bodies[j], where[j] = body, at
    cores = os.cpu_count() or 2
    if len(jobs) < 2 or cores < 2 or not getattr(codec.compressor, "decodes_slowly", False):
        codec.decode_many(bodies, blocks, where)
        return
    if _DECODERS is None:
        _DECODERS = ThreadPoolExecutor(cores, thread_name_prefix="zreplay-io-decode")
    step = -(-len(blocks) // cores)
    spans = [(a, a + step) for a in range(0, len(blocks), step)]
    try:
        futs = [
            _DECODERS.submit(codec.decode_many, bodies[a:z], blocks[a:z], where[a:z])
            for a, z in spans
        ]
    except RuntimeError:  # interpreter shutdown (buffers read at exit): decode here
        codec.decode_many(bodies, blocks, where)
        return
    wait(futs)  # every batch done writing ``blocks`` before any failure is raised
    for f in futs:
        f.result()


def _forget_decoders() -> None:
    global _DECODERS, _ENCODERS
    _DECODERS = _ENCODERS = None  # threads do not survive a fork


at_fork(_forget_decoders)

_ENCODERS: ThreadPoolExecutor | None = None


def _encode_all(codec, rows: np.ndarray) -> list[bytes]:
    """The consecutive whole chunks ``rows`` (``[k * chunk_rows, *row_shape]``) encoded,
    in order.  Image chunks (a frame codec: the GIL released) in one run per core on
    their own pool, so a commit's frames are encoded on every core, not one key's on one
    thread; others here (zstd: microseconds a chunk)."""
    global _ENCODERS
    cores = os.cpu_count() or 2
    cr = codec.shape[0]
    k = len(rows) // cr
    if k < 2 or cores < 2 or not getattr(codec.compressor, "decodes_slowly", False):
        return codec.encode_run(rows)
    if _ENCODERS is None:
        _ENCODERS = ThreadPoolExecutor(cores, thread_name_prefix="zreplay-io-encode")
    step = -(-k // cores) * cr
    runs = [rows[i : i + step] for i in range(0, len(rows), step)]
    try:
        futs = [_ENCODERS.submit(codec.encode_run, r) for r in runs]
    except RuntimeError:  # interpreter shutdown (buffers committed at exit): encode here
        return codec.encode_run(rows)
    return [body for f in futs for body in f.result()]


def _size(block) -> int:
    return len(block) if isinstance(block, bytes) else block.nbytes


_POOL: ThreadPoolExecutor | None = None


def _forget_pool() -> None:
    global _POOL
    _POOL = None  # threads do not survive a fork: a forked child starts its own


at_fork(_forget_pool)


def _submit(fn, *args) -> Future:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(16, thread_name_prefix="zreplay-s3io")
    try:
        return _POOL.submit(fn, *args)
    except RuntimeError:  # interpreter shutdown (buffers closed at exit): run inline
        f: Future = Future()
        try:
            f.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            f.set_exception(e)
        return f


def _pass_on(to: Future, done: Future) -> None:
    """``done``'s outcome onto ``to``."""
    if done.cancelled():
        to.cancel()
    elif done.exception() is not None:
        to.set_exception(done.exception())
    else:
        to.set_result(done.result())


class _Selection:
    def __init__(self, array: ObjectArray, sel):
        self._array, self._sel = array, sel

    def read(self) -> Future:
        return _submit(self._array.read, self._sel)

    def write(self, value) -> Future:
        return self._array.submit_write(self._sel, value)


class ObjectArray:
    """One Zarr array under ``key`` of the backend's bucket (see the module docstring)."""

    def __init__(self, backend, key: str, meta: ArrayMeta, writable: bool, cache: ShardCache):
        self.backend, self.key, self.meta = backend, key, meta
        self.writable, self.cache = writable, cache
        self.shape, self.dtype = meta.shape, meta.dtype

    def __getitem__(self, sel) -> _Selection:
        return _Selection(self, sel)

    def _obj(self, i: int) -> str:
        return f"{self.key}/{self.meta.object_key(i)}"

    def widened(self, rows: int) -> ObjectArray:
        """A reader of the same array taken as ``rows`` rows long (no request: see
        ``Backend.widened``)."""
        return ObjectArray(self.backend, self.key, self.meta.resized(rows)[0], False, self.cache)

    def resize(self, exclusive_max, **_ignored) -> Future:
        """Set the row axis's length (one PUT of ``zarr.json``; metadata only), on the
        pool: a commit resizes all its arrays at once."""
        return _submit(self._resize, int(exclusive_max[0]))

    def _resize(self, rows: int) -> ObjectArray:
        meta, raw = self.meta.resized(rows)
        self.backend.put([(f"{self.key}/zarr.json", raw)])
        self.meta, self.shape = meta, meta.shape
        return self

    # -- reads ------------------------------------------------------------------------

    def read(self, sel) -> np.ndarray:
        """Rows ``sel`` (a slice, or int64 rows in any order, repeats allowed, read in
        that order) as ``[n, *row_shape]``."""
        if isinstance(sel, slice):
            start, stop, _ = sel.indices(self.shape[0])
            rows = np.arange(start, max(start, stop), dtype=np.int64)
        else:
            rows = np.asarray(sel, np.int64)
            if len(rows) > 1 and not bool(np.all(np.diff(rows) > 0)):
                uniq, inv = np.unique(rows, return_inverse=True)  # reads go by sorted chunks
                return self.read(uniq)[inv.reshape(-1)]
        out = np.empty((len(rows), *self.meta.row_shape), self.meta.dtype)
        if not len(rows):
            return out
        chunk = rows // self.meta.chunk_rows
        uniq, first = np.unique(chunk, return_index=True)
        bounds = np.append(first, len(rows))
        cr = self.meta.chunk_rows
        if cr == 1 and not self.cache.chunk_bytes:
            # (rows are sorted and unique here: chunk j is row j) every chunk straight
            # into its row of ``out``, no block of its own, nothing kept
            self._read_blocks(uniq, rows, bounds, out.reshape(len(uniq), 1, *out.shape[1:]))
            return out
        blocks = self.cache.chunks(self.key, uniq)
        self._decode_held(uniq, blocks)
        miss = [j for j, b in enumerate(blocks) if b is None]
        if miss:
            if len(miss) < len(uniq):  # read only the chunks not held
                mu = uniq[miss]
                mrows = rows[np.isin(chunk, mu)]
                mfirst = np.unique(mrows // self.meta.chunk_rows, return_index=True)[1]
                got = self._read_blocks(mu, mrows, np.append(mfirst, len(mrows)))
            else:
                mu, got = uniq, self._read_blocks(uniq, rows, bounds)
            for j, b in zip(miss, got, strict=True):
                blocks[j] = b
            if self.cache.chunk_bytes:  # blocks of their own, not views of one read's array
                self.cache.put_chunks(self.key, mu, [b.copy() for b in got], cr)
        if cr == 1:
            for j, b in enumerate(blocks):
                out[j] = b[0]
            return out
        for j, b in enumerate(blocks):
            a, z = bounds[j], bounds[j + 1]
            out[a:z] = b[rows[a:z] - uniq[j] * cr]
        return out

    def _decode_held(self, uniq: np.ndarray, blocks: list) -> None:
        """Decode the chunks held as encoded bytes (kept decoded from now on); one that
        does not decode is forgotten and left to be read from the store (None)."""
        done = []
        for j, b in enumerate(blocks):
            if isinstance(b, bytes):
                try:
                    blocks[j] = self.meta.codec.decode(memoryview(b))
                except ChunkError:
                    self.cache.drop_chunk(self.key, int(uniq[j]))
                    blocks[j] = None
                    continue
                done.append(j)
        if done:
            self.cache.put_chunks(
                self.key, uniq[done], [blocks[j] for j in done], self.meta.chunk_rows
            )

    def _read_blocks(self, uniq, rows, bounds, blocks: np.ndarray | None = None) -> np.ndarray:
        """The decoded chunks ``uniq`` (sorted) holding ``rows`` (sorted; ``bounds``:
        where each chunk's rows start), from the store, as ``blocks`` ``[len(uniq),
        chunk_rows, *row_shape]`` (made here if None)."""
        m = self.meta
        if blocks is None:
            blocks = np.empty((len(uniq), m.chunk_rows, *m.row_shape), m.dtype)
        if m.shard_rows is None:
            return self._read_chunks(uniq, blocks)
        for attempt in range(RETRIES):
            try:
                return self._read_sharded(uniq, rows, bounds, attempt == 0, blocks)
            except (ChunkError, FileNotFoundError):
                # A cached index may describe an object since replaced, and a writer may
                # replace a shard between its index GET and the chunk GETs (a chunk still
                # filling up moves): again, with fresh indexes.
                if attempt == RETRIES - 1:
                    raise
                time.sleep(0.002 * attempt)
        raise AssertionError("unreachable")

    def _missing(self, what: str) -> None:
        if self.meta.all_chunks_stored:
            raise FileNotFoundError(f"{self.key}: {what} is not stored")

    def _read_chunks(self, uniq: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        got = self.backend.get([(self._obj(int(c)), None) for c in uniq], missing_ok=True)
        for j, (c, body) in enumerate(zip(uniq, got, strict=True)):
            if body is None:
                self._missing(f"chunk {int(c)}")
                blocks[j] = self.meta.fill_value
            else:
                blocks[j] = self.meta.codec.decode(body)
        return blocks

    def _read_sharded(self, uniq, rows, bounds, use_cache: bool, blocks) -> np.ndarray:
        m, cache = self.meta, self.cache
        cps, sr, cr = m.chunks_per_shard, m.shard_rows, m.chunk_rows
        shard_of = uniq // cps
        shards, sfirst = np.unique(shard_of, return_index=True)
        sbounds = np.append(sfirst, len(uniq))
        known = max(cache.known_rows, int(rows[-1]) + 1)
        gap = getattr(self.backend, "gap", GAP)  # local files declare their own
        indexes: dict[int, np.ndarray | None] = {}
        covers: dict[int, int] = {}  # rows each index vouches for
        whole: dict[int, memoryview] = {}
        need, wanted = [], []
        for i, s in enumerate(shards.tolist()):
            max_row = int(rows[bounds[sbounds[i + 1]] - 1])
            hit = cache.index(self.key, s, max_row) if use_cache else None
            if hit is None:
                need.append(s)
                wanted.append(uniq[sbounds[i] : sbounds[i + 1]])
            else:
                indexes[s], covers[s] = hit
        if not use_cache:
            cache.drop(self.key, need)
        # Round 1: the indexes not cached; a shard the merged ranges would span for the
        # most part anyway is fetched whole instead (index and chunks in one request).
        reqs = []
        for s, chunks in zip(need, wanted, strict=True):
            stored = (min((s + 1) * sr, known) - s * sr) * m.row_bytes  # before compression
            whole_get = _mostly_spanned(chunks, cr * m.row_bytes, stored, gap)
            reqs.append((self._obj(s), None if whole_get else (-m.index_nbytes, None)))
        got = self.backend.get(reqs, True) if reqs else []
        for s, (_, rng), body in zip(need, reqs, got, strict=True):
            if body is None:
                self._missing(f"shard {s}")
                indexes[s] = None
                continue
            mv = memoryview(body).cast("B")
            idx = parse_index(mv[-m.index_nbytes :], m, self._obj(s))
            covers[s] = min((s + 1) * sr, known // cr * cr)
            cache.put_index(self.key, s, idx, covers[s], (s + 1) * sr)
            indexes[s] = idx
            if rng is None:
                whole[s] = mv
        # Round 2: the chunks, merged ranges per shard.
        fills: list = []  # blocks of chunks not stored
        reqs, where = [], []
        jobs: list = []  # (block number, encoded bytes, (object, chunk)) to decode
        for i, s in enumerate(shards.tolist()):
            lo, hi = int(sbounds[i]), int(sbounds[i + 1])
            idx = indexes[s]
            if idx is None:
                fills.extend(range(lo, hi))
                continue
            local = uniq[lo:hi] - s * cps
            off, nb = idx[local, 0], idx[local, 1]
            stored = off != np.uint64(MISSING)
            for j in np.flatnonzero(~stored):
                self._missing(f"chunk {int(uniq[lo + j])}")
                fills.append(lo + j)
            if s in whole:
                body, obj = whole[s], self._obj(s)
                _within(obj, off[stored], nb[stored], 0, len(body) - m.index_nbytes)
                for j in np.flatnonzero(stored):
                    a = int(off[j])
                    jobs.append((lo + j, body[a : a + int(nb[j])], (obj, uniq[lo + j])))
                self._keep_between(s, idx, covers[s], body, 0, len(body), uniq[lo:hi])
                continue
            js = np.flatnonzero(stored)
            order = js[np.argsort(off[js], kind="stable")]
            starts = off[order].astype(np.int64)
            ends = starts + nb[order].astype(np.int64)
            for a, z in merge_ranges(starts, ends, gap):
                reqs.append((self._obj(s), (a, z)))
                where.append((lo, hi, s, a, off, nb, order[(starts >= a) & (ends <= z)]))
        got = self.backend.get(reqs) if reqs else []
        for (lo, hi, s, a, off, nb, members), body in zip(where, got, strict=True):
            mv, obj = memoryview(body).cast("B"), self._obj(s)
            _within(obj, off[members], nb[members], a, a + len(mv))
            for j in members:
                b = int(off[j]) - a
                jobs.append((lo + j, mv[b : b + int(nb[j])], (obj, uniq[lo + j])))
            self._keep_between(s, indexes[s], covers[s], mv, a, a + len(mv), uniq[lo:hi])
        _decode_all(m.codec, jobs, blocks)
        for j in fills:
            blocks[j] = m.fill_value
        return blocks

    def _keep_between(self, s: int, idx, covers: int, body, a: int, z: int, needed) -> None:
        """Keep, encoded, the chunks of shard ``s`` that ``body`` (its bytes ``[a, z)``)
        holds beside the ``needed`` ones, where ``idx`` vouches for them (chunks wholly
        below ``covers``: complete and committed when it was read)."""
        if not self.cache.chunk_bytes:
            return
        m = self.meta
        off, nb = idx[:, 0], idx[:, 1]
        inside = off != np.uint64(MISSING)
        start = np.where(inside, off, 0).astype(np.int64)
        end = start + nb.astype(np.int64)
        inside &= (start >= a) & (end <= z)
        chunk = s * m.chunks_per_shard + np.arange(len(idx))
        inside &= ((chunk + 1) * m.chunk_rows <= covers) & ~np.isin(chunk, needed)
        keep = np.flatnonzero(inside)
        if len(keep):
            bodies = [bytes(body[start[j] - a : end[j] - a]) for j in keep.tolist()]
            self.cache.put_encoded(self.key, chunk[keep], bodies, m.chunk_rows)

    # -- writes (the segment's writer) -------------------------------------------------

    def submit_write(self, sel, value) -> Future:
        """Write rows ``sel`` (a slice); writes of one array run in the order submitted."""
        start, stop, _ = sel.indices(max(self.shape[0], sel.stop or 0))
        values = np.ascontiguousarray(value, self.meta.dtype)
        if len(values) != stop - start:
            raise ValueError(f"{self.key}: {len(values)} rows for [{start}, {stop})")
        if not len(values):
            done: Future = Future()
            done.set_result(None)
            return done
        # The lane takes this write's future before the write is submitted, and the
        # submission happens outside the lock: at interpreter shutdown _submit runs the
        # write inline, in this thread, and _write_after takes the lock itself.
        fut: Future = Future()
        with self.cache.lock:
            prev = self.cache.lanes.get(self.key)
            self.cache.lanes[self.key] = fut
        _submit(self._write_after, prev, start, values).add_done_callback(partial(_pass_on, fut))
        return fut

    def _write_after(self, prev: Future | None, start: int, values: np.ndarray) -> None:
        if prev is not None:
            wait([prev])  # its failure is its caller's; the writer retries from its commit
        if self.meta.shard_rows is None:
            self._write_chunks(start, values)
            return
        with self.cache.lock:
            w = self.cache.writers.get(self.key)
            if w is None:
                w = self.cache.writers[self.key] = ShardWriter(
                    self.meta, self.key, partial(_encode_all, self.meta.codec)
                )
        load = lambda s: self.backend.get([(self._obj(s), None)], missing_ok=True)[0]  # noqa: E731
        shards = w.write(start, values, load)
        self.backend.put([(self._obj(s), body) for s, body, _, _ in shards])
        for s, _, index, covers in shards:
            self.cache.put_index(self.key, s, index, covers, (s + 1) * self.meta.shard_rows)

    def _write_chunks(self, start: int, values: np.ndarray) -> None:
        m, cr = self.meta, self.meta.chunk_rows
        stop = start + len(values)
        items, last = [], None
        for c in range(start // cr, (stop - 1) // cr + 1):
            c0 = c * cr
            a, z = max(start, c0), min(stop, c0 + cr)
            if a == c0 and z == c0 + cr:
                block = values[a - start : z - start]
            else:
                block = self._chunk_to_update(c)
                block[a - c0 : z - c0] = values[a - start : z - start]
            items.append((self._obj(c), m.codec.encode(block)))
            last = (c, block)
        self.backend.put(items)
        self.cache.tails[self.key] = last

    def _chunk_to_update(self, c: int) -> np.ndarray:
        tail = self.cache.tails.get(self.key)
        if tail is not None and tail[0] == c:
            return tail[1].copy()
        (body,) = self.backend.get([(self._obj(c), None)], missing_ok=True)
        if body is None:
            return self.meta.fill_block(self.meta.chunk_rows)
        return self.meta.codec.decode(body).copy()
