"""The fused kernels of PyTorch's transformer inference fast path.

``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer`` and so ``nn.TransformerEncoder``
and ``nn.Transformer``, in eval mode without autograd, call ``_native_multi_head_attention``
and ``_transformer_encoder_layer_fwd`` on any device PyTorch counts as supported, the
PrivateUse1 backend included. Those call ``_transform_bias_rescale_qkv`` and
``_masked_softmax``. PyTorch implements all four for CPU and CUDA only.

Each is written here as a composite of ATen ops that follows CPU's kernel step by step,
and lowered by tracing it into one program (``decompose.lower_composite``). The
composites also serve as meta kernels where PyTorch has none.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

from .builder import Value
from .decompose import lower_composite
from .registry import LoweringContext, register, register_meta_check

aten = torch.ops.aten


# -- _masked_softmax -------------------------------------------------------------------
def _softmax_mask(x: torch.Tensor, mask: torch.Tensor, mask_type: int | None) -> torch.Tensor:
    """The boolean mask (True: left out) at ``x``'s shape, as CPU's kernel reads it.

    A (L, L) attention mask (type 0) and a (B, L) key padding mask (type 1) apply only to a
    4-D input; any other mask (type 2) has the input's shape.
    """
    if mask.dim() != 2 or x.dim() != 4:
        mask_type = 2
    if mask_type == 0:
        return mask.view(1, 1, mask.shape[0], mask.shape[1]).expand(x.shape)
    if mask_type == 1:
        return mask.view(mask.shape[0], 1, 1, mask.shape[1]).expand(x.shape)
    return mask


@register_meta_check(aten._masked_softmax.default)
def _check_masked_softmax(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None,
                          mask_type: int | None = None) -> None:
    """CPU's argument errors, in its order."""
    if mask.dtype != torch.bool:
        raise RuntimeError("Mask should be a boolean tensor")
    if mask.dim() != 2 or x.dim() != 4:
        mask_type = 2
    if mask_type is None:
        raise RuntimeError("Mask Type should be defined")
    if mask_type == 2:
        if x.shape != mask.shape:
            raise RuntimeError("For mask_type == 2 mask shape should match input shape")
    elif mask_type == 1:
        if x.shape[0] != mask.shape[0] or x.shape[2] != mask.shape[1] or x.shape[3] != mask.shape[1]:
            raise RuntimeError("For mask_type == 1 mask shape should be (B, L)")
    elif mask_type == 0:
        if x.shape[2] != mask.shape[0] or x.shape[2] != mask.shape[1]:
            raise RuntimeError("For mask_type == 0 mask shape should be (L, L)")
    else:
        raise RuntimeError("Unrecognized mask_type")
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"masked_softmax expects a floating point input, got {x.dtype}")


def masked_softmax(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None,
                   mask_type: int | None = None) -> torch.Tensor:
    """Softmax over ``dim`` of the elements the mask leaves in. As on CPU, a row whose every
    element is masked out is NaN (its maximum is -inf)."""
    dim = x.dim() - 1 if dim is None else dim
    left_out = _softmax_mask(x, mask, mask_type)
    return torch.softmax(x.masked_fill(left_out, -math.inf), dim)


@register(aten._masked_softmax.default)
def _masked_softmax(ctx: LoweringContext, x: Value, mask: Value, dim: int | None = None,
                    mask_type: int | None = None) -> Value:
    return lower_composite(ctx, masked_softmax, x, mask, dim, mask_type)


