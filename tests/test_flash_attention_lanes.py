"""Flash attention on the [B, T, H * D] layout (flash_attention_lanes.py, TORCH_TPU_FLASH_LANES).

On the CPU emulator the kernels run in Pallas' interpret mode; every value is compared with PyTorch's
attention on CPU in float64. What a TPU gets (Mosaic kernels, no transposes) is checked by exporting.
"""

import pytest
import torch
import torch.nn.functional as F

from torchtpu import flash_attention, flash_attention_lanes

pytest.importorskip("jax", reason="JAX is an optional dependency (the dev extra installs it)")


@pytest.fixture(autouse=True)
def lanes_on(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_FLASH_ATTENTION", "1")
    monkeypatch.setenv("TORCH_TPU_FLASH_LANES", "1")


@pytest.fixture
def decisions(monkeypatch):
    """What flash_attention.takes_lanes answered (in a compiled graph, while it was traced)."""
    seen, real = [], flash_attention.takes_lanes
    monkeypatch.setattr(flash_attention, "takes_lanes", lambda *a: (seen.append(real(*a)), seen[-1])[1])
    return seen


def _attention(qkv: torch.Tensor, heads: int, causal: bool) -> torch.Tensor:
    """A transformer's attention from its fused projection [B, T, 3C], as examples/gpt.py has it."""
    b, t, c3 = qkv.shape
    c = c3 // 3
    q, k, v = (x.view(b, t, heads, c // heads).transpose(1, 2) for x in qkv.split(c, dim=2))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return y.transpose(1, 2).reshape(b, t, c)


def _exact() -> tuple[str, float]:
    """(precision, tolerance) of the float32 checks: ``highest`` on the emulator, float32-exact there;
    on a TPU the kernels take float32 only at ``medium`` (bf16 operands), so that, at bf16's tolerance."""
    from torchtpu.lowering import target

    return ("medium", 3e-2) if target.tpu() else ("highest", 2e-5)


def _nodes(out: torch.Tensor) -> set[str]:
    seen, todo, names = set(), [out.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.add(type(fn).__name__)
        todo.extend(f for f, _ in fn.next_functions)
    return names


def _check(qkv: torch.Tensor, heads: int, causal: bool, tol: float, fn=_attention) -> None:
    leaf = qkv.double().requires_grad_()
    want = _attention(leaf, heads, causal)
    (want * want).sum().backward()
    got_leaf = qkv.to("tpu").requires_grad_()
    got = fn(got_leaf, heads, causal)
    (got * got).sum().backward()
    if "CompiledFunctionBackward" not in _nodes(got):  # (compiled: the decisions fixture says)
        assert any("flash_attention_lanes" in n for n in _nodes(got)), _nodes(got)
    for g, w in ((got.detach().cpu(), want.detach()), (got_leaf.grad.cpu(), leaf.grad)):
        w = w.to(qkv.dtype)
        torch.testing.assert_close(g, w, atol=tol * max(1.0, w.abs().max().item()), rtol=tol)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_lanes_match_cpu_forward_and_backward(causal, head_dim):
    qkv = torch.randn(2, 128, 3 * 2 * head_dim, generator=torch.Generator().manual_seed(0))
    precision, tol = _exact()
    with torch.tpu.precision(precision):
        _check(qkv, 2, causal, tol)


def test_lanes_in_bfloat16_at_medium():
    qkv = torch.randn(1, 256, 3 * 256, generator=torch.Generator().manual_seed(1)).bfloat16()
    _check(qkv, 4, True, 3e-2)


def test_lanes_with_query_and_key_blocks_smaller_than_the_length(monkeypatch):
    monkeypatch.setattr(flash_attention, "BLOCK_Q", 128)
    monkeypatch.setattr(flash_attention, "BLOCK_K", 128)
    qkv = torch.randn(1, 384, 3 * 128, generator=torch.Generator().manual_seed(2))
    precision, tol = _exact()
    with torch.tpu.precision(precision):
        _check(qkv, 2, True, tol)


@pytest.mark.parametrize("mode", ["defer_and_fuse", "compiled"])
def test_lanes_in_defer_and_fuse_and_compiled(mode, decisions):
    qkv = torch.randn(2, 128, 3 * 128, generator=torch.Generator().manual_seed(3))
    fn = torch.compile(_attention, backend="tpu", dynamic=False) if mode == "compiled" else _attention
    precision, tol = _exact()
    with torch.tpu.precision(precision):
        if mode == "defer_and_fuse":
            with torch.tpu.defer_and_fuse():
                _check(qkv, 2, True, tol, fn)
        else:
            _check(qkv, 2, True, tol, fn)
    assert decisions and all(decisions)


def test_head_major_inputs_keep_the_head_major_kernel():
    # [B, H, T, D]-contiguous q, k, v: the head-major kernel takes them without any copy
    q = torch.randn(1, 2, 128, 64, device="tpu")
    assert flash_attention.qualifies(q, q, q, None, 0.0, True)
    assert not flash_attention.takes_lanes(q, q, q, None)
    seen = q.transpose(1, 2).contiguous().transpose(1, 2)  # [B, T, H, D] seen as [B, H, T, D]
    assert flash_attention.takes_lanes(seen, seen, seen, None)
    assert not flash_attention.takes_lanes(seen, seen, seen, torch.zeros(128, 128, device="tpu"))


def test_lanes_on_by_default_and_off_on_request(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_FLASH_LANES")
    seen = torch.randn(1, 128, 2, 64, device="tpu").transpose(1, 2)
    assert flash_attention.takes_lanes(seen, seen, seen, None)
    monkeypatch.setenv("TORCH_TPU_FLASH_LANES", "0")
    assert not flash_attention.takes_lanes(seen, seen, seen, None)


@pytest.mark.parametrize("fused", [False, True])
def test_a_tpu_gets_mosaic_lane_kernels_and_no_transposes(fused):
    # no layout copies and no lane broadcasts outside the kernels: the head-major path's costs on the v5e
    jax = pytest.importorskip("jax")
    from jax import export

    width = 3 * 768 if fused else 768
    a = jax.ShapeDtypeStruct((2, 512, width), jax.numpy.bfloat16)
    rows = jax.ShapeDtypeStruct((2, 512, 768), jax.numpy.bfloat16)
    lse = jax.ShapeDtypeStruct((2, 512, 768), jax.numpy.float32)
    inputs = [a] if fused else [a] * 3
    static = (True, 0.125, False, (512, 512), 64, fused)
    fwd = export.export(jax.jit(lambda *x: flash_attention._lanes_forward(*static, *x)), platforms=["tpu"])(*inputs)
    bwd = export.export(jax.jit(lambda *x: flash_attention._lanes_backward(*static, *x)),
                        platforms=["tpu"])(*inputs, rows, lse, rows)
    text = fwd.mlir_module() + bwd.mlir_module()
    assert text.count("tpu_custom_call") == 3
    assert "stablehlo.transpose" not in text and "stablehlo.broadcast_in_dim" not in text
    assert "stablehlo.slice" not in text  # the fused projection is read in place, not cut into q, k, v
    assert [tuple(x.shape) for x in bwd.out_avals] == [(2, 512, width)] * (1 if fused else 3)
    assert flash_attention_lanes.heads_per_block(64) == 2


def test_separate_projections_take_the_lanes_without_a_concatenation(decisions, monkeypatch):
    fused = []
    real = flash_attention._one_projection
    monkeypatch.setattr(flash_attention, "_one_projection", lambda *a: (fused.append(real(*a)), fused[-1])[1])

    def separate(qkv: torch.Tensor, heads: int, causal: bool) -> torch.Tensor:
        b, t, c3 = qkv.shape
        q, k, v = (x.contiguous().view(b, t, heads, c3 // 3 // heads).transpose(1, 2) for x in qkv.split(c3 // 3, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return y.transpose(1, 2).reshape(b, t, c3 // 3)

    qkv = torch.randn(1, 128, 3 * 128, generator=torch.Generator().manual_seed(4))
    precision, tol = _exact()
    with torch.tpu.precision(precision):
        _check(qkv, 2, False, tol)  # one projection, split: read whole
        _check(qkv, 2, False, tol, separate)  # three tensors
    assert fused == [True, False] and all(decisions)


@pytest.mark.parametrize("q_len", [64, 8])  # 8: the shortest query the kernels take, one block of 8 rows
def test_lanes_with_a_shorter_query_than_key_not_causal(decisions, q_len):
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, n, 2, 64, generator=g) for n in (q_len, 256, 256))  # [B, T, H, D]
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    want = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves))
    (want * want).sum().backward()
    got_leaves = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    precision, tol = _exact()
    with torch.tpu.precision(precision):
        got = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in got_leaves))
        (got * got).sum().backward()
    assert decisions == [True]
    for a, w in zip([got, *(t.grad for t in got_leaves)], [want, *(t.grad for t in leaves)]):
        w = w.float()
        torch.testing.assert_close(a.detach().cpu(), w, atol=tol * max(1.0, w.abs().max().item()), rtol=tol)
