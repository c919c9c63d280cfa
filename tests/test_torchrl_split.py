"""The pieces ``ZarrStorage`` is made of, each on its own: the ring and its record, the
order a TorchRL checkpoint is imported in, and the one module that moves TorchRL's
writers."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torchrl")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from zreplay.api.torchrl_checkpoints import import_order  # noqa: E402
from zreplay.api.torchrl_forms import Form  # noqa: E402
from zreplay.api.torchrl_ring import Ring, check_record, record, ring_slots  # noqa: E402
from zreplay.errors import CorruptBufferError  # noqa: E402
from zreplay.store.torchrl_record import record_problem  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src" / "zreplay"


@given(
    slots=st.integers(1, 40),
    written=st.integers(0, 200),
    writer_knows=st.booleans(),
)
def test_an_imported_torchrl_ring_shows_every_slot_as_torchrl_did(slots, written, writer_knows):
    """TorchRL's round-robin writer puts row ``i`` in slot ``i % slots``; appending the
    slots in import_order into a ring shifted by its next slot shows each slot's row,
    and the ring's next slot is the writer's cursor."""
    torchrl = np.full(slots, -1)
    for i in range(written):
        torchrl[i % slots] = i
    n = min(written, slots)
    next_slot = written % slots if writer_knows else None
    order, shift = import_order(n, slots, next_slot)
    appended = torchrl[order.numpy()]
    start = 1000  # rows go on after those the segment held before
    ring = Ring(slots, start, shift)
    W = start + len(appended)
    assert ring.length(W) == n
    shown = appended[ring.rows_of(np.arange(n), W) - start]
    assert (shown == torchrl[:n]).all()
    if n == slots and writer_knows:
        assert ring.next_slot(W) == written % slots
    elif n < slots:
        assert ring.next_slot(W) == n


@given(
    max_size=st.integers(1, 10_000),
    dims=st.none() | st.lists(st.integers(1, 8), min_size=1, max_size=3),
    rows=st.integers(0, 100_000),
    data=st.data(),
)
def test_every_record_a_storage_writes_passes_the_untrusted_check(max_size, dims, rows, data):
    """What ``record`` writes for any ring a storage can hold is accepted by the check
    that opening (and zreplay.verify) runs on a record read from disk."""
    ndim = 1 if dims is None else len(dims) + 1
    slots, _ = ring_slots(max_size, dims)
    start = data.draw(st.integers(0, rows))
    shift = data.draw(st.integers(0, slots - 1))
    form = data.draw(st.sampled_from([None, Form()]))
    saved = record(max_size, ndim, dims, Ring(slots, start, shift), False, form)
    assert record_problem(saved, rows) is None
    check_record(
        saved, "buf", has_rows=True, n_rows=rows, columns=None, max_size=max_size, ndim=ndim
    )


def test_a_record_whose_shift_leaves_the_ring_is_refused_naming_it():
    saved = record(8, 1, None, Ring(8, 0, 0), False, Form())
    saved["shift"] = 8
    with pytest.raises(CorruptBufferError, match="shift is 8"):
        check_record(saved, "buf", has_rows=True, n_rows=10, columns=None, max_size=8, ndim=1)
    with pytest.raises(ValueError, match="max_size=8, not 9"):
        check_record(
            record(8, 1, None, Ring(8), False, Form()),
            "buf",
            has_rows=True,
            n_rows=10,
            columns=None,
            max_size=9,
            ndim=1,
        )


def test_only_the_writers_module_moves_torchrl_writers():
    """TorchRL's writers keep their cursor in private fields; one module reads and moves
    them (api/torchrl_writers.py), so a TorchRL upgrade that renames them is one fix."""
    private = {"_cursor", "_write_count"}
    found = []
    for path in SRC.rglob("*.py"):
        if path.name == "torchrl_writers.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in private:
                found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found
    writers = (SRC / "api" / "torchrl_writers.py").read_text()
    assert all(name in writers for name in private)
