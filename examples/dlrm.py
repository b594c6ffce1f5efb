"""DLRM (deep learning recommendation model) on synthetic click logs: EmbeddingBag lookups of
sparse features, an MLP over dense ones, their pairwise dot-product interactions, and a top MLP.

    python examples/dlrm.py                  # 8 sparse features, tables of 100k rows
    python examples/dlrm.py --tiny --steps 4

The click labels follow a hidden rule of the features, so the loss falls below log(2).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn


def mlp(sizes: list[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, dense: int, rows: int, tables: int, dim: int) -> None:
        super().__init__()
        self.bottom = mlp([dense, 64, dim], last_relu=True)
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for _ in range(tables))
        pairs = (tables + 1) * tables // 2
        self.top = mlp([dim + pairs, 64, 1], last_relu=False)

    def forward(self, dense: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        # indices: (tables, N) flat bags; offsets: (tables, batch) where each bag starts
        x = self.bottom(dense)
        feats = [x] + [emb(indices[t], offsets[t]) for t, emb in enumerate(self.embeddings)]
        z = torch.stack(feats, dim=1)  # (batch, tables + 1, dim)
        dots = z @ z.transpose(1, 2)
        i, j = torch.tril_indices(z.shape[1], z.shape[1], offset=-1, device=z.device)
        return self.top(torch.cat([x, dots[:, i, j]], dim=1)).squeeze(1)


def batch(step: int, size: int, dense: int, rows: int, tables: int, bag: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(size, dense, generator=g)
    indices = torch.randint(0, rows, (tables, size * bag), generator=g)
    offsets = torch.arange(0, size * bag, bag).expand(tables, size).contiguous()
    # the hidden rule: two dense features, and a little of the first table's first index
    label = (x[:, 0] + x[:, 1] + 0.5 * (indices[0, ::bag] < rows // 2) - 0.25 > 0).float()
    return x, indices, offsets, label


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="tpu")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--tiny", action="store_true", help="small tables and batches (a smoke test)")
    args = p.parse_args(argv)
    dense, rows, tables, dim, bag = (4, 1000, 3, 8, 2) if args.tiny else (13, 100_000, 8, 32, 4)
    size = 32 if args.tiny else args.batch
    torch.manual_seed(0)
    model = DLRM(dense, rows, tables, dim).to(args.device)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    losses, start, first_step_s = [], time.perf_counter(), None
    for step in range(args.steps):
        x, idx, off, label = (t.to(args.device) for t in batch(step, size, dense, rows, tables, bag))
        loss = F.binary_cross_entropy_with_logits(model(x, idx, off), label)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step == 0:
            first_step_s = time.perf_counter() - start
            start = time.perf_counter()
    steps_per_s = (len(losses) - 1) / (time.perf_counter() - start) if len(losses) > 1 else float("nan")
    print(f"dlrm on {args.device}: {len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
          f"first step {first_step_s:.1f} s, then {steps_per_s:.2f} steps/s")
    return {"losses": losses, "steps_per_s": steps_per_s}


if __name__ == "__main__":
    main()
