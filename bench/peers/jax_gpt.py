"""JAX peer of ``torchtpu.examples.gpt``: the same pre-LayerNorm GPT, op for op, and PyTorch's AdamW.

Parameters live in a flat dict keyed by the torch model's ``state_dict`` names, in torch's layouts
(a Linear weight is ``(out, in)`` and is applied as ``x @ w.T``), so a torch checkpoint loads with
``{k: jnp.asarray(v.numpy()) for k, v in sd.items()}`` and the two models can be compared exactly.

Op for op with the torch model (``GPT.forward`` / ``GPT.loss``):
- token embedding + learned positional embedding (no scaling), no dropout (the demo's is 0.0);
- per block: ``x + proj(causal_attention(qkv(ln1(x))))`` then ``x + out(gelu(fc(ln2(x))))``;
  attention as ``F.scaled_dot_product_attention(is_causal=True)``: scale ``1/sqrt(head_dim)``;
  GELU is the exact (erf) form, torch's default; LayerNorm eps 1e-5 with affine weight and bias;
- final LayerNorm, then an untied ``head`` Linear without bias; loss = mean cross-entropy.
Initialisation follows torch's defaults in distribution (not bit for bit): embeddings N(0, 1),
Linear weight and bias U(-1/sqrt(in), 1/sqrt(in)), LayerNorm ones and zeros.

``compute_dtype=jnp.bfloat16`` mirrors ``torch.autocast(dtype=torch.bfloat16)``: Linear layers take
bf16 inputs and give bf16 outputs (accumulated in f32 by the MXU), while LayerNorm, the softmax and
the loss run in float32, and the residual stream stays float32 (f32 + bf16 promotes to f32 in both).

``flash=True`` computes the causal attention with JAX's Pallas TPU flash-attention kernel
(``jax.experimental.pallas.ops.tpu.flash_attention``) as torchtpu's SDPA does
(``torchtpu.flash_attention``): the same block sizes, float32 operands entering as bfloat16. Off a
TPU the kernel runs in Pallas' interpret mode (Mosaic lowers for TPUs only).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Params = dict[str, jax.Array]

LN_EPS = 1e-5  # nn.LayerNorm's default
FLASH_BLOCK = 512  # torchtpu.flash_attention.BLOCK_Q and BLOCK_K: the same kernel grid on both sides


@dataclass(frozen=True)
class GPTConfig:
    """Mirrors ``torchtpu.examples.gpt.GPTConfig`` (kept separate so a JAX worker never imports torch)."""

    vocab: int = 256
    seq: int = 64
    d_model: int = 128
    heads: int = 4
    layers: int = 2


def init_params(cfg: GPTConfig, seed: int = 0) -> Params:
    """Parameters with torch's default initialisation distributions, under torch's state_dict names."""
    rng = np.random.default_rng(seed)
    d = cfg.d_model
    p: dict[str, np.ndarray] = {
        "tok.weight": rng.standard_normal((cfg.vocab, d)),
        "pos.weight": rng.standard_normal((cfg.seq, d)),
    }

    def linear(name: str, n_in: int, n_out: int, bias: bool = True) -> None:
        bound = 1.0 / math.sqrt(n_in)  # kaiming_uniform(a=sqrt(5)) reduces to this bound
        p[f"{name}.weight"] = rng.uniform(-bound, bound, (n_out, n_in))
        if bias:
            p[f"{name}.bias"] = rng.uniform(-bound, bound, (n_out,))

    def layer_norm(name: str) -> None:
        p[f"{name}.weight"] = np.ones(d)
        p[f"{name}.bias"] = np.zeros(d)

    for i in range(cfg.layers):
        b = f"blocks.{i}"
        layer_norm(f"{b}.ln1")
        linear(f"{b}.qkv", d, 3 * d)
        linear(f"{b}.proj", d, d)
        layer_norm(f"{b}.ln2")
        linear(f"{b}.fc", d, 4 * d)
        linear(f"{b}.out", 4 * d, d)
    layer_norm("ln")
    linear("head", d, cfg.vocab, bias=False)
    return {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}


def param_count(params: Params) -> int:
    return sum(int(v.size) for v in params.values())


def make_batch(cfg: GPTConfig, batch: int, seed: int = 0) -> tuple[jax.Array, jax.Array]:
    """The torch example's synthetic task: each sequence counts upward modulo the vocabulary."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, cfg.vocab, (batch, 1))
    seq = (start + np.arange(cfg.seq + 1)) % cfg.vocab
    return jnp.asarray(seq[:, :-1], jnp.int32), jnp.asarray(seq[:, 1:], jnp.int32)


# ---------------------------------------------------------------------------------------------
# the model


