"""The exceptions zreplay raises, and :func:`warn_caller` for its warnings.

Each subclasses the builtin that callers already catch, so ``except ValueError`` keeps
working for bad input and ``except RuntimeError`` for state problems, and each message
says what to do next.
"""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the first frame outside zreplay: the user's line
    that called into it, however deep the warning is found."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


class ZReplayError(Exception):
    """Base class of every zreplay error."""


class SchemaError(ZReplayError, ValueError):
    """A trajectory does not match the buffer's schema (keys, dtypes, shapes, T/B)."""


class KeyNameError(SchemaError):
    """A key name is not safe as a Zarr path component."""


class EmptyTrajectoryError(SchemaError):
    """A trajectory with no rows (T == 0 or B == 0) was added."""


class StackError(SchemaError, RuntimeError):
    """A list of items given to ``ZarrStorage`` does not stack into one batch (also a
    ``RuntimeError``, which TorchRL's storages raise there)."""


class CapacityError(ZReplayError, ValueError):
    """A single trajectory is larger than the buffer's capacity (or than the RAM the
    writer needs to stage it)."""


class HandoffError(ZReplayError, TypeError):
    """A buffer cannot cross a process boundary as it is (pickling, a Ray task, a spawned
    DataLoader worker): a private temporary store, or a TorchRL storage.  The message
    says what to pass instead."""


class PickleRefusedError(ZReplayError, ValueError):
    """Loading an arbitrary pickle was refused; pass ``allow_pickle=True`` if the source is trusted."""


class FormatError(ZReplayError, ValueError):
    """A path is not a zreplay buffer (or an RLinf directory), or its format version is unsupported."""


class DestinationError(ZReplayError, ValueError):
    """A checkpoint, export or dump target (or a load source) is the buffer itself, lies
    inside it or holds it, or is a file or a non-empty directory the operation does not
    replace; nothing was touched."""


class CorruptBufferError(ZReplayError, RuntimeError):
    """A buffer's files are damaged: unreadable commit record, missing or inconsistent index.

    ``finding`` is what is damaged; the message adds ``advice`` (what to do) after it.
    :func:`zreplay.verify` reports the finding alone: advice such as "run
    zreplay.verify()" is circular in its own report.
    """

    def __init__(self, finding: str, advice: str = "") -> None:
        super().__init__(f"{finding}. {advice}" if advice else finding)
        self.finding = finding


# What a reader without an image codec installs (pyproject.toml's own requirement).
IMAGECODECS_FIX = "pip install 'imagecodecs>=2026.3.6'"


class MissingCodecError(ZReplayError, ImportError):
    """An array's codec cannot run in this Python: ``imagecodecs`` is not installed, or
    its build lacks the format (one without AVIF, say).  The buffer is not damaged:
    reads raise this (never ``CorruptBufferError``), :func:`zreplay.verify` lists what it
    could not check, and nothing is written.  ``codec`` is the codec's name in
    ``zarr.json`` (``"zreplay.avif"``), ``where`` the array."""

    def __init__(self, codec: str, reason: str, where: str = ""):
        head = f"{where}: " if where else ""
        super().__init__(
            f"{head}codec {codec!r} cannot run in this Python ({reason}); the buffer is not "
            f"damaged. Install a build that has it: {IMAGECODECS_FIX}"
        )
        self.codec, self.reason, self.where = codec, reason, where

    def __reduce__(self):
        return type(self), (self.codec, self.reason, self.where)


class WriterLockedError(ZReplayError, RuntimeError):
    """Another live process holds the writer lock of this segment."""


class BufferClosedError(ZReplayError, RuntimeError):
    """The buffer was closed; reopen it to use it again."""


class EmptyBufferError(ZReplayError, RuntimeError):
    """Sampling was requested from a buffer (or window) holding no transitions."""


class StaleViewError(ZReplayError, RuntimeError):
    """A read-only view was asked for positions (``view[i]``, ``rows``, ``trajectory``,
    ``episode``, ``clips``) of its snapshot whose rows a writer has since removed (a
    ``clear()``, eviction, a loaded checkpoint, the buffer made again): a view is a
    snapshot until ``refresh()``, and those positions may name other rows after it.
    Call ``refresh()`` and index again."""


class WriteFailedError(ZReplayError, RuntimeError):
    """A write to the store failed (full disk, permissions); the previous commit is intact.

    Raised by ``flush()`` and by the first ``add`` after a background commit failed (that
    add adds nothing); ``flush()`` and later adds retry the commit.  The cause (an
    ``OSError``, or TensorStore's error naming the file) is ``__cause__``."""


class ReadOnlyError(ZReplayError, RuntimeError):
    """A write was attempted through a read-only view."""


class SealedSegmentError(ReadOnlyError):
    """A writer was opened on a sealed segment (an imported dataset's offline part, or
    one ``zreplay.seal`` sealed): it is never written again.  Write under another
    ``writer_id``; its writer samples the sealed rows beside its own."""


class AppendOnlyError(ZReplayError, NotImplementedError):
    """A write that is not an append (``zreplay.torchrl.ZarrStorage`` never overwrites a
    row in place: ``storage[idx] = value``, writes through a view, non-sequential writers)."""


class DeviceUnavailableError(ZReplayError, RuntimeError):
    """A batch was asked for on a device this process cannot use (``device="cuda"``
    without a CUDA device or a CUDA build of torch)."""


class MainGuardError(ZReplayError, RuntimeError):
    """A process that multiprocessing is still starting (a ``spawn``/``forkserver``
    DataLoader worker importing the parent's script) opened a buffer for writing: the
    script's top level ran again because it lacks ``if __name__ == "__main__":``."""


class NoSuchBucketError(ZReplayError, OSError):
    """An ``s3://`` URL names a bucket that does not exist (zreplay never creates one).
    Not a ``FileNotFoundError``: code that takes a missing object for "not written yet"
    must not take a missing bucket so."""

    def __init__(self, bucket: str):
        super().__init__(
            f"no such bucket {bucket!r}: create it first (zreplay creates keys in an "
            "existing bucket, never the bucket itself), or check the bucket name and endpoint"
        )
        self.bucket = bucket

    def __reduce__(self):
        return type(self), (self.bucket,)


class RateLimitTimeout(ZReplayError, TimeoutError):
    """A rate-limited ``sample`` or ``add`` waited longer than its limiter's ``timeout_s``
    (Reverb's ``DeadlineExceeded``); the message says what it waited for.  Nothing was
    sampled or added."""
