"""The random stream of a buffer: its seed, generator and counters, in one place.

Every draw of a buffer (rows, clips, n-step transitions, prioritized or not) takes its
randomness from one :class:`RandomStream`, so a seed reproduces a whole run, and the
stream is saved with every commit so that reopening a buffer continues it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import CorruptBufferError
from ..forks import on_fork

# Counters a saved stream holds, and their defaults.
_COUNTS = {"num_sampled": 0, "step": 0}


def fresh_seed() -> int:
    """A random 63-bit seed (kept with the buffer, so a resumed run continues from it)."""
    return int(np.random.SeedSequence().entropy % (1 << 63))


class RandomStream:
    """Seed, generator (numpy PCG64, never the global state), ``step`` (batches drawn:
    a sampler hook's step, a prioritized sampler's beta clock) and ``num_sampled``
    (transitions drawn by row samples).

    ``tag``: saved as ``"kind"`` with the state; a stream with a tag only resumes a state
    carrying the same tag (a stream without one resumes any saved stream).
    """

    def __init__(self, seed: int | None = None, tag: str | None = None):
        self.tag = tag
        self.reseed(fresh_seed() if seed is None else int(seed))
        # A forked child (a DataLoader worker over a writer, a child of a seeded run)
        # draws its own batches, never its parent's next ones.
        on_fork(self, RandomStream.unseeded)

    def reseed(self, seed: int, rank: int | None = None) -> None:
        """Restart from ``seed`` (``rank``: the stream of that rank of a distributed
        job, independent of the other ranks'); counters restart at 0."""
        self.seed = int(seed)
        bits = (
            np.random.SeedSequence(self.seed, spawn_key=(rank,)) if rank is not None else self.seed
        )
        self.rng = np.random.Generator(np.random.PCG64(bits))
        self.step = 0
        self.num_sampled = 0

    def unseeded(self) -> None:
        """A fresh, unrelated generator (a DataLoader worker must not replay its parent's
        draws); the seed and counters stay."""
        self.rng = np.random.default_rng()

    def take_step(self, step: int | None = None) -> int:
        """The step a draw uses: ``step`` if given (the counter does not move), else the
        counter, which then advances."""
        if step is not None:
            return int(step)
        step, self.step = self.step, self.step + 1
        return step

    def state(self) -> dict:
        """JSON: seed, generator state and counters (saved with every commit)."""
        out = {
            "seed": self.seed,
            "rng": self.rng.bit_generator.state,
            "num_sampled": self.num_sampled,
            "step": self.step,
        }
        if self.tag is not None:
            out["kind"] = self.tag
        return out

    def resumes(self, state: Mapping | None) -> bool:
        """Whether :meth:`load` would take ``state``."""
        if not state or "rng" not in state:
            return False
        return self.tag is None or state.get("kind") == self.tag

    def load(self, state: Mapping | None) -> bool:
        """Continue a saved stream (see ``tag``); returns whether it did."""
        if not self.resumes(state):
            return False
        try:  # read from a commit record: a stranger's buffer may hold anything here
            rng = np.random.Generator(type(self.rng.bit_generator)())  # tried aside first
            rng.bit_generator.state = dict(state["rng"])
            counts = [int(state.get(k, d)) for k, d in _COUNTS.items()]
            seed = int(state.get("seed", self.seed))
        except (TypeError, ValueError, OverflowError, KeyError) as e:
            raise CorruptBufferError(
                f"the random stream saved in the buffer's commit record is damaged ({e}); "
                "restore the buffer from a checkpoint"
            ) from None
        if min(counts) < 0:
            raise CorruptBufferError(
                f"the random stream saved in the buffer's commit record is damaged "
                f"(negative counts {counts}); restore the buffer from a checkpoint"
            )
        self.rng.bit_generator.state = rng.bit_generator.state  # in place: others hold it
        self.num_sampled, self.step = counts
        self.seed = seed
        return True
