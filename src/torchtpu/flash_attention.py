"""``F.scaled_dot_product_attention`` on tpu through a Pallas flash-attention kernel.

The math lowering of attention materializes the [B, H, L, S] score tensor (and its softmax, and
their gradients) in device memory; a flash kernel streams key/value blocks through on-chip memory
with an online softmax, so memory grows with L * S no more and the matrix unit stays busy. The
kernel is JAX's own Pallas TPU flash attention (``jax.experimental.pallas.ops.tpu``), lowered by
``torchtpu.kernels`` (exported with ``jax.export``, inlined into torchtpu's program, so it fuses
with its neighbours in DeferAndFuse and is one node of a ``torch.compile`` graph). On a TPU it is a
Mosaic kernel; on the CPU emulator Pallas' interpret mode lowers the same kernel to plain HLO loops
(exact, slow: off there unless ``TORCH_TPU_FLASH_ATTENTION=1``).

Which calls take it (:func:`qualifies`): 4-D float32 or bfloat16 query/key/value with equal batch,
heads and head dim, no dropout, a key length that is a multiple of 128 (the kernel's lane width),
a query length that is a multiple of 8 (and of 128 beyond 128), a head dim of 64, 128 or a multiple
of 128; causal (square) or not; with a floating additive mask or none (a boolean mask, whose fully
masked rows PyTorch sets to 0, takes the math path). Everything else, shapes traced as symbolic
(``torch.compile(dynamic=True)``), and everything under
``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)``, take PyTorch's own composite path, which
torchtpu lowers as plain matmul/softmax programs.

A call whose q, k and v are [B, T, H, D] tensors seen as [B, H, T, D] (a transformer's usual
transpose), with no mask and a head dim of 64 or 128, takes torchtpu's own kernels on the
[B, T, H * D] layout instead (``flash_attention_lanes.py``): no layout copies around the kernel, no
padded 64-lane tiles. On a TPU v5e (29th session) the bf16 100M GPT's compiled step took 60.6 ms
with them and 76.6 ms with the head-major kernel (JAX jit 64.8); ``TORCH_TPU_FLASH_LANES=0`` turns
them off.

Precision: at ``medium`` (the default) float32 inputs enter the kernel as bfloat16, the one bf16
pass per product that ``medium`` means for every other matmul; scores, softmax and accumulation stay
float32 inside the kernel. At ``high`` and ``highest`` the kernel multiplies float32 operands.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from typing import Any

import torch

from . import flash_attention_dq, flash_attention_lanes
from .runtime import env

_BLOCK = 128  # the kernel's lane width: key lengths and key blocks are multiples of it
# Block edges along queries and keys (clipped to the lengths). The kernel's grid has one step per
# (batch, head, query block, key block). Measured on a TPU v5e (bench/flash_attention.py, causal
# fwd+bwd at 16x12x512x64, f32 at medium): 128x128 (JAX's defaults) 7.09 ms, 256x256 4.79,
# 512x512 3.95, against 5.86 for the math lowering.
BLOCK_Q = 512
BLOCK_K = 512
# The key block of the dq half of the backward alone. JAX's wrapper broadcast each row's sum(dO * O)
# to this width in device memory, so at 512 it was the largest of the backward's broadcasts; torchtpu
# now sends that operand 128 lanes wide at any width (flash_attention_dq.py). Before that change, on
# the v5e (27th session, bench/flash_attention.py, bf16 fwd+bwd at 16x12x512x64): 512 3.585 ms, 128
# 3.726, 256 3.771: 512 was the fastest even with its broadcast.
BLOCK_K_DQ = 512
_HEAD_DIMS = (64, 128)  # below 128: the sizes the kernel is tested with; beyond: multiples of 128


# -- where it runs ---------------------------------------------------------------------------------

@functools.cache
def _jax_present() -> bool:
    return importlib.util.find_spec("jax") is not None


def enabled() -> bool:
    """Whether qualifying attention calls use the flash kernel now: TORCH_TPU_FLASH_ATTENTION (unset:
    on a TPU only), JAX installed, and PyTorch's fused SDPA backends not switched off
    (``sdpa_kernel([SDPBackend.MATH])`` turns flash and "overrideable" off)."""
    chosen = env.read("TORCH_TPU_FLASH_ATTENTION")
    if chosen is None:
        chosen = _tpu()
    if not chosen or not _jax_present():
        return False
    return torch._C._get_flash_sdp_enabled() or torch._C._get_overrideable_sdp_enabled()


def qualifies(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None,
              dropout_p: float, is_causal: bool) -> bool:
    """Whether the flash kernel computes this call (shapes and options; see the module docstring)."""
    if dropout_p != 0.0 or query.is_nested or key.is_nested or value.is_nested:
        return False
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        return False
    if not all(isinstance(n, int) for t in (query, key, value) for n in t.shape):
        # a graph traced with dynamic shapes (torch.compile(dynamic=True), or Dynamo's automatic
        # dynamic shapes after a second length): the kernels are built for static block grids, and a
        # shape test on a symbolic length would guard it to one value, so the math path takes it
        return False
    if query.dtype not in (torch.float32, torch.bfloat16) or key.dtype != query.dtype or value.dtype != query.dtype:
        return False
    b, h, q_len, d = query.shape
    if tuple(key.shape) != tuple(value.shape) or key.shape[0] != b or key.shape[1] != h or key.shape[3] != d:
        return False
    kv_len = key.shape[2]
    if kv_len == 0 or kv_len % _BLOCK or q_len == 0 or q_len % 8 or (q_len > _BLOCK and q_len % _BLOCK):
        return False
    if d not in _HEAD_DIMS and (d < _BLOCK or d % _BLOCK):
        return False
    if is_causal and (attn_mask is not None or q_len != kv_len):
        return False
    if query.dtype == torch.float32 and _tpu() and _precision() != "medium":
        # On a TPU v5e the kernel's float32 products are not float32-accurate (8e-3 off at
        # `highest`, measured): `high` and `highest` keep the math lowering's multi-pass products.
        return False
    if attn_mask is not None:
        if not attn_mask.is_floating_point() or attn_mask.dim() > 4:
            return False
        try:
            torch.broadcast_shapes(attn_mask.shape, (b, h, q_len, kv_len))
        except RuntimeError:
            return False
    return True


def _tpu() -> bool:
    from .lowering import target

    return target.tpu()


def _precision() -> str:
    from .engine import precision

    return precision.current()


# -- the kernel, as JAX functions ------------------------------------------------------------------

def _library() -> Any:
    from jax.experimental.pallas.ops.tpu import flash_attention

    return flash_attention


def _edge(length: int, wanted: int) -> int:
    """A block edge along a length: the wanted one if it divides the length, else 128 (which
    divides every qualifying length over 128) or the whole length."""
    edge = min(wanted, length)
    return edge if length % edge == 0 else min(_BLOCK, length)


def _forward_blocks(fa: Any, bq: int, bk: int) -> Any:
    """The forward kernel's block sizes (the backward's are _backward's own arguments)."""
    return fa.BlockSizes(block_q=bq, block_k_major=bk, block_k=bk, block_b=1)


