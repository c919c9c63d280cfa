"""Replacing a writable core's contents all or nothing: a staging core built aside."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

from ..engine import replace
from ..engine.ramtier import RamPolicy


@contextlib.contextmanager
def staged_replacement(core, writer, state: Mapping | None) -> Iterator:
    """Yield a staging core (same class as ``core``, segment ``writer.writer_id``, rows and
    ids going on from ``writer``'s) whose contents replace ``writer``'s when the block
    ends (``replace.swap_in_staged``), or are discarded if it raises; then ``core``
    resumes ``state`` (default: its own state as it is then)."""
    with replace.replacement(writer) as path:
        staging = type(core).writer(
            path,
            writer_id=writer.writer_id,
            ram=RamPolicy(trajectories=2),
            layout=replace.staging_layout(writer),
            durable=writer.durable,
        )
        try:
            yield staging
        finally:
            staging.close()
        new = dict(core.saved.state() if state is None else state)
        before = writer.commit.contents
        try:
            replace.swap_in_staged(writer, new)
        except BaseException:
            core.follow_replaced(before)  # past its point of no return, it did replace
            raise
    core.load_state(new)
