"""F.scaled_dot_product_attention through the Pallas flash-attention kernel (flash_attention.py).

On the CPU emulator the kernel runs in Pallas' interpret mode (plain HLO loops, exact), turned on
here with TORCH_TPU_FLASH_ATTENTION=1; on a TPU it is a Mosaic kernel (what the TPU gets is checked
by exporting for it). Every value is compared with PyTorch's attention on CPU.
"""

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.nn.attention import SDPBackend, sdpa_kernel

from torchtpu import flash_attention, kernels
from torchtpu.engine import deferred

pytest.importorskip("jax", reason="JAX is an optional dependency (the dev extra installs it)")


@pytest.fixture(autouse=True)
def flash_on(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_FLASH_ATTENTION", "1")


@pytest.fixture
def calls(monkeypatch):
    """One entry per call of flash_attention.attention (in a compiled graph: while it is traced)."""
    seen = []
    real = flash_attention.attention
    monkeypatch.setattr(flash_attention, "attention", lambda *a, **kw: (seen.append(1), real(*a, **kw))[1])
    return seen


@pytest.fixture
def highest():
    with torch.tpu.precision("highest"):
        yield


def _inputs(b=1, h=2, q_len=128, kv_len=128, d=64, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype) for n in (q_len, kv_len, kv_len)]


def _cpu(q, k, v, mask=None, **kw):
    """PyTorch's attention on CPU in float64 (rounded to the inputs' dtype): the reference."""
    dtype = q.dtype
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    m = mask.double().requires_grad_() if mask is not None and mask.is_floating_point() else mask
    out = F.scaled_dot_product_attention(*leaves, attn_mask=m, **kw)
    (out * out).sum().backward()
    grads = [t.grad for t in leaves] + ([m.grad] if m is not None and m.is_floating_point() else [])
    return out.detach().to(dtype), [g.to(dtype) for g in grads]


def _tpu(fn, q, k, v, mask=None, **kw):
    leaves = [t.to("tpu").requires_grad_() for t in (q, k, v)]
    m = mask.to("tpu").requires_grad_() if mask is not None and mask.is_floating_point() else \
        (mask.to("tpu") if mask is not None else None)
    out = fn(*leaves, attn_mask=m, **kw)
    (out * out).sum().backward()
    grads = [t.grad for t in leaves] + ([m.grad] if m is not None and m.is_floating_point() else [])
    return out, [g.cpu() for g in grads]


def _uses_flash(out: torch.Tensor) -> bool:
    return "flash_attention" in type(out.grad_fn).__name__


def _tpu_keeps_math(dtype) -> bool:
    """On a TPU, float32 at high/highest takes the math path (the kernel's f32 products are not
    f32-accurate there): these tests then check that path."""
    from torchtpu.lowering import target

    return target.tpu() and dtype == torch.float32 and torch.tpu.get_precision() != "medium"


def _check(q, k, v, mask=None, fn=F.scaled_dot_product_attention, flash=True, tol=2e-5, **kw):
    flash = flash and not _tpu_keeps_math(q.dtype)
    want, want_grads = _cpu(q, k, v, mask, **kw)
    out, grads = _tpu(fn, q, k, v, mask, **kw)
    assert _uses_flash(out) == flash, type(out.grad_fn).__name__
    # tolerances relative to each tensor's largest value (peaked softmaxes make large gradients)
    for g, w in zip([out.detach().cpu(), *grads], [want, *want_grads]):
        torch.testing.assert_close(g, w, atol=tol * max(1.0, w.abs().max().item()), rtol=tol)


@pytest.mark.parametrize("causal", [False, True])
def test_forward_backward_match_cpu(highest, causal):
    _check(*_inputs(), is_causal=causal)


def test_longer_keys_than_queries_and_explicit_scale(highest):
    _check(*_inputs(q_len=64, kv_len=256, d=128), scale=0.3)


@pytest.mark.parametrize("causal", [False, True])
def test_a_smaller_key_block_for_the_dq_half_gives_the_same_gradients(highest, monkeypatch, causal):
    """BLOCK_K_DQ below BLOCK_K: dq's kernel walks the keys in more blocks (two of 128 here, where
    dk/dv and the forward take all 256 at once); dq, dk and dv still match CPU's."""
    monkeypatch.setattr(flash_attention, "BLOCK_K", 256)
    monkeypatch.setattr(flash_attention, "BLOCK_K_DQ", 128)
    _check(*_inputs(q_len=256, kv_len=256), is_causal=causal)


@pytest.mark.parametrize("mask_shape", [(128, 256), (2, 1, 128, 256)])
def test_additive_mask_and_its_gradient(highest, mask_shape):
    q, k, v = _inputs(b=2, kv_len=256)
    mask = torch.randn(mask_shape, generator=torch.Generator().manual_seed(1))
    _check(q, k, v, mask)


