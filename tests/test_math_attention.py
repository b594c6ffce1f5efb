"""Attention's math path on tpu (torchtpu.math_attention) against PyTorch's own on CPU."""

import re

import pytest
import torch
import torch.nn.functional as F

MATH = torch.ops.aten._scaled_dot_product_attention_math


def _grads_of(fn, dev, tensors, **kwargs):
    """fn's output and the gradients of a fixed, non-uniform weighting of it, on ``dev``."""
    leaves = [t.detach().to(dev).requires_grad_(t.is_floating_point()) for t in tensors]
    out = fn(*leaves, **{k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
    weight = torch.linspace(-1, 2, out.numel()).reshape(out.shape).to(out.dtype)
    (out * weight.to(dev)).sum().backward()
    return [out.detach().cpu()] + [t.grad.cpu() for t in leaves]


def _case(dtype, q_heads=4, k_heads=4, v_heads=None, q_len=3, kv_len=5, batch=(2,)):
    g = torch.Generator().manual_seed(q_heads * 100 + q_len * 10 + kv_len)
    v_heads = k_heads if v_heads is None else v_heads
    q = torch.randn(*batch, q_heads, q_len, 8, generator=g).to(dtype)
    k = torch.randn(*batch, k_heads, kv_len, 8, generator=g).to(dtype)
    v = torch.randn(*batch, v_heads, kv_len, 6, generator=g).to(dtype)
    return q, k, v


CASES = {
    "plain": ({}, {}),
    "causal": ({}, {"is_causal": True}),
    "bool_mask_with_a_fully_masked_row": ({}, {"attn_mask": "bool"}),
    "float_mask": ({}, {"attn_mask": "float"}),
    "queries_longer_than_keys": ({"q_len": 7, "kv_len": 4}, {"scale": 0.3}),
    "negative_scale": ({}, {"scale": -0.7}),
    "gqa": ({"q_heads": 6, "k_heads": 2}, {"enable_gqa": True, "attn_mask": "bool"}),
    "gqa_causal_long_queries": ({"q_heads": 4, "k_heads": 1, "q_len": 6, "kv_len": 6},
                                {"enable_gqa": True, "is_causal": True}),
    "gqa_unequal_key_and_value_heads": ({"q_heads": 4, "k_heads": 2, "v_heads": 1}, {"enable_gqa": True}),
    "no_head_dim": ({"batch": ()}, {}),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_math_attention_matches_cpu_forward_and_backward(name, dtype):
    shape, kwargs = CASES[name]
    q, k, v = _case(dtype, **shape)
    if name == "no_head_dim":
        q, k, v = q[0], k[0], v[0]  # (heads, len, dim): the leading dim is a batch, not heads
    kwargs = dict(kwargs)
    if kwargs.get("attn_mask") == "bool":
        mask = torch.rand(q.shape[-2], k.shape[-2], generator=torch.Generator().manual_seed(1)) > 0.3
        mask[0] = False  # a fully masked row: _safe_softmax's zeros, not NaN
        kwargs["attn_mask"] = mask
    elif kwargs.get("attn_mask") == "float":
        kwargs["attn_mask"] = torch.randn(q.shape[-2], k.shape[-2]).to(dtype)
    ref = _grads_of(F.scaled_dot_product_attention, "cpu", (q, k, v), **kwargs)
    with torch.tpu.precision("highest"):
        got = _grads_of(F.scaled_dot_product_attention, "tpu", (q, k, v), **kwargs)
    tol = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    for r, t in zip(ref, got):
        assert t.dtype == r.dtype
        torch.testing.assert_close(t, r, rtol=tol, atol=tol)


def test_math_attention_op_with_a_dropout_mask_returns_pytorchs_weights():
    """The op itself (both outputs), with dropout given as a mask, as PyTorch's tests call it."""
    q, k, v = _case(torch.float32)
    keep = torch.rand(2, 4, 3, 5, generator=torch.Generator().manual_seed(2)) > 0.25
    ref = MATH(q, k, v, None, 0.25, False, keep)
    with torch.tpu.precision("highest"):
        got = MATH(*(t.to("tpu") for t in (q, k, v)), None, 0.25, False, keep.to("tpu"))
    for r, t in zip(ref, got):
        torch.testing.assert_close(t.cpu(), r, rtol=2e-5, atol=2e-5)


def test_math_attention_errors_as_pytorchs():
    q, k, v = _case(torch.float32, q_heads=6, k_heads=4)
    for dev in ("cpu", "tpu"):
        qd, kd, vd = (t.to(dev) for t in (q, k, v))
        with pytest.raises(RuntimeError, match="must divide the number of heads"):
            MATH(qd, kd, vd, enable_gqa=True)
        with pytest.raises(RuntimeError, match="attn_mask should not be set when is_causal"):
            MATH(qd, kd[:, :1], vd[:, :1], torch.zeros(3, 5, device=dev), is_causal=True)


def test_decoding_attention_scales_the_query_and_reads_shared_key_value_heads_once(module_texts):
    """Regression (TPU v5e, GPT-2-small decode at batch 8): PyTorch's math path scales query and key
    each by the scale's square root, so with one query over a static KV cache every layer multiplied
    the whole key cache (a materialized [8, 12, 512, 64] product per layer on the chip). The shorter
    operand now takes the whole scale; with GQA the query heads are grouped onto the shared key/value
    heads where PyTorch repeats (copies) the cache."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 6, 1, 16, generator=g)
    k_cache, v_cache = (torch.randn(3, 2, 37, 16, generator=g) for _ in range(2))
    mask = (torch.arange(37) <= 20)[None]
    ref = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
    with torch.tpu.precision("highest"):
        out = F.scaled_dot_product_attention(*(t.to("tpu") for t in (q, k_cache, v_cache)),
                                             attn_mask=mask.to("tpu"), enable_gqa=True)
    torch.testing.assert_close(out.cpu(), ref, rtol=2e-5, atol=2e-5)
    text = "\n".join(module_texts)
    cache_sized = r"tensor<3x2x(37x16|16x37)xf32>"
    multiplied = [line for line in text.splitlines() if "stablehlo.multiply" in line and re.search(cache_sized, line)]
    assert not multiplied, multiplied[:2]
    assert "3x6x37x16" not in text and "3x6x16x37" not in text  # no repeated (6-head) cache


@pytest.mark.parametrize("how", ["defer_and_fuse", "compiled_dynamic"])
def test_math_attention_in_defer_and_fuse_and_compiled_with_dynamic_shapes(how):
    """The same path recorded by DeferAndFuse, and traced by torch.compile with symbolic lengths
    (the scaled operand is chosen by comparing them: a guard, not an error)."""
    def attend(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    fn = torch.compile(attend, backend="tpu", dynamic=True) if how == "compiled_dynamic" else attend
    for q_len, kv_len in ((3, 5), (6, 9), (7, 4)):
        q, k, v = _case(torch.float32, q_heads=4, k_heads=2, q_len=q_len, kv_len=kv_len)
        mask = torch.rand(q_len, kv_len, generator=torch.Generator().manual_seed(q_len)) > 0.2
        want = attend(q, k, v, mask)
        with torch.tpu.precision("highest"):
            if how == "defer_and_fuse":
                with torch.tpu.defer_and_fuse():
                    got = fn(*(t.to("tpu") for t in (q, k, v, mask))).cpu()
            else:
                got = fn(*(t.to("tpu") for t in (q, k, v, mask))).cpu()
        torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)


def test_a_dynamic_graph_reading_a_traced_tensors_size_lowers_whole():
    """With symbolic shapes, this block's graphs read a size off a traced view (``aten.sym_size.int``:
    the attention's scale from the head dim; Dynamo gives the length and the width, both 16 at the
    first call, one symbol, so the head dim is an expression of it). That node had no lowering, so
    each such graph fell back to running op by op (pytest turns that warning into an error); it now
    lowers to the size's value."""
    def block(x):
        b, t, _ = x.shape
        q, k, v = ((x * s).view(b, t, 2, 8).transpose(1, 2) for s in (1.0, 0.5, -1.0))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, 16)

    torch._dynamo.reset()
    compiled = torch.compile(block, backend="tpu", dynamic=True)
    for length in (16, 9):
        x = torch.randn(2, length, 16, generator=torch.Generator().manual_seed(length))
        with torch.tpu.precision("highest"):
            got = _grads_of(compiled, "tpu", [x])
        want = _grads_of(block, "cpu", [x])
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-5)
