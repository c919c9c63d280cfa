"""What a writable core's writer saves with every commit beside its rows.

A :class:`SavedState` is the writer's :class:`~zreplay.engine.committer.StateSource`:
the random stream, the bound sampler (its JSON state and, prioritized, the leaves to
save), the facade's own state and a ring's ``view_rows``.  The committer thread asks it
for them while it builds a commit, and hands it the writer's row space (taken under the
writer's lock) for the leaves, so nothing calls back into the core or the engine under
that lock.  Its format is FORMAT.md's ``sampler`` object of ``commit.json``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from ..store.commit import VIEW_ROWS
from .bound_sampler import BoundSampler
from .stream import RandomStream

log = logging.getLogger("zreplay")


class SavedState:
    """The state a writer commits for its core (see the module docstring).

    ``facade``: the facade's JSON state (``commit.sampler["facade"]``), changed in place
    by the facade; ``view_rows``: views show only trajectories starting within this many
    newest rows (None: every visible row); ``kept``: a state committed unchanged instead
    of the live one (:meth:`keep`); ``error``: why the last state could not be saved."""

    def __init__(self, stream: RandomStream, bound: BoundSampler, facade: Mapping):
        self.stream, self.bound = stream, bound
        self.facade = dict(facade)
        self.view_rows: int | None = None
        self.kept: dict | None = None
        self.error: TypeError | None = None

    @property
    def keeps_priorities(self) -> bool:
        return self.bound.prioritized

    def state(self) -> dict:
        """The JSON a commit carries as its ``sampler`` object."""
        if self.kept is not None:
            return dict(self.kept)
        out = {**self.stream.state(), **self.bound.state(), "facade": dict(self.facade)}
        if self.view_rows is not None:
            out[VIEW_ROWS] = self.view_rows
        return out

    def keep(self, state: Mapping | None) -> None:
        """Commit ``state`` unchanged from now on, whatever the core draws."""
        self.kept = dict(state or {})

    def priorities_to_save(self, space, n_rows: int, explicit: bool):
        return self.bound.priorities_to_save(space, n_rows, explicit)

    def save_failed(self) -> None:
        self.bound.save_failed()

    def state_failed(self, error: TypeError) -> None:
        log.error("zreplay: the sampler state was not saved with a commit: %s", error)
        self.error = error

    def take_error(self) -> TypeError | None:
        """Why the last state could not be saved (once), or None."""
        error, self.error = self.error, None
        return error
