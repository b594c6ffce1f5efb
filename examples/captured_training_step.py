"""Train the demo GPT with its whole step captured once and replayed, as with CUDA graphs.

    python examples/captured_training_step.py            # the tpu device
    python examples/captured_training_step.py --tiny     # the smoke test's size
    python examples/captured_training_step.py --device cuda   # the same code with torch.cuda.graph

The step (forward, backward, AdamW with capturable=True) runs as usual for the warm-up steps, which
create the optimizer's state, then is captured with ``torch.tpu.graph`` (``torch.cuda.graph`` on a
GPU) and replayed: each new batch is copied into the captured input tensors and ``replay()`` runs
the step as one program, with none of its Python. The same model and batches are also trained with
the plain loop: the script prints both speeds and the largest difference between their losses.
"""

from __future__ import annotations

import argparse
import time

import torch

from torchtpu.examples.gpt import GPT, GPTConfig, make_batch


def train(cfg: GPTConfig, device: str, batches: list, captured: bool, warmup: int) -> tuple[list[float], float]:
    """The losses of training on ``batches``, and the steps per second after the warm-up."""
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, capturable=captured)
    static_x, static_y = (t.to(device) for t in batches[0])
    losses: list[torch.Tensor] = []

    def step() -> torch.Tensor:
        loss = model.loss(static_x, static_y)
        loss.backward()
        opt.step()
        return loss

    accel = torch.get_device_module(device)
    graph = None
    for i, (x, y) in enumerate(batches):
        if i == warmup:
            if captured:  # capture (nothing runs; the program compiles) before the clock starts, as
                graph = accel.TPUGraph() if device == "tpu" else accel.CUDAGraph()  # the plain loop's
                with accel.graph(graph):  # programs compiled in its warm-up
                    static_loss = step()
            accel.synchronize()
            start = time.perf_counter()
        static_x.copy_(x)
        static_y.copy_(y)
        if not captured or i < warmup:
            losses.append(step().detach().clone())
            opt.zero_grad(set_to_none=True)
            continue
        graph.replay()
        losses.append(static_loss.detach().clone())
    accel.synchronize()
    steps_per_s = (len(batches) - warmup) / (time.perf_counter() - start)
    return [float(v) for v in losses], steps_per_s


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="tpu")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tiny", action="store_true", help="a 1-layer model, few steps (the smoke test)")
    args = p.parse_args(argv)
    cfg = GPTConfig(layers=1, d_model=32, seq=16, vocab=64) if args.tiny else GPTConfig()
    steps = 8 if args.tiny else args.steps
    data = torch.Generator().manual_seed(1)
    batches = [make_batch(cfg, args.batch, data) for _ in range(steps)]
    plain, plain_rate = train(cfg, args.device, batches, captured=False, warmup=args.warmup)
    replayed, replay_rate = train(cfg, args.device, batches, captured=True, warmup=args.warmup)
    diff = max(abs(a - b) for a, b in zip(plain, replayed))
    print(f"{args.device}: plain loop {plain_rate:.1f} steps/s, captured and replayed {replay_rate:.1f} steps/s "
          f"({replay_rate / plain_rate:.2f}x); losses {plain[0]:.4f} -> {plain[-1]:.4f}, largest difference "
          f"between the two {diff:.2e}")
    return {"plain_steps_per_s": plain_rate, "replay_steps_per_s": replay_rate, "loss_diff": diff,
            "losses": replayed}


if __name__ == "__main__":
    main()
