"""The dq half of the flash-attention backward: JAX's Pallas dq kernel, called with narrower inputs.

JAX's wrapper (``flash_attention._flash_attention_bwd_dq``) broadcasts each query row's
``sum(dO * O)`` to ``[B, H, L, block_k_major]`` float32 in device memory, although the kernel's
BlockSpec for it reads only the first 128 lanes (it tiles them across the key block itself). A
broadcast cannot fuse into a kernel's operand, so at the 512-key block torchtpu uses, every layer's
backward wrote a [16, 12, 512, 512] float32 tensor (201 MB) of which a quarter was read: the v5e's
26th-session profile of the bf16 100M step put 6.5 ms of its 78 in such broadcasts, these the
largest. Here the same kernel gets that operand 128 lanes wide: the very tensor the dk/dv half
reads, so XLA makes it once per layer.

This is the same grid and the same BlockSpecs as JAX's (jax 0.10.2), without segment ids (torchtpu
passes none); the kernel body is JAX's. Only JAX functions: it runs inside the exported backward.
"""

from __future__ import annotations

import functools
from typing import Any


def dq(fa: Any, q: Any, k: Any, v: Any, bias: Any, l: Any, m: Any, do: Any, di: Any, *,
       block_q: int, block_k_major: int, block_k: int, sm_scale: float, causal: bool) -> tuple[Any, Any]:
    """(dq, d bias or None) of the flash backward. ``fa`` is JAX's flash-attention module; ``l``, ``m``
    and ``di`` are per query row ([B, H, L]), as ``fa._flash_attention_bwd`` has them."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    batch, heads, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    lanes = fa.MIN_BLOCK_SIZE
    fa._verify_block("block_q_dq", "q_seq_len", block_q, q_len)
    fa._verify_block("block_k_major_dq", "kv_seq_len", block_k_major, kv_len)
    fa._verify_block("block_k_dq", "block_k", block_k, kv_len)
    l, m, di = (jnp.broadcast_to(x[..., None], (*x.shape, lanes)) for x in (l, m, di))

    def row_block(b: Any, h: Any, qi: Any, _: Any) -> tuple:
        return (b, h, qi, 0)

    def key_block(b: Any, h: Any, qi: Any, ki: Any) -> tuple:
        if causal:  # a skipped block above the diagonal fetches the row's first one instead
            ki = lax.select(fa.below_or_on_diag(qi, block_q, ki, block_k_major), ki, 0)
        return (b, h, ki, 0)

    def bias_block(b: Any, h: Any, qi: Any, ki: Any) -> tuple:
        return (b, h, qi, ki)

    rows = pl.BlockSpec((1, 1, block_q, head_dim), row_block)
    keys = pl.BlockSpec((1, 1, block_k_major, head_dim), key_block)
    per_row = pl.BlockSpec((1, 1, block_q, lanes), row_block)
    bias_spec = pl.BlockSpec((1, 1, block_q, block_k_major), bias_block) if bias is not None else None
    kernel = functools.partial(fa._flash_attention_dq_kernel, sm_scale=sm_scale, causal=causal,
                               mask_value=fa.DEFAULT_MASK_VALUE, block_k=block_k, kv_seq_len=kv_len)
    grid = (batch, heads, q_len // block_q, kv_len // block_k_major)
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0, grid=grid,
            in_specs=[rows, keys, keys, bias_spec, None, None, per_row, per_row, rows, per_row],
            out_specs=[rows, bias_spec], scratch_shapes=[pltpu.VMEM((block_q, head_dim), jnp.float32)]),
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct(bias.shape, bias.dtype) if bias is not None else None],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel",
                                                                  "arbitrary")),
        name=f"flash_mha_bwd_dq_{block_q}x{block_k_major}x{block_k}",
    )(q, k, v, bias, None, None, l, m, do, di)

