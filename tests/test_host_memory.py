"""On the CPU plugin, freed device memory stays pooled in the process (runtime.host_memory)."""

import ctypes
import ctypes.util

import pytest
import torch
from helpers import run_python

from torchtpu.runtime import host_memory

_libc = ctypes.CDLL(ctypes.util.find_library("c"))
pytestmark = [pytest.mark.skipif(not hasattr(_libc, "mallinfo2"), reason="needs glibc >= 2.33 (mallinfo2)"),
              pytest.mark.emulator_only("device memory is malloc memory only on the CPU plugin")]

# Counts the blocks glibc serves with their own mmap (each costs an munmap when freed and
# zero-filled page faults when first written) while a 24 MB device buffer is computed.
_COUNT_MMAPPED = """
import ctypes, ctypes.util, torch, torchtpu
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = Info
torch.ones(4, device="tpu").cpu()
before = libc.mallinfo2().hblks
y = torch.ones(6 << 20, device="tpu") + 1
torch.tpu.synchronize()
print("mmapped", libc.mallinfo2().hblks - before)
"""


def _mmapped_blocks(env: dict) -> int:
    r = run_python(_COUNT_MMAPPED, env)
    assert r.returncode == 0, r.stderr
    return int(r.stdout.split("mmapped")[1])


def test_device_buffers_come_from_the_pooled_heap():
    assert _mmapped_blocks({}) == 0


def test_the_pool_can_be_turned_off():
    # Also shows the check above can fail: glibc's default mmaps a 24 MB block.
    assert _mmapped_blocks({"TORCH_TPU_HOST_MEMORY_POOL": "0"}) >= 1


def test_empty_cache_returns_pooled_memory():
    x = torch.ones(1 << 20, device="tpu") * 2
    assert host_memory.is_pooled()
    del x
    torch.tpu.synchronize()
    torch.tpu.empty_cache()  # malloc_trim: must not disturb live buffers
    assert torch.ones(3, device="tpu").sum().item() == 3
