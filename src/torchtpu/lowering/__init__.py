"""ATen -> StableHLO lowerings, one module per op family (importing fills the registry)."""

from . import (  # noqa: F401
    elementwise,
    foreach,
    indexing,
    matmul,
    normalization,
    random_ops,
    reductions,
    shape,
    view_ops,
)
from . import conv, sort  # noqa: F401,E402  (issue 3 families)
