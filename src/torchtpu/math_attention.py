"""``aten::_scaled_dot_product_attention_math`` for tpu tensors: PyTorch's math attention, arranged
for XLA.

Attention that the flash kernel does not take (``flash_attention.qualifies``) reaches PyTorch's
composite math path. Its semantics are kept here (float32 accumulation for half inputs unless
``allow_fp16_bf16_reduction_math_sdp``, boolean and causal masks as -inf, ``_safe_softmax``, the
same dropout and dropout-mask forms, the same outputs and dtypes); two of its arrangements are not:

- PyTorch scales both query and key by the square root of the scale "for stability" (in half
  precision, on devices that multiply in it). Here the inputs are already float32 or the matrix unit
  accumulates in float32, and the key side is the costly one to scale: in decoding with a static
  KV cache the key is the whole cache, and its scaled copy is a pass over the cache per layer that
  the compiler may also not fuse (on a TPU v5e, the bench's 100M GPT decoding at batch 8: a materialized
  [8, 12, 512, 64] product per layer, and the cache fetched whole into on-chip memory for it). So
  the shorter of query and key is multiplied by the whole scale. With a power-of-four head dim the
  scale is a power of two and the product exact.
- With ``enable_gqa`` PyTorch repeats key and value heads to the query's head count (a copy of
  both, per call). Here the query's heads are grouped onto the shared key/value heads instead, so
  the products read key and value once (at static sizes; a graph traced with symbolic sizes repeats,
  as PyTorch does).
"""

from __future__ import annotations

import math

import torch

_MATH = torch.ops.aten._scaled_dot_product_attention_math.default


def _boolean_to_additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """PyTorch's convention: True attends (adds 0), False is masked (adds -inf)."""
    # (device-side fills only: no host tensor, which a graph capture would refuse to upload)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask.logical_not(), -math.inf)


def _accumulation_copy(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in (torch.float16, torch.bfloat16) and not torch._C._get_math_sdp_allow_fp16_bf16_reduction():
        return t.to(torch.float32)
    return t


def scaled_dot_product_attention_math(
        query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0, is_causal: bool = False, dropout_mask: torch.Tensor | None = None, *,
        scale: float | None = None, enable_gqa: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, attention weights), as PyTorch's math path returns them (module docstring)."""
    if query.is_nested or key.is_nested or value.is_nested:
        return _MATH.decompose(query, key, value, attn_mask, dropout_p, is_causal, dropout_mask,
                               scale=scale, enable_gqa=enable_gqa)
    out_dtype = query.dtype
    q, k, v = (_accumulation_copy(t) for t in (query, key, value))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if q.shape[-2] <= k.shape[-2]:
        q = q * scale
    else:
        k = k * scale
    if is_causal:
        if attn_mask is not None:
            raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set when "
                               "is_causal=True")
        attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = _boolean_to_additive(attn_mask, q.dtype)
    heads, groups = (q.shape[-3], 1) if q.dim() >= 3 else (1, 1)
    if enable_gqa and (heads != k.shape[-3] or heads != v.shape[-3]):
        if heads % k.shape[-3] or heads % v.shape[-3]:
            raise RuntimeError("Number of heads in key and value must divide the number of heads in ")
        symbolic = any(isinstance(d, torch.SymInt) for d in (*q.shape, *k.shape))
        if k.shape[-3] == v.shape[-3] and not symbolic:
            # Query head h shares key/value head h // groups (PyTorch's repeat_interleave): fold
            # each group's queries into one longer query block of its key/value head.
            groups = heads // k.shape[-3]
        else:
            # Unequal key and value head counts, or symbolic sizes (a graph traced with dynamic
            # shapes, where the folded sizes would be computed from symbols the graph cannot
            # lower): repeat both, as PyTorch does.
            k = k.repeat_interleave(heads // k.shape[-3], dim=-3)
            v = v.repeat_interleave(heads // v.shape[-3], dim=-3)
    if groups > 1:
        kv_heads, q_len = heads // groups, q.shape[-2]
        q = q.reshape(*q.shape[:-3], kv_heads, groups * q_len, q.shape[-1])
    scores = torch.matmul(q, k.transpose(-2, -1))
    if groups > 1:
        scores = scores.reshape(*scores.shape[:-3], heads, q_len, scores.shape[-1])
    if attn_mask is not None:
        scores = scores + attn_mask
    attn = torch.ops.aten._safe_softmax(scores, -1)
    if dropout_p > 0.0:
        if dropout_mask is not None:
            attn = attn.masked_fill(dropout_mask.logical_not(), 0.0)
            v = v * (1.0 / (1.0 - dropout_p))
        else:
            attn = torch.dropout(attn, dropout_p, True)
    weights = attn
    if groups > 1:
        attn = attn.reshape(*attn.shape[:-3], kv_heads, groups * q_len, attn.shape[-1])
    out = torch.matmul(attn, v)
    if groups > 1:
        out = out.reshape(*out.shape[:-3], heads, q_len, out.shape[-1])
    return out.to(out_dtype), weights.to(out_dtype)


def register(lib: torch.library.Library) -> None:
    """Take the math path for tpu tensors, with and without autograd (its composite would otherwise
    fill both keys); every op it calls has its own lowering and derivative."""
    for key in ("AutogradPrivateUse1", "PrivateUse1"):
        lib.impl("_scaled_dot_product_attention_math", scaled_dot_product_attention_math, key)
