"""A test-only stand-in for the parts of torchvision LeRobot 0.4.4 calls, for the LeRobot
judge environment (.ci/lerobot-env): the registry's torchvision does not import beside the
CPU torch wheel the project pins, and LeRobot's dataset code imports it at module level.

What LeRobot 0.4.4 uses: ``transforms.ToTensor`` (image features), ``set_video_backend``
and ``io.VideoReader`` (its ``video_backend="pyav"`` decode path). The reader is written
over PyAV here; nothing else of torchvision exists.
"""

from . import io, transforms

__version__ = "0.0.0+zreplay-judge"
_backend = "pyav"


def set_video_backend(backend: str) -> None:
    if backend != "pyav":
        raise ValueError(f"this torchvision stand-in decodes with pyav only, not {backend!r}")
    global _backend
    _backend = backend


def get_video_backend() -> str:
    return _backend


__all__ = ["io", "transforms", "set_video_backend", "get_video_backend"]
