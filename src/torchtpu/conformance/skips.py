"""The conformance sweep's one skip list, and the ops compared by metadata only.

SKIPS: entries not run at all, each with the reason. The summary counts every
skipped (op, dtype) as a failure.

METADATA_ONLY: entries whose values cannot match CPU by construction (random
draws from a different generator, uninitialized memory); their outputs are
still checked for device, dtype and shape, and the report says so.
"""

from __future__ import annotations

SKIPS: dict[str, str] = {
}

_RANDOM = "random values (tpu uses XLA's counter-based generator, not CPU's)"
_UNINIT = "uninitialized memory"

METADATA_ONLY: dict[str, str] = {
    "bernoulli": _RANDOM,
    "cauchy": _RANDOM,
    "exponential": _RANDOM,
    "geometric": _RANDOM,
    "log_normal": _RANDOM,
    "multinomial": _RANDOM,
    "normal": _RANDOM,
    "normal.in_place": _RANDOM,
    "normal.number_mean": _RANDOM,
    "uniform": _RANDOM,
    "rand_like": _RANDOM,
    "randn": _RANDOM,
    "randn_like": _RANDOM,
    "randint": _RANDOM,
    "randint_like": _RANDOM,
    "nn.functional.dropout": _RANDOM,
    "nn.functional.dropout2d": _RANDOM,
    "nn.functional.dropout3d": _RANDOM,
    "nn.functional.alpha_dropout": _RANDOM,
    "nn.functional.feature_alpha_dropout.with_train": _RANDOM,
    "nn.functional.rrelu": _RANDOM,
    "nn.functional.fractional_max_pool2d": _RANDOM,
    "nn.functional.fractional_max_pool3d": _RANDOM,
    "svd_lowrank": _RANDOM,
    "pca_lowrank": _RANDOM,
    "empty": _UNINIT,
    "empty_like": _UNINIT,
    "empty_strided": _UNINIT,
    "empty_permuted": _UNINIT,
    "new_empty": _UNINIT,
    "new_empty_strided": _UNINIT,
    "resize_": _UNINIT,
    "resize_as_": _UNINIT,
}

# Entries whose index outputs may legitimately differ from CPU's where values tie
# (CPU's unstable sort / quickselect and XLA's stable sort pick different tied
# positions). Their integer outputs pass when they select the same values of the
# input as CPU's indices do; values are compared exactly as usual.
TIED_INDICES: dict[str, str] = {
    name: "ties may be broken differently; indices must select the same values"
    for name in ("sort", "argsort", "topk", "kthvalue", "median", "nanmedian", "mode", "msort",
                 "masked.median")
}

# Entries whose outputs are unique only up to a gauge (the sign of each eigenvector): their
# forward outputs are compared after the OpInfo's own output_process_fn_grad, which
# removes it (abs of the eigenvectors), as PyTorch's gradient tests compare them.
GAUGE_FREE_OUTPUTS: dict[str, str] = {
    "linalg.eigh": "eigenvectors compared up to sign (abs), as OpInfo's output_process_fn_grad",
    "linalg.svd": "singular vectors compared up to sign (abs, or U @ Vh), as OpInfo's output_process_fn_grad",
    "svd": "singular vectors compared up to sign (abs, or U @ V^H), as OpInfo's output_process_fn_grad",
}

# Entries whose non-input tensor arguments PyTorch requires on the CPU (they are
# sizes, not data); only the input moves to tpu.
HOST_ARGS: dict[str, str] = {
    "tensor_split": "tensor_indices_or_sections must be a CPU tensor",
}
