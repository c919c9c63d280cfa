"""``zreplay.torchrl.ZarrStorage``: a TorchRL storage on a persistent zreplay buffer.

TorchRL's ``LazyTensorStorage`` is a ring of ``max_size`` slots that its round-robin
writer overwrites; this storage shows the same slots (same ``len``, ``storage[index]``,
``_is_full``, last cursor, samples under the same seed) over an append-only zreplay
segment: every extend is appended, a slot shows the newest row written to it, and whole
old trajectories are evicted on disk once every row in them has been overwritten
(the ring and its record: :mod:`zreplay.api.torchrl_ring`).  So rows are compressed,
committed atomically, readable by ``zreplay.open`` while training runs, and a storage
constructed on an existing ``path`` resumes: same ``len``, same rows, and the writer's
cursor where it was.

This module is what TorchRL calls (its ``Storage`` protocol) over
:class:`~zreplay.core.BufferCore` (``self.core``).  Beside it: what it holds
(:mod:`.torchrl_forms`), how its slots are indexed and viewed (:mod:`.torchrl_columns`),
TorchRL's writers' cursors (:mod:`.torchrl_writers`), checkpoints coming in
(:mod:`.torchrl_checkpoints`) and the commit a pickled copy shows
(:mod:`.torchrl_copies`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Unpack

import numpy as np
import torch
from tensordict._td import _SubTensorDict
from torchrl.data.replay_buffers.storages import Storage, TensorStorage

from ..core import BufferCore, RamPolicy, RandomStream
from ..core.options import StoreOptions, store_options
from ..errors import AppendOnlyError, FormatError, ReadOnlyError, SchemaError, StaleViewError
from ..numbers import as_int
from ..schema import Schema
from ..store.location import locate
from ..store.root import is_buffer
from ..store.torchrl_record import KIND
from .torchrl_checkpoints import (
    OwnCheckpoints,
    import_order,
    own_checkpoint,
    rows_state,
    state_rows,
    torchrl_checkpoint,
)
from .torchrl_columns import SlotColumns, check_schema, show_slots, slot_index
from .torchrl_copies import ShownCommit, commit_pin
from .torchrl_forms import Form, class_names, encode, find_class, leading, take
from .torchrl_ring import (
    MAX_PIECE_ROWS,
    Ring,
    check_record,
    checked_max_size,
    dims_after_first,
    pieces,
    record,
    ring_slots,
)
from .torchrl_writers import attached_writers, follow, known_cursor, place_writer, writer_position


class ZarrStorage(TensorStorage):
    """A TorchRL storage of ``max_size`` rows persisted as a zreplay buffer at ``path``.

    Use it wherever TorchRL takes a storage (``TensorDictReplayBuffer(storage=...)``)
    with its round-robin writer and the ``RandomSampler``, ``SamplerWithoutReplacement``,
    ``SliceSampler`` and ``SliceSamplerWithoutReplacement`` samplers.  Rows keep their
    dtypes (uint8, bool, ...) and nesting; the first extend fixes the keys, dtypes and
    row shapes, and a later extend that differs raises :class:`~zreplay.SchemaError` (a
    ``ValueError``) before anything is written, with the writer's cursor rolled back.

    Args:
        max_size: slots, as ``LazyTensorStorage(max_size)`` (at most ``2**48``: row
            numbers are int64 and keep growing after the ring wraps).
        path: buffer directory or ``s3://bucket/prefix``; an existing one is resumed
            (``max_size`` must be the one it was written with).  ``None``: a private
            temporary store removed on :meth:`close`.
        device: where returned TensorDicts live (rows are stored on disk and in RAM).
        ndim: storage dims, as ``LazyTensorStorage(max_size, ndim=...)``: ``[envs, time]``
            batches; the ring runs along dim 0 (``max_size`` counts elements).
        flush_each_extend: every ``extend``/``add`` returns only once its rows are
            committed (fsynced too with ``durable=True``, the default), so a ``kill -9``
            right after it loses nothing; default ``False``: commits run in the
            background and :meth:`flush` waits for them.
        tensorclasses: tensorclasses the rows may be rebuilt as.  A buffer records its
            tensorclasses by name and reading it never imports one (a buffer from
            elsewhere could name a module of its own choosing): a recorded class comes
            back if it is listed here or its module is already imported in this process
            (or it was extended here), else its rows are TensorDicts, with a warning.
        **store: the store options every writable buffer takes (:class:`zreplay.StoreOptions`:
            ``writer_id``, ``durable``, ``overwrite``, ``break_lock``, ``layout``,
            ``storage_options``, ``ram_budget_bytes`` (default 1 GiB of the newest rows),
            ``staging_bytes``, ``rate_limiter``; ``learner_id`` is refused: TorchRL's
            samplers draw its batches, which a rate limiter does not count).
    """

    supports_conditional_update = False
    _default_checkpointer = OwnCheckpoints

    def __init__(
        self,
        max_size: int,
        path: str | Path | None = None,
        *,
        device: torch.device | str = "cpu",
        ndim: int = 1,
        flush_each_extend: bool = False,
        tensorclasses: Iterable[type] = (),
        **store: Unpack[StoreOptions],
    ):
        opts = store_options("ZarrStorage", store)
        allowed = class_names(tensorclasses)
        if opts["learner_id"] is not None:
            raise ValueError(
                "ZarrStorage cannot be a learner: TorchRL's samplers draw its batches, which "
                "a rate limiter does not see (its extends would wait on a count that never "
                "moves); declare the learner where the batches are counted, e.g. "
                "zreplay.open(path, rate_limiter=..., learner_id=...)"
            )
        ram_budget_bytes = opts.pop("ram_budget_bytes")
        max_size = checked_max_size(max_size)
        ndim = as_int(ndim, "ndim", minimum=1)
        self.__dict__["core"] = None  # TensorStorage.__init__ assigns _len and initialized
        super().__init__(storage=None, max_size=max_size, device=device, ndim=ndim)
        self._given_max = M = max_size
        self._flush_each = bool(flush_each_extend)
        self._piece = min(M, MAX_PIECE_ROWS)
        self._classes: dict[str, type | None] = dict(allowed)
        self.core = BufferCore.writer(
            path,
            stream=RandomStream(tag=KIND),
            owner=self,
            # Rows stay until every row of their trajectory is overwritten (see module).
            capacity=M + self._piece - 1,
            ram=RamPolicy(enabled=True, trajectories=None, max_bytes=ram_budget_bytes),
            **opts,
        )
        try:
            engine = self.core.engine
            if engine.num_rows != engine.own_rows:
                raise FormatError(
                    f"ZarrStorage at {path}: the buffer holds sealed offline segments "
                    f"({engine.num_rows - engine.own_rows} rows, zreplay.seal), which a "
                    "TorchRL ring neither holds nor samples; give ZarrStorage a path of its "
                    "own, or sample the offline part with TrajectoryReplayBuffer, "
                    "ReplayBuffer or zreplay.open"
                )
            self._open_ring()
        except BaseException:
            self.core.close()
            raise

    def _open_ring(
        self, state: Mapping | None = None, low_row: int = 0, stop: int | None = None
    ) -> None:
        """The ring of what the segment holds (``state``: its facade state, default the
        writer's; ``low_row``: a read-only copy's first visible row, where its row
        positions start; ``stop``: the row position the ring ends at, default the last
        visible one: a pinned copy's is an older commit's)."""
        saved = dict(self.core.facade_state if state is None else state)
        self._W = self._ring_stop() if stop is None else stop
        schema = self.core.schema
        check_record(
            saved,
            self.core.path,
            has_rows=bool(self.core.num_rows),
            n_rows=self._W + low_row,
            columns=None if schema is None else schema.keys,
            max_size=self._given_max,
            ndim=self.ndim,
        )
        dims = saved.get("dims")
        self._dims = None if dims is None else tuple(int(d) for d in dims)
        M0 = self._slots_along_dim0(self._dims)
        # An empty segment is an empty ring, wherever its rows go on from (a clear moves
        # the row counter on to a shard boundary).
        start = int(saved.get("start", 0)) - low_row if self.core.num_rows else self._W
        self._ring = Ring(M0, start, int(saved.get("shift", 0)))
        self._ring_guessed = bool(saved.get("guessed", False))
        self._form = Form.from_state(saved.get("form"), saved.get("batches"))
        if "_classes" not in self.__dict__:
            self._classes: dict[str, type | None] = {}  # recorded name -> class (None: a TD)
        if getattr(self, "_columns", None) is not None:
            self._columns.retire()  # views taken so far showed other contents
        self._columns: SlotColumns | None = None  # made by the first view of these contents
        if self._ring.length(self._W):  # SliceSampler's seam: where the newest row is
            self._set_last_cursor((self._ring.next_slot(self._W) - 1) % M0)
        if not self.core.writable:
            return
        self.core.facade_state = record(
            self._given_max, self.ndim, self._dims, self._ring, self._ring_guessed, self._form
        )
        if self._dims is not None:
            self._fit_capacity()

    def _slots_along_dim0(self, dims: tuple[int, ...] | None) -> int:
        """The ring's slots (TorchRL's ``_max_size_along_dim0``), ``max_size`` set as
        TorchRL's storages set it once the dims after the first are known (``dims``:
        ``None`` for ``ndim=1`` and until the first extend of ``ndim > 1``)."""
        M0, self._per_slot = ring_slots(self._given_max, dims)
        self.max_size = M0 * self._per_slot
        self._piece = min(self._piece, M0)
        # Overwritten rows stay on disk until their whole piece is (see __init__): a
        # zreplay.open view shows only pieces that start within the ring's newest M0
        # rows, which are all live (it may miss up to a piece of live rows before them).
        self.core.view_rows = M0
        return M0

    def _fit_capacity(self) -> None:
        """The segment keeps the ring's rows and no more (see ``__init__``), once the
        dims of an ``ndim > 1`` storage tell its slots."""
        self.core.engine.set_capacity(self._ring.max_size + self._piece - 1)

    # -- sizes and state TorchRL reads -------------------------------------------------

    @property
    def _len(self) -> int:
        if self.__dict__.get("core") is None:
            return 0
        return self._ring.length(self._W) * self._per_slot

    @_len.setter
    def _len(self, value: int) -> None:
        if self.__dict__.get("core") is not None and int(value) != len(self):
            raise AppendOnlyError(
                "ZarrStorage's length follows its rows; it cannot be set (TorchRL's "
                "write_at and ConsumingSampler are not supported)"
            )

    @property
    def initialized(self) -> bool:
        core = self.__dict__.get("core")
        return core is not None and core.schema is not None and self._form is not None

    @initialized.setter
    def initialized(self, value: bool) -> None:
        pass  # derived from the buffer's schema

    @property
    def shape(self) -> torch.Size | None:
        if self.ndim == 1:
            return torch.Size([len(self)])
        if self._dims is None:
            return None
        return torch.Size([self._ring.length(self._W), *self._dims])

    @property
    def _total_shape(self) -> torch.Size | None:
        if self.ndim > 1 and self._dims is None:
            return None
        return torch.Size([self._ring.max_size, *(self._dims or ())])

    @property
    def _len_along_dim0(self) -> int:
        return self._ring.length(self._W)

    @property
    def checkpointer(self):
        return self._checkpointer

    @checkpointer.setter
    def checkpointer(self, value) -> None:
        # ReplayBuffer sets this after registering its writer: sync the writer's cursor.
        if value is not None and not isinstance(value, OwnCheckpoints):
            raise TypeError(
                f"ZarrStorage checkpoints itself (rb.dumps/rb.loads); drop checkpointer="
                f"{type(value).__name__}"
            )
        Storage.checkpointer.fset(self, value)
        if self.__dict__.get("core") is not None:
            self._sync_writers(only_fresh=True)

    def _sync_writers(self, only_fresh: bool = False) -> None:
        """Put the attached writers' cursors where the next row goes (a fresh writer on
        a resumed storage; after loading a checkpoint, which rb.loads then confirms).
        A guessed next slot (a TorchRL state dict of a full ring) is never handed out:
        the writers keep their own cursors, and the first extend (or a writer whose
        state was restored) tells where the ring really goes on."""
        writers = attached_writers(self)
        for w in writers:
            follow(w, self._writer_restored)
        if self._ring_guessed:
            return
        for w in writers:
            if not only_fresh or writer_position(w)[1] == 0:
                count = min(self._W - self._ring.start, 2**31 - 1)
                place_writer(w, self._ring.next_slot(self._W), count)

    def _writer_restored(self, writer) -> None:
        """A followed writer's ``load_state_dict`` (which TorchRL's ``rb.load_state_dict``
        calls right after the storage's) settles a guessed next slot at once, from the
        cursor it restored: nothing of the guess is left for a storage dropped before its
        first extend to lose."""
        if self._ring_guessed and self.__dict__.get("core") is not None:
            self._settle_guess(writer_position(writer)[0])

    # -- writing --------------------------------------------------------------------

    def _max_size_along_dim0(self, *, single_data=None, batched_data=None):
        # TorchRL's writers ask this before they move their cursor and write count: a
        # read-only copy refuses here, so a refused extend changes nothing.
        if single_data is not None or batched_data is not None:
            self._check_writable("extend")
        return super()._max_size_along_dim0(single_data=single_data, batched_data=batched_data)

    def set(self, cursor, data, *, set_cursor: bool = True) -> None:
        """Append ``data`` (a TensorDict ``[n, ...]``, or ``[]`` for ``add``) at the
        writer's ``cursor``, which must be the next ``n`` slots of the ring."""
        self._check_writable("extend")
        if not set_cursor:
            raise AppendOnlyError(
                "ZarrStorage is append-only: rows cannot be overwritten in place "
                "(storage[idx] = value, rb[idx] = value, write_at); extend instead"
            )
        cur = torch.as_tensor(cursor).reshape(-1).to("cpu", torch.int64)
        single = isinstance(cursor, int | np.integer) or (
            isinstance(cursor, torch.Tensor) and cursor.dim() == 0
        )
        try:
            n = 0
            if not (isinstance(data, list | tuple) and not data):
                form, cols, classes = encode(data, single)
                n = len(next(iter(cols.values())))
            if n == 0:
                if not self.initialized:
                    raise IndexError("index 0 is out of bounds for dimension 0 with size 0")
                return
            self._append(cur, form, cols, classes, n)
        except BaseException:
            added = self._resync()
            for w in attached_writers(self):  # TorchRL's writer moved (by len(cursor)) first
                count = max(0, writer_position(w)[1] - (0 if added else cur.numel()))
                place_writer(w, self._ring.next_slot(self._W), count)
            raise
        # The cursor as read above: TorchRL's setter fails on a numpy array after the rows
        # went in (its own storages call it before they write).
        self._set_last_cursor(int(cur[0]) if single else cur)
        self._bump_mutation_revision()
        if self._flush_each:
            self.core.flush()  # committed (and fsynced if durable) before extend returns

    def _resync(self) -> bool:
        """After an exception in ``set``: if the rows were added before it (a Ctrl-C
        after the add), the extend happened: the ring goes on after them, as the
        segment does (True)."""
        if self.core.closed or self.core.next_row == self._W:
            return False
        self.core.facade_state["guessed"] = False
        self._open_ring()
        return True

    def _settle_guess(self, cursor: int | None) -> None:
        """A TorchRL state dict of a full ring does not say where its writer's cursor
        is; a restored writer does (``cursor``): re-append the ring once, from there."""
        if self._ring_guessed and cursor is not None:
            M0 = self._ring.max_size
            if int(cursor) % M0 != self._ring.next_slot(self._W):
                rows = self._slot_rows(np.arange(M0))
                self._import_rows(rows, len(self), int(cursor), sync=False)

    def _append(self, cursor: torch.Tensor, form: Form, cols: dict, classes, n: int) -> None:
        if self._dims is None and self.ndim > 1:
            dims = dims_after_first(form, cols, self.ndim)
            ring, piece = self._ring, self._piece
            M0 = self._slots_along_dim0(dims)
            self._ring, self._dims = Ring(M0, self._W), dims
            # In the facade state before the rows: a commit that holds them holds the dims.
            self.core.facade_state.update(dims=list(dims), start=self._W)
            try:
                self._append_rows(cursor, form, cols, classes, n)
            except BaseException:
                if self.core.closed or self.core.next_row != self._W:
                    raise  # the rows are in: so are the dims (see _resync)
                self._ring, self._piece, self._dims = ring, piece, None
                self._slots_along_dim0(None)
                self.core.facade_state.update(dims=None, start=ring.start)
                raise
            self._fit_capacity()
            return
        self._append_rows(cursor, form, cols, classes, n)

    def _append_rows(self, cursor: torch.Tensor, form: Form, cols: dict, classes, n) -> None:
        want = self._ring.expected(self._W, n)
        if self._ring_guessed and len(cursor) and not torch.equal(cursor, want):
            self._settle_guess(int(cursor[0]))
            want = self._ring.expected(self._W, n)
        if not torch.equal(cursor, want):
            raise AppendOnlyError(
                f"ZarrStorage appends at the ring's next slots ({show_slots(want)}) but the "
                f"writer asked for {show_slots(cursor)}; only TorchRL's round-robin writers "
                "are supported (the writer's cursor was put back: extend again)"
            )
        schema = self.core.schema
        if schema is not None and self._form is not None:
            why = self._form.differs(form)
            if why:
                raise SchemaError(f"ZarrStorage: {why}; a storage holds one kind of data")
            check_schema(schema, cols)
        else:
            Schema.infer({k: v[:, None] for k, v in cols.items()})
            self._form = form
            self.core.facade_state["form"] = form.to_state()
        try:
            self.core.add(pieces(cols, n, self._piece))
        except BaseException:
            if schema is None:
                self._form = self.core.facade_state["form"] = None
            raise
        self._classes.update(classes)
        self._W += n
        self._ring_guessed = self.core.facade_state["guessed"] = False
        if self._columns is not None:
            m = min(n, self._ring.max_size)  # the slots just written, no duplicates
            self._columns.written(want[-m:], {k: v[-m:] for k, v in cols.items()})

    def _empty(self) -> None:
        """``rb.empty()``: drop every row (on disk too; the schema stays)."""
        self._check_writable("empty it")
        with self._replacing():
            self.core.facade_state.update(shift=0, guessed=False)
            self.core.engine.clear()
            self._open_ring()  # empty: the ring starts where the rows go on
        self._bump_mutation_revision()

    @contextmanager
    def _replacing(self) -> Iterator[None]:
        """Around ``empty()`` and loads, which replace the contents: a sequence count,
        odd while they run, so a read on another thread that overlapped one says the
        storage was emptied (see :meth:`_read`) instead of failing on rows that went."""
        self._replacements = self.__dict__.get("_replacements", 0) + 1
        try:
            yield
        finally:
            self._replacements += 1

    # -- reading --------------------------------------------------------------------

    def get(self, index):
        """Rows at ``index`` (int, slice, tensor, list, mask: torch indexing over the
        ``len(self)`` slots) as a TensorDict; a slice gives a read-only lazy view."""
        if not self.initialized:
            raise RuntimeError("Cannot get elements out of a non-initialized storage.")
        if self.ndim > 1:
            return self._get_along_dims(index)
        if isinstance(index, slice) and self._lazy_ok():
            return self._view(index)
        began = self.__dict__.get("_replacements", 0)  # before len(), which checks the slots
        slots = slot_index(index, len(self))
        return self._build(self._rows_at(lambda: slots.reshape(-1), began=began), slots.shape)

    def _rows_at(self, slots, keys: list[str] | None = None, began: int | None = None) -> dict:
        """``core.rows`` of the rows the slots ``slots()`` show.  When rows a read-only
        copy showed have left the disk (its reader raises ``StaleViewError``), the copy
        refreshes, follows the newest commit (see :meth:`refresh`) and reads again, so no
        read mixes two commits' rows.  ``began``: the replacement count (see
        :meth:`_replacing`) when the slots were chosen, default now."""
        if began is None:
            began = self.__dict__.get("_replacements", 0)
        while True:
            want = slots()
            try:
                got = self._read(want, keys, began)
            except IndexError:  # positions of an older commit than the reader's now
                if self.core.writable or not self._follow_commit():
                    raise
                continue
            except StaleViewError:  # the rows it showed left the disk: follow the newest
                if self.core.writable:
                    raise
                self.core.refresh()
                self._follow_commit()
                continue
            if self.core.writable or not self._follow_commit():
                return got
            if len(want) and want.max() >= self._ring.length(self._W):
                raise IndexError(
                    f"the writer of {self.core.path} replaced the rows this read-only copy "
                    f"showed and now shows {len(self)}; index it again"
                )

    def _ring_stop(self) -> int:
        """Where the ring's rows end now: a writer's ring runs over its segment's global
        rows (stable when old ones are evicted), a read-only copy's over the positions of
        its view (from its first visible row, see ``_open_ring``)."""
        return self.core.next_row if self.core.writable else self.core.num_rows

    def _read_ring_rows(self, rows: np.ndarray, keys: list[str] | None) -> dict:
        """The rows of the ring's coordinates ``rows`` (see :meth:`_ring_stop`)."""
        if self.core.writable:
            return self.core.read_global_rows(rows, keys)
        return self.core.rows(rows, keys)

    def _read(self, want: np.ndarray, keys: list[str] | None, began: int) -> dict:
        """``core.rows`` of slots ``want``.  In a writing storage, a read that overlapped
        ``empty()`` or a load on another thread (a legal race, not damage) raises
        ``IndexError`` in slots, never the rows underneath: its rows may have gone, or
        be another contents'."""
        try:
            got = self._read_ring_rows(self._ring.rows_of(want, self._W), keys)
        except Exception as e:
            if self.core.writable and self._replaced_since(began):
                raise self._emptied(want) from e
            raise
        if self.core.writable and self._replaced_since(began):
            raise self._emptied(want)
        return got

    def _replaced_since(self, began: int) -> bool:
        return began % 2 == 1 or self.__dict__.get("_replacements", 0) != began

    def _emptied(self, want: np.ndarray) -> IndexError:
        return IndexError(
            f"ZarrStorage at {self.core.path} was emptied or loaded (empty(), loads(), "
            f"load_state_dict()) on another thread while {len(want)} of its slots were "
            f"being read; it now holds {len(self)}: sample or index it again"
        )

    def _build(self, flat: dict, lead: tuple[int, ...]):
        """Rows as the data they were given as (see :mod:`.torchrl_forms`)."""
        return self._form.build(flat, lead, self.device, self._class)

    def _class(self, name: str) -> type | None:
        """The tensorclass recorded as ``name``: one passed as ``tensorclasses`` or
        extended here, else one already imported in this process, never imported (looked
        up once; ``None`` and one warning if not found: rows are TensorDicts)."""
        if name not in self._classes:
            self._classes[name] = find_class(name, self._classes)
        return self._classes[name]

    def _get_along_dims(self, index):
        """``storage[index]`` of an ``ndim > 1`` storage (shape ``[len along dim 0,
        *dims]``): the slots ``index[0]`` names are read once each, and the index is
        applied to them with its first part renumbered (torch's semantics, dense)."""
        began = self.__dict__.get("_replacements", 0)  # before L0, which checks the slots
        L0 = self._ring.length(self._W)
        first, rest = (index[0], index[1:]) if isinstance(index, tuple) and index else (index, ())
        parts = index if isinstance(index, tuple) else (index,)
        if any(p is Ellipsis or p is None for p in parts):  # dims move: index every row
            rows = self._rows_at(lambda: np.arange(L0), began=began)
            return take(self._build(rows, (L0,)), index)
        if isinstance(first, slice):
            slots, pos = np.arange(*first.indices(L0)), slice(None)
        else:
            wanted = slot_index(first, L0)
            slots, inv = np.unique(wanted.reshape(-1), return_inverse=True)
            pos = torch.from_numpy(inv.reshape(wanted.shape))
            pos = int(pos) if pos.dim() == 0 else pos
        rows = self._rows_at(lambda: slots, began=began)
        return take(self._build(rows, (len(slots),)), (pos, *rest))

    def _lazy_ok(self) -> bool:
        """Whether ``storage[slice or tuple]`` is a lazy view (TensorDicts, ``ndim=1``)."""
        return self._form.kind == "td" and not self._form.classes and self.ndim == 1

    def __getitem__(self, index):
        # A sampler's tuple index (SliceSampler reads flags at it): a lazy view, so only
        # the keys it reads are read; the batch itself comes through get().
        if isinstance(index, tuple) and self.initialized and self._lazy_ok():
            return self._view(index)
        return self.get(index)

    def _view(self, index):
        if self._columns is None:
            specs = self.core.schema.specs
            M0 = self._ring.max_size
            self._columns = SlotColumns(specs, self._form.batches, M0, self._rows_at, self.__len__)
        view = _SubTensorDict(self._columns.structure(len(self)), index)
        return view if self.device.type == "cpu" else view.to(self.device)

    # -- checkpoints ----------------------------------------------------------------

    def state_dict(self) -> dict:
        """TorchRL's storage state: ``{"_storage": the max_size slots' TensorDict state
        (zeros past len), "initialized", "_len"}`` plus the writer's next slot (absent
        while it is only a guess: as in TorchRL's, the writer's state then says it).  It
        holds every row in RAM, as TorchRL's does; ``rb.dumps(path)`` links files
        instead."""
        if self.core.writable:
            self._settle_guess(known_cursor(attached_writers(self)))
        if not self.initialized:
            return {"_storage": {}, "initialized": False, "_len": 0}
        rows = rows_state(self._slot_rows(np.arange(self._ring.max_size)))
        out = {"_storage": rows, "initialized": True, "_len": len(self)}
        if not self._ring_guessed:  # a guess is not exported as if it were known
            out["_next_slot"] = self._ring.next_slot(self._W)
        return out

    def load_state_dict(self, state_dict: Mapping) -> None:
        """Replace the contents with a ``state_dict()`` of this class or of TorchRL's
        tensor storages (a full ring's next slot, which theirs lack, is taken from the
        restored writer's first extend)."""
        self._check_writable("load state dicts")
        rows, n = state_rows(state_dict, self.ndim)
        self._import_rows(rows, n, state_dict.get("_next_slot"))

    def dumps(self, path) -> None:
        """A copy-free snapshot (a zreplay buffer directory: hard links, or server-side
        copies on S3) at ``path``; ``rb.dumps(dir)`` puts it in ``dir/storage``."""
        self._check_writable("checkpoint it")
        self._settle_guess(known_cursor(attached_writers(self)))
        self.core.engine.checkpoint(path)

    def loads(self, path) -> None:
        """Replace the contents with a checkpoint: this class's (:meth:`dumps`) or a
        ``LazyTensorStorage``/``LazyMemmapStorage`` one (``rb.dumps`` of TorchRL)."""
        self._check_writable("load checkpoints")
        options = self.core.path.backend.storage_options
        if is_buffer(path, options):
            self._load_own_checkpoint(locate(path, options))
            return
        self._import_rows(*torchrl_checkpoint(path, self._given_max))

    def _import_rows(self, rows, n: int, next_slot: int | None, sync: bool = True) -> None:
        """Replace the contents with the first ``len = n`` elements of ``rows`` (a
        TorchRL ring of ``max_size`` slots along dim 0: a TensorDict, tensorclass, tensor
        or pytree as :meth:`get` gives; ``None``: nothing) whose writer's next slot is
        ``next_slot`` (``None``: ``n % max_size``); ``sync``: move attached writers there.
        The rows are appended oldest first, in :func:`.torchrl_checkpoints.import_order`,
        so every slot shows what it showed in TorchRL."""
        dims = self._dims
        if self.ndim > 1 and rows is not None:
            dims = dims_after_first(*encode(take(rows, torch.arange(0)), False)[:2], self.ndim)
        M, per = ring_slots(self._given_max, dims)
        n = -(-int(n) // per)  # slots along dim 0
        size = leading(rows)
        if rows is not None and size != M:
            raise ValueError(
                f"the checkpoint holds a ring of {size * per} elements ({size} slots); this "
                f"ZarrStorage has max_size={self._given_max} (construct it with "
                f"max_size={size * per})"
            )
        if not 0 <= n <= M:
            raise ValueError(f"the checkpoint's len {n} is not in [0, {M}]")
        with self._replacing():
            classes = {}
            if rows is None or not n:
                self.core.facade_state.update(shift=0, guessed=False)
                self.core.engine.clear()  # empty: the ring starts where the rows go on
            else:
                order, c = import_order(n, M, next_slot)
                form, cols, classes = encode(take(rows, order), single=False)
                old = self._form
                if (
                    old is not None
                    and old.classes
                    and not form.classes
                    and not old.differs(replace(form, classes=old.classes))
                ):  # a state dict holds TensorDicts: the storage keeps its tensorclasses
                    form = replace(form, classes=dict(old.classes))
                # Until the restored writer's first extend says where its cursor is (ZarrStorage).
                guessed = n == M and next_slot is None
                ring = record(self._given_max, self.ndim, dims, Ring(M, 0, c), guessed, form)
                state = self.core.saved.state()  # read when the block ends: the ring goes in below
                try:
                    with self.core.replacing(state) as staging:  # all or nothing
                        staging.add(pieces(cols, n, self._piece))
                        ring["start"] = staging.next_row - n  # rows go on from the old ones
                        state["facade"] = ring
                except BaseException:
                    if not self.core.closed:
                        self._open_ring()  # the ring of what the segment holds now, old or new
                    raise
                self.core.facade_state = ring
            self._open_ring()
        self._classes.update(classes)
        self._bump_mutation_revision()
        if sync:
            self._sync_writers()

    def _slot_rows(self, slots: np.ndarray):
        """Rows of ``slots`` (zeros for slots past ``len``) as :meth:`get` gives them."""
        L, schema = self._ring.length(self._W), self.core.schema
        live = slots < L
        got = self._rows_at(lambda: slots[live])
        flat = {}
        for k, spec in schema.specs.items():
            col = np.zeros((len(slots), *spec.row_shape), spec.dtype)
            col[live] = got[k]
            flat[k] = col
        return self._build(flat, (len(slots),))

    def _load_own_checkpoint(self, src) -> None:
        """Take over a :meth:`dumps` of a ZarrStorage (hard links / server-side copies)."""
        found = own_checkpoint(
            src, self.core.path.backend.storage_options, self._given_max, self.ndim
        )
        if found is None:
            self._import_rows(None, 0, None)
            return
        wid, commit = found
        state = dict(commit.sampler)
        facade = dict(state["facade"])
        with self._replacing():
            try:
                self.core.adopt(src, wid, commit.low_traj, commit.n_traj, state)
            except BaseException:
                if not self.core.closed:
                    self._open_ring()  # the ring of what the segment holds now, old or new
                raise
            self._open_ring(facade)
        self.core.flush()
        self._bump_mutation_revision()
        self._sync_writers()

    # -- lifecycle ------------------------------------------------------------------

    @property
    def path(self):
        return self.core.path

    def flush(self) -> None:
        """Block until every extend is committed to the store."""
        self.core.flush()

    def close(self) -> None:
        """Commit and release the writer lock (idempotent).  A ring whose next slot was
        only guessed is put in order first if a restored writer knows it."""
        if not self.core.closed and self.core.writable:
            self._settle_guess(known_cursor(attached_writers(self)))
        self.core.close()

    # -- crossing a process boundary --------------------------------------------------

    def __reduce__(self):
        # The writer stays in this process (it holds the lock); the other side gets a
        # read-only ZarrStorage of what this one committed (handoff flushes first).
        h = self.core.handoff("ZarrStorage", "a read-only ZarrStorage", sampler=False)
        args = (h.path, h.storage_options, self._given_max, str(self.device), self.ndim)
        # What this storage shows, committed: the copy shows that commit, not a later one.
        pin = (
            commit_pin(self.core.engine.commit)
            if self.core.writable
            else self._shown.pin_now(self._W)
        )
        return (_read_only_copy, (*args, pin))

    def _open_copy(
        self, path, storage_options, max_size: int, device: str, ndim: int, pin=None
    ) -> None:
        self.__dict__["core"] = None
        TensorStorage.__init__(self, storage=None, max_size=max_size, device=device, ndim=ndim)
        self._given_max = max_size
        self._piece = min(max_size, MAX_PIECE_ROWS)
        self._shown = ShownCommit(pin)
        # Every row on disk: the copy shows the ring's slots itself, partly overwritten
        # pieces included (a zreplay.open view hides those: view_rows).
        self.core = BufferCore.reader(
            path, storage_options=storage_options, owner=self, every_row=True
        )
        try:
            self._follow_commit()
        except BaseException:
            self.core.close()
            raise

    @property
    def read_only(self) -> bool:
        """Whether this is an unpickled, read-only copy (see :meth:`refresh`)."""
        return not self.core.writable

    def refresh(self) -> bool:
        """A read-only copy (what a pickled ZarrStorage becomes: in a worker process, a
        deep copy) shows the rows committed when it was made; this makes it show those
        committed since.  True if anything changed.  A writing storage is always
        current (False)."""
        if self.core.writable:
            return False
        before = (self._shown.seen, self._W, self._ring, self._form)
        self._shown.unpin()
        self.core.refresh()
        self._follow_commit()
        return (self._shown.seen, self._W, self._ring, self._form) != before

    def _follow_commit(self) -> bool:
        """Show the ring of the commit :class:`.torchrl_copies.ShownCommit` picks over
        the reader (True if it changed)."""
        found = self._shown.follow(self.core, self._given_max)
        if found is None:
            return False
        facade, low, stop = found
        self._open_ring(facade, low_row=low, stop=stop)
        self._bump_mutation_revision()
        return True

    def _check_writable(self, what: str) -> None:
        if not self.core.writable:
            raise ReadOnlyError(
                f"this ZarrStorage is a read-only copy of {self.core.path} (it was pickled: "
                f"the storage that writes stays in the process that made it); {what} "
                "through that one"
            )

    def __repr__(self) -> str:
        keys = self.core.keys if self.__dict__.get("core") is not None else []
        return (
            f"ZarrStorage(path={self.core.path}, len={len(self)}, max_size={self.max_size}, "
            f"keys={keys})"
        )


def _read_only_copy(path, storage_options, max_size: int, device: str, ndim: int = 1, pin=None):
    """What a pickled ZarrStorage becomes (see ``ZarrStorage.__reduce__``): a read-only
    copy showing the commit ``pin`` (``(contents, row stop, facade state)``)."""
    storage = ZarrStorage.__new__(ZarrStorage)
    storage._open_copy(path, storage_options, max_size, device, ndim, pin)
    return storage
