"""Flash attention on the model's own [B, T, H * D] layout: heads side by side in the lanes.

JAX's Pallas kernel (``flash_attention.py``) takes [B, H, T, D]. A transformer makes q, k and v as
[B, T, H * D] (one matmul's output) and wants its attention output back that way, so around each
kernel call q, k, v, the output and, in the backward, the output's gradient and dq, dk, dv moved
between the two layouts: on the v5e the 26th session's profile of the bf16 100M GPT step put 7.6 ms
of its 78 in such copies (~120 of bf16[16,512,12,64]), and at D = 64 a [.., T, 64] tile fills half
of the TPU's 128 lanes, so the kernel also read and wrote padded tiles.

These kernels read and write [B, T, C] directly, C = H * D, in blocks of 128 lanes: one head at D =
128, a pair at D = 64. Each head of a block is taken with a lane mask instead of a lane slice: the
scores of head h are ``(q * in_h) k^T`` over all 128 lanes, the other head's lanes contributing
zeros, and a product whose result spans the lanes (``p v``, ``p^T dO``, ``dS^T q``, ``dS k``) keeps
head h's lanes. The v5e's matrix unit is 128 wide, so a 64-deep or 64-wide product costs it as much
as a 128 one: the masks cost selects, not matrix work. The log-sum-exp goes out as [B, T, C]
float32, each head's value in its own lanes, the layout the backward reads its rows in.

The backward's two kernels (dk/dv over key blocks, dq over query blocks) recompute the
probabilities from the log-sum-exp, as JAX's do, and compute each row's sum(dO * O) themselves
from O and dO (JAX's wrapper broadcast it over 128 lanes in device memory first).

q, k and v may be one fused projection [B, T, 3C] passed three times with lane-group offsets
(``offsets``), so the thirds of a ``qkv.split`` are read in place rather than sliced out.

Causal attention needs equal query and key lengths; no mask, no dropout (the caller checks).
Only JAX functions: they run inside the kernel ops ``torchtpu.kernels`` exports.
"""

from __future__ import annotations

import functools
from typing import Any

LANES = 128
MASK_VALUE = -0.7 * 3.4028234663852886e38  # as JAX's kernels: finite, so exp underflows to 0 without NaN


def heads_per_block(head_dim: int) -> int:
    return LANES // head_dim


def _lane_masks(head_dim: int, rows: int) -> list[Any]:
    """[rows, 128] booleans: the lanes of each head of a block (made at the full shape they select
    in, as JAX's kernels make their causal masks: no boolean broadcast for Mosaic to lay out)."""
    import jax.numpy as jnp
    from jax import lax

    lane = lax.broadcasted_iota(jnp.int32, (rows, LANES), 1)
    # comparisons, not lane // head_dim: Mosaic lowers a signed division through the chip's generation
    return [(lane >= h * head_dim) & (lane < (h + 1) * head_dim) for h in range(heads_per_block(head_dim))]


def _causal_keep(qi: Any, kj: Any, bq: int, bk: int) -> Any:
    import jax.numpy as jnp
    from jax import lax

    row = lax.broadcasted_iota(jnp.int32, (bq, bk), 0) + qi * bq
    col = lax.broadcasted_iota(jnp.int32, (bq, bk), 1) + kj * bk
    return col <= row


def _block_runs(qi: Any, kj: Any, bq: int, bk: int) -> Any:
    """Whether a (query block, key block) pair has any key at or before a query (causal)."""
    return kj * bk <= qi * bq + bq - 1


def _only_head(x: Any, in_h: Any) -> Any:
    """``x`` with the other heads' lanes zeroed, in its dtype (selected in float32: the v5e's vector
    unit has no bfloat16 arithmetic, so Mosaic's float32 select is the plain path)."""
    import jax.numpy as jnp

    return jnp.where(in_h, x.astype(jnp.float32), 0.0).astype(x.dtype)