# -- _transform_bias_rescale_qkv -------------------------------------------------------
@register_meta_check(aten._transform_bias_rescale_qkv.default)
def _check_transform_qkv(qkv: torch.Tensor, qkv_bias: torch.Tensor, num_heads: int) -> None:
    if qkv.dim() != 3:
        raise IndexError(f"Dimension out of range (expected to be in range of [-{qkv.dim()}, "
                         f"{qkv.dim() - 1}], but got 2)")
    width = qkv.shape[2]
    if (width // 3) % num_heads != 0 or width % 3 != 0:
        raise RuntimeError("Expected D % num_head == 0 && _3D % 3 == 0 to be true, but got false.")


def _inv_sqrt(n: int, dtype: torch.dtype) -> float:
    """1/sqrt(n) as CPU's kernel has it: the root taken in ``dtype``, the quotient rounded to it."""
    np_dtype = {torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16,
                torch.float64: np.float64}.get(dtype, np.float32)
    root = np.sqrt(np.asarray(n, dtype=np_dtype))
    return float(np.asarray(1.0 / float(root), dtype=np_dtype))


def transform_bias_rescale_qkv(qkv: torch.Tensor, qkv_bias: torch.Tensor,
                               num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T, 3D) projections plus their bias, split into q, k, v of (B, heads, T, D/heads);
    q is then scaled by 1/sqrt(D/heads), a factor computed in the input's dtype as on CPU."""
    b, t, width = qkv.shape
    d = width // 3
    head_dim = d // num_heads
    x = (qkv + qkv_bias).view(b, t, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
    q = x[0] * _inv_sqrt(head_dim, qkv.dtype)
    return q.contiguous(), x[1].contiguous(), x[2].contiguous()


@register(aten._transform_bias_rescale_qkv.default)
def _transform_bias_rescale_qkv(ctx: LoweringContext, qkv: Value, qkv_bias: Value, num_heads: int) -> Any:
    return lower_composite(ctx, transform_bias_rescale_qkv, qkv, qkv_bias, num_heads)


_meta_lib = torch.library.Library("aten", "IMPL")
_meta_lib.impl("_masked_softmax", masked_softmax, "Meta")  # the composites are meta kernels too
_meta_lib.impl("_transform_bias_rescale_qkv", transform_bias_rescale_qkv, "Meta")


# -- _native_multi_head_attention ------------------------------------------------------
@register_meta_check(aten._native_multi_head_attention.default)
def _check_mha(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int, num_head: int,
               qkv_weight: torch.Tensor, qkv_bias: torch.Tensor, *rest: Any) -> None:
    """CPU's argument errors, in its order."""
    checks = [
        (query.dim() == 3, f"expected 3-D `query`, got {query.dim()}-D tensor"),
        (query.dim() != 3 or query.shape[2] == embed_dim,
         f"passed-in embed_dim {embed_dim} didn't match last dim of query {query.shape[-1]}"),
        (key.dim() == 3, f"expected 3-D `key`, got {key.dim()}-D tensor"),
        (value.dim() == 3, f"expected 3-D `value`, got {value.dim()}-D tensor"),
        (query.shape == key.shape == value.shape, "expected `query`/`key`/`value` shapes to match"),
        (qkv_weight.dim() == 2, f"expected 2-D `qkv_weight`, got {qkv_weight.dim()}-D tensor"),
        (qkv_weight.dim() != 2 or qkv_weight.shape[0] == 3 * embed_dim,
         "expected `qkv_weight` first dim to be 3x embed_dim"),
        (qkv_weight.dim() != 2 or qkv_weight.shape[1] == embed_dim,
         "expected `qkv_weight` second dim to be embed_Dim"),
        (qkv_bias.dim() == 1, f"expected 1-D `qkv_bias`, got {qkv_bias.dim()}-D tensor"),
        (qkv_bias.dim() != 1 or qkv_bias.shape[0] == 3 * embed_dim,
         "expected `qkv_bias` first dim and first dim of query to be equal"),
        (embed_dim % num_head == 0, "`embed_dim` must divide evenly by `num_heads`"),
    ]
    for ok, message in checks:
        if not ok:
            raise RuntimeError(message)


def native_multi_head_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, embed_dim: int,
                                num_head: int, qkv_weight: torch.Tensor, qkv_bias: torch.Tensor,
                                proj_weight: torch.Tensor, proj_bias: torch.Tensor, mask: torch.Tensor | None = None,
                                need_weights: bool = True, average_attn_weights: bool = True,
                                mask_type: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """CPU's kernel: q, k and v projected with the thirds of ``qkv_weight``, attention weights by
    a masked softmax (a mask of any dtype counts its nonzero elements as left out), the context
    projected by ``proj_weight``; the weights are returned averaged over heads, per head, or
    not at all."""
    if query.numel() == 0:
        return torch.empty_like(query), None
    w_q, w_k, w_v = qkv_weight.chunk(3, 0)
    qkv = torch.cat([query @ w_q.t(), key @ w_k.t(), value @ w_v.t()], 2)
    q, k, v = transform_bias_rescale_qkv(qkv, qkv_bias, num_head)
    scores = q @ k.transpose(2, 3)
    if mask is None:
        weights = torch.softmax(scores, 3)
    else:
        weights = masked_softmax(scores, mask.to(torch.bool), 3, mask_type)
    context = (weights @ v).permute(0, 2, 1, 3).reshape(query.shape[0], query.shape[1], embed_dim)
    out = F.linear(context, proj_weight, proj_bias)
    if not need_weights:
        return out, None
    if average_attn_weights:
        weights = weights.sum(1) / num_head
    return out, weights


@register(aten._native_multi_head_attention.default)
def _native_multi_head_attention(ctx: LoweringContext, *args: Any) -> Any:
    return lower_composite(ctx, native_multi_head_attention, *args)


# -- _transformer_encoder_layer_fwd ----------------------------------------------------
def transformer_encoder_layer(src: torch.Tensor, embed_dim: int, num_heads: int, qkv_weight: torch.Tensor,
                              qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
                              use_gelu: bool, norm_first: bool, eps: float, norm_weight_1: torch.Tensor,
                              norm_bias_1: torch.Tensor, norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor,
                              ffn_weight_1: torch.Tensor, ffn_bias_1: torch.Tensor, ffn_weight_2: torch.Tensor,
                              ffn_bias_2: torch.Tensor, mask: torch.Tensor | None = None,
                              mask_type: int | None = None) -> torch.Tensor:
    """CPU's kernel: self-attention and a feed-forward block (exact GELU or ReLU), each with
    its residual, layer-normalized after each block or (``norm_first``) before it."""
    if src.numel() == 0:
        return src.clone()

    def norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # Written out: ``eps`` reaches the lowering as a runtime scalar (a 0-d tensor), which
        # F.layer_norm does not take. Statistics in float for reduced-precision inputs, as on CPU.
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        mean = xf.mean(-1, keepdim=True)
        centered = xf - mean
        rstd = torch.rsqrt((centered * centered).mean(-1, keepdim=True) + eps)
        return (centered * rstd * weight + bias).to(x.dtype)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    x = native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                    mask, False, True, mask_type)[0] + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
    hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
    x = F.linear(hidden, ffn_weight_2, ffn_bias_2) + residual
    if not norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    return x


@register(aten._transformer_encoder_layer_fwd.default)
def _transformer_encoder_layer_fwd(ctx: LoweringContext, *args: Any) -> Value:
    return lower_composite(ctx, transformer_encoder_layer, *args)
