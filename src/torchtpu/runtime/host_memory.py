"""Host memory as device memory: keep freed blocks pooled (XLA:CPU only).

On the CPU plugin every device buffer, program output and XLA temporary is a
``malloc`` block. glibc hands blocks above its mmap threshold (128 KB, rising
with use) straight back to the kernel on ``free`` and trims the heap top, so a
training step that frees and re-allocates its activations pays an ``munmap``
per buffer on the host thread (30 us for 256 KB, 185 us for 4 MB measured
here) and a zero-filled page fault per 4 KB when the next program writes its
outputs. A real device allocator pools its memory instead; this does the same
for glibc: blocks up to 32 MB come from the heap and freed memory is kept for
reuse, until :func:`release_freed_memory` (``torch.tpu.empty_cache()``).

The process's device state turns it on for the CPU plugin unless
``TORCH_TPU_HOST_MEMORY_POOL=0``. Process-wide by nature (``mallopt``), so CPU
tensors in the same process reuse memory the same way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
from typing import Any

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc caps the mmap threshold at 32 MB on 64-bit hosts; larger blocks stay mmapped.
_MMAP_THRESHOLD_BYTES = 32 << 20
# Trim the heap top only when this much is free there.
_TRIM_THRESHOLD_BYTES = 1 << 30

_lock = threading.Lock()
_pooled = False


@functools.cache
def _glibc() -> Any:
    """The C library when it has glibc's mallopt/malloc_trim; elsewhere there is nothing to tune."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "mallopt") or not hasattr(libc, "malloc_trim"):
        return None
    return libc


def pool_freed_memory() -> bool:
    """Make malloc keep freed memory for reuse; False when the C library is not glibc."""
    global _pooled
    with _lock:
        if not _pooled:
            libc = _glibc()
            if libc is None:
                return False
            ok = libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES) == 1
            _pooled = libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES) == 1 and ok
        return _pooled


def is_pooled() -> bool:
    return _pooled


def release_freed_memory() -> None:
    """Return pooled free memory to the operating system (no-op when not pooled)."""
    if _pooled:
        _glibc().malloc_trim(0)


def available_and_total() -> tuple[int, int]:
    """(available, total) bytes of the host's physical memory: Linux's MemAvailable (what can be
    allocated without swapping, page cache included) where readable, else free pages."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = page * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, total
    except OSError:
        pass
    return page * os.sysconf("SC_AVPHYS_PAGES"), total
