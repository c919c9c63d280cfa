"""``torchvision.io.VideoReader`` as LeRobot 0.4.4 drives it, over PyAV: ``seek(t,
keyframes_only=True)`` goes to the keyframe at or before ``t`` seconds; iterating yields
``{"pts": seconds, "data": uint8 [C, H, W] tensor}`` in decode order from there;
``container`` is the open PyAV container (LeRobot closes it)."""

from __future__ import annotations

import av
import torch


class VideoReader:
    def __init__(self, path: str, stream: str = "video", num_threads: int = 0):
        if stream != "video":
            raise ValueError(f"this stand-in reads the video stream only, not {stream!r}")
        self.container = av.open(str(path))
        self._stream = self.container.streams.video[0]
        self._frames = None

    def seek(self, time_s: float, keyframes_only: bool = False) -> VideoReader:
        # PyAV seeks to the keyframe at or before the target (backward by default).
        target = int(time_s / self._stream.time_base) if self._stream.time_base else 0
        self.container.seek(max(target, 0), stream=self._stream, backward=True, any_frame=False)
        self._frames = None
        return self

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self._frames is None:
            self._frames = self.container.decode(self._stream)
        frame = next(self._frames)
        rgb = frame.to_ndarray(format="rgb24")
        return {
            "pts": float(frame.pts * self._stream.time_base),
            "data": torch.from_numpy(rgb).permute(2, 0, 1).contiguous(),
        }

    def get_metadata(self) -> dict:
        s = self._stream
        return {
            "video": {
                "fps": [float(s.average_rate or 0)],
                "duration": [float(s.duration * s.time_base) if s.duration else 0.0],
            }
        }