def test_bfloat16_inputs():
    _check(*_inputs(dtype=torch.bfloat16), is_causal=True, tol=3e-2)


def test_medium_precision_error_is_the_math_lowerings(monkeypatch):
    """At ``medium`` float32 operands enter the kernel as bf16, as every medium product does: its
    error against CPU is of the math lowering's size (measured: 4e-3 and 3e-3 here)."""
    q, k, v = _inputs(seed=3)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    flash = F.scaled_dot_product_attention(*(t.to("tpu") for t in (q, k, v)), is_causal=True).cpu()
    monkeypatch.setenv("TORCH_TPU_FLASH_ATTENTION", "0")
    math = F.scaled_dot_product_attention(*(t.to("tpu") for t in (q, k, v)), is_causal=True).cpu()
    err_flash, err_math = (flash - want).abs().max().item(), (math - want).abs().max().item()
    assert 0 < err_flash < 3 * err_math + 1e-3, (err_flash, err_math)


@pytest.mark.parametrize("case", ["short_keys", "dropout", "bool_mask", "gqa", "odd_head_dim", "3d"])
def test_calls_the_kernel_cannot_take_use_the_math_path(highest, case):
    q, k, v = _inputs()
    kw, mask = {}, None
    if case == "short_keys":
        q, k, v = _inputs(q_len=64, kv_len=64)
    elif case == "dropout":
        out = F.scaled_dot_product_attention(*(t.to("tpu") for t in (q, k, v)), dropout_p=0.5)
        assert "flash" not in str(out.grad_fn) and out.shape == q.shape
        return
    elif case == "bool_mask":
        mask = torch.rand(128, 128, generator=torch.Generator().manual_seed(2)) > 0.3
    elif case == "gqa":
        k, v = k[:, :1], v[:, :1]
        kw["enable_gqa"] = True
    elif case == "odd_head_dim":
        q, k, v = _inputs(d=40)
    elif case == "3d":
        q, k, v = (t[0] for t in (q, k, v))
    _check(q, k, v, mask, flash=False, **kw)


def test_math_backend_choice_and_switch_turn_it_off(highest, monkeypatch):
    q, k, v = _inputs()
    with sdpa_kernel([SDPBackend.MATH]):
        _check(q, k, v, flash=False)
    monkeypatch.setenv("TORCH_TPU_FLASH_ATTENTION", "0")
    _check(q, k, v, flash=False)


def test_on_by_default_on_a_tpu_only(monkeypatch):
    from torchtpu.lowering import target

    monkeypatch.delenv("TORCH_TPU_FLASH_ATTENTION")
    assert flash_attention.enabled() == target.tpu()


def test_fuses_in_defer_and_fuse(highest):
    q, k, v = _inputs()
    with torch.tpu.eager_mode("defer_and_fuse"):
        qt, kt, vt = (t.to("tpu") for t in (q, k, v))
        flushes = deferred.stats["flushes"]
        out = F.scaled_dot_product_attention(qt * 2, kt, vt, is_causal=True).relu()
        assert deferred.has_pending()
        host = out.cpu()
        assert deferred.stats["flushes"] == flushes + 1
    want = F.scaled_dot_product_attention(q * 2, k, v, is_causal=True).relu()
    torch.testing.assert_close(host, want, atol=2e-5, rtol=2e-5)
    with torch.tpu.eager_mode("defer_and_fuse"):
        _check(q, k, v, is_causal=True)


def test_debug_mode(highest):
    with torch.tpu.eager_mode("debug"):
        _check(*_inputs(), is_causal=True)


