"""histogram and histogramdd: host kernels over device ops, with CPU's checks and edges.

The outer edges come from ``range`` or from the data's per-dimension min and max (read
back, as CPU's kernel reads them), widened by 1/2 each way where they coincide; the
inner edges are ``linspace`` between them. Each element then lands in the bin of
``searchsorted(edges, x, right=True) - 1`` per dimension, the last bin closed on the
right, elements outside the outer edges or NaN left out, as ATen's binary-search and
local-search kernels place them (edges are expected sorted, as PyTorch documents). The
counts (or weights) are summed by ``index_add`` on the device; ``density`` divides by
the total and by each bin's widths.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .meta_checks import scalar_type_name
from .registry import register_host_kernel

aten = torch.ops.aten


def _g(v: float) -> str:
    return format(v, "g")  # C++'s default ostream format for doubles


def _outer_edges(x2d: torch.Tensor, rng: Sequence[float] | None) -> tuple[list[float], list[float]]:
    """ATen's select_outer_bin_edges for x2d (M, N)."""
    n = x2d.shape[-1]
    lo, hi = [0.0] * n, [1.0] * n
    if rng is not None:
        if len(rng) != 2 * n:
            raise RuntimeError(f"torch.histogramdd: for a {n}-dimensional histogram range should have {2 * n} "
                               f"elements, but got {len(rng)}")
        lo, hi = [float(v) for v in rng[0::2]], [float(v) for v in rng[1::2]]
    elif x2d.numel() > 0:
        mins, maxs = torch.aminmax(x2d, dim=0)
        lo, hi = mins.double().tolist(), maxs.double().tolist()
    for d in range(n):
        if not (math.isfinite(lo[d]) and math.isfinite(hi[d])):
            raise RuntimeError(f"torch.histogramdd: dimension {d}'s range [{_g(lo[d])}, {_g(hi[d])}] is not finite")
        if lo[d] > hi[d]:
            raise RuntimeError(f"torch.histogramdd: min should not exceed max, but got min {_g(lo[d])} max "
                               f"{_g(hi[d])} for dimension {d}")
        if lo[d] == hi[d]:
            lo[d], hi[d] = lo[d] - 0.5, hi[d] + 0.5
    return lo, hi


def _check_floating(x: torch.Tensor) -> None:
    """CPU's kernels dispatch over floating types only (half types are computed here)."""
    if not x.dtype.is_floating_point:
        raise NotImplementedError(f"\"histogramdd\" not implemented for '{scalar_type_name(x.dtype)}'")


def _check_bin_counts(bins: Sequence[int]) -> None:
    for d, b in enumerate(bins):
        if b <= 0:
            raise RuntimeError(f"torch.histogram(): bins must be > 0, but got {b} for dimension {d}")


def _linspace_edges(x: torch.Tensor, lo: Sequence[float], hi: Sequence[float],
                    bins: Sequence[int]) -> list[torch.Tensor]:
    """Per dimension, bins + 1 equally spaced edges from lo to hi, in x's dtype (CPU's linspace_out)."""
    return [torch.linspace(lo[d], hi[d], bins[d] + 1, dtype=x.dtype, device=x.device) for d in range(len(bins))]


def _check_inputs(x: torch.Tensor, edges: Sequence[torch.Tensor], weight: torch.Tensor | None) -> None:
    """ATen's histogramdd_check_inputs."""
    if x.dim() < 2:
        raise RuntimeError(f"torch.histogramdd: input tensor should have at least 2 dimensions, but got {x.dim()}")
    n = x.shape[-1]
    if len(edges) != n:
        raise RuntimeError(f"torch.histogramdd: expected {n} sequences of bin edges for a {n}-dimensional "
                           f"histogram but got {len(edges)}")
    for d, e in enumerate(edges):
        if e.dtype != x.dtype:
            raise RuntimeError(f"torch.histogramdd: input tensor and bins tensors should have the same dtype, but got "
                               f"input with dtype {x.dtype} and bins for dimension {d} with dtype {e.dtype}")
        if e.dim() != 1:
            raise RuntimeError(f"torch.histogramdd: bins tensor should have one dimension, but got {e.dim()} "
                               f"dimensions in the bins tensor for dimension {d}")
        if e.numel() == 0:
            raise RuntimeError(f"torch.histogramdd: bins tensor should have at least 1 element, but got 0 elements "
                               f"in the bins tensor for dimension {d}")
    if weight is not None:
        if weight.dtype != x.dtype:
            raise RuntimeError("torch.histogramdd: if weight tensor is provided, input tensor and weight tensor "
                               f"should have the same dtype, but got input({x.dtype}), and weight({weight.dtype})")
        want = list(x.shape[:-1])
        got = list(weight.shape) or [1]
        if want != got:
            raise RuntimeError("torch.histogramdd: if weight tensor is provided it should have the same shape as the "
                               f"input tensor excluding its innermost dimension, but got input with shape "
                               f"{list(x.shape)} and weight with shape {list(weight.shape)}")