def _operands(causal: bool, scale: float, low: bool, q: Any, k: Any, v: Any, mask: Any) -> tuple:
    """The kernel's (q, k, v, bias, sm_scale). The kernel computes ``(q.k + bias) * sm_scale``;
    PyTorch ``q.k * scale + mask``: with a mask, q is scaled first and sm_scale is 1."""
    import jax.numpy as jnp

    sm_scale = scale
    if mask is not None:
        q, sm_scale = q * jnp.asarray(scale, q.dtype), 1.0
    if low:
        q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    return q, k, v, mask, sm_scale


def _forward(causal: bool, scale: float, low: bool, blocks: tuple[int, int, int], q: Any, k: Any, v: Any,
             *mask: Any) -> tuple:
    """(output, logsumexp of each query row's scaled scores)."""
    import jax.numpy as jnp

    fa = _library()
    out_dtype = q.dtype
    qk, kk, vk, bias, sm_scale = _operands(causal, scale, low, q, k, v, mask[0] if mask else None)
    # exported by kernels: Mosaic on a TPU, Pallas' interpret mode on the emulator
    o, l, m = fa._flash_attention(qk, kk, vk, bias, None, True, causal, sm_scale, _forward_blocks(fa, *blocks[:2]),
                                  False)
    return o.astype(out_dtype), m + jnp.log(l)


