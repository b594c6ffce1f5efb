"""Matrix decompositions on the default tpu device against PyTorch's CPU (not a test).

    .venv/bin/python bench/linalg.py [--sizes 64,256,512] [--repeat 5]

Per op and size: best-of-``repeat`` milliseconds on CPU and on tpu (warm: compiled
before timing, each tpu call synchronized), and their ratio, in one run. On the
CPU-emulated device eigh and svd run LAPACK through torchtpu's host kernels;
``TORCH_TPU_CPU_KERNELS=0`` shows the portable Jacobi lowerings a TPU runs instead
(seconds per call at 512).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch


def _best_ms(f: Callable[[], object], repeat: int, sync: bool) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = f()  # kept: synchronize() waits on the launches whose outputs are still alive
        if sync:
            torch.tpu.synchronize()
        best = min(best, time.perf_counter() - t0)
        del result
    return best * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="64,256,512")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    ops: dict[str, Callable[[torch.Tensor], object]] = {
        "eigh": torch.linalg.eigh,
        "svd": lambda x: torch.linalg.svd(x, full_matrices=False),
        "svdvals": torch.linalg.svdvals,
        "qr": torch.linalg.qr,
        "inv": torch.linalg.inv,
        "cholesky": torch.linalg.cholesky,
    }
    print(f"{'op':10s} {'n':>5s} {'cpu ms':>9s} {'tpu ms':>9s} {'tpu/cpu':>8s}")
    for n in (int(s) for s in args.sizes.split(",")):
        torch.manual_seed(0)
        a = torch.randn(n, n)
        spd = a @ a.T + n * torch.eye(n)  # symmetric positive definite: valid for every op
        dev = spd.to("tpu")
        for name, op in ops.items():
            op(dev)  # compile
            torch.tpu.synchronize()
            cpu = _best_ms(lambda op=op, x=spd: op(x), args.repeat, sync=False)
            tpu = _best_ms(lambda op=op, x=dev: op(x), args.repeat, sync=True)
            print(f"{name:10s} {n:5d} {cpu:9.2f} {tpu:9.2f} {tpu / cpu:8.2f}")


if __name__ == "__main__":
    main()
