"""zreplay inside TorchRL's replay buffers (needs ``torchrl``; tested with 0.14.1).

* :class:`ZarrStorage`: a TorchRL storage persisted as a zreplay buffer, for
  ``TensorDictReplayBuffer(storage=ZarrStorage(max_size, path=...), sampler=...)``.

``import zreplay`` does not import this module (torchrl is optional).
"""

from .api.torchrl_storage import ZarrStorage

__all__ = ["ZarrStorage"]
