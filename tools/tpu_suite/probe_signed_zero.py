"""Where a float64 negative zero keeps its sign on the device: to study off the TPU host (not a test).

    python3 tools/tpu_suite/probe_signed_zero.py

Round twenty's v5e gave +0.0 for the emulated float64 power's (-0.0) ** 3, which computes -0.0
in float32 and converts it to float64. This prints signbit for each path a -0.0 can take: the
host transfer both ways, float32 <-> float64 conversions on the device, and float64 arithmetic.
"""

from __future__ import annotations

import torch

import torchtpu  # noqa: F401  (registers the device)

f64, f32 = torch.float64, torch.float32


def main() -> None:
    z64 = torch.tensor([-0.0, 0.0, -1.0], dtype=f64)
    z32 = torch.tensor([-0.0, 0.0, -1.0], dtype=f32)
    d64, d32 = z64.to("tpu"), z32.to("tpu")
    cases = {
        "f64 transfer there and back": d64.cpu(),
        "f32 transfer there and back": d32.cpu(),
        "f32 -> f64 on the device": d32.to(f64).cpu(),
        "f64 -> f32 on the device": d64.to(f32).cpu(),
        "f64 x * 1": (d64 * 1).cpu(),
        "f64 neg(+0.0 -0.0 +1.0)": (-torch.tensor([0.0, -0.0, 1.0], dtype=f64, device="tpu")).cpu(),
        "f64 x ** 3": (d64 ** 3).cpu(),
        "f64 float_power(x, 3)": torch.float_power(d64, 3).cpu(),
    }
    for name, t in cases.items():
        print(f"{name:32s} signbit {t.signbit().tolist()}  values {t.tolist()}")


if __name__ == "__main__":
    main()