def test_one_node_of_a_compiled_graph_without_graph_breaks(highest, calls):
    q, k, v = _inputs()
    counters.clear()

    def block(q, k, v, attn_mask=None):
        return F.scaled_dot_product_attention(q.sin(), k, v, attn_mask=attn_mask, is_causal=True) * 2

    compiled = torch.compile(block, backend="tpu")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = block(*leaves)
    (ref * ref).sum().backward()
    out, grads = _tpu(compiled, q, k, v)
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), atol=2e-5, rtol=2e-5)
    for g, t in zip(grads, leaves):
        torch.testing.assert_close(g, t.grad, atol=2e-5, rtol=2e-5)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 1
    assert bool(calls) != _tpu_keeps_math(q.dtype)  # traced through the kernel, not the math composite


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic_dynamic"])
def test_a_graph_with_symbolic_lengths_takes_the_math_path(highest, calls, dynamic):
    # Tracing with a symbolic length once failed in the kernel's setup (its block sizes put in the op's
    # text as symbols), so torch.compile(dynamic=True), or Dynamo's automatic dynamic shapes at a
    # second length, raised for every qualifying attention: now the math path takes such a graph
    torch._dynamo.reset()

    def block(x):  # a transformer's layout, heads of 64
        b, t, _ = x.shape
        q, k, v = ((x * s).view(b, t, 2, 64).transpose(1, 2) for s in (1.0, 0.5, -1.0))
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, 128)

    compiled = torch.compile(block, backend="tpu", dynamic=dynamic)
    traced_through_the_kernel = []
    for length in (128, 256):
        x = torch.randn(2, length, 128, generator=torch.Generator().manual_seed(length))
        leaf = x.to("tpu").requires_grad_()
        out = compiled(leaf)
        out.sum().backward()
        ref_leaf = x.double().requires_grad_()
        ref = block(ref_leaf)
        ref.sum().backward()
        torch.testing.assert_close(out.detach().cpu(), ref.detach().float(), atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(leaf.grad.cpu(), ref_leaf.grad.float(), atol=2e-5, rtol=2e-5)
        traced_through_the_kernel.append(bool(calls))
        calls.clear()
    # a static length keeps the kernel: automatic dynamic shapes trace the first length statically
    assert traced_through_the_kernel == [not dynamic and not _tpu_keeps_math(torch.float32), False]


def test_a_tpu_gets_a_mosaic_kernel(monkeypatch):
    """What a TPU would be sent: exported for the TPU, the kernel is one ``tpu_custom_call`` (a
    Mosaic kernel), forward and backward, in StableHLO the plugin's version accepts."""
    forward, backward = flash_attention._ops()
    monkeypatch.setattr(kernels, "_export_platform", lambda: "tpu")
    shapes = ((3, 1, 128, 64),) * 3
    dtypes = (torch.float32,) * 3
    static = (True, 0.125, True, (128, 128, 128))
    fwd = kernels._KERNELS[forward._schema.name.split("::")[1]]
    text, specs = fwd.module_for(shapes, dtypes, static)
    try:
        assert "tpu_custom_call" in text and "while" not in text
        assert [s for s, _ in specs] == [(3, 1, 128, 64), (3, 1, 128)]
        bwd = kernels._KERNELS[backward._schema.name.split("::")[1]]
        btext, bspecs = bwd.module_for(shapes + ((3, 1, 128, 64), (3, 1, 128), (3, 1, 128, 64)),
                                       dtypes + (torch.float32,) * 3, static)
        assert btext.count("tpu_custom_call") >= 2  # the dk/dv and the dq kernels
        assert [s for s, _ in bspecs] == [(3, 1, 128, 64)] * 3
    finally:  # these modules are a TPU's: no later call on this emulator may take them
        fwd._modules.clear()
        fwd._inlined.clear()
        bwd._modules.clear()
        bwd._inlined.clear()


@pytest.mark.parametrize("dq_block", [512, 128])
def test_a_tpu_is_sent_no_key_block_wide_broadcast_of_the_rows_sums(monkeypatch, dq_block):
    """JAX's own wrapper broadcast each row's sum(dO * O) to the dq kernel's key block in device memory
    (a [.., 512, 512] float32 tensor at 512 keys) though the kernel reads 128 lanes of it;
    flash_attention_dq sends it 128 lanes wide: exported for a TPU, no such tensor at any dq block."""
    _, backward = flash_attention._ops()
    monkeypatch.setattr(kernels, "_export_platform", lambda: "tpu")
    bwd = kernels._KERNELS[backward._schema.name.split("::")[1]]
    shape = (1, 1, 512, 64)
    try:
        text, _ = bwd.module_for((shape,) * 4 + (shape[:3], shape), (torch.bfloat16,) * 4 + (
            torch.float32, torch.bfloat16), (True, 0.125, False, (512, 512, dq_block)))
        assert text.count("tpu_custom_call") >= 2
        assert "tensor<1x1x512x512xf32>" not in text
        assert "tensor<1x1x512x128xf32>" in text
    finally:
        bwd._modules.clear()
        bwd._inlined.clear()


def test_float32_at_high_or_highest_keeps_the_math_path_on_a_tpu(monkeypatch):
    q, k, v = (t.to("tpu") for t in _inputs())
    monkeypatch.setattr(flash_attention, "_tpu", lambda: True)
    assert flash_attention.qualifies(q, k, v, None, 0.0, True)  # medium
    for p in ("high", "highest"):
        with torch.tpu.precision(p):
            assert not flash_attention.qualifies(q, k, v, None, 0.0, True)
            assert flash_attention.qualifies(q.bfloat16(), k.bfloat16(), v.bfloat16(), None, 0.0, True)
