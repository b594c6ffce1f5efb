"""PyTorch's transformer inference fast path (eval mode, no autograd) against CPU.

Regression: nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder and
nn.Transformer failed in eval mode on tpu, because PyTorch routes them to fused kernels
(_native_multi_head_attention, _transformer_encoder_layer_fwd, _masked_softmax) that it
implements for CPU and CUDA only.
"""

import copy

import pytest
import torch
from helpers import assert_matches
from torch import nn

aten = torch.ops.aten
MODES = ["strict", "defer_and_fuse"]


def _run(module: nn.Module, mode: str, *args, **kwargs):
    """The module's eval-mode output on CPU and on tpu (same weights), under no_grad."""
    module = module.eval()
    with torch.no_grad():
        expected = module(*args, **kwargs)
        tpu_module = copy.deepcopy(module).to("tpu")
        moved = [a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args]
        moved_kw = {k: v.to("tpu") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        with torch.tpu.eager_mode(mode), torch.tpu.precision("highest"):
            got = tpu_module(*moved, **moved_kw)
    return got, expected


def _padding_mask(batch: int, length: int) -> torch.Tensor:
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[0, length - 3:] = True
    return mask


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("masks", ["none", "padding", "padding_float", "attn", "both"])
def test_multihead_attention_fast_path_matches_cpu(mode, need_weights, average, masks):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True)
    x = torch.randn(3, 6, 16)
    kw = {}
    if masks in ("padding", "both"):
        kw["key_padding_mask"] = _padding_mask(3, 6)
    if masks == "padding_float":
        kw["key_padding_mask"] = _padding_mask(3, 6).float() * -1e4  # nonzero: left out, as on CPU
    if masks in ("attn", "both"):
        kw["attn_mask"] = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)
    got, expected = _run(mha, mode, x, x, x, need_weights=need_weights, average_attn_weights=average, **kw)
    assert_matches(got[0], expected[0], rtol=1e-4, atol=1e-5)
    if need_weights:
        assert_matches(got[1], expected[1], rtol=1e-4, atol=1e-5)
    else:
        assert got[1] is None and expected[1] is None


