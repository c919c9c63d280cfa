"""Proportional prioritized replay (Schaul et al. 2016) over a buffer's rows, and over
clip start positions.

Each visible row ``r`` holds a leaf ``(p_r + eps) ** alpha`` in a
:class:`~zreplay.sampling.prioritized_state.PrioritizedState` (one per writer's segment,
float64 sum tree);
new rows enter at the largest priority ever applied (``initial_priority`` before any),
evicted rows drop out, and ``update_priorities`` for a row evicted since it was drawn is
ignored.  Rows are drawn with ``P(r) = leaf_r / sum(leaves)``.

Clips and n-step transitions are keyed by the row they start at (see
:class:`~zreplay.samplers.contract.Units`): draws are rows by priority, kept when the row
starts a valid unit and redrawn otherwise (rejection, exact; after 8 rounds the rest
are drawn from the valid start rows directly).  So a unit's probability is its start
row's leaf over the leaves of all valid start rows.  With padding (``pad=``) the clips
that start at or before an episode's first step all key its first row: together they
are drawn with that row's probability, each with an equal share of it (so, at equal
priorities, each padded clip is drawn less often than an unpadded one), and their
weights are that row's; use ``pad=None`` where every clip must stand on its own.

Importance weights: ``w = (leaf / min_leaf) ** -beta`` with ``min_leaf`` the smallest
positive leaf of all live rows (all segments), i.e. ``(N * P) ** -beta`` divided by the
largest weight any live row could get (cpprb's and TorchRL's convention), so ``w <= 1``
and weights are comparable across batches.  ``weights / weights.max()`` gives rlpyt's
batch-max normalisation.  ``beta`` anneals linearly from ``beta`` to 1 over ``beta_steps``
steps of the buffer's step counter (0: constant).

Batches carry ``index`` (int64: the global row ids drawn, or the start rows of the units
drawn; in a view over several segments ``row + (segment << 40)``; once a segment's
contents were replaced after indices were drawn from it (a clear, a loaded checkpoint),
``+ (tag << 56)`` naming its contents) and ``weight`` (float32).  Pass ``index`` back to
``update_priorities`` with the new priorities: an index drawn before a replace is
skipped after it, as one whose row was evicted is (its row number may name another
row now).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import CorruptBufferError, EmptyBufferError, warn_caller
from ..index.coords import SEGMENT_SHIFT, GlobalRow, TaggedRows, tag_rows, untag_rows
from ..sampling.clips import ClipSpec
from ..sampling.prioritized_state import PrioritizedState
from .contract import Context, Drawn, PrioritySampler, RowSpace, Units, VisibleRows, draw_weighted

# A batch's index is a TaggedRow (zreplay.index.coords): bits 40-55 the segment's key,
# bits 56-62 which contents of its segment it was drawn from (see _Tree).
_TAGS = 127
_MIN_CAPACITY = 4096
_REJECTION_ROUNDS = 8


def _capacity_for(rows: int, current: int = 0) -> int:
    need = max(_MIN_CAPACITY, int(rows))
    if need <= current:
        return current
    return max(2 * current, 1 << (need - 1).bit_length())


@dataclass
class _Tree:
    """One segment's tree.  ``tag`` names which contents of the segment it holds: it
    starts at 0 and moves on (1..127, round) when the contents are replaced (a clear, a
    loaded checkpoint) after indices were drawn from them (``drawn``), so an index drawn
    before a replace, whose row numbers the new contents may reuse, never applies after
    it."""

    state: PrioritizedState
    epoch: object
    changed: bool = True
    tag: int = 0
    drawn: bool = False


class Prioritized(PrioritySampler):
    """Prioritized replay over rows (see the module docstring).

    Args:
        alpha: priority exponent (0: uniform, 1: fully proportional).
        beta: importance-sampling exponent at step 0.
        eps: added to every priority before ``** alpha`` (a row with error 0 stays drawable).
        beta_steps: anneal beta linearly to 1 over this many buffer steps (0: constant).
        initial_priority: priority of new rows before any update.
        stratified: draw one mass in each of ``n`` equal slices of the total (lower variance).
        save_every_s: writable buffers save priorities with a commit at most this often
            (and always on ``flush``/``close``/``save_checkpoint``).
    """

    prioritized = True

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        beta_steps: int = 0,
        initial_priority: float = 1.0,
        stratified: bool = False,
        save_every_s: float = 10.0,
    ):
        # PrioritizedState validates the numbers; fail at construction, not first sample.
        PrioritizedState(1, alpha, beta, eps, int(beta_steps), initial_priority)
        if not save_every_s >= 0:
            raise ValueError(f"save_every_s must be >= 0 seconds, got {save_every_s}")
        self.alpha, self.beta, self.eps = float(alpha), float(beta), float(eps)
        self.beta_steps = int(beta_steps)
        self.initial_priority = float(initial_priority)
        self.stratified = bool(stratified)
        self.save_every_s = float(save_every_s)
        self._segs: dict[int, _Tree] = {}

    def config(self) -> dict:
        return {
            "alpha": self.alpha,
            "beta": self.beta,
            "eps": self.eps,
            "beta_steps": self.beta_steps,
            "initial_priority": self.initial_priority,
            "stratified": self.stratified,
            "save_every_s": self.save_every_s,
        }

    def beta_at(self, step: int) -> float:
        """Beta at buffer step ``step`` (linear from ``beta`` to 1 over ``beta_steps``)."""
        if self.beta_steps <= 0:
            return self.beta
        return self.beta + (1.0 - self.beta) * min(1.0, max(0.0, step / self.beta_steps))

    def leaf_value(self, priorities) -> np.ndarray:
        """Tree value ``(p + eps) ** alpha`` of priorities ``p: float64[k]``."""
        return (np.asarray(priorities, np.float64) + self.eps) ** self.alpha

    # -- following the buffer's rows ------------------------------------------------

    def sync(self, space: RowSpace) -> None:
        """Make each segment's tree hold exactly its visible rows: rows added since the
        last call enter at the running max priority, evicted rows leave."""
        for seg in space.segments:
            self._sync_tree(seg)

    def _sync_tree(self, seg: VisibleRows) -> _Tree:
        cur = self._segs.get(seg.key)
        if cur is None or cur.epoch is not seg.epoch:
            tag = 0 if cur is None else (cur.tag % _TAGS + 1 if cur.drawn else cur.tag)
            cur = self._segs[seg.key] = _Tree(self._restore(seg), seg.epoch, tag=tag)
        st = cur.state
        if seg.low_row > st.low:
            st.evict_below(min(seg.low_row, st.high))
            if seg.low_row > st.high:  # everything it held is gone, and rows after it
                st.low = st.high = seg.low_row
            cur.changed = True
        if seg.n_rows > st.high:
            need = seg.n_rows - st.low
            if need > st.capacity:
                st.grow(_capacity_for(need, st.capacity))
            st.add(np.arange(st.high, seg.n_rows, dtype=np.int64))
            cur.changed = True
        return cur

    def _new_state(self, capacity: int, start_row: int, max_priority: float) -> PrioritizedState:
        return PrioritizedState(
            capacity,
            alpha=self.alpha,
            beta=self.beta,
            eps=self.eps,
            beta_steps=self.beta_steps,
            initial_priority=max_priority,
            start_row=start_row,
        )

    def _restore(self, seg: VisibleRows) -> PrioritizedState:
        """A tree for a segment first seen: its saved leaves where it has them.  Saved
        leaves that cannot be read (a damaged copy: ``zreplay.verify`` reports it) are
        not the rows' data: the rows start afresh at ``initial_priority``, with a warning,
        and the writer's next save replaces the damaged copy's name in its commit."""
        got = seg.persisted() if seg.persisted is not None else None
        live = max(1, seg.n_rows - seg.low_row)
        fresh = self._new_state(_capacity_for(live), seg.low_row, self.initial_priority)
        if got is None:
            return fresh
        meta, read = got
        cap = int(meta["capacity"])
        if cap < live:
            cap = _capacity_for(live, cap)
        st = self._new_state(cap, seg.low_row, float(meta["max_priority"]))
        lo, hi = max(int(meta["low"]), seg.low_row), min(int(meta["high"]), seg.n_rows)
        if hi > lo:
            try:
                leaves = read(lo, hi)
                if not (np.isfinite(leaves).all() and (leaves >= 0).all()):
                    raise CorruptBufferError("saved leaves are negative or not finite")
            except CorruptBufferError as e:
                warn_caller(
                    f"zreplay: the saved priorities cannot be read ({e}); rows "
                    f"[{lo}, {hi}) start again at initial_priority={self.initial_priority:g}. "
                    "Their data is intact; the next save replaces the damaged copy"
                )
                return fresh
            st.add(np.arange(seg.low_row, hi, dtype=np.int64))  # max priority, then:
            st.tree.update(np.arange(lo, hi, dtype=np.int64) % cap, leaves)
        return st

    # -- drawing --------------------------------------------------------------------

    def _live(self, space: RowSpace) -> list[tuple[VisibleRows, PrioritizedState, int]]:
        """``(segment, tree, contents tag)`` of every segment with rows to draw; their
        indices are handed out from now on (``_Tree.drawn``)."""
        out = []
        for seg in space.segments:
            cur = self._sync_tree(seg)
            st = cur.state
            if st.size and st.tree.total > 0.0:
                cur.drawn = True
                out.append((seg, st, cur.tag))
        if not out:
            raise EmptyBufferError(
                "Cannot sample from an empty buffer (no row has a priority > 0)."
            )
        return out

    def _draw(self, ctx: Context, live, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` rows by priority: (positions, index, weight float64), weights normalised
        by the smallest leaf of all segments."""
        beta = self.beta_at(ctx.step)
        if len(live) == 1:
            seg, st, tag = live[0]
            rows, w = st.sample(ctx.rng, n, self.stratified, beta=beta)
            return seg.positions(rows), tag_rows(rows, seg.key, tag), w
        gmin = min(st.tree.min for _, st, _ in live)
        which = draw_weighted(ctx.rng, np.array([st.tree.total for _, st, _ in live]), n)
        pos, index, weight = (np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n))
        for i, (seg, st, tag) in enumerate(live):
            sel = np.flatnonzero(which == i)
            if sel.size:
                rows, w = st.sample(ctx.rng, sel.size, self.stratified, beta=beta)
                pos[sel], index[sel] = seg.positions(rows), tag_rows(rows, seg.key, tag)
                weight[sel] = w * (gmin / st.tree.min) ** beta
        return pos, index, weight

    def draw_rows(self, ctx: Context, n: int) -> Drawn:
        pos, index, weight = self._draw(ctx, self._live(ctx.space), n)
        return pos, {"index": index, "weight": weight.astype(np.float32)}

    def draw_units(self, ctx: Context, units: Units, n: int) -> Drawn:
        live = self._live(ctx.space)
        flat, index = np.full(n, -1, np.int64), np.zeros(n, np.int64)
        weight = np.zeros(n)
        todo = np.arange(n)
        for _ in range(_REJECTION_ROUNDS):
            pos, idx, w = self._draw(ctx, live, todo.size)
            f = units.from_rows(pos, ctx.rng)
            ok = f >= 0
            done = todo[ok]
            flat[done], index[done], weight[done] = f[ok], idx[ok], w[ok]
            todo = todo[~ok]
            if not todo.size:
                break
        else:
            f, idx, w = self._draw_exact(ctx, live, units, todo.size)
            flat[todo], index[todo], weight[todo] = f, idx, w
        return flat, {"index": index, "weight": weight.astype(np.float32)}

    def _draw_exact(self, ctx: Context, live, units: Units, n: int):
        """Draw among the rows that key a unit only (O(units); rejection kept missing)."""
        pos = units.key_rows()
        leaf, index = np.zeros(len(pos)), np.zeros(len(pos), np.int64)
        for seg, st, tag in live:
            sel = np.flatnonzero((pos >= seg.first) & (pos < seg.first + st.size))
            rows = seg.rows_at(pos[sel])
            leaf[sel] = st.tree.get(rows % st.capacity)
            index[sel] = tag_rows(rows, seg.key, tag)
        j = draw_weighted(ctx.rng, leaf, n)
        gmin = min(st.tree.min for _, st, _ in live)
        weight = (leaf[j] / gmin) ** -self.beta_at(ctx.step)
        return units.from_rows(pos[j], ctx.rng), index[j], weight

    # -- priorities -----------------------------------------------------------------

    def update_priorities(self, space: RowSpace, index: TaggedRows, priorities) -> int:
        """Set the priorities of ``index`` (int64[k], from a batch) to ``priorities``
        (float[k] or a scalar); returns how many were applied (rows evicted since they
        were drawn are skipped).  ``ValueError`` for NaN, infinite or negative values."""
        idx = _batch_index(index)
        p = np.asarray(priorities, np.float64).reshape(-1)
        if p.size == 1 and idx.size != 1:
            p = np.full(idx.size, p[0])
        if p.shape != idx.shape:
            raise ValueError(
                f"update_priorities got {idx.size} indices but {p.size} priorities; pass one "
                "priority per index (e.g. |TD error| per sampled row)"
            )
        self.sync(space)
        if not (idx >> SEGMENT_SHIFT).any():  # rows of one writer's first contents
            cur = self._segs.get(0)
            if cur is None or cur.tag:
                return 0  # drawn before its contents were replaced: they do not apply
            cur.changed = True
            return cur.state.update(idx, p)
        keys, tags, rows = untag_rows(idx)
        applied = 0
        for key in np.unique(keys):
            cur = self._segs.get(int(key))
            if cur is None:
                continue
            sel = (keys == key) & (tags == cur.tag)  # drawn from the contents it holds
            applied += cur.state.update(rows[sel], p[sel])
            cur.changed = True
        return applied

    def priorities(self, space: RowSpace, index: TaggedRows) -> np.ndarray:
        """Leaves ``(p + eps) ** alpha`` (float64) of live rows ``index``; 0 for rows no
        longer (or not yet) visible."""
        idx = _batch_index(index)
        self.sync(space)
        out = np.zeros(idx.size)
        keys, tags, all_rows = untag_rows(idx)
        for key in np.unique(keys):
            cur = self._segs.get(int(key))
            if cur is None:
                continue
            st = cur.state
            sel = np.flatnonzero((keys == key) & (tags == cur.tag))
            rows = all_rows[sel]
            live = (rows >= st.low) & (rows < st.high)
            out[sel[live]] = st.tree.get(rows[live] % st.capacity)
        return out

    # -- persistence ----------------------------------------------------------------

    def snapshot(self, key: int, stop_row: GlobalRow) -> tuple[dict, np.ndarray] | None:
        """What to save for segment ``key``: metadata and the leaves of live rows below
        ``stop_row`` (``None`` if unchanged since the last snapshot); marks it saved."""
        cur = self._segs.get(key)
        if cur is None or not cur.changed:
            return None
        st = cur.state
        hi = max(min(st.high, int(stop_row)), st.low)
        meta = {
            "low": st.low,
            "high": hi,
            "capacity": st.capacity,
            "max_priority": st.max_priority,
            "alpha": self.alpha,
            "eps": self.eps,
        }
        cur.changed = hi < st.high  # rows past the commit are saved next time
        return meta, st.tree.get(np.arange(st.low, hi, dtype=np.int64) % st.capacity)

    def mark_changed(self, key: int) -> None:
        """A snapshot was not saved after all: take the next one."""
        cur = self._segs.get(key)
        if cur is not None:
            cur.changed = True

    def priorities_state(self) -> dict:
        """Every segment's tree as plain values and float64 arrays (for torch.save)."""
        return {int(k): s.state.state_dict() for k, s in self._segs.items()}

    def load_priorities_state(self, state: dict, space: RowSpace) -> None:
        """Inverse of :meth:`priorities_state` for the segments of ``space`` (their rows
        must be the rows the state was taken over; rows evicted since are dropped)."""
        for seg in space.segments:
            got = state.get(seg.key, state.get(str(seg.key)))
            if got is not None:
                self._segs[seg.key] = _Tree(PrioritizedState.from_state_dict(got), seg.epoch)
                self._sync_tree(seg)


