"""Whole models on tpu against the CPU, step by step."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchtpu.examples.gpt import GPT, GPTConfig, make_batch


def train_pair(model, make, steps, precision, lr=1e-3):
    cpu_model = model
    tpu_model = copy.deepcopy(model).to("tpu")
    o_cpu = torch.optim.AdamW(cpu_model.parameters(), lr=lr)
    o_tpu = torch.optim.AdamW(tpu_model.parameters(), lr=lr)
    losses = []
    with torch.tpu.precision(precision):
        for step in range(steps):
            x, y = make(step)
            lc = F.cross_entropy(cpu_model(x).reshape(-1, cpu_model_vocab(cpu_model)), y.reshape(-1))
            o_cpu.zero_grad()
            lc.backward()
            o_cpu.step()
            lt = F.cross_entropy(tpu_model(x.to("tpu")).reshape(-1, cpu_model_vocab(cpu_model)),
                                 y.to("tpu").reshape(-1))
            o_tpu.zero_grad()
            lt.backward()
            o_tpu.step()
            losses.append((lc.item(), lt.item()))
    return losses


def cpu_model_vocab(m):
    return m.cfg.vocab if hasattr(m, "cfg") else 10


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x):
        return self.net(x)


def _mlp_data(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)


@pytest.mark.parametrize("precision,rtol", [("highest", 1e-4), ("medium", 2e-2)])
def test_mlp_matches_cpu_step_by_step(precision, rtol):
    torch.manual_seed(0)
    losses = train_pair(MLP(), _mlp_data, 20, precision)
    for i, (lc, lt) in enumerate(losses):
        assert abs(lc - lt) <= rtol * abs(lc), (i, lc, lt)
    assert losses[-1][1] < losses[0][1]


@pytest.mark.parametrize("precision,rtol,cfg", [
    ("highest", 1e-4, GPTConfig()),  # the demo's model, exactly
    ("medium", 2e-2, GPTConfig(seq=32, d_model=64, layers=2)),
])
def test_gpt_matches_cpu_step_by_step(precision, rtol, cfg):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    batches = [make_batch(cfg, 4, g) for _ in range(20)]
    losses = train_pair(GPT(cfg), lambda s: batches[s], 20, precision, lr=3e-3)
    for i, (lc, lt) in enumerate(losses):
        assert abs(lc - lt) <= rtol * abs(lc), (i, lc, lt)
    assert losses[-1][1] < losses[0][1] * 0.8


def test_bfloat16_model_and_autocast():
    torch.manual_seed(0)
    m = MLP()
    x = torch.randn(8, 32)
    ref = m.to(torch.bfloat16)(x.to(torch.bfloat16)).float()
    out = m.to("tpu")(x.to("tpu", torch.bfloat16)).float().cpu()
    torch.testing.assert_close(out, ref, rtol=5e-2, atol=5e-2)
    m2 = MLP().to("tpu")
    with torch.autocast("tpu", dtype=torch.bfloat16):
        y = m2(torch.randn(4, 32, device="tpu"))
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert m2.net[0].weight.grad.dtype == torch.float32