def _counts(x: torch.Tensor, edges: Sequence[torch.Tensor], weight: torch.Tensor | None,
            density: bool) -> torch.Tensor:
    """The histogram of x (..., N) over per-dimension edges (checked)."""
    n = x.shape[-1]
    x2d = x.reshape(-1, n)
    sizes = [e.numel() - 1 for e in edges]
    flat = torch.zeros(x2d.shape[0], dtype=torch.int64, device=x.device)
    inside = torch.ones(x2d.shape[0], dtype=torch.bool, device=x.device)
    for d, e in enumerate(edges):
        col = x2d[:, d].contiguous()
        nb = max(sizes[d], 1)
        inside = inside & (col >= e[0]) & (col <= e[-1])  # NaN fails both
        pos = torch.searchsorted(e.contiguous(), col, right=True) - 1
        pos = pos.clamp(0, nb - 1)  # the right edge closes the last bin
        flat = flat * nb + pos
    w = weight.reshape(-1) if weight is not None else torch.ones(x2d.shape[0], dtype=x.dtype, device=x.device)
    w = torch.where(inside, w, torch.zeros_like(w))
    total = math.prod(sizes)
    hist = torch.zeros(total, dtype=x.dtype, device=x.device)
    if total:
        hist = hist.index_add(0, torch.where(inside, flat, torch.zeros_like(flat)), w)
    hist = hist.reshape(sizes)
    if density:
        hist = hist / hist.sum()
        for d, e in enumerate(edges):
            shape = [1] * n
            shape[d] = sizes[d]
            hist = hist / e.diff().reshape(shape)
    return hist


@register_host_kernel(aten.histogram.bin_ct)
def histogram_bin_ct(x: torch.Tensor, bins: int = 100, *, range: Sequence[float] | None = None,
                     weight: torch.Tensor | None = None, density: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    _check_floating(x)
    x2d = x.reshape(-1, 1)
    _check_bin_counts([bins])
    edges = _linspace_edges(x2d, *_outer_edges(x2d, range), [bins])
    w = weight.reshape(-1) if weight is not None else None
    _check_inputs(x2d, edges, w)
    return _counts(x2d, edges, w, density), edges[0]


@register_host_kernel(aten.histogram.bins_tensor)
def histogram_bins_tensor(x: torch.Tensor, bins: torch.Tensor, *, weight: torch.Tensor | None = None,
                          density: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    _check_floating(x)
    x2d = x.reshape(-1, 1)
    w = weight.reshape(-1) if weight is not None else None
    _check_inputs(x2d, [bins], w)
    return _counts(x2d, [bins], w, density), bins.clone()


def _bin_edges(x: torch.Tensor, bins: Sequence[int], rng: Sequence[float] | None) -> list[torch.Tensor]:
    if x.dim() < 2:
        raise RuntimeError("torch.histogramdd: input tensor should have at least 2 dimensions")
    x2d = x.reshape(-1, x.shape[-1])
    lo, hi = _outer_edges(x2d, rng)
    if len(bins) != x.shape[-1]:
        raise RuntimeError("histogramdd: The size of bins must be equal to the innermost dimension of the input.")
    _check_bin_counts(bins)
    return _linspace_edges(x, lo, hi, bins)


@register_host_kernel(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(x: torch.Tensor, bins: Sequence[int], *, range: Sequence[float] | None = None,
                          weight: torch.Tensor | None = None, density: bool = False) -> list[torch.Tensor]:
    _check_floating(x)
    return _bin_edges(x, bins, range)


@register_host_kernel(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(x: torch.Tensor, bins: Sequence[int], *,
                             range: Sequence[float] | None = None,
                             weight: torch.Tensor | None = None, density: bool = False) -> torch.Tensor:
    _check_floating(x)
    edges = _bin_edges(x, bins, range)
    _check_inputs(x, edges, weight)
    return _counts(x, edges, weight, density)


@register_host_kernel(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(x: torch.Tensor, bins: Sequence[torch.Tensor], *,
                                 weight: torch.Tensor | None = None, density: bool = False) -> torch.Tensor:
    _check_floating(x)
    _check_inputs(x, bins, weight)
    return _counts(x, bins, weight, density)
