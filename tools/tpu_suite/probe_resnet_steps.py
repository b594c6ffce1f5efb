"""Why examples/resnet_amp_channels_last.py ends at a loss of 0.920 on a TPU v5e and 0.600 on the
emulator (round 23): a wrong gradient somewhere, or bf16 rounding compounded over 30 steps?

    python3 tools/tpu_suite/probe_resnet_steps.py [--tiny] [--steps 30] [--skip-run]

1. One training step of the example's net from the same weights and batch on ``tpu`` and on the CPU,
   in three settings: the example's (bf16 autocast, channels-last), float32 channels-last at
   ``highest`` precision, and bf16 autocast in the default layout. Per parameter, the gradient's
   relative error (``||g - g64|| / ||g64||``) against a float64 CPU step, for ``tpu`` and for the
   CPU's own run in that setting; the worst few are printed. A ``tpu`` gradient much further from
   float64 than the CPU's, in float32 above all, is a fault to find; errors of the same size are
   rounding.
2. The example's loss per step on ``tpu`` and on the CPU (its ``main()``, same seeds), and the first
   step where they part by more than 0.05.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "resnet_amp_channels_last.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("resnet_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def grads(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, device: str,
          autocast: bool, channels_last: bool) -> tuple[float, dict[str, torch.Tensor]]:
    """One forward and backward of a copy of ``model`` on ``device``: the loss and each gradient (CPU, float64)."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    m = copy.deepcopy(model).to(device, memory_format=fmt)
    x = images.to(device).to(memory_format=fmt)
    ctx = torch.autocast(device, dtype=torch.bfloat16) if autocast else torch.autocast(device, enabled=False)
    with ctx:
        loss = F.cross_entropy(m(x), labels.to(device))
    loss.backward()
    return loss.item(), {n: p.grad.detach().to("cpu", torch.float64) for n, p in m.named_parameters()}


SETTINGS = [("bf16 autocast, channels-last (the example)", True, True),
            ("float32 channels-last, highest", False, True),
            ("bf16 autocast, default layout", True, False)]


def compare_one_step(ex: Any, tiny: bool, settings: list[tuple[str, bool, bool]] = SETTINGS) -> None:
    size, widths, blocks = (16, (8, 16), 1) if tiny else (32, (32, 64, 128, 256), 2)
    torch.manual_seed(0)
    model = ex.ResNet(widths, blocks, 10)
    data = ex.SyntheticImages(32, size, 10)
    images = torch.stack([data[i][0] for i in range(32)])
    labels = torch.stack([data[i][1] for i in range(32)])
    loss64, ref = grads(model.double(), images.double(), labels, "cpu", False, False)
    model = model.float()
    for title, autocast, channels_last in settings:
        with torch.tpu.precision("highest" if not autocast else "medium"):
            loss_t, g_t = grads(model, images, labels, "tpu", autocast, channels_last)
        torch.set_float32_matmul_precision("highest")
        loss_c, g_c = grads(model, images, labels, "cpu", autocast, channels_last)
        rows = []
        for name, g64 in ref.items():
            scale = g64.norm().item() or 1.0
            rows.append((name, (g_t[name] - g64).norm().item() / scale, (g_c[name] - g64).norm().item() / scale))
        worst = sorted(rows, key=lambda r: -r[1])[:6]
        ratio = max(r[1] / max(r[2], 1e-12) for r in rows)
        print(f"== {title}: loss tpu {loss_t:.6f} cpu {loss_c:.6f} float64 {loss64:.6f}; worst tpu/cpu error "
              f"ratio over {len(rows)} parameters {ratio:.2f}", flush=True)
        for name, e_t, e_c in worst:
            print(f"   {name:32s} tpu {e_t:.2e}  cpu {e_c:.2e}")


def compare_runs(ex: Any, tiny: bool, steps: int) -> None:
    argv = ["--steps", str(steps), "--workers", "0"] + (["--tiny"] if tiny else [])
    tpu = ex.main(["--device", "tpu", *argv])["losses"]
    cpu = ex.main(["--device", "cpu", *argv])["losses"]
    parted = next((i for i, (a, b) in enumerate(zip(tpu, cpu, strict=True)) if abs(a - b) > 0.05), None)
    print(f"== the example's losses, {steps} steps: first step parting by > 0.05: {parted}")
    for i, (a, b) in enumerate(zip(tpu, cpu, strict=True)):
        print(f"   step {i:2d}  tpu {a:.4f}  cpu {b:.4f}  diff {a - b:+.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="the example's --tiny net (a smoke run)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip-run", action="store_true", help="the one-step comparison only")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    ex = load_example()
    compare_one_step(ex, args.tiny)
    if not args.skip_run:
        compare_runs(ex, args.tiny, args.steps)


if __name__ == "__main__":
    main()
