"""A fused RMSNorm written in Pallas, used as a torch op in a Llama-style block on ``tpu``.

    python examples/kernels/rmsnorm_llama.py [--tiny] [--steps N]

The kernel reads each row once, computing its mean square and the normalized, scaled row in one
pass (PyTorch's own RMSNorm is a few ops: a square, a mean, an rsqrt, two products). It becomes an
op with ``torchtpu.kernels.custom_jax_kernel``: Pallas/Mosaic on a TPU, Pallas's interpret mode on
the CPU emulator. Its backward is a JAX function too (Pallas calls have no automatic derivative).
The block with the kernel is checked against the same block with PyTorch's ``F.rms_norm`` on the
CPU (output and every gradient), then trained a few steps, printing steps/s.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

EPS = 1e-6


def make_rms_norm(interpret: bool):
    """The kernel as a torch op: ``rms_norm(x2d, weight)`` on [rows, d] and [d] tensors."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from torchtpu.kernels import custom_jax_kernel

    def body(x_ref, w_ref, o_ref):
        x = x_ref[...].astype(jnp.float32)
        inv = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)
        o_ref[...] = (x * inv * w_ref[...].astype(jnp.float32)).astype(o_ref.dtype)

    def backward(x, w, g):
        # d/dx of x * inv * w, inv = (mean(x^2) + eps)^-1/2; d/dw = sum over rows of g * x * inv
        x32, g32, w32 = x.astype(jnp.float32), g.astype(jnp.float32), w.astype(jnp.float32)
        inv = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + EPS)
        gw = g32 * w32
        dx = inv * gw - x32 * inv**3 * jnp.mean(gw * x32, axis=-1, keepdims=True)
        dw = jnp.sum(g32 * x32 * inv, axis=0)
        return dx.astype(x.dtype), dw.astype(w.dtype)

    @custom_jax_kernel(name="pallas_rms_norm", backward=backward)
    def rms_norm(x, w):
        # one block holds the whole array: fine at these sizes (a large model would tile the rows
        # with a grid and BlockSpecs so each block fits the TPU core's vector memory)
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=interpret)(x, w)

    return rms_norm


class RMSNorm(nn.Module):
    def __init__(self, d: int, kernel=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.kernel = kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is None:
            return F.rms_norm(x, (x.shape[-1],), self.weight, EPS)
        return self.kernel(x.reshape(-1, x.shape[-1]), self.weight).reshape(x.shape)


class LlamaBlock(nn.Module):
    """Pre-norm attention (causal, rotary-free for brevity) and a SwiGLU MLP, RMSNorm before each."""

    def __init__(self, d: int, heads: int, hidden: int, kernel=None) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(d, kernel), RMSNorm(d, kernel)
        self.qkv, self.out = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.gate, self.up, self.down = (nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False),
                                         nn.Linear(hidden, d, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.out(a)
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="small sizes (the CI smoke test)")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args(argv)
    d, heads, hidden, batch, seq = (32, 4, 64, 2, 8) if args.tiny else (256, 8, 688, 8, 128)
    on_emulator = "emulated" in torch.tpu.get_device_name()
    rms_norm = make_rms_norm(interpret=on_emulator)

    torch.manual_seed(0)
    reference = LlamaBlock(d, heads, hidden)  # PyTorch's RMSNorm, on the CPU
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.01 * torch.randn_like(p))  # norm weights other than ones
    block = copy.deepcopy(reference).to("tpu")
    for norm in (block.norm1, block.norm2):
        norm.kernel = rms_norm
    x = torch.randn(batch, seq, d)

    result = {}
    with torch.tpu.precision("highest"):  # float32 products, so the comparison sees the kernel
        want = reference(x)
        want.square().mean().backward()
        got = block(x.to("tpu"))
        got.square().mean().backward()
        result["output_max_abs_diff"] = float((got.detach().cpu() - want.detach()).abs().max())
        result["grad_max_abs_diff"] = max(float((p.grad.cpu() - r.grad).abs().max())
                                          for p, r in zip(block.parameters(), reference.parameters()))
    print(f"block with the Pallas RMSNorm vs PyTorch's on CPU: output {result['output_max_abs_diff']:.2e}, "
          f"gradients {result['grad_max_abs_diff']:.2e}")

    opt = torch.optim.AdamW(block.parameters(), lr=1e-3)
    target = torch.randn(batch, seq, d, device="tpu")
    xs = x.to("tpu")
    losses = []
    start = None
    for step in range(args.steps):
        if step == 1:
            torch.tpu.synchronize()
            start = time.perf_counter()  # after the first step's compiles
        loss = F.mse_loss(block(xs), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    steps_s = (args.steps - 1) / (time.perf_counter() - start) if start else 0.0
    print(f"{args.steps} AdamW steps: loss {losses[0]:.4f} -> {losses[-1]:.4f}, {steps_s:.1f} steps/s")
    result.update(losses=losses, steps_per_second=steps_s)
    return result


if __name__ == "__main__":
    main()
