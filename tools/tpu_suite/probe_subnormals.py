"""How the device treats subnormal numbers, against CPU: to study off the TPU host (not a test).

    python3 tools/tpu_suite/probe_subnormals.py

TPUs are said to flush float32 subnormals to zero in arithmetic, where CPU keeps them; round
twelve's v5e failed the exact check of ``Builder.rounded_to_bf16`` over random bit patterns, of
which about 0.4% are subnormal and 0.4% NaN. For each case this prints how many results differ
from CPU's bits, split into input classes (normal, subnormal, zero, inf, NaN), and how many of the
differing ones are a zero of the input's sign (a flush), with the first few bit patterns.
"""

from __future__ import annotations

import torch

import torchtpu  # noqa: F401  (registers the device)
from torchtpu import _device_state
from torchtpu.engine import compile_cache
from torchtpu.lowering.builder import Builder


def bit_patterns() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (200000,), generator=g, dtype=torch.int64)
    tiny = torch.randint(1, 0x00800000, (2000,), generator=g, dtype=torch.int64)  # subnormals of both signs
    bits = torch.cat([bits, tiny, tiny | 0x80000000, torch.tensor([0x00008000, 0x00018000, 0x007FFFFF, 0x00800000])])
    return (bits & 0xFFFFFFFF).to(torch.uint32).view(torch.float32)


def classes(x: torch.Tensor) -> dict[str, torch.Tensor]:
    x = x.float()
    sub = (x != 0) & (x.abs() < torch.finfo(torch.float32).tiny)
    return {"normal": torch.isfinite(x) & (x != 0) & ~sub, "subnormal": sub, "zero": x == 0,
            "inf": torch.isinf(x), "nan": torch.isnan(x)}


def report(name: str, x: torch.Tensor, got_bits: torch.Tensor, want_bits: torch.Tensor, got: torch.Tensor) -> None:
    differ = got_bits != want_bits
    nan_out = torch.isnan(got.float())
    differ &= ~(nan_out & torch.isnan(x.float()))  # a NaN for a NaN: payloads may differ
    flushed = differ & (got.float() == 0) & (torch.signbit(got.float()) == torch.signbit(x.float()))
    parts = [f"{k} {int((differ & m).sum())}/{int(m.sum())}" for k, m in classes(x).items()]
    print(f"{name}: differ {int(differ.sum())} of {x.numel()} ({', '.join(parts)}); of them flushed to a signed "
          f"zero {int(flushed.sum())}")
    xi = x.float().view(torch.int32)
    for i in differ.nonzero().flatten()[:5].tolist():
        print(f"    x=0x{int(xi[i]) & 0xFFFFFFFF:08x} got=0x{int(got_bits[i]) & 0xFFFFFFFF:x} "
              f"want=0x{int(want_bits[i]) & 0xFFFFFFFF:x}")


def bits_of(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32).to(torch.int64)


def main() -> None:
    x = bit_patterns()
    dev = x.to("tpu")
    report("f32 upload and download", x, bits_of(dev.cpu()), bits_of(x), dev.cpu())
    for name, fn in (("f32 x * 1", lambda t: t * 1.0), ("f32 x + 0", lambda t: t + 0.0), ("f32 -x", torch.neg),
                     ("f32 abs", torch.abs), ("f32 x.bfloat16()", lambda t: t.bfloat16()),
                     ("f32 x.half()", lambda t: t.half())):
        want, got = fn(x), fn(dev).cpu()
        report(name, x, bits_of(got), bits_of(want), got)
    xb = x.bfloat16()
    for name, fn in (("bf16 upload and download", lambda t: t), ("bf16 x * 1", lambda t: t * 1.0),
                     ("bf16 x.float()", lambda t: t.float())):
        want, got = fn(xb), fn(xb.to("tpu")).cpu()
        report(name, xb, bits_of(got), bits_of(want), got)
    b = Builder()  # the integer rounding that round twelve's exact check failed
    arg = b.arg(tuple(x.shape), torch.float32)
    client = _device_state.client()
    exe = compile_cache.compile(b.module([b.rounded_to_bf16(arg)]), client=client)
    outs, _ = exe.execute([client.buffer_from_host(x.numpy())])
    got = torch.from_numpy(outs[0].to_host().view("uint16").astype("int16")).view(torch.bfloat16)
    report("Builder.rounded_to_bf16", x, bits_of(got), bits_of(x.bfloat16()), got)


if __name__ == "__main__":
    main()