def _linear(p: Params, name: str, x: jax.Array, cd: Any) -> jax.Array:
    w, b = p[f"{name}.weight"], p.get(f"{name}.bias")
    if cd is not None:  # autocast: bf16 operands and result, bias added in bf16 like addmm
        x, w = x.astype(cd), w.astype(cd)
        b = None if b is None else b.astype(cd)
    y = x @ w.T
    return y if b is None else y + b


def _layer_norm(p: Params, name: str, x: jax.Array) -> jax.Array:
    x = x.astype(jnp.float32)  # autocast runs layer_norm in float32
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)  # biased variance, as torch
    return (x - mean) * lax.rsqrt(var + LN_EPS) * p[f"{name}.weight"] + p[f"{name}.bias"]


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """softmax(q k^T / sqrt(hd) masked) v; scores and softmax in float32, the product in v's dtype."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    s = jnp.where(mask, s, -jnp.inf)
    return jax.nn.softmax(s, axis=-1).astype(v.dtype) @ v


def _flash_block(length: int) -> int:
    """torchtpu's block edge along a length (``flash_attention._edge``): 512 clipped to the length
    if it divides it, else 128 (which divides every length the kernel takes beyond 128)."""
    edge = min(FLASH_BLOCK, length)
    return edge if length % edge == 0 else min(128, length)


def _flash_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal ``softmax(q k^T / sqrt(hd)) v`` through the Pallas TPU flash kernel. float32 operands
    enter as bfloat16, as torchtpu feeds the kernel at its default "medium" precision (and as XLA's
    default precision multiplies the math path's float32 operands on a TPU: one bf16 pass); scores,
    softmax and accumulation stay float32 inside the kernel."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    bq, bk = _flash_block(q.shape[2]), _flash_block(k.shape[2])
    blocks = fa.BlockSizes(block_q=bq, block_k_major=bk, block_k=bk, block_b=1,
                           block_q_major_dkv=bq, block_k_major_dkv=bk, block_k_dkv=bk, block_q_dkv=bq,
                           block_k_major_dq=bk, block_k_dq=bk, block_q_dq=bq)
    dtype = q.dtype
    if dtype == jnp.float32:
        q, k, v = (z.astype(jnp.bfloat16) for z in (q, k, v))
    out = fa.flash_attention(q, k, v, causal=True, sm_scale=1.0 / math.sqrt(q.shape[-1]), block_sizes=blocks)
    return out.astype(dtype)


def kernel_mode(flash: bool) -> contextlib.AbstractContextManager:
    """Where a jitted function holding the flash kernel is traced (its forward and its backward):
    Pallas' interpret mode off a TPU, since Mosaic lowers for TPUs only."""
    if not flash or jax.default_backend() == "tpu":
        return contextlib.nullcontext()
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.force_tpu_interpret_mode(True)  # True: plain HLO loops, as torchtpu's emulator runs it


def _split_heads(z: jax.Array, heads: int) -> jax.Array:
    b, t, d = z.shape
    return z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3)


def _merge_heads(a: jax.Array) -> jax.Array:
    b, h, t, hd = a.shape
    return a.transpose(0, 2, 1, 3).reshape(b, t, h * hd)


def _mlp(p: Params, blk: str, x: jax.Array, cd: Any) -> jax.Array:
    h = jax.nn.gelu(_linear(p, f"{blk}.fc", _layer_norm(p, f"{blk}.ln2", x), cd), approximate=False)
    return _linear(p, f"{blk}.out", h, cd)


def forward(p: Params, idx: jax.Array, cfg: GPTConfig, compute_dtype: Any = None, flash: bool = False) -> jax.Array:
    """Logits ``(batch, seq, vocab)`` of ``GPT.forward`` (``flash``: attention by the Pallas kernel)."""
    t = idx.shape[1]
    x = p["tok.weight"][idx] + p["pos.weight"][jnp.arange(t)]
    causal = jnp.tril(jnp.ones((t, t), bool))
    for i in range(cfg.layers):
        blk = f"blocks.{i}"
        qkv = _linear(p, f"{blk}.qkv", _layer_norm(p, f"{blk}.ln1", x), compute_dtype)
        q, k, v = (_split_heads(z, cfg.heads) for z in jnp.split(qkv, 3, axis=-1))
        a = _flash_attention(q, k, v) if flash else _attention(q, k, v, causal)
        x = x + _linear(p, f"{blk}.proj", _merge_heads(a), compute_dtype)
        x = x + _mlp(p, blk, x, compute_dtype)
    return _linear(p, "head", _layer_norm(p, "ln", x), compute_dtype)


def loss_fn(p: Params, x: jax.Array, y: jax.Array, cfg: GPTConfig, compute_dtype: Any = None,
            flash: bool = False) -> jax.Array:
    """``GPT.loss``: mean cross-entropy over every position (computed in float32)."""
    logits = forward(p, x, cfg, compute_dtype, flash).astype(jnp.float32)
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
    return (logz - picked).mean()


