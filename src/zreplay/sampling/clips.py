"""Clips: ``history_len`` frames ``frameskip`` apart inside one episode, planned as rows
to gather per key over an :class:`~zreplay.index.episodes.EpisodeView`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ..conventions import ACTION_KEYS
from ..index.episodes import EpisodeView
from ..numbers import as_int

# How clips may start before an episode's first step: padded frames zeroed or repeated.
PAD_MODES = ("zero", "repeat")


@dataclass
class ClipSpec:
    """``history_len`` frames ``frameskip`` apart; ``action_keys`` dense over the span."""

    history_len: int = 1
    frameskip: int = 1
    pad: str | None = None
    action_keys: tuple[str, ...] = ACTION_KEYS

    def __post_init__(self):
        self.history_len = as_int(self.history_len, "history_len", minimum=1)
        self.frameskip = as_int(self.frameskip, "frameskip", minimum=1)
        if self.pad not in (None, *PAD_MODES):
            raise ValueError(f"pad must be None, 'zero' or 'repeat', got {self.pad!r}")
        self.action_keys = tuple(self.action_keys)

    @property
    def span(self) -> int:
        return self.history_len * self.frameskip

    @property
    def pad_left(self) -> int:
        """How far before step 0 a padded clip may start (its last frame stays real)."""
        return (self.history_len - 1) * self.frameskip if self.pad else 0

    def counts(self, view: EpisodeView) -> np.ndarray:
        return np.maximum(0, view.length - self.span + 1 + self.pad_left)

    def cumulative(self, view: EpisodeView) -> np.ndarray:
        return view.cumulative(("clip", self.span, self.pad_left), lambda: self.counts(view))

    def num_clips(self, view: EpisodeView) -> int:
        cum = self.cumulative(view)
        return int(cum[-1]) if len(cum) else 0


@dataclass
class ClipPlan:
    """Rows to gather per key (``[n, h]`` strided or ``[n, span]`` dense) and pad masks."""

    rows: dict[str, np.ndarray]
    pad: dict[str, np.ndarray | None]  # None: no padded frames (pad=None)
    is_pad: np.ndarray | None
    episode: np.ndarray
    start: np.ndarray


def plan_clips(view: EpisodeView, spec: ClipSpec, flat: np.ndarray, keys: list[str]) -> ClipPlan:
    """Rows of clips at flat clip indices ``flat`` (in ``[0, spec.num_clips(view))``)."""
    cum = spec.cumulative(view)
    ep, k = EpisodeView.locate(cum, np.asarray(flat, np.int64))
    s0 = k - spec.pad_left if spec.pad_left else k
    h, fs = spec.history_len, spec.frameskip
    rows_s, pad_s = _rows(view, ep, s0, np.arange(0, h * fs, fs), spec)
    rows, pad = {}, {}
    dense = None
    for key in keys:
        if fs > 1 and _is_action(key, spec.action_keys):
            if dense is None:
                dense = _rows(view, ep, s0, np.arange(h * fs), spec)
            rows[key], pad[key] = dense
        else:
            rows[key], pad[key] = rows_s, pad_s
    return ClipPlan(rows, pad, pad_s, ep, s0)


def _rows(view: EpisodeView, ep: np.ndarray, s0: np.ndarray, steps: np.ndarray, spec: ClipSpec):
    """Rows ``[n, len(steps)]`` of steps ``s0 + steps`` of episodes ``ep`` (steps before 0
    clamped to 0), and the mask of those clamped (None without padding: there are none)."""
    if not spec.pad_left:  # every step is inside its episode
        if view.multi:  # an episode's rows may lie in several pieces
            rows = view.rows(ep[:, None], s0[:, None] + steps)
        else:
            rows = view.rows(ep, s0)[:, None] + steps
        return rows, (None if spec.pad is None else np.zeros(rows.shape, bool))
    strided = s0[:, None] + steps
    return view.rows(ep[:, None], np.maximum(strided, 0)), strided < 0


def _is_action(key: str, action_keys: tuple[str, ...]) -> bool:
    return any(key == a or key.startswith(a + "/") for a in action_keys)


def finish_clips(
    plan: ClipPlan, gathered: Mapping[str, np.ndarray], spec: ClipSpec
) -> dict[str, np.ndarray]:
    """Gathered ``[n, m, ...]`` rows -> ``[n, h, ...]`` clips (dense actions reshaped to
    ``(h, frameskip * action_dim)``), padded frames zeroed for ``pad="zero"``."""
    out = {}
    h = spec.history_len
    for key, a in gathered.items():
        r = plan.rows[key]
        if spec.pad == "zero":
            m = plan.pad[key]
            if m.any():
                a[m] = 0
        if r.shape[1] != h:  # dense action block
            a = a.reshape(r.shape[0], h, -1)
        out[key] = a
    return out
