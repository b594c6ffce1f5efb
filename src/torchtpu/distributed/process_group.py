"""``TpuProcessGroup``: the process group of the ``tpu_dist`` backend.

c10d's extension point for a backend written in Python is a subclass of ``ProcessGroup`` (its
``Backend`` class has no Python constructor): c10d's ``_new_process_group_helper`` then uses the
object as the whole group, for every device, and C++ callers (DDP's reducer, functional
collectives) reach its methods through PyTorch's ``PyProcessGroup`` trampoline. Each group owns a
``ProcessGroupGloo`` created over the same (prefixed) store, rank, size and timeout, and runs
every collective on it through host staging (``staging.py``): the Gloo group's timeout is the
group's, and a dead peer makes Gloo raise instead of hanging.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)

from . import BACKEND_NAME, TRANSPORT
from .staging import Staged
from .untraced import untraced
from .work import StagedWork, completed

Tensors = list[torch.Tensor]


@untraced
class BackendFacts:
    """What c10d asks of a group's per-device backend (``pg._get_backend(device)``), answered for
    a Python group that has none: no communicator splitting (``split_group`` and eager NCCL-style
    connection are skipped), no coalescing, no backend-allocated tensors."""

    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False

    def __init__(self, group: TpuProcessGroup) -> None:
        self._group = group

    def name(self) -> str:
        return BACKEND_NAME

    def supports_tensor_alloc(self, device: torch.device) -> bool:
        return False

    def rank(self) -> int:
        return self._group.rank()

    def size(self) -> int:
        return self._group.size()


@untraced
class TpuProcessGroup(dist.ProcessGroup):
    """A c10d process group of tpu (and CPU) tensors whose collectives Gloo runs on host copies."""

    transport = TRANSPORT

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self.timeout = timeout
        self._group_name = self._group_desc = ""
        # The Gloo group's store is the same prefixed store c10d gave this group, so groups made
        # by new_group never see each other's keys.
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        if dist.get_debug_level() == dist.DebugLevel.DETAIL:
            # c10d wraps Gloo and NCCL groups, not a Python group, in its collective checker (each
            # collective's kind, shapes and dtypes compared across ranks first, over a helper Gloo
            # group): wrapping the Gloo group the host copies go through gives tpu_dist the same
            # checks. Without it a shape mismatch aborted the process inside Gloo.
            self._gloo = dist.distributed_c10d._create_process_group_wrapper(
                self._gloo, BACKEND_NAME, store, rank, size, timeout)

    @classmethod
    def from_backend_options(cls, dist_options: Any, backend_options: Any = None) -> TpuProcessGroup:
        """The creator of ``Backend.register_backend(..., extended_api=True)``."""
        return cls(dist_options.store, dist_options.group_rank, dist_options.group_size, dist_options.timeout)

    # -- identity ---------------------------------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    # c10d's ProcessGroup keeps a group's name and description in its per-device backends, which
    # a Python group has none of: kept here (functional collectives find groups by name).
    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return self._group_desc

    def _get_backend(self, device: torch.device | str) -> BackendFacts:
        return BackendFacts(self)

    @property
    def _device_types(self) -> list[torch.device]:
        return [torch.device("tpu"), torch.device("cpu")]

    def __repr__(self) -> str:
        return f"TpuProcessGroup(rank={self._rank}, size={self._size}, transport={self.transport!r})"

    # -- helpers ----------------------------------------------------------------------------------

    def _run(self, staged: Staged, launch: Callable[[], dist.Work], result: Any) -> dist.Work:
        """Start a Gloo collective on staged host tensors; its results reach the device tensors
        when the Work is waited on (c10d waits at once for a synchronous call; ``async_op=True``
        lets the exchange, on Gloo's threads, overlap the device work that follows)."""
        return StagedWork(launch(), staged.finish, result)

    # -- collectives ------------------------------------------------------------------------------

    def allreduce(self, tensors: Tensors, opts: AllreduceOptions) -> dist.Work:
        s = Staged(opts.reduceOp)
        hosts = s.hosts(tensors)
        return self._run(s, lambda: self._gloo.allreduce(hosts, opts), tensors)

    def allreduce_coalesced(self, tensors: Tensors,
                            opts: AllreduceCoalescedOptions) -> dist.Work:
        s = Staged(opts.reduceOp)
        hosts = s.hosts(tensors)
        # Gloo's coalesced allreduce needs one dtype; tensors of several dtypes go one by one.
        if len({h.dtype for h in hosts}) <= 1:
            return self._run(s, lambda: self._gloo.allreduce_coalesced(hosts, opts), tensors)
        for h in hosts:
            one = AllreduceOptions()
            one.reduceOp, one.timeout = opts.reduceOp, opts.timeout
            self._gloo.allreduce([h], one).wait()
        s.finish()
        return completed(tensors)

    def broadcast(self, tensors: Tensors, opts: BroadcastOptions) -> dist.Work:
        s = Staged()
        # the root's tensors are only read: nothing comes back to them
        hosts = s.hosts(tensors, written=self._rank != opts.rootRank)
        return self._run(s, lambda: self._gloo.broadcast(hosts, opts), tensors)

    def reduce(self, tensors: Tensors, opts: ReduceOptions) -> dist.Work:
        s = Staged(opts.reduceOp)
        hosts = s.hosts(tensors)
        return self._run(s, lambda: self._gloo.reduce(hosts, opts), tensors)

    def _gather_lists(self, gloo_op: Callable[..., dist.Work], output_lists: list[Tensors],
                      input_tensors: Tensors, opts: AllgatherOptions) -> dist.Work:
        s = Staged()
        ins = s.hosts(input_tensors, written=False)
        outs = [s.outputs(o) for o in output_lists]
        return self._run(s, lambda: gloo_op(outs, ins, opts), output_lists)

    def allgather(self, output_tensors: list[Tensors], input_tensors: Tensors,
                  opts: AllgatherOptions) -> dist.Work:
        return self._gather_lists(self._gloo.allgather, output_tensors, input_tensors, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: AllgatherOptions) -> dist.Work:
        s = Staged()
        h_in, h_out = s.host(input, written=False), s.output(output)
        return self._run(s, lambda: self._gloo._allgather_base(h_out, h_in, opts), [output])

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists: list[Tensors], input_tensors: Tensors,
                            opts: AllgatherOptions) -> dist.Work:
        return self._gather_lists(self._gloo.allgather_coalesced, output_lists, input_tensors, opts)

    def _pairwise(self, s: Staged, outputs: Tensors, inputs: Tensors, single: Any, opts: Any) -> dist.Work:
        """A coalesced call as one Gloo call per (output, input) pair: Gloo has no coalesced form."""
        pairs = [(s.output(o), s.host(i, written=False)) for o, i in zip(outputs, inputs)]
        for h_out, h_in in pairs:
            single(h_out, h_in, opts).wait()
        s.finish()
        return completed(outputs)

    def all_gather_single_coalesced(self, outputs: Tensors, inputs: Tensors,
                                    opts: AllgatherOptions) -> dist.Work:
        return self._pairwise(Staged(), outputs, inputs, self._gloo._allgather_base, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors: Tensors, input_lists: list[Tensors],
                       opts: ReduceScatterOptions) -> dist.Work:
        s = Staged(opts.reduceOp)
        ins = [s.hosts(i, written=False) for i in input_lists]
        outs = s.outputs(output_tensors)
        return self._run(s, lambda: self._gloo.reduce_scatter(outs, ins, opts), output_tensors)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: ReduceScatterOptions) -> dist.Work:
        s = Staged(opts.reduceOp)
        h_in, h_out = s.host(input, written=False), s.output(output)
        return self._run(s, lambda: self._gloo._reduce_scatter_base(h_out, h_in, opts), [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: Tensors, inputs: Tensors,
                                        opts: ReduceScatterOptions) -> dist.Work:
        return self._pairwise(Staged(opts.reduceOp), outputs, inputs, self._gloo._reduce_scatter_base, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall(self, output_tensors: Tensors, input_tensors: Tensors,
                 opts: AllToAllOptions) -> dist.Work:
        # Gloo's list all_to_all takes equal sizes only; NCCL's any. As one all_to_all_single of
        # the flattened tensors, uneven sizes work here too.
        s = Staged()
        flat_in = torch.cat([h.reshape(-1) for h in s.hosts(input_tensors, written=False)])
        flat_out = torch.empty(sum(o.numel() for o in output_tensors), dtype=flat_in.dtype)
        for o, part in zip(output_tensors, flat_out.split([o.numel() for o in output_tensors])):
            s.gloo_view(part.view(o.shape), written_into=o)
        h_in, h_out = s.gloo_view(flat_in), s.gloo_view(flat_out)
        in_splits, out_splits = [t.numel() for t in input_tensors], [t.numel() for t in output_tensors]
        return self._run(s, lambda: self._gloo.alltoall_base(h_out, h_in, out_splits, in_splits, opts),
                         output_tensors)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: AllToAllOptions) -> dist.Work:
        s = Staged()
        h_in, h_out = s.host(input, written=False), s.output(output)
        return self._run(s, lambda: self._gloo.alltoall_base(h_out, h_in, output_split_sizes,
                                                             input_split_sizes, opts), [output])

    alltoall_base = all_to_all_single

    def gather(self, output_lists: list[Tensors], input_tensors: Tensors,
               opts: GatherOptions) -> dist.Work:
        s = Staged()
        ins = s.hosts(input_tensors, written=False)
        outs = [s.outputs(o) for o in output_lists]  # empty on ranks other than the root
        return self._run(s, lambda: self._gloo.gather(outs, ins, opts), output_lists)

    def scatter(self, output_tensors: Tensors, input_lists: list[Tensors],
                opts: ScatterOptions) -> dist.Work:
        s = Staged()
        ins = [s.hosts(i, written=False) for i in input_lists]  # empty on ranks other than the root
        outs = s.outputs(output_tensors)
        return self._run(s, lambda: self._gloo.scatter(outs, ins, opts), output_tensors)

    def barrier(self, opts: BarrierOptions) -> dist.Work:
        # A barrier orders host-side progress; like gloo's (and unlike NCCL's) it does not wait
        # for device work, which a collective on a tensor does where it reads the tensor.
        self._gloo.barrier(opts).wait()
        return completed([])

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        if timeout is None:
            self._gloo.monitored_barrier(wait_all_ranks=wait_all_ranks)
        else:
            self._gloo.monitored_barrier(timeout, wait_all_ranks)

    # -- point to point ---------------------------------------------------------------------------

    def send(self, tensors: Tensors, dstRank: int, tag: int) -> dist.Work:
        s = Staged()
        hosts = s.hosts(tensors, written=False)
        # Not waited here: a send completes when its receiver receives. The host copies live on
        # in the work until then.
        return StagedWork(self._gloo.send(hosts, dstRank, tag), s.finish, tensors)

    def recv(self, tensors: Tensors, srcRank: int, tag: int) -> dist.Work:
        s = Staged()
        hosts = s.outputs(tensors)
        return StagedWork(self._gloo.recv(hosts, srcRank, tag), s.finish, tensors)

    def recv_anysource(self, tensors: Tensors, tag: int) -> dist.Work:
        s = Staged()
        hosts = s.outputs(tensors)
        return StagedWork(self._gloo.recv_anysource(hosts, tag), s.finish, tensors)

    # -- lifetime ---------------------------------------------------------------------------------

    def shutdown(self) -> None:
        self._gloo.shutdown()

    def abort(self) -> None:
        self._gloo.abort()


