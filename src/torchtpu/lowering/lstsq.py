"""linalg.lstsq: least squares through the SVD, with CPU's checks and output conventions.

A host kernel of ``linalg_lstsq.out`` (the functional op is a composite over it): it checks
the arguments as ATen's kernel does, then computes on the device with tpu ops. The
solution is the minimum-norm one, pinv(A) B, keeping the singular values above rcond
times the largest (LAPACK's gelsd; gelsy's pivoted QR makes the same choice except for
singular values right at the cut-off). Per LAPACK driver, as on CPU: ``rank`` for all
but gels, ``singular_values`` for gelsd and gelss, and ``residuals`` (the squared
residual norms) where m > n and the driver is not gelsy, for gelsd and gelss only when
every matrix has full rank, which is a data-dependent shape and so reads the ranks back.
Products run at full f32 precision, as the decompositions do.
"""

from __future__ import annotations

import torch

from ..engine import precision
from .meta_checks import scalar_type_name
from .registry import register_host_kernel

aten = torch.ops.aten

_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")
def _check(a: torch.Tensor, b: torch.Tensor, driver: str | None) -> bool:
    """ATen's argument checks, in its order; returns whether b is a vector per matrix."""
    if a.dim() < 2:
        raise RuntimeError("torch.linalg.lstsq: input must have at least 2 dimensions.")
    if b.dim() < 1:
        raise RuntimeError("torch.linalg.lstsq: other must have at least 1 dimension.")
    if a.dtype != b.dtype:
        raise RuntimeError("torch.linalg.lstsq: Expected input and other to have the same dtype, but got input's "
                           f"dtype {scalar_type_name(a.dtype)} and other's dtype {scalar_type_name(b.dtype)}")
    if not 0 <= a.dim() - b.dim() <= 1:
        raise RuntimeError("torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and "
                           "(input.dim() - other.dim()) <= 1")
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])
    rows = b.shape[-1] if vector else b.shape[-2]
    if a.shape[-2] != rows:
        raise RuntimeError("torch.linalg.lstsq: input.size(-2) should match other.size("
                           + ("-1)" if vector else "-2)"))
    if driver is not None and driver not in _DRIVERS:
        raise RuntimeError("torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)")
    if not a.dtype.is_floating_point:  # CPU's words; half types, which CPU refuses too, are computed
        raise RuntimeError("This function doesn't handle types other than float and double")
    return vector


def _put(out: torch.Tensor, value: torch.Tensor) -> None:
    out.resize_(value.shape)
    out.copy_(value)


@register_host_kernel(aten.linalg_lstsq.out)
def linalg_lstsq_out(a: torch.Tensor, b: torch.Tensor, rcond: float | None = None, *, driver: str | None = None,
                     solution: torch.Tensor, residuals: torch.Tensor, rank: torch.Tensor,
                     singular_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    vector = _check(a, b, driver)
    driver = driver or "gelsy"
    m, n = a.shape[-2], a.shape[-1]
    eps = torch.finfo(a.dtype).eps
    if driver == "gels":
        cut = 0.0  # QR, which assumes full rank: every nonzero singular value counts
    elif rcond is None:
        cut = eps * max(m, n)
    else:
        cut = eps if rcond < 0 else rcond  # LAPACK: a negative rcond means machine precision
    rhs = b.unsqueeze(-1) if vector else b
    with precision.full_precision():
        u, s, vh = torch.linalg.svd(a, full_matrices=False)
        kept = s > cut * s[..., :1] if s.shape[-1] else s > 0
        inverse = torch.where(kept, 1 / torch.where(kept, s, torch.ones_like(s)), torch.zeros_like(s))
        x = vh.mT @ (inverse.unsqueeze(-1) * (u.mT @ rhs))
        ranks = kept.sum(-1)
        empty_real = s.new_empty((0,))
        resid = empty_real
        if m > n and driver != "gelsy" and (driver == "gels" or bool((ranks == n).all())):
            resid = (a @ x - rhs).pow(2).sum(-2)
    _put(solution, x.squeeze(-1) if vector else x)
    _put(residuals, resid)
    _put(rank, ranks if driver != "gels" else ranks.new_empty((0,)))
    _put(singular_values, s if driver in ("gelsd", "gelss") else empty_real)
    return solution, residuals, rank, singular_values