def _backward(causal: bool, scale: float, low: bool, blocks: tuple[int, int, int], q: Any, k: Any, v: Any,
              *rest: Any) -> tuple:
    """Gradients of q, k, v (and of the mask, when there is one) from (…, out, logsumexp, grad_out)."""
    import jax.numpy as jnp

    fa = _library()
    mask = rest[0] if len(rest) == 4 else None
    out, lse, grad_out = rest[-3:]
    dtype = q.dtype
    qk, kk, vk, bias, sm_scale = _operands(causal, scale, low, q, k, v, mask)
    if low:
        grad_out = grad_out.astype(jnp.bfloat16)
    # The kernels take the row max m and row sum l of exp(s - m); with m = logsumexp and l = 1
    # they compute the same probabilities exp(s - lse). (fa._flash_attention_bwd, less its dq call.)
    ones = jnp.ones_like(lse)
    di = jnp.sum(out.astype(jnp.float32) * grad_out.astype(jnp.float32), axis=-1)
    bq, bk, bk_dq = blocks
    dk, dv = fa._flash_attention_bwd_dkv(qk, kk, vk, bias, None, ones, lse, grad_out, di, block_q_major=bq,
                                         block_k_major=bk, block_k=bk, block_q=bq, sm_scale=sm_scale,
                                         causal=causal, mask_value=fa.DEFAULT_MASK_VALUE, debug=False)
    dq, dbias = flash_attention_dq.dq(fa, qk, kk, vk, bias, ones, lse, grad_out, di, block_q=bq,
                                      block_k_major=bk_dq, block_k=bk_dq, sm_scale=sm_scale, causal=causal)
    if mask is not None:
        dq = dq.astype(jnp.float32) * scale
        return dq.astype(dtype), dk.astype(dtype), dv.astype(dtype), dbias.astype(mask.dtype)
    return dq.astype(dtype), dk.astype(dtype), dv.astype(dtype)


def _lanes_operands(low: bool, fused: bool, arrays: tuple) -> tuple[list, int, tuple[int, int, int]]:
    """(q, k, v as the kernels take them, C, their lane-group offsets): one fused projection
    [B, T, 3C] passed three times, or three [B, T, C] arrays; bfloat16 when ``low``."""
    import jax.numpy as jnp

    arrays = [x.astype(jnp.bfloat16) for x in arrays] if low else list(arrays)
    if fused:
        width = arrays[0].shape[-1] // 3
        groups = width // flash_attention_lanes.LANES
        return arrays * 3, width, (0, groups, 2 * groups)
    return arrays, arrays[0].shape[-1], (0, 0, 0)


def _lanes_forward(causal: bool, scale: float, low: bool, blocks: tuple[int, int], head_dim: int, fused: bool,
                   *arrays: Any) -> tuple:
    """(output, log-sum-exp in each head's lanes) on [B, T, H * D] (flash_attention_lanes.py)."""
    qkv, width, offsets = _lanes_operands(low, fused, arrays)
    o, lse = flash_attention_lanes.forward(*qkv, head_dim=head_dim, scale=scale, causal=causal, bq=blocks[0],
                                           bk=blocks[1], width=width, offsets=offsets)
    return o.astype(arrays[0].dtype), lse


def _lanes_backward(causal: bool, scale: float, low: bool, blocks: tuple[int, int], head_dim: int, fused: bool,
                    *rest: Any) -> tuple:
    """Gradients of the inputs (q, k, v, or the fused projection) from (…, out, log-sum-exp, grad_out)."""
    import jax.numpy as jnp

    arrays, (out, lse, grad_out) = rest[:-3], rest[-3:]
    qkv, width, offsets = _lanes_operands(low, fused, arrays)
    if low:
        grad_out = grad_out.astype(jnp.bfloat16)
    grads = flash_attention_lanes.backward(*qkv, out, lse, grad_out, head_dim=head_dim, scale=scale, causal=causal,
                                           bq=blocks[0], bk=blocks[1], width=width, offsets=offsets)
    if fused:  # one gradient of the projection (the model's split backward concatenates the same again)
        return (jnp.concatenate(grads, axis=-1).astype(arrays[0].dtype),)
    return tuple(g.astype(a.dtype) for g, a in zip(grads, arrays))


# -- the ops ---------------------------------------------------------------------------------------

def _kernel_ops(forward_fn: Any, backward_fn: Any, name: str, statics: int) -> tuple[Any, Any]:
    """The raw kernel ops of a JAX forward and backward (their first ``statics`` arguments static), with
    the backward registered as the autograd of the forward's first result: its inputs are the forward's
    inputs, then its results, then the output's gradient."""
    from . import kernels

    nums = tuple(range(statics))
    forward = kernels.jax_op(forward_fn, name=name, static_argnums=nums)
    backward = kernels.jax_op(backward_fn, name=f"{name}_backward", static_argnums=nums)

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        tensors, static = inputs
        ctx.save_for_backward(*tensors, *output)
        ctx.static = static

    def autograd_backward(ctx: Any, grads: list) -> tuple:
        *inputs, out, lse = ctx.saved_tensors
        grad_out = grads[0] if grads[0] is not None else torch.zeros_like(out)
        return list(backward([*inputs, out, lse, grad_out], ctx.static)), None

    torch.library.register_autograd(forward._schema.name, autograd_backward, setup_context=setup_context,
                                    lib=kernels._lib)
    return forward, backward


