"""Numerical accuracy of the tpu device against the CPU: matrix-product precision modes (and
their speed), f32 elementwise functions (values and gradients), float64 and int64.

    python bench/tpu_accuracy.py [--mm-size N]   # on the emulator, or on a TPU host (docs/tpu.md)

Prints one line per measurement. Errors are maxima over the samples: ``abs`` absolute,
``rel`` relative to |CPU value|, ``mixed`` relative to max(|CPU value|, 1) (what rtol/atol
comparisons see).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def matmul_precision() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    ref = a.double() @ b.double()
    x, w = torch.randn(2, 4, 16, 16), torch.randn(8, 4, 3, 3)
    conv_ref = F.conv2d(x.double(), w.double())
    for p in ("medium", "high", "highest"):
        with torch.tpu.precision(p):
            mm = (a.to("tpu") @ b.to("tpu")).cpu().double()
            conv = F.conv2d(x.to("tpu"), w.to("tpu")).cpu().double()
        print(f"precision {p:8s} mm maxrel={float((mm - ref).abs().max() / ref.abs().max()):.3g} "
              f"conv maxrel={float((conv - conv_ref).abs().max() / conv_ref.abs().max()):.3g}", flush=True)


def matmul_speed(n: int) -> None:
    """Each precision's float32 product rate: ``n``x``n`` @ ``n``x``n`` chained 20 times per
    timing (one read at the end), best of 5; TFLOP/s and the ratio to ``medium``."""
    import time

    a = torch.randn(n, n, device="tpu") / n**0.5
    b = torch.randn(n, n, device="tpu")
    rates = {}
    for p in ("medium", "high", "highest"):
        with torch.tpu.precision(p):
            c = a
            for _ in range(3):
                c = c @ b
            c.cpu()
            best = float("inf")
            for _ in range(5):
                start = time.perf_counter()
                c = a
                for _ in range(20):
                    c = c @ b
                c.sum().item()
                best = min(best, (time.perf_counter() - start) / 20)
        rates[p] = 2 * n**3 / best / 1e12
        print(f"precision {p:8s} mm {n}x{n}: {best * 1e3:.3f} ms, {rates[p]:.2f} TFLOP/s, "
              f"{rates[p] / rates['medium']:.2f}x medium's rate", flush=True)


def elementwise() -> None:
    torch.manual_seed(0)
    x = torch.cat([torch.linspace(-12, 12, 40001), torch.logspace(-8, 0, 5000), -torch.logspace(-8, 0, 5000),
                   torch.randn(20000) * 3])
    pos = x.abs() + 1e-6
    unit = torch.rand(20000) * 1.98 - 0.99
    cases = [
        ("exp", torch.exp, x), ("expm1", torch.expm1, x), ("log", torch.log, pos), ("log1p", torch.log1p, pos),
        ("log2", torch.log2, pos), ("sin", torch.sin, x), ("cos", torch.cos, x), ("tan", torch.tan, unit),
        ("tanh", torch.tanh, x), ("sigmoid", torch.sigmoid, x), ("erf", torch.erf, x), ("erfc", torch.erfc, x),
        ("erfinv", torch.erfinv, unit), ("atan", torch.atan, x), ("asin", torch.asin, unit),
        ("acos", torch.acos, unit), ("sinh", torch.sinh, x), ("cosh", torch.cosh, x), ("asinh", torch.asinh, x),
        ("acosh", torch.acosh, x.abs() + 1.0), ("atanh", torch.atanh, unit), ("sqrt", torch.sqrt, pos),
        ("rsqrt", torch.rsqrt, pos), ("lgamma", torch.lgamma, pos), ("digamma", torch.digamma, pos),
        ("gelu", F.gelu, x), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"), x), ("silu", F.silu, x),
        ("softplus", F.softplus, x), ("pow2.5", lambda t: t.pow(2.5), pos), ("logsigmoid", F.logsigmoid, x),
        ("mish", F.mish, x), ("elu", F.elu, x),
    ]
    for name, fn, v in cases:
        ref = fn(v).double()
        got = fn(v.to("tpu")).cpu().double()
        fin = torch.isfinite(ref)
        d = (got - ref).abs()[fin]
        mag = ref.abs()[fin]
        cpu_in = v.clone().requires_grad_(True)
        fn(cpu_in).sum().backward()
        tpu_in = v.to("tpu").requires_grad_(True)
        fn(tpu_in).sum().backward()
        g_ref = cpu_in.grad.double()
        g_fin = torch.isfinite(g_ref)
        g_mixed = ((tpu_in.grad.cpu().double() - g_ref).abs()[g_fin] / g_ref.abs()[g_fin].clamp_min(1.0)).max()
        print(f"f32 {name:10s} abs={d.max().item():.3g} rel={(d / mag.clamp_min(1e-30)).max().item():.3g} "
              f"mixed={(d / mag.clamp_min(1.0)).max().item():.3g} grad_mixed={g_mixed.item():.3g} "
              f"nonfinite_mismatch={int((torch.isfinite(got) != fin).sum())}", flush=True)


def wide_types() -> None:
    torch.manual_seed(0)
    d = torch.randn(20000, dtype=torch.float64)
    square = d[:10000].reshape(100, 100)
    # (a float64 cumsum is left out: on a v5e it did not finish compiling within a minute)
    for name, fn in (("transfer", lambda t: t.clone()), ("add", lambda t: t + 0.1), ("mul", lambda t: t * 1.1),
                     ("div", lambda t: t / 3), ("exp", torch.exp), ("log", lambda t: t.abs().log()),
                     ("sqrt", lambda t: t.abs().sqrt()), ("sin", torch.sin), ("sum", lambda t: t.sum())):
        ref = fn(d)
        got = fn(d.to("tpu")).cpu()
        rel = ((got - ref).abs() / ref.abs().clamp_min(1e-300)).max().item()
        print(f"f64 {name:8s} maxrel={rel:.3g}", flush=True)
    got = (square.to("tpu") @ square.to("tpu")).cpu()
    print(f"f64 mm       maxrel={((got - square @ square).abs().max() / (square @ square).abs().max()).item():.3g}")
    for v in (1e38, 1e39, 1e300, 1e-38, 1e-39, 1e-300):
        t = torch.tensor([v], dtype=torch.float64)
        print(f"f64 value {v!r}: transfer -> {t.to('tpu').cpu().item()!r}, *1 -> {(t.to('tpu') * 1).cpu().item()!r}")
    # what an overflow and IEEE's specials become in the emulated float64 (inf, or NaN from the
    # pair's correction term), and f32 pow at infinities (computed through float64 on a TPU)
    inf = float("inf")
    for name, fn, v in (("1e30 * 1e10", lambda t: t * 1e10, 1e30), ("exp(100)", torch.exp, 100.0),
                        ("exp(89)", torch.exp, 89.0), ("inf * 2", lambda t: t * 2, inf), ("inf + 1", lambda t: t + 1, inf),
                        ("1 / 0", lambda t: 1 / t, 0.0), ("sqrt(inf)", torch.sqrt, inf), ("-inf * 3", lambda t: t * 3, -inf),
                        ("(3e38)^2", lambda t: t * t, 3e38), ("inf - inf", lambda t: t - t, inf)):
        t = torch.tensor([v], dtype=torch.float64)
        print(f"f64 special {name:12s} cpu={fn(t).item()!r} tpu={fn(t.to('tpu')).cpu().item()!r}", flush=True)
    x = torch.tensor([inf, -inf, 0.0, -0.0, 3e38, 1e-30])
    print(f"f32 pow(x, 1.5) x={x.tolist()} cpu={x.pow(1.5).tolist()} tpu={x.to('tpu').pow(1.5).cpu().tolist()}")
    i = torch.tensor([2**62 + 12345, -(2**63), 2**63 - 1, -7])
    t = i.to("tpu")
    exact = (torch.equal(t.cpu(), i) and torch.equal((t + 0).cpu(), i) and torch.equal((t // 3).cpu(), i // 3)
             and torch.equal((t * 1).cpu(), i))
    print(f"int64 near 2**63 exact: {exact}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mm-size", type=int, default=4096, help="side of the timed products (default 4096)")
    opts = parser.parse_args()
    print(f"device: {torch.tpu.get_device_name()}")
    matmul_precision()
    matmul_speed(opts.mm_size)
    elementwise()
    wide_types()
