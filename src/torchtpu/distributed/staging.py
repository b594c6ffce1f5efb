"""Host staging: the CPU tensors a Gloo collective works on, and their way back to the device.

A tpu tensor is read into a fresh host tensor (``Tensor.cpu()``: the read waits for the work that
produces the tensor in Strict and Debug mode, and is a materialization point in DeferAndFuse),
Gloo works on that host tensor in place, and the result is copied back into the tpu tensor.
CPU tensors are handed to Gloo as they are, so a ``tpu_dist`` group serves them as gloo would.

Gloo knows a fixed set of dtypes. Collectives that only move data take every other dtype as
bytes (bit-exact); reductions widen a dtype Gloo lacks to one where the same arithmetic is exact
modulo the narrow type (int16 in int32), and complex sums run on the real view.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed import ReduceOp

# The dtypes of Gloo's collectives (its GENERATE_ALL_TYPES set), measured with torch 2.13.
GLOO_DTYPES = frozenset({torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                         torch.uint8, torch.int32, torch.int64, torch.bool})
# Reductions of these run in a wider dtype; casting the result back wraps as the narrow type's own
# arithmetic would (two's complement), and MIN/MAX and bitwise ops are exact.
_WIDER_FOR_REDUCTION = {torch.int16: torch.int32}
# Reductions that act on a complex number's real and imaginary parts independently.
_COMPLEX_AS_REAL = ("SUM", "AVG")


def _op_name(op: ReduceOp | ReduceOp.RedOpType) -> str:
    return op.op.name if isinstance(op, ReduceOp) else op.name


class Staged:
    """Host tensors standing in for a collective's tensors, and what to copy back at the end.

    ``host(t)`` gives the tensor Gloo reads (and, in place, writes); ``output(t)`` a host tensor
    Gloo only writes (the device tensor is not read: no wait for its producer); ``finish()``
    copies every written host tensor into its device tensor."""

    def __init__(self, reduce_op: ReduceOp | None = None) -> None:
        self._reduce = None if reduce_op is None else _op_name(reduce_op)
        self._back: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _gloo_view(self, host: torch.Tensor) -> torch.Tensor:
        """The tensor Gloo gets for ``host``: itself, or a view of its memory in a Gloo dtype."""
        dtype = host.dtype
        if dtype in GLOO_DTYPES:
            return host
        if self._reduce is None:
            return as_bytes(host)
        if dtype.is_complex and self._reduce in _COMPLEX_AS_REAL:
            return torch.view_as_real(host)
        return host  # Gloo raises its own error for this dtype and op

    def gloo_view(self, host: torch.Tensor, written_into: torch.Tensor | None = None) -> torch.Tensor:
        """The Gloo tensor for a host tensor the caller made; ``written_into``: the device tensor
        that gets ``host``'s values at ``finish``."""
        if written_into is not None:
            self._back.append((written_into, host))
        return self._gloo_view(host)

    def _host_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return _WIDER_FOR_REDUCTION.get(dtype, dtype) if self._reduce is not None else dtype

    def host(self, t: torch.Tensor, written: bool = True) -> torch.Tensor:
        """The Gloo tensor holding ``t``'s values; copied back into ``t`` at ``finish`` if written."""
        _check_dense(t)
        if t.device.type == "cpu" and t.is_contiguous() and self._host_dtype(t.dtype) == t.dtype:
            return self._gloo_view(t)
        if t.device.type == "cpu":
            host = t.detach().to(self._host_dtype(t.dtype), memory_format=torch.contiguous_format, copy=True)
        else:  # a fresh host tensor; the read waits for t's producer (or materializes it)
            host = t.detach().cpu().to(self._host_dtype(t.dtype)).contiguous()
        if written:
            self._back.append((t, host))
        return self._gloo_view(host)

    def output(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor for Gloo to fill, copied into ``t`` at ``finish``."""
        _check_dense(t)
        if t.device.type == "cpu" and t.is_contiguous() and self._host_dtype(t.dtype) == t.dtype:
            return self._gloo_view(t)
        host = torch.empty(t.shape, dtype=self._host_dtype(t.dtype))
        self._back.append((t, host))
        return self._gloo_view(host)

    def hosts(self, ts: Sequence[torch.Tensor], written: bool = True) -> list[torch.Tensor]:
        return [self.host(t, written) for t in ts]

    def outputs(self, ts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [self.output(t) for t in ts]

    def finish(self) -> None:
        """Copy Gloo's results into the device tensors (in place: views and aliases see them)."""
        back, self._back = self._back, []
        with torch.no_grad():
            for device_tensor, host in back:
                device_tensor.copy_(host)


def as_bytes(host: torch.Tensor) -> torch.Tensor:
    """``host``'s memory as uint8, rows kept: dim 0 stays dim 0, so split sizes along it still hold."""
    rows = host.shape[0] if host.dim() else 1
    per_row = host.numel() // rows if rows else 0
    return host.reshape(rows, per_row).view(torch.uint8)


def _check_dense(t: torch.Tensor) -> None:
    if t.layout != torch.strided:
        raise RuntimeError(f"tpu_dist: only dense (strided) tensors take part in collectives, got {t.layout}")
