"""A new buffer written from another program's dataset, all or nothing: what
``import_lerobot`` and ``import_minari`` share.

The buffer is built aside (:func:`~zreplay.store.guard.new_tree`) and appears at its
target whole, or not at all; each source episode becomes one trajectory ``[T, 1]`` (one
episode of the buffer's episode table), in the order given; episodes are added in
batches (one ``add`` per episode costs ~15 ms), so what is read ahead of the writer is
bounded by ``batch_episodes`` and ``batch_bytes``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ..core import OFFLINE_WRITER, BufferCore, Prepared, RandomStream, seal
from ..store.guard import new_tree
from ..threads import deferred_interrupts


def import_episodes(
    target,
    tool: str,
    source,
    episodes: Iterable[dict[str, np.ndarray]],
    *,
    overwrite: bool,
    batch_episodes: int,
    batch_bytes: int,
    finish: Callable[[Path], None] | None = None,
    **writer,
) -> list[str]:
    """Write ``episodes`` (each ``{key: [T, ...]}``, flat keys) as the trajectories of a
    new buffer at ``target`` (a location); returns the buffer's keys.

    ``tool`` and ``source`` name the import in ``new_tree``'s messages; an existing
    buffer at ``target`` is replaced only with ``overwrite=True``.  ``finish(tmp)`` runs
    on the built buffer, writer closed, before it is put in place (metadata beside the
    rows).  ``writer`` goes to :meth:`BufferCore.writer` (``ram``, ``capacity``, the
    user's ``layout``, ``durable``, ...).  The first episode's key order is kept as the
    ``ReplayBuffer`` column order.  The episodes are the buffer's offline part: written
    as segment ``writer_id`` (default ``"offline"``) and sealed (FORMAT.md, "Sealed
    segments"), so online writers append beside them and never evict them.
    """
    writer.setdefault("writer_id", OFFLINE_WRITER)
    with new_tree(target, tool, overwrite=overwrite, sources=[source]) as tmp:
        core = None
        try:
            with deferred_interrupts():  # the writer is made and then closed, or never made
                core = BufferCore.writer(tmp, stream=RandomStream(tag="swm"), **writer)
            batch, nbytes = [], 0
            for cols in episodes:
                if not core.facade_state.get("columns"):  # its ReplayBuffer reopens the order
                    core.facade_state["columns"] = list(cols)
                n = len(next(iter(cols.values())))
                lanes = {k: np.ascontiguousarray(v)[:, None] for k, v in cols.items()}
                batch.append(Prepared(lanes, n, 1, split_episodes=False))
                nbytes += sum(v.nbytes for v in cols.values())
                if nbytes >= batch_bytes or len(batch) >= batch_episodes:
                    core.add(batch)
                    batch, nbytes = [], 0
            core.add(batch)
            core.flush()
            keys = list(core.keys)
        finally:
            if core is not None:
                core.close()
        seal(tmp, writer["writer_id"], writer.get("storage_options"))
        if finish is not None:
            # Ctrl-C held back: one that ends zarr's wait for its own I/O thread leaves
            # that thread writing into the tree while the tree is removed, and part of
            # the staging tree stays behind.  (The metadata written here is small.)
            with deferred_interrupts():
                finish(tmp)
    return keys
