"""Work handles of ``tpu_dist`` collectives.

A collective's inputs are read to host memory when it is called; Gloo then exchanges them on its
own threads, and the results reach the device tensors when the Work is waited on
(:class:`StagedWork`), as a cuda tensor written by NCCL is valid once its work is waited on. A
synchronous call (c10d waits at once) sees no difference; ``async_op=True`` overlaps the exchange
with the device work that follows, and point-to-point operations cannot deadlock on each other (a
``batch_isend_irecv`` of two ranks that each receive first). :func:`completed` is the Work of
calls that finished before returning.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from .untraced import untraced


def completed(result: Any) -> dist.Work:
    """A Work that is already complete, whose future holds ``result`` (the collective's tensors)."""
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


@untraced
class StagedWork(dist.Work):
    """A Gloo Work on host tensors and the copy to the device that follows it.

    The copy runs once, on the thread that first waits (or finds the work completed): tpu
    tensors are only ever written by their user's threads, never by Gloo's."""

    def __init__(self, inner: dist.Work, finish: Callable[[], None], result: list[torch.Tensor]) -> None:
        super().__init__()
        self._inner = inner
        self._finish: Callable[[], None] | None = finish
        self._result = result

    def _complete(self) -> None:
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        # Gloo's timeout (the group's, or this call's) applies: a dead peer raises here.
        self._inner.wait(timeout) if timeout else self._inner.wait()
        self._complete()
        return True

    def is_completed(self) -> bool:
        if self._finish is not None and self._inner.is_completed():
            self._complete()
        return self._finish is None

    def is_success(self) -> bool:
        return self.is_completed() and self._inner.is_success()

    def exception(self) -> Any:
        return self._inner.exception()

    def get_future(self) -> torch.futures.Future:
        self.wait()
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._result)
        return future

    def _source_rank(self) -> int:
        """The sender of a receive from any source (``dist.recv(t)`` without ``src``)."""
        return self._inner._source_rank()
