"""The samplers' older import path: their modules moved to :mod:`zreplay.samplers` (one
sampler package).  ``zreplay.sampling.samplers.<module>`` names the same module object as
``zreplay.samplers.<module>`` (``base`` is ``zreplay.samplers.contract``, where the
contract it held now lives), so code importing from here, or patching a module found
here, keeps working."""

import sys

from ...samplers import contract, hook, prioritized, recency, staleness, uniform
from ...samplers.contract import Context, RowSpace, Sampler, SegmentRows, Units, VisibleRows
from ...samplers.hook import Hook, as_sampler
from ...samplers.prioritized import Prioritized, PrioritizedClips
from ...samplers.recency import Recency
from ...samplers.staleness import Staleness
from ...samplers.uniform import Uniform, Window

# The submodules' old names: an import machinery lookup of "zreplay.sampling.samplers.x"
# finds these once this package is imported (which importing the name does first).
for _name, _module in {
    "base": contract,
    "hook": hook,
    "prioritized": prioritized,
    "recency": recency,
    "staleness": staleness,
    "uniform": uniform,
}.items():
    sys.modules[f"{__name__}.{_name}"] = _module
    globals()[_name] = _module

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
    "VisibleRows",
    "Window",
    "as_sampler",
]