def _each_block(step: Any, causal: bool, qi: Any, kj: Any, bq: int, bk: int) -> None:
    """Run ``step`` for this grid step's (query block, key block), but not for a block wholly above the
    diagonal of causal attention (nothing of it is kept)."""
    from jax.experimental import pallas as pl

    if causal:
        pl.when(_block_runs(qi, kj, bq, bk))(step)
    else:
        step()


def _scores(q: Any, k: Any, in_h: Any, scale: float, keep: Any) -> Any:
    """Head h's scaled scores [bq, bk], float32, masked above the diagonal."""
    import jax
    import jax.numpy as jnp

    s = jax.lax.dot_general(_only_head(q, in_h), k, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * scale
    return s if keep is None else jnp.where(keep, s, MASK_VALUE)


def _row_value(tile: Any, in_h: Any) -> Any:
    """[bq, 1]: head h's per-row value of a [bq, 128] tile holding it in that head's lanes."""
    import jax.numpy as jnp

    return jnp.max(jnp.where(in_h, tile, -jnp.inf), axis=1)[:, None]


def _repeat(x: Any, width: int) -> Any:
    """A [bq, 128] tile whose lanes are equal, widened to ``width`` lanes (a multiple of 128)."""
    import jax.numpy as jnp

    return jnp.tile(x, (1, width // LANES))


# -- forward ---------------------------------------------------------------------------------------

def _forward_kernel(q_ref: Any, k_ref: Any, v_ref: Any, o_ref: Any, lse_ref: Any, m_sc: Any, l_sc: Any,
                    acc_sc: Any, *, scale: float, causal: bool, head_dim: int, bq: int, bk: int, nk: int) -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    qi, kj = pl.program_id(2), pl.program_id(3)
    masks = _lane_masks(head_dim, bq)

    @pl.when(kj == 0)
    def _start() -> None:
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    def step() -> None:
        q, k, v = q_ref[...], k_ref[...], v_ref[...]
        keep = _causal_keep(qi, kj, bq, bk) if causal else None
        for h, in_h in enumerate(masks):
            s = _scores(q, k, in_h, scale, keep)
            m_prev, l_prev = m_sc[h], l_sc[h]  # [bq, 128], equal lanes
            m_next = jnp.maximum(m_prev, jnp.max(s, axis=1)[:, None])
            p = jnp.exp(s - _repeat(m_next, bk))
            alpha = jnp.exp(m_prev - m_next)
            l_sc[h] = alpha * l_prev + jnp.sum(p, axis=1)[:, None]
            m_sc[h] = m_next
            pv = jax.lax.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)  # [bq, 128]
            acc_sc[h] = acc_sc[h] * alpha + pv

    _each_block(step, causal, qi, kj, bq, bk)

    @pl.when(kj == nk - 1)
    def _finish() -> None:
        out = jnp.zeros((bq, LANES), jnp.float32)
        lse = jnp.zeros((bq, LANES), jnp.float32)
        for h, in_h in enumerate(masks):
            l_h = l_sc[h]
            out = jnp.where(in_h, acc_sc[h] / l_h, out)
            lse = jnp.where(in_h, m_sc[h] + jnp.log(l_h), lse)
        o_ref[...] = out.astype(o_ref.dtype)
        lse_ref[...] = lse


def _spec(rows: int, query_major: bool, of_queries: bool, offset: int) -> Any:
    """The BlockSpec of a block of ``rows`` rows and 128 lanes, at lane group ``offset + g``, for a grid
    (b, g, i, j) whose third axis walks query blocks (``query_major``) or key blocks: a query-row
    block (``of_queries``) follows the query-block axis, a key-row block the key-block one."""
    from jax.experimental import pallas as pl

    if query_major == of_queries:
        return pl.BlockSpec((None, rows, LANES), lambda b, g, i, j: (b, i, g + offset))
    return pl.BlockSpec((None, rows, LANES), lambda b, g, i, j: (b, j, g + offset))


def _params() -> Any:
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))


