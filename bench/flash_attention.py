"""Attention forward + backward on ``tpu``: the Pallas flash kernel (at several block sizes) against
the math lowering, at the 100M GPT's shapes by default (not a test).

    python bench/flash_attention.py [--shape 16,12,512,64] [--blocks 128x128,256x256,512x512,512x512x128]
                                    [--dtype float32] [--no-causal] [--iters 10] [--lanes] [--out results.json]

``--lanes``: q, k and v in a transformer's layout ([B, T, H, D] seen as [B, H, T, D], the output
taken back to [B, T, H * D]) for every row, and each block size also through the lane-layout
kernels (flash_attention_lanes.py), which read that layout as it is; the other rows then run with
``TORCH_TPU_FLASH_LANES=0`` (the head-major kernel, with the layout copies around it).

One process, Strict mode, ``torch.compile`` of ``F.scaled_dot_product_attention`` followed by its
backward (one program each way, as in a compiled training step). Per variant: the first call's
seconds (compiles), then the median of ``--iters`` timed calls (each ends in a device sync), and the
largest difference of the output and of dq from the math lowering's. On the CPU emulator the
kernel runs in Pallas' interpret mode (``--small``: tiny shapes), so only a TPU's figures mean speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any


def run_variant(torch: Any, shape: tuple[int, ...], dtype: Any, causal: bool, flash: bool,
                blocks: tuple[int, ...] | None, iters: int, model_layout: bool = False,
                lanes: bool = False) -> dict[str, Any]:
    import torch.nn.functional as F

    from torchtpu import flash_attention

    os.environ["TORCH_TPU_FLASH_ATTENTION"] = "1" if flash else "0"
    os.environ["TORCH_TPU_FLASH_LANES"] = "1" if lanes else "0"
    if blocks:  # query x key (x the dq half's key block, else the key block)
        flash_attention.BLOCK_Q, flash_attention.BLOCK_K = blocks[:2]
        flash_attention.BLOCK_K_DQ = blocks[2] if len(blocks) > 2 else blocks[1]
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    b, h, t, d = shape
    made = (b, t, h, d) if model_layout else shape  # a transformer's q, k, v: [B, T, H, D]
    q, k, v = (torch.randn(made, generator=g).to(dtype).to("tpu").requires_grad_() for _ in range(3))
    grad = torch.randn((b, t, h * d) if model_layout else shape, generator=g).to(dtype).to("tpu")

    @torch.compile(backend="tpu")
    def attend(q, k, v):
        if not model_layout:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        y = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=causal)
        return y.transpose(1, 2).reshape(b, t, h * d)

    def step() -> Any:
        for t in (q, k, v):
            t.grad = None
        out = attend(q, k, v)
        out.backward(grad)
        return out

    t0 = time.perf_counter()
    out = step()
    torch.tpu.synchronize()
    first = time.perf_counter() - t0
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        torch.tpu.synchronize()
        times.append(time.perf_counter() - t0)
    return {"flash": flash, "lanes": lanes, "blocks": list(blocks) if blocks else None, "first_s": round(first, 2),
            "ms": round(statistics.median(times) * 1e3, 3), "out": out.detach().float().cpu(),
            "dq": q.grad.float().cpu()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="16,12,512,64", help="batch,heads,seq,head_dim")
    p.add_argument("--blocks", default="128x128,256x256,512x512,128x512,512x128,512x512x128,512x512x256",
                   help="query x key block edges to try; a third edge is the dq half's key block "
                        "(flash_attention.BLOCK_K_DQ; else the key block)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--small", action="store_true", help="shape 1,2,256,64, blocks 128x128 (CPU emulator)")
    p.add_argument("--lanes", action="store_true", help="a transformer's layout for every row, and the lane-layout "
                                                        "kernels at each block size")
    p.add_argument("--out", help="write the results as JSON here")
    a = p.parse_args()
    import torch

    shape = (1, 2, 256, 64) if a.small else tuple(int(x) for x in a.shape.split(","))
    blocks = [(128, 128)] if a.small else [tuple(int(x) for x in b.split("x")) for b in a.blocks.split(",")]
    dtype = getattr(torch, a.dtype)
    causal = not a.no_causal
    rows = [run_variant(torch, shape, dtype, causal, False, None, a.iters, a.lanes)]
    for b in blocks:
        for lanes in (False, True) if a.lanes else (False,):
            try:
                rows.append(run_variant(torch, shape, dtype, causal, True, b, a.iters, a.lanes, lanes))
            except Exception as e:  # noqa: BLE001  (a block size the kernel refuses: a row, not the end)
                rows.append({"flash": True, "lanes": lanes, "blocks": list(b),
                             "error": f"{type(e).__name__}: {str(e)[:200]}"})
    math = rows[0]
    print(f"attention fwd+bwd, shape {shape}, {a.dtype}, causal={causal}, precision "
          f"{torch.tpu.get_precision()}, device {torch.tpu.get_device_name()}")
    print(f"{'variant':<16}{'ms':>10}{'x math':>9}{'first s':>9}{'|out - math|':>14}{'|dq - math|':>13}")
    for r in rows:
        name = "math" if not r["flash"] else ("lanes " if r["lanes"] else "flash ") + "x".join(map(str, r["blocks"]))
        if "error" in r:
            print(f"{name:<16} {r['error']}")
            continue
        d_out = (r["out"] - math["out"]).abs().max().item()
        d_dq = (r["dq"] - math["dq"]).abs().max().item()
        r.update(max_diff_out=d_out, max_diff_dq=d_dq)
        print(f"{name:<16}{r['ms']:>10.3f}{math['ms'] / r['ms']:>9.2f}{r['first_s']:>9.1f}{d_out:>14.2e}{d_dq:>13.2e}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"shape": shape, "dtype": a.dtype, "causal": causal, "model_layout": a.lanes,
                       "rows": [{k: v for k, v in r.items() if k not in ("out", "dq")} for r in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
