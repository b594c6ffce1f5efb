"""TORCH_TPU_XLA_THREAD_NICE lowers the priority of the CPU plugin's compute threads (runtime.host_threads)."""

import os
import sys

import pytest
from helpers import run_python

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names and priorities: Linux"),
              pytest.mark.emulator_only("XLA:CPU's compute threads")]

# Prints the nice value of each XLA pool thread and of the main thread after one op.
_NICE_OF_THREADS = """
import os, torch
from torchtpu.runtime import host_threads
(torch.ones(4, device="tpu") + 1).cpu()
pool = host_threads.thread_ids_named(host_threads.XLA_POOL_THREAD_NAME)
print("pool", sorted({os.getpriority(os.PRIO_PROCESS, t) for t in pool}), len(pool))
print("main", os.getpriority(os.PRIO_PROCESS, os.getpid()))
"""


def _nice_values(env: dict) -> tuple[str, str]:
    r = run_python(_NICE_OF_THREADS, env)
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.startswith(("pool", "main")))
    return lines["pool"], lines["main"]


_BASE = os.getpriority(os.PRIO_PROCESS, 0)  # what the child process inherits


@pytest.mark.skipif(_BASE >= 19, reason="the tests run at the lowest priority already")
def test_xla_pool_threads_get_the_requested_nice_value_and_the_host_thread_keeps_its_own():
    target = max(_BASE + 1, 7)
    pool, main = _nice_values({"TORCH_TPU_XLA_THREAD_NICE": str(target)})
    assert pool.startswith(f"[{target}] ") and int(pool.split()[-1]) >= 1
    assert main == str(_BASE)


def test_by_default_the_pool_keeps_the_process_priority():
    pool, main = _nice_values({})
    assert pool.startswith(f"[{_BASE}] ") and main == str(_BASE)