def forward(q: Any, k: Any, v: Any, *, head_dim: int, scale: float, causal: bool, bq: int, bk: int, width: int,
            offsets: tuple[int, int, int] = (0, 0, 0)) -> tuple[Any, Any]:
    """(output [B, T, width] in q's dtype, log-sum-exp [B, T, width] float32 in each head's lanes).
    q, k and v hold their heads at lane groups ``offsets`` on (one fused projection [B, T, 3 * width]
    passed three times: 0, width / 128 and twice that)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    batch, q_len = q.shape[:2]
    kv_len = k.shape[1]
    nh = heads_per_block(head_dim)
    out = jax.ShapeDtypeStruct((batch, q_len, width), q.dtype)
    kernel = functools.partial(_forward_kernel, scale=scale, causal=causal, head_dim=head_dim, bq=bq, bk=bk,
                               nk=kv_len // bk)
    return pl.pallas_call(
        kernel,
        grid=(batch, width // LANES, q_len // bq, kv_len // bk),
        in_specs=[_spec(bq, True, True, offsets[0]), _spec(bk, True, False, offsets[1]),
                  _spec(bk, True, False, offsets[2])],
        out_specs=[_spec(bq, True, True, 0)] * 2,
        out_shape=[out, jax.ShapeDtypeStruct(out.shape, jnp.float32)],
        scratch_shapes=[pltpu.VMEM((nh, bq, LANES), jnp.float32)] * 3,
        compiler_params=_params(),
        name=f"flash_lanes_fwd_{bq}x{bk}",
    )(q, k, v)


# -- backward --------------------------------------------------------------------------------------

def _probabilities_and_dscores(q: Any, k: Any, v: Any, o: Any, do: Any, lse: Any, in_h: Any, scale: float,
                               keep: Any, bk: int) -> tuple[Any, Any]:
    """Head h's probabilities P and the scores' gradient dS (of q k^T, scale included), [bq, bk]."""
    import jax
    import jax.numpy as jnp

    s = _scores(q, k, in_h, scale, keep)
    p = jnp.exp(s - _repeat(jnp.broadcast_to(_row_value(lse, in_h), (s.shape[0], LANES)), bk))
    # sum(dO * O) over the head's lanes: the softmax backward's row term
    di = jnp.sum(jnp.where(in_h, o.astype(jnp.float32) * do.astype(jnp.float32), 0.0), axis=1)[:, None]
    dp = jax.lax.dot_general(_only_head(do, in_h), v, (((1,), (1,)), ((), ())),
                             preferred_element_type=jnp.float32)
    return p, p * (dp - di) * scale


def _dkv_kernel(q_ref: Any, k_ref: Any, v_ref: Any, o_ref: Any, do_ref: Any, lse_ref: Any, dk_ref: Any, dv_ref: Any,
                dk_sc: Any, dv_sc: Any, *, scale: float, causal: bool, head_dim: int, bq: int, bk: int,
                nq: int) -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    kj, qi = pl.program_id(2), pl.program_id(3)
    masks, key_masks = _lane_masks(head_dim, bq), _lane_masks(head_dim, bk)

    @pl.when(qi == 0)
    def _start() -> None:
        dk_sc[...] = jnp.zeros(dk_sc.shape, jnp.float32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, jnp.float32)

    def step() -> None:
        q, k, v, o, do, lse = (r[...] for r in (q_ref, k_ref, v_ref, o_ref, do_ref, lse_ref))
        keep = _causal_keep(qi, kj, bq, bk) if causal else None
        for in_h, key_in_h in zip(masks, key_masks):
            p, ds = _probabilities_and_dscores(q, k, v, o, do, lse, in_h, scale, keep, bk)
            # p^T dO and dS^T q as JAX's dk/dv kernel writes them (a transpose, then a plain product)
            dv = jax.lax.dot(p.T.astype(do.dtype), do, preferred_element_type=jnp.float32)
            dk = jax.lax.dot(ds.T.astype(q.dtype), q, preferred_element_type=jnp.float32)
            dv_sc[...] += jnp.where(key_in_h, dv, 0.0)
            dk_sc[...] += jnp.where(key_in_h, dk, 0.0)

    _each_block(step, causal, qi, kj, bq, bk)

    @pl.when(qi == nq - 1)
    def _finish() -> None:
        dk_ref[...] = dk_sc[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def _dq_kernel(q_ref: Any, k_ref: Any, v_ref: Any, o_ref: Any, do_ref: Any, lse_ref: Any, dq_ref: Any, dq_sc: Any, *,
               scale: float, causal: bool, head_dim: int, bq: int, bk: int, nk: int) -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    qi, kj = pl.program_id(2), pl.program_id(3)
    masks = _lane_masks(head_dim, bq)

    @pl.when(kj == 0)
    def _start() -> None:
        dq_sc[...] = jnp.zeros(dq_sc.shape, jnp.float32)

    def step() -> None:
        q, k, v, o, do, lse = (r[...] for r in (q_ref, k_ref, v_ref, o_ref, do_ref, lse_ref))
        keep = _causal_keep(qi, kj, bq, bk) if causal else None
        for in_h in masks:
            _, ds = _probabilities_and_dscores(q, k, v, o, do, lse, in_h, scale, keep, bk)
            dq = jax.lax.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)
            dq_sc[...] += jnp.where(in_h, dq, 0.0)

    _each_block(step, causal, qi, kj, bq, bk)

    @pl.when(kj == nk - 1)
    def _finish() -> None:
        dq_ref[...] = dq_sc[...].astype(dq_ref.dtype)


def backward(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, *, head_dim: int, scale: float, causal: bool,
             bq: int, bk: int, width: int, offsets: tuple[int, int, int] = (0, 0, 0)) -> tuple[Any, Any, Any]:
    """(dq, dk, dv), [B, T, width] each in its input's dtype, from the forward's output and
    log-sum-exp (q, k, v as :func:`forward` takes them)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    batch, q_len = q.shape[:2]
    kv_len = k.shape[1]
    groups = width // LANES

    def inputs(query_major: bool) -> list[Any]:
        return [_spec(bq, query_major, True, offsets[0]), _spec(bk, query_major, False, offsets[1]),
                _spec(bk, query_major, False, offsets[2])] + [_spec(bq, query_major, True, 0)] * 3

    key_block = _spec(bk, False, False, 0)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, scale=scale, causal=causal, head_dim=head_dim, bq=bq, bk=bk, nq=q_len // bq),
        grid=(batch, groups, kv_len // bk, q_len // bq),
        in_specs=inputs(False),
        out_specs=[key_block, key_block],
        out_shape=[jax.ShapeDtypeStruct((batch, kv_len, width), x.dtype) for x in (k, v)],
        scratch_shapes=[pltpu.VMEM((bk, LANES), jnp.float32)] * 2,
        compiler_params=_params(),
        name=f"flash_lanes_bwd_dkv_{bq}x{bk}",
    )(q, k, v, o, do, lse)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, scale=scale, causal=causal, head_dim=head_dim, bq=bq, bk=bk, nk=kv_len // bk),
        grid=(batch, groups, q_len // bq, kv_len // bk),
        in_specs=inputs(True),
        out_specs=_spec(bq, True, True, 0),
        out_shape=jax.ShapeDtypeStruct((batch, q_len, width), q.dtype),
        scratch_shapes=[pltpu.VMEM((bq, LANES), jnp.float32)],
        compiler_params=_params(),
        name=f"flash_lanes_bwd_dq_{bq}x{bk}",
    )(q, k, v, o, do, lse)
    return dq, dk, dv
