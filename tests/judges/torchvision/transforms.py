"""``torchvision.transforms.ToTensor`` as LeRobot 0.4.4 uses it (PIL image or HWC uint8
array -> float32 [C, H, W] in [0, 1])."""

from __future__ import annotations

import numpy as np
import torch


class ToTensor:
    def __call__(self, pic) -> torch.Tensor:
        arr = np.asarray(pic)
        if arr.ndim == 2:
            arr = arr[:, :, None]
        t = torch.from_numpy(np.array(arr, copy=True)).permute(2, 0, 1).contiguous()
        return t.float().div(255) if t.dtype == torch.uint8 else t.float()


class Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


__all__ = ["ToTensor", "Compose"]