@pytest.mark.parametrize("mode", MODES)
def test_multihead_attention_cross_attention_matches_cpu(mode):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    q, kv = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    got, expected = _run(mha, mode, q, kv, kv)
    assert_matches(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("activation,norm_first", [("relu", False), ("gelu", False), ("gelu", True)])
@pytest.mark.parametrize("masks", ["none", "padding", "causal"])
def test_encoder_layer_fast_path_matches_cpu(mode, activation, norm_first, masks):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, activation=activation, norm_first=norm_first)
    x = torch.randn(3, 7, 16)
    kw = {}
    if masks == "padding":
        kw["src_key_padding_mask"] = _padding_mask(3, 7)
    if masks == "causal":
        kw["src_mask"] = nn.Transformer.generate_square_subsequent_mask(7)
        kw["is_causal"] = True
    got, expected = _run(layer, mode, x, **kw)
    assert_matches(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_transformer_encoder_and_transformer_eval_match_cpu(mode):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    x = torch.randn(2, 6, 16)
    got, expected = _run(encoder, mode, x, src_key_padding_mask=_padding_mask(2, 6))
    assert_matches(got, expected, rtol=1e-4, atol=1e-5)
    model = nn.Transformer(16, 2, 1, 1, 32, batch_first=True)
    src, tgt = torch.randn(2, 6, 16), torch.randn(2, 4, 16)
    got, expected = _run(model, mode, src, tgt, tgt_mask=nn.Transformer.generate_square_subsequent_mask(4))
    assert_matches(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lengths", [[6, 3, 1], [6, 6, 6], [4, 0, 2]])
def test_transformer_encoder_nested_fast_path_matches_cpu(mode, lengths):
    """With a padding mask (and the default enable_nested_tensor=True) the fast path packs the
    batch into a nested tensor. Regression: _nested_tensor_from_mask_left_aligned was missing."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2)
    x = torch.randn(len(lengths), 6, 16)
    padding = torch.arange(6)[None, :] >= torch.tensor(lengths)[:, None]
    got, expected = _run(encoder, mode, x, src_key_padding_mask=padding)
    assert_matches(got, expected, rtol=1e-4, atol=1e-5)


def test_nested_tensor_from_mask_matches_cpu():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 4)
    keep = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    gap = torch.tensor([[1, 0, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    xt, keep_t, gap_t = x.to("tpu"), keep.to("tpu"), gap.to("tpu")
    assert torch._nested_tensor_from_mask_left_aligned(xt, keep_t) is True
    assert torch._nested_tensor_from_mask_left_aligned(xt, gap_t) is torch._nested_tensor_from_mask_left_aligned(
        x, gap) is False
    expected = torch._nested_tensor_from_mask(x, keep)
    got = torch._nested_tensor_from_mask(xt, keep_t)
    assert got.is_nested and got.device.type == "tpu"
    assert_matches(list(got.unbind()), list(expected.unbind()))
    assert torch.equal(got._nested_tensor_size(), expected._nested_tensor_size())
    assert_matches(got.to_padded_tensor(-1.0), expected.to_padded_tensor(-1.0))
    assert_matches(got.to_padded_tensor(0.0, (3, 7, 4)), expected.to_padded_tensor(0.0, (3, 7, 4)))
    for call, cpu_args, tpu_args in [
        (lambda a, m: torch._nested_tensor_from_mask(a, m), (x, gap), (xt, gap_t)),
        (lambda a, m: torch._nested_tensor_from_mask(a, m), (x, keep.int()), (xt, keep_t.int())),
        (lambda a, m: torch._nested_tensor_from_mask(a, m), (x[0], keep), (xt[0], keep_t)),
        (lambda a, m: torch._nested_tensor_from_mask_left_aligned(a, m), (x, keep[:2]), (xt, keep_t[:2])),
        (lambda a, m: a.to_padded_tensor(0.0, (3, 2, 4)), (expected, None), (got, None)),
    ]:
        with pytest.raises(RuntimeError) as cpu_error:
            call(*cpu_args)
        with pytest.raises(RuntimeError) as tpu_error:
            call(*tpu_args)
        assert str(tpu_error.value) == str(cpu_error.value).split("\n")[0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("mask_type", [0, 1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_softmax_matches_cpu(mode, mask_type, dtype):
    """Masked-out elements get 0, and a row with every element masked out is NaN, as on CPU."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 5).to(dtype)
    shape = {0: (5, 5), 1: (2, 5), 2: (2, 3, 5, 5)}[mask_type]
    mask = torch.rand(shape) > 0.6
    if mask_type == 0:
        mask[4] = True
    elif mask_type == 1:
        mask[1] = True
    else:
        mask[0, 1, 2] = True
    for dim in (3, 2, -1):
        expected = aten._masked_softmax(x, mask, dim, mask_type)
        with torch.tpu.eager_mode(mode):
            got = aten._masked_softmax(x.to("tpu"), mask.to("tpu"), dim, mask_type)
        low = dtype == torch.bfloat16  # one bf16 ulp: exp differs from CPU's in the last bit
        assert_matches(got, expected, rtol=2e-2 if low else 1e-5, atol=1e-3 if low else 1e-5)
        assert got.cpu().isnan().sum() == expected.isnan().sum()
        if dim != 2:
            assert expected.isnan().any()  # the test has a fully masked row


@pytest.mark.parametrize("call", [
    lambda d: aten._masked_softmax(torch.randn(2, 3, 4, 4, device=d), torch.ones(2, 4, device=d), 3, 1),
    lambda d: aten._masked_softmax(torch.randn(2, 3, 4, 4, device=d), torch.ones(2, 4, dtype=torch.bool, device=d),
                                   3, None),
    lambda d: aten._masked_softmax(torch.randn(2, 3, 4, 4, device=d), torch.ones(3, 4, dtype=torch.bool, device=d),
                                   3, 1),
    lambda d: aten._masked_softmax(torch.randn(3, 4, device=d), torch.ones(3, 5, dtype=torch.bool, device=d), 1, 2),
    lambda d: aten._native_multi_head_attention(torch.randn(2, 3, 8, device=d), torch.randn(2, 3, 8, device=d),
                                                torch.randn(2, 3, 8, device=d), 8, 3, torch.randn(24, 8, device=d),
                                                torch.randn(24, device=d), torch.randn(8, 8, device=d),
                                                torch.randn(8, device=d)),
    lambda d: aten._native_multi_head_attention(torch.randn(2, 3, 8, device=d), torch.randn(2, 4, 8, device=d),
                                                torch.randn(2, 4, 8, device=d), 8, 2, torch.randn(24, 8, device=d),
                                                torch.randn(24, device=d), torch.randn(8, 8, device=d),
                                                torch.randn(8, device=d)),
])
def test_fast_path_kernel_errors_match_cpu(call):
    with pytest.raises(RuntimeError) as cpu_error:
        call("cpu")
    with pytest.raises(type(cpu_error.value), match=str(cpu_error.value).split("\n")[0][:40].replace("(", ".")
                       .replace(")", ".").replace("[", ".").replace("]", ".").replace("`", ".")):
        call("tpu")
        torch.tpu.synchronize()


def test_transform_bias_rescale_qkv_matches_cpu():
    torch.manual_seed(0)
    qkv, bias = torch.randn(2, 5, 24), torch.randn(24)
    expected = aten._transform_bias_rescale_qkv(qkv, bias, 2)
    got = aten._transform_bias_rescale_qkv(qkv.to("tpu"), bias.to("tpu"), 2)
    assert_matches(list(got), list(expected))


def test_compiled_encoder_layer_eval_matches_cpu():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        expected = layer(x)
        compiled = torch.compile(copy.deepcopy(layer).to("tpu"), backend="tpu")
        with torch.tpu.precision("highest"):
            got = compiled(x.to("tpu"))
    assert_matches(got, expected, rtol=1e-4, atol=1e-5)
