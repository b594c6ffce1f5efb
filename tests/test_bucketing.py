"""Bounded dynamism: torch.compile(dynamic=True) graphs run at bucket sizes.

Each test compares against CPU eager and counts graph compilations
(``compile_cache_stats()["graph_misses"]``: one per program variant) to check that a
bucket's executable serves every size in it.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchtpu.engine import bucketing
from torchtpu.examples.gpt import GPT, GPTConfig


def _misses() -> int:
    return torch.tpu.compile_cache_stats()["graph_misses"]


def test_bucket_sizes():
    assert [bucketing.bucket_for(n, None) for n in (1, 2, 3, 5, 8, 9, 300)] == [1, 2, 4, 8, 8, 16, 512]
    assert bucketing.bucket_for(300, 400) == 400  # capped at the declared maximum
    try:
        bucketing.set_dynamic_buckets("16,64")
        assert [bucketing.bucket_for(n, None) for n in (3, 16, 17, 64, 65)] == [16, 16, 64, 64, 65]
    finally:
        bucketing.set_dynamic_buckets("pow2")
    with pytest.raises(ValueError):
        bucketing.set_dynamic_buckets([0, 4])


def test_gpt_sequence_sweep_compiles_one_program_per_bucket():
    torch.manual_seed(0)
    cpu_model = GPT(GPTConfig(seq=64, d_model=64, layers=1)).eval()
    model = torch.compile(copy.deepcopy(cpu_model).to("tpu"), backend="tpu", dynamic=True)
    lengths = [2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 30, 33, 50, 64]
    with torch.no_grad(), torch.tpu.precision("highest"):
        model(torch.randint(0, 256, (1, 2)).to("tpu"))  # the first (static) trace
        before = _misses()
        for t in lengths:
            idx = torch.randint(0, 256, (1, t))
            out = model(idx.to("tpu"))
            assert out.shape == (1, t, 256)
            torch.testing.assert_close(out.cpu(), cpu_model(idx), rtol=1e-5, atol=1e-5)
    buckets = {bucketing.bucket_for(t, None) for t in lengths}
    assert _misses() - before <= len(buckets)


class Pool(nn.Module):
    """Reductions, softmax and a contraction over the dynamic dimension, on merged views."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.proj(x)  # (B, T, 8): the linear flattens (B, T)
        gram = h.transpose(1, 2) @ h  # contracts over T
        return (h.mean(1), h.sum(1), h.amax(1), F.softmax(h, dim=1), F.log_softmax(h, dim=1), gram,
                h.cumsum(1), h.argmax(1))


def test_masked_reductions_match_cpu_across_sizes():
    torch.manual_seed(0)
    cpu_model = Pool()
    model = torch.compile(copy.deepcopy(cpu_model).to("tpu"), backend="tpu", dynamic=True)
    with torch.no_grad(), torch.tpu.precision("highest"):
        model(torch.randn(3, 2, 8).to("tpu"))
        before = _misses()
        for t in (3, 5, 6, 7, 11, 12):
            x = torch.randn(3, t, 8)
            for got, want in zip(model(x.to("tpu")), cpu_model(x)):
                assert got.shape == want.shape
                torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    assert _misses() - before == 3  # buckets 4, 8 and 16 (the static first call is separate)


def test_graph_that_cannot_be_padded_runs_at_exact_sizes():
    torch.manual_seed(0)

    def f(x: torch.Tensor) -> torch.Tensor:
        # cat along the dynamic dimension puts valid data after padding: not bucketable
        return torch.cat([x, x * 2], dim=1).cumsum(1)[:, -1]

    g = torch.compile(f, backend="tpu", dynamic=True)
    for t in (3, 5, 6):
        x = torch.randn(2, t)
        torch.testing.assert_close(g(x.to("tpu")).cpu(), f(x))


@pytest.mark.parametrize("use", ["divide", "add", "fill", "from_a_view"])
def test_a_size_used_as_a_value_is_the_actual_size(monkeypatch, use):
    # A graph's size symbols hold the bucket sizes when it runs padded: used as a value they gave the
    # bucket's size (x.sum(1) + x.shape[1] came out 8 - 6 = 2 too large at length 6), silently. Such a
    # graph now runs at its exact sizes, while a size used as a shape keeps the padding.
    fns = {
        "divide": lambda x: x.sum(1) / x.shape[1],
        "add": lambda x: x.sum(1) + x.shape[1],
        "fill": lambda x: x.sum(1, keepdim=True) * torch.full((1, 1), x.shape[1], device=x.device),
        "from_a_view": lambda x: x.sum(1) + x.view(x.shape[0], 2, -1).shape[-1],
    }
    reasons = []
    real = bucketing.analyze

    def analyze(gm, **kw):
        try:
            return real(gm, **kw)
        except bucketing.NotBucketable as e:
            reasons.append(str(e))
            raise

    monkeypatch.setattr(bucketing, "analyze", analyze)
    f = fns[use]
    torch._dynamo.reset()
    g = torch.compile(f, backend="tpu", dynamic=True)
    with torch.tpu.precision("highest"):
        for t in (6, 10, 12):
            x = torch.randn(3, t, generator=torch.Generator().manual_seed(t))
            torch.testing.assert_close(g(x.to("tpu")).cpu(), f(x))
    assert any("takes a size as a value" in r for r in reasons), reasons


