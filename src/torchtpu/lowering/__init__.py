"""ATen -> StableHLO lowerings, one module per op family (importing fills the registry)."""

from . import elementwise, foreach, indexing, matmul, normalization, random_ops, reductions, shape  # noqa: F401
