"""ATen -> StableHLO lowerings, one module per op family (importing fills the registry)."""

from . import (  # noqa: F401
    conv,
    ctc,
    data_dependent,
    elementwise,
    fft,
    foreach,
    grid_sample,
    indexing,
    interpolate,
    linalg,
    matmul,
    meta_checks,
    normalization,
    prims,
    random_ops,
    reductions,
    shape,
    sort,
    special,
    view_ops,
)
