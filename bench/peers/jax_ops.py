"""JAX peer of the per-op overhead workload: a chain of tiny dependent elementwise ops."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp


def chain(x: jax.Array, n: int) -> jax.Array:
    """``n`` dependent ops, alternating ``* 1.0001`` and ``+ 0.0001`` (the torch side runs the same)."""
    for _ in range(n // 2):
        x = x * 1.0001
        x = x + 0.0001
    return x


def op_by_op(shape: tuple[int, ...], n: int) -> Callable[[], None]:
    """One run of the chain with every op dispatched on its own (no jit), then a wait for the result."""
    x0 = jnp.ones(shape, jnp.float32)
    return lambda: chain(x0, n).block_until_ready()


def jitted(shape: tuple[int, ...], n: int) -> Callable[[], None]:
    """The whole chain as one jitted program (XLA fuses it): the floor that fusion can reach."""
    x0 = jnp.ones(shape, jnp.float32)
    f = jax.jit(partial(chain, n=n))
    return lambda: f(x0).block_until_ready()
