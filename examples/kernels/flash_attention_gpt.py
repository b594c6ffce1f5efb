"""The demo GPT with its attention through the Pallas flash-attention kernel, on ``tpu``.

    python examples/kernels/flash_attention_gpt.py [--tiny] [--steps N]

``F.scaled_dot_product_attention`` on tpu tensors takes a Pallas flash-attention kernel (for the
GPT's q, k, v, torchtpu's own on their [B, T, H * D] layout; JAX's for head-major ones) where the
call qualifies (``torchtpu.flash_attention``: key length a multiple of 128, head dim 64
or 128, ...): on a TPU by default (a Mosaic kernel), on the CPU emulator when
``TORCH_TPU_FLASH_ATTENTION=1`` (Pallas' interpret mode: exact and slow), which this script sets
unless the variable is set already. The model code is unchanged: ``torchtpu.examples.gpt`` calls
``F.scaled_dot_product_attention(q, k, v, is_causal=True)``. The script checks that the kernel ran
(``torch.profiler`` sees its op), compares the logits and every gradient with the same model on the
CPU (PyTorch's attention), then trains a few steps, printing steps/s. Needs JAX. The comparison runs
at ``highest`` where the kernel takes float32 operands there (the emulator); on a TPU, where it takes
them at ``medium`` only, it runs at ``medium`` and reports the math lowering's error beside it.
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from collections.abc import Sequence

import torch

# the forward ops of the head-major kernel and of the kernels on the model's [B, T, H * D] layout (the
# GPT's q, k, v take the latter: torchtpu.flash_attention.takes_lanes)
KERNEL_OPS = ("torchtpu_kernels::flash_attention", "torchtpu_kernels::flash_attention_lanes")


def kernel_events(fn) -> int:
    """The profiler's events of a flash kernel's forward op during one call of ``fn`` (at least one
    per attention layer)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key in KERNEL_OPS)


def check_precision() -> str:
    """The precision to check the kernel at: ``highest`` (float32-accurate products) where the kernel
    takes float32 operands there, as on the emulator; on a TPU it takes them at ``medium`` only
    (Mosaic's float32 products are not float32-accurate), so the check runs there."""
    from torchtpu import flash_attention

    q = torch.empty(1, 1, 128, 64, device="tpu")
    with torch.tpu.precision("highest"):
        return "highest" if flash_attention.qualifies(q, q, q, None, 0.0, True) else "medium"


def differences(model: torch.nn.Module, reference: torch.nn.Module, idx: torch.Tensor,
                tgt: torch.Tensor) -> tuple[float, float]:
    """The largest logit and gradient differences of ``model`` on tpu from ``reference`` on the CPU,
    each relative to the reference tensor's largest value."""
    model.zero_grad(set_to_none=True)
    reference.zero_grad(set_to_none=True)
    want = reference(idx)
    reference.loss(idx, tgt).backward()
    got = model(idx.to("tpu"))
    model.loss(idx.to("tpu"), tgt.to("tpu")).backward()
    logits = float((got.detach().cpu() - want.detach()).abs().max()) / float(want.detach().abs().max())
    grads = max(float((p.grad.cpu() - r.grad).abs().max()) / max(float(r.grad.abs().max()), 1e-12)
                for p, r in zip(model.parameters(), reference.parameters()))
    return logits, grads


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="small sizes (the CI smoke test)")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    os.environ.setdefault("TORCH_TPU_FLASH_ATTENTION", "1")
    from torchtpu.examples.gpt import GPT, GPTConfig, make_batch

    # head dim 64 and sequences of 128 keys or more: the shapes the kernel takes
    cfg = (GPTConfig(vocab=64, seq=128, d_model=128, heads=2, layers=1) if args.tiny else
           GPTConfig(vocab=256, seq=512, d_model=256, heads=4, layers=4))
    batch = 2 if args.tiny else 8
    torch.manual_seed(0)
    reference = GPT(cfg)  # on the CPU: PyTorch's own attention
    model = copy.deepcopy(reference).to("tpu")
    idx, tgt = make_batch(cfg, batch, torch.Generator().manual_seed(0))

    result: dict = {"precision": check_precision()}
    with torch.tpu.precision(result["precision"]):
        result["kernel_events_per_forward"] = kernel_events(lambda: model(idx.to("tpu")))
        result["logits_max_rel_diff"], result["grad_max_rel_diff"] = differences(model, reference, idx, tgt)
        if result["precision"] != "highest":  # the error to expect: the math lowering's, at this precision
            chosen, os.environ["TORCH_TPU_FLASH_ATTENTION"] = os.environ["TORCH_TPU_FLASH_ATTENTION"], "0"
            try:
                result["math_logits_max_rel_diff"], result["math_grad_max_rel_diff"] = differences(
                    model, reference, idx, tgt)
            finally:
                os.environ["TORCH_TPU_FLASH_ATTENTION"] = chosen
    print(f"flash kernel op events per forward: {result['kernel_events_per_forward']} ({cfg.layers} layers); "
          f"against PyTorch on the CPU at precision {result['precision']!r}: logits "
          f"{result['logits_max_rel_diff']:.2e}, gradients {result['grad_max_rel_diff']:.2e} (relative to "
          "each tensor's largest value)")
    if "math_logits_max_rel_diff" in result:
        print(f"  the math lowering at {result['precision']!r}: logits {result['math_logits_max_rel_diff']:.2e}, "
              f"gradients {result['math_grad_max_rel_diff']:.2e}")

    model.zero_grad(set_to_none=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = idx.to("tpu"), tgt.to("tpu")
    losses = []
    start = None
    for step in range(args.steps):
        if step == 1:
            torch.tpu.synchronize()
            start = time.perf_counter()  # after the first step's compiles
        loss = model.loss(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    steps_s = (args.steps - 1) / (time.perf_counter() - start) if start else 0.0
    print(f"{args.steps} AdamW steps at seq {cfg.seq}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"{steps_s:.2f} steps/s")
    result.update(losses=losses, steps_per_second=steps_s)
    return result


if __name__ == "__main__":
    main()