def test_a_size_used_as_a_shape_keeps_the_padding():
    def f(x: torch.Tensor) -> torch.Tensor:
        shaped = x.new_zeros(x.shape[0], x.shape[1]) + torch.arange(x.shape[1], device=x.device)
        return (x * 3 + shaped).sum(1)

    torch._dynamo.reset()
    g = torch.compile(f, backend="tpu", dynamic=True)
    with torch.tpu.precision("highest"):
        for t in (6, 10, 12, 14):
            x = torch.randn(3, t, generator=torch.Generator().manual_seed(t))
            before = _misses()
            torch.testing.assert_close(g(x.to("tpu")).cpu(), f(x))
            if t in (12, 14):  # 10's bucket, 16: no new program
                assert _misses() == before


def test_exact_mode_disables_padding():
    torch.manual_seed(0)
    cpu_model = Pool()
    model = torch.compile(copy.deepcopy(cpu_model).to("tpu"), backend="tpu", dynamic=True)
    try:
        bucketing.set_dynamic_buckets("exact")
        with torch.no_grad():
            model(torch.randn(2, 2, 8).to("tpu"))
            before = _misses()
            for t in (3, 5, 6):
                x = torch.randn(2, t, 8)
                torch.testing.assert_close(model(x.to("tpu"))[0].cpu(), cpu_model(x)[0], rtol=2e-2, atol=2e-2)
            assert _misses() - before == 3
    finally:
        bucketing.set_dynamic_buckets("pow2")


def test_mark_dynamic_with_bounds():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    f = torch.compile(lambda x: F.softmax(lin.to("tpu")(x), dim=0).sum(0), backend="tpu")
    with torch.tpu.precision("highest"):
        for n in (5, 7, 9):
            x = torch.randn(n, 4)
            xt = x.to("tpu")
            torch._dynamo.mark_dynamic(xt, 0, min=2, max=10)
            torch.testing.assert_close(f(xt).cpu(), F.softmax(lin.cpu()(x), dim=0).sum(0), rtol=1e-5, atol=1e-5)


def test_dynamic_training_matches_cpu():
    """The forward graph runs bucketed and hands views of its padded results to a backward
    graph that runs at exact sizes (layer-norm backward is not masked): gradients match CPU."""
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    f = torch.compile(tpu_model, backend="tpu", dynamic=True)
    with torch.tpu.precision("highest"):
        for n in (3, 5, 6, 9):
            x = torch.randn(n, 8)
            cpu_model.zero_grad()
            tpu_model.zero_grad()
            cpu_model(x).pow(2).mean().backward()
            f(x.to("tpu")).pow(2).mean().backward()
            for p, ref in zip(tpu_model.parameters(), cpu_model.parameters()):
                torch.testing.assert_close(p.grad.cpu(), ref.grad, rtol=1e-4, atol=1e-5)


def test_two_dynamic_dimensions_merged_and_reduced_together():
    """Masks over two padded dims at once, and over a (B*T) dim merged from two padded ones;
    the inference outputs come back contiguous, as in eager."""
    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flat = x.reshape(-1, x.shape[-1])  # (B*T, C): both factors padded
        return x.sum((0, 1)), F.softmax(flat, dim=0), x.amax((0, 1)), x * 2

    g = torch.compile(f, backend="tpu", dynamic=True)
    with torch.no_grad():
        g(torch.randn(2, 2, 4).to("tpu"))
        before = _misses()
        for b, t in ((3, 5), (4, 6), (3, 7), (4, 8)):
            x = torch.randn(b, t, 4)
            for got, want in zip(g(x.to("tpu")), f(x)):
                assert got.shape == want.shape and got.is_contiguous()
                torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
                got.view(-1)  # a contiguous tensor, as eager returns
    assert _misses() - before == 1  # every size falls in the (4, 8) bucket


def test_hf_llama_inference_is_bucketed():
    """A real decoder (rotary embeddings, a KV cache's first cat onto an empty tensor,
    graph tensor constants) runs one program per bucket and matches CPU."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    cpu_model = transformers.LlamaForCausalLM(cfg).eval()
    model = torch.compile(copy.deepcopy(cpu_model).to("tpu"), backend="tpu", dynamic=True)
    lengths = (3, 5, 6, 7, 9, 12, 16)
    with torch.no_grad(), torch.tpu.precision("highest"):
        model(input_ids=torch.randint(3, 96, (1, 2)).to("tpu"))
        before = _misses()
        for t in lengths:
            ids = torch.randint(3, 96, (1, t))
            got = model(input_ids=ids.to("tpu")).logits
            torch.testing.assert_close(got.cpu(), cpu_model(input_ids=ids).logits, rtol=1e-4, atol=1e-4)
    assert _misses() - before <= len({bucketing.bucket_for(t, None) for t in lengths})