@functools.cache
def _lanes_ops() -> tuple[Any, Any]:
    """The lane-layout forward and backward ops, defined at first use, with the forward's autograd."""
    return _kernel_ops(_lanes_forward, _lanes_backward, "flash_attention_lanes", 6)


@functools.cache
def _ops() -> tuple[Any, Any]:
    """The forward and backward ops (``torch.ops.torchtpu_kernels.flash_attention[_backward]``),
    defined at first use, with the forward's autograd."""
    return _kernel_ops(_forward, _backward, "flash_attention", 4)


def _one_projection(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether q, k and v are the three thirds of one [B, T, 3C] projection (``qkv.split(C, 2)``, viewed
    as heads): equal shapes, rows 3C apart, k and v C and 2C after q. Only a cost decision: the kernels
    then read that projection whole, and the values are the same either way."""
    width = query.shape[1] * query.shape[3]
    return (tuple(key.shape) == tuple(value.shape) == tuple(query.shape)
            and all(t.stride(2) == 3 * width for t in (query, key, value))
            and key.storage_offset() == query.storage_offset() + width
            and value.storage_offset() == query.storage_offset() + 2 * width)


def takes_lanes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None) -> bool:
    """Whether a qualifying call goes to the lane-layout kernels (TORCH_TPU_FLASH_LANES): no mask, a
    head dim of 64 or 128 with whole 128-lane blocks of heads, and q, k, v each a [B, T, H, D] tensor
    seen as [B, H, T, D] (heads side by side in a row: stride D between heads, 1 within one), so
    that [B, T, H * D] is the layout they already have. A [B, H, T, D]-contiguous call keeps the
    head-major kernel, which needs no copy for it."""
    if attn_mask is not None or not env.read("TORCH_TPU_FLASH_LANES"):
        return False
    h, d = query.shape[1], query.shape[3]
    if d not in (64, 128) or (h * d) % flash_attention_lanes.LANES:
        return False
    return all(t.stride(3) == 1 and t.stride(1) == d for t in (query, key, value))


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
              is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Attention through the flash kernel (the caller checked :func:`qualifies`)."""
    b, h, q_len, d = query.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    low = query.dtype == torch.float32 and _precision() == "medium"
    if takes_lanes(query, key, value, attn_mask):
        blocks = (_edge(q_len, BLOCK_Q), _edge(key.shape[2], BLOCK_K))
        rows = [t.transpose(1, 2).reshape(b, t.shape[2], h * d) for t in (query, key, value)]
        fused = _one_projection(query, key, value)
        if fused:  # XLA folds the concatenation of its three slices back into the projection: no copies
            rows = [torch.cat(rows, dim=2)]
        out = _lanes_ops()[0](rows, repr((bool(is_causal), scale, low, blocks, d, fused)))[0]
        return out.view(b, q_len, h, d).transpose(1, 2)
    inputs = [query, key, value]
    if attn_mask is not None:
        inputs.append(attn_mask.to(torch.float32).expand(b, h, q_len, key.shape[2]))
    kv_len = key.shape[2]
    blocks = (_edge(q_len, BLOCK_Q), _edge(kv_len, BLOCK_K), _edge(kv_len, BLOCK_K_DQ))
    forward, _ = _ops()
    return forward(inputs, repr((bool(is_causal), scale, low, blocks)))[0]


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, *, scale: float | None = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """``aten::scaled_dot_product_attention`` for tpu tensors: the flash kernel where it is enabled
    and the call qualifies, else PyTorch's own composite (math) path."""
    if enabled() and qualifies(query, key, value, attn_mask, dropout_p, is_causal):  # (GQA: unequal heads)
        return attention(query, key, value, attn_mask, is_causal, scale)
    return torch.ops.aten.scaled_dot_product_attention.default.decompose(
        query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def register(lib: torch.library.Library) -> None:
    """Take ``aten::scaled_dot_product_attention`` for tpu tensors, with and without autograd (the
    composite it replaces would otherwise fill both keys)."""
    for key in ("AutogradPrivateUse1", "PrivateUse1"):
        lib.impl("scaled_dot_product_attention", scaled_dot_product_attention, key)