# ---------------------------------------------------------------------------------------------
# AdamW exactly as torch.optim.AdamW's single-tensor path with its defaults


def adamw_init(params: Params) -> dict[str, Any]:
    # m and v must be distinct buffers: the train step donates both
    return {"step": jnp.zeros((), jnp.int32), "m": jax.tree.map(jnp.zeros_like, params),
            "v": jax.tree.map(jnp.zeros_like, params)}


def adamw_update(params: Params, grads: Params, state: dict[str, Any], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01) -> tuple[Params, dict[str, Any]]:
    """One AdamW step: decoupled decay ``p *= 1 - lr*wd`` on every parameter (torch decays all of
    ``model.parameters()``, biases and LayerNorm too), then the bias-corrected Adam update with
    ``denom = sqrt(v) / sqrt(1 - b2^t) + eps`` and ``step_size = lr / (1 - b1^t)``."""
    b1, b2 = betas
    step = state["step"] + 1
    t = step.astype(jnp.float32)
    step_size = lr / (1 - b1**t)
    bc2_sqrt = jnp.sqrt(1 - b2**t)
    m = jax.tree.map(lambda m, g: m + (g - m) * (1 - b1), state["m"], grads)  # torch: m.lerp_(g, 1 - b1)
    v = jax.tree.map(lambda v, g: v * b2 + (1 - b2) * g * g, state["v"], grads)
    new = jax.tree.map(lambda p, m, v: p * (1 - lr * weight_decay) - step_size * m / (jnp.sqrt(v) / bc2_sqrt + eps),
                       params, m, v)
    return new, {"step": step, "m": m, "v": v}


def make_train_step(cfg: GPTConfig, lr: float, compute_dtype: Any = None, flash: bool = False):
    """A jitted ``(params, opt_state, x, y) -> (params, opt_state, loss)``: forward, grad and AdamW in
    one program; params and optimizer state are donated (updated in place, as torch's are)."""

    @partial(jax.jit, donate_argnums=(0, 1))
    def step(params: Params, opt_state: dict[str, Any], x: jax.Array, y: jax.Array):
        with kernel_mode(flash):  # around value_and_grad: the kernel's backward is traced there too
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y, cfg, compute_dtype, flash)
        params, opt_state = adamw_update(params, grads, opt_state, lr)
        return params, opt_state, loss

    return step


# ---------------------------------------------------------------------------------------------
# greedy decoding with a static KV cache


def init_cache(cfg: GPTConfig, batch: int) -> tuple[list[jax.Array], list[jax.Array]]:
    """Per layer, preallocated K and V of shape ``(batch, heads, seq, head_dim)``."""
    shape = (batch, cfg.heads, cfg.seq, cfg.d_model // cfg.heads)
    return ([jnp.zeros(shape, jnp.float32) for _ in range(cfg.layers)],
            [jnp.zeros(shape, jnp.float32) for _ in range(cfg.layers)])


def make_decode_step(cfg: GPTConfig):
    """A jitted ``(params, ks, vs, tok, pos) -> (next_tok, ks, vs, pos + 1)``: one token per sequence
    through the model, its K/V written at ``pos`` with ``dynamic_update_slice`` (caches donated),
    attention over the whole static cache with positions after ``pos`` masked, greedy argmax."""

    @partial(jax.jit, donate_argnums=(1, 2))
    def step(params: Params, ks: list[jax.Array], vs: list[jax.Array], tok: jax.Array, pos: jax.Array):
        x = (params["tok.weight"][tok] + params["pos.weight"][pos])[:, None, :]  # (batch, 1, d)
        mask = jnp.arange(cfg.seq) <= pos
        at = (jnp.zeros_like(pos),) * 2 + (pos, jnp.zeros_like(pos))  # index types must all agree
        ks, vs = list(ks), list(vs)
        for i in range(cfg.layers):
            blk = f"blocks.{i}"
            qkv = _linear(params, f"{blk}.qkv", _layer_norm(params, f"{blk}.ln1", x), None)
            q, k, v = (_split_heads(z, cfg.heads) for z in jnp.split(qkv, 3, axis=-1))
            ks[i] = lax.dynamic_update_slice(ks[i], k, at)
            vs[i] = lax.dynamic_update_slice(vs[i], v, at)
            x = x + _linear(params, f"{blk}.proj", _merge_heads(_attention(q, ks[i], vs[i], mask)), None)
            x = x + _mlp(params, blk, x, None)
        logits = _linear(params, "head", _layer_norm(params, "ln", x), None)[:, 0]
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), ks, vs, pos + 1

    return step
