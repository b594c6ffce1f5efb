"""Where a float32 function on tpu is farthest from CPU: the worst inputs, to study off the TPU host.

    python3 tools/tpu_suite/probe_unary.py cosh sinh asinh ...   # torch function names

For each function, over the grid ``tests/test_tpu_target.py`` uses for these functions, prints the
largest relative error against the CPU's float32 result and against float64, with the five worst
inputs and their values. Non-finite CPU results must match exactly (reported, not compared).
"""

from __future__ import annotations

import sys

import torch

import torchtpu  # noqa: F401  (registers the device)


def grid() -> torch.Tensor:
    x = torch.cat([torch.linspace(-12, 12, 4001), torch.logspace(-30, 0, 500), -torch.logspace(-30, 0, 500),
                   torch.linspace(80, 89.4, 2001), -torch.linspace(80, 89.4, 2001),
                   torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e30, -1e30, 89.3, -89.3,
                                 89.5, 1e19, 3e38])])
    return x


def probe(name: str) -> None:
    fn = getattr(torch, name)
    x = grid()
    if name in ("atanh", "erfinv"):
        x = torch.cat([torch.rand(2000, generator=torch.Generator().manual_seed(0)) * 1.98 - 0.99,
                       torch.tensor([1.0, -1.0, 0.0, -0.0, 0.9999999, 1e-30])])
    elif name == "acosh":
        x = x.abs() + 1.0
    ref, ref64 = fn(x), fn(x.double())
    got = fn(x.to("tpu")).cpu()
    fin = torch.isfinite(ref) & ~((ref.abs() < torch.finfo(torch.float32).tiny) & (ref != 0))  # not subnormals
    same_special = torch.equal(torch.isnan(got), torch.isnan(ref)) and torch.equal(got[~fin & ~ref.isnan()],
                                                                                  ref[~fin & ~ref.isnan()])
    scale = ref.double().abs().clamp_min(1e-38)
    err_cpu = torch.where(fin, (got.double() - ref.double()).abs() / scale, torch.zeros_like(scale))
    err_64 = torch.where(fin, (got.double() - ref64).abs() / ref64.abs().clamp_min(1e-38), torch.zeros_like(scale))
    eps = torch.finfo(torch.float32).eps
    print(f"{name}: max error vs CPU f32 {err_cpu.max().item() / eps:.2f} eps, vs f64 {err_64.max().item() / eps:.2f}"
          f" eps (CPU itself {((ref.double() - ref64).abs() / ref64.abs().clamp_min(1e-38))[fin].max().item() / eps:.2f}"
          f" eps); special values same: {same_special}", flush=True)
    if not same_special:
        odd = (torch.isnan(got) != torch.isnan(ref)) | (~torch.isfinite(ref) & ~ref.isnan() & (got != ref))
        print(f"    special values differ at x = {x[odd][:6].tolist()}: tpu {got[odd][:6].tolist()}", flush=True)
    for i in err_cpu.argsort(descending=True)[:5].tolist():
        print(f"    x={x[i].item()!r}: tpu {got[i].item()!r} cpu {ref[i].item()!r} f64 {ref64[i].item()!r} "
              f"({err_cpu[i].item() / eps:.2f} eps)", flush=True)


if __name__ == "__main__":
    for fn_name in sys.argv[1:]:
        probe(fn_name)
