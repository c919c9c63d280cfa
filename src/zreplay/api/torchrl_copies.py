"""Which commit a read-only copy of a :class:`~zreplay.torchrl.ZarrStorage` shows.

A pickled storage (in a worker process, a deep copy) becomes a read-only copy over a
reader of the same buffer.  It shows the commit the storage was pickled at (its *pin*:
``(contents id, row stop, record)``) while every row of that commit's ring is still on
disk, then the newest commit its reader sees: :meth:`ShownCommit.follow` says which
ring to show after each refresh of the reader.
"""

from __future__ import annotations

from ..errors import FormatError
from ..store.torchrl_record import KIND
from .torchrl_ring import ring_slots


def commit_pin(commit) -> tuple:
    """The pin of a writer's last ``commit``: what a copy pickled now shows."""
    return (commit.contents, commit.n_rows, dict((commit.sampler or {}).get("facade") or {}))


class ShownCommit:
    """The commit a read-only copy shows: ``seen`` (``(contents, low row, rows)`` of its
    reader's segment; ``None``: an emptied segment; ``False``: none yet), ``shown`` (the
    record of the ring it shows) and ``pin`` (the commit it was pickled at, ``None``
    once it follows the newest)."""

    def __init__(self, pin: tuple | None):
        self.seen: tuple | None | bool = False
        self.shown: dict = {}
        self.pin = pin
        self.last_record: dict = {}  # the newest record seen (an emptied segment has none)

    def pin_now(self, stop: int) -> tuple | None:
        """The pin of what the copy shows, its ring ending at row position ``stop``."""
        if not self.seen:
            return None
        return (self.seen[0], stop + self.seen[1], dict(self.shown))

    def unpin(self) -> None:
        """Show the newest commit from now on."""
        if self.pin is not None:
            self.pin, self.seen = None, False

    def follow(self, core, max_size: int) -> tuple[dict, int, int | None] | None:
        """``(record, low row, row stop)`` of the ring to show over ``core`` (the copy's
        reader; ``stop``: ``None`` for its newest row) if the commit shown changes, else
        ``None``.  ``FormatError`` if the buffer is not one ZarrStorage's segment."""
        segs = core.engine.segments()
        ours = [c for _, c in segs if (c.sampler or {}).get("facade", {}).get("kind") == KIND]
        if len(segs) > 1 or len(ours) != len(segs):
            raise FormatError(
                f"{core.path} holds {len(segs)} segments, not one written by a "
                "ZarrStorage; open it with zreplay.open()"
            )
        seen = (ours[0].contents, ours[0].low_row, ours[0].n_rows) if ours else None
        if seen == self.seen:
            return None
        self.seen = seen
        if ours:
            self.last_record = dict(ours[0].sampler["facade"])
        elif not self.last_record:  # an emptied segment is not listed; its commit is
            for _, c in core.engine.commits():
                if (c.sampler or {}).get("facade", {}).get("kind") == KIND:
                    self.last_record = dict(c.sampler["facade"])
        # An emptied segment: an empty ring of the kind of data it held.
        facade = self.last_record
        if not ours and facade:
            facade = dict(facade, start=0, shift=0)
        low, stop = (ours[0].low_row, None) if ours else (0, None)
        pinned = self._pinned(ours[0], max_size) if ours and self.pin is not None else None
        if pinned is not None:
            facade, stop = pinned
        else:
            self.pin = None  # its rows left the disk: the newest commit from now on
        self.shown = facade
        return facade, low, stop

    def _pinned(self, commit, max_size: int) -> tuple[dict, int] | None:
        """``(record, row stop)`` of the commit this copy was pickled at, over
        ``commit`` (the reader's), if every row it shows is still visible there."""
        contents, n_rows, facade = self.pin
        if contents != commit.contents or not commit.low_row <= n_rows <= commit.n_rows:
            return None
        try:
            M0, per = ring_slots(max_size, facade.get("dims"))
            shown = min(n_rows - int(facade.get("start", 0)), M0)
        except (TypeError, ValueError):
            return None
        if n_rows - max(shown, 0) < commit.low_row:
            return None
        return facade, n_rows - commit.low_row
