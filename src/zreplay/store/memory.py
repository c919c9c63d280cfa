"""How much memory this process may have: the bound every read, add and copy that sizes
an allocation from what a buffer's files say is checked against (a buffer may come from
a stranger: crafted counts must fail clearly, not by the kernel's OOM killer)."""

from __future__ import annotations

import os

# cgroup v2 and v1 memory limits of this process's container ("max" or huge: none).
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def physical_memory() -> int:
    """Bytes of memory this process may have: the machine's RAM, or its container's
    (cgroup) limit if lower (a bound on what any read or add may allocate: a buffer's
    crafted counts must fail clearly, not by the kernel's OOM killer)."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 1 << 40
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as f:
                text = f.read(64).strip()
        except OSError:
            continue
        if text.isdigit():
            ram = min(ram, int(text))
    return ram
