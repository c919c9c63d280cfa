"""Holding Ctrl-C back across the few statements that publish a change in memory.

An exception between two assignments of a multi-part state change would leave it half
done.  Everything that can fail (conversions, allocations, copies) runs before such a
step; what remains are plain assignments, and the one exception that can still arrive
between them is the KeyboardInterrupt of a SIGINT (a notebook user pressing Ctrl-C, who
then goes on using the buffer).  :func:`deferred_interrupts` delivers that one after the
step instead of in the middle of it.
"""

from __future__ import annotations

from ..threads import deferred_interrupts

__all__ = ["deferred_interrupts"]
