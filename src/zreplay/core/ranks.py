"""Which share of a buffer each rank of a distributed job reads.

RLinf's split: ``n`` trajectories in ``world_size`` contiguous blocks, the first
``n % world_size`` ranks taking one more.  ``load_checkpoint(is_distributed=True)`` and
:func:`zreplay.rank_loader` both use it, so ranks are disjoint and cover everything.
"""

from __future__ import annotations


def rank_block(n: int, rank: int, world: int) -> tuple[int, int]:
    """RLinf's contiguous block ``[start, stop)`` of ``n`` items for ``rank`` of ``world``:
    the first ``n % world`` ranks get one extra.  Blocks are disjoint and cover ``[0, n)``."""
    per, rem = divmod(n, world)
    start = rank * per + min(rank, rem)
    return start, start + per + (1 if rank < rem else 0)


def distributed() -> bool:
    """True inside an initialised ``torch.distributed`` process group."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: what is given, else the ``torch.distributed`` process
    group's when one is initialised, else ``(0, 1)``."""
    if rank is None or world_size is None:
        if distributed():
            import torch.distributed as dist

            rank = dist.get_rank() if rank is None else rank
            world_size = dist.get_world_size() if world_size is None else world_size
        else:
            rank = 0 if rank is None else rank
            world_size = 1 if world_size is None else world_size
    rank, world_size = int(rank), int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, world_size={world_size})")
    return rank, world_size
