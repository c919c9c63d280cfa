"""``zreplay.samplers``: the public names of the samplers (see
:mod:`zreplay.sampling.samplers`): pass one as ``sampler=`` to any buffer or view."""

from .sampling.samplers import (
    Context,
    Hook,
    Prioritized,
    PrioritizedClips,
    Recency,
    RowSpace,
    Sampler,
    SegmentRows,
    Staleness,
    Uniform,
    Units,
    Window,
    as_sampler,
)

__all__ = [
    "Context",
    "Hook",
    "Prioritized",
    "PrioritizedClips",
    "Recency",
    "RowSpace",
    "Sampler",
    "SegmentRows",
    "Staleness",
    "Uniform",
    "Units",
    "Window",
    "as_sampler",
]