class PrioritizedClips(Prioritized):
    """Prioritized sequence replay: :class:`Prioritized`, plus a clip shape, so that the
    *row* entry points (``TrajectoryReplayBuffer.sample``, ``BufferView.sample``) return
    ``n`` clips ``[n, history_len, ...]`` instead of ``n`` rows, drawn with probability
    proportional to the priority of their start row among all valid clip starts (clips
    never cross an episode boundary; see ``ClipSpec`` for ``frameskip``/``pad``).
    ``index`` holds the start rows: update them with one priority per clip (e.g. R2D2's
    ``0.9 * max|td| + 0.1 * mean|td|``).  Clip entry points (``ReplayBuffer.sample``,
    ``sample_clips``) draw the same way with their own clip shape.
    """

    def __init__(
        self,
        history_len: int,
        frameskip: int = 1,
        pad: str | None = None,
        action_keys: tuple[str, ...] = ("actions", "action"),
        **prioritized,
    ):
        super().__init__(**prioritized)
        self.clips = ClipSpec(history_len, frameskip, pad, tuple(action_keys))

    def config(self) -> dict:
        c = self.clips
        clip = {"history_len": c.history_len, "frameskip": c.frameskip, "pad": c.pad}
        return {**clip, "action_keys": list(c.action_keys), **super().config()}


def _batch_index(index) -> np.ndarray:
    """A batch's ``index`` (numpy or torch, any shape) as flat int64; ``ValueError`` for
    anything but integers (a float index is never truncated to a row)."""
    idx = np.asarray(index).reshape(-1)
    if idx.size == 0:
        return idx.astype(np.int64)
    if idx.dtype.kind not in "iu":
        raise ValueError(f"index must be integers (a batch's 'index'), got dtype {idx.dtype}")
    return idx.astype(np.int64, copy=False)
