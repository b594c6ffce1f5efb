"""One rank of tests/test_distributed.py: ``python tests/dist_worker.py SCENARIO RANK WORLD INIT_FILE``.

Each scenario runs torch.distributed on tpu tensors in a process of its own (its own emulated
device) and checks the results; a failed check exits non-zero with the reasons on stderr. The
eager mode comes from the environment (TORCH_TPU_DEFER_AND_FUSE, TORCH_TPU_LAUNCH_BLOCKING).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

TIMEOUT = timedelta(seconds=60)
failures: list[str] = []


def check(name: str, got: object, want: object, rtol: float = 0.0, atol: float = 0.0) -> None:
    """``got`` (tpu results) equal to ``want`` (the reference): dtypes, shapes, values."""
    got_list = got if isinstance(got, (list, tuple)) else [got]
    want_list = want if isinstance(want, (list, tuple)) else [want]
    try:
        assert len(got_list) == len(want_list), f"{len(got_list)} results, want {len(want_list)}"
        for g, w in zip(got_list, want_list):
            if isinstance(w, torch.Tensor):
                assert isinstance(g, torch.Tensor) and g.device.type == "tpu", f"not a tpu tensor: {g!r}"
                torch.testing.assert_close(g.cpu(), w, rtol=rtol, atol=atol, equal_nan=True)
            else:
                assert g == w, f"{g!r} != {w!r}"
    except AssertionError as e:
        failures.append(f"{name}: {e}")


def data(rank: int, shape: tuple[int, ...], dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Rank-specific values, small integers (exact in every dtype; products stay in range)."""
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_complex:
        return torch.complex(torch.randint(-4, 5, shape, generator=g).float(),
                             torch.randint(-4, 5, shape, generator=g).float()).to(dtype)
    return torch.randint(-4, 5, shape, generator=g).to(dtype)


# -- collectives ---------------------------------------------------------------------------------

FLOAT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG"]
INT_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
ref_group: dist.ProcessGroup | None = None


def on_both(name: str, fn, rtol: float = 0.0) -> None:
    """Run ``fn(device, group)`` with tpu tensors on the tpu_dist group and with CPU tensors on a
    gloo group; the tpu results must equal gloo's."""
    try:
        want = fn("cpu", ref_group)
        got = fn("tpu", None)
    except Exception:  # noqa: BLE001  (every check runs; the failures are reported together)
        failures.append(f"{name}: {traceback.format_exc()}")
        return
    check(name, got, want, rtol=rtol)
    if os.environ.get("TORCH_TPU_DEFER_AND_FUSE") == "1":
        from torchtpu.engine import deferred

        # a collective is a materialization point: nothing it read is left recorded
        if deferred.has_pending():
            failures.append(f"{name}: ops still recorded after the collective in DeferAndFuse")


def produced(t: torch.Tensor, device: str) -> torch.Tensor:
    """``t`` on ``device``, as the result of device work (so a collective has work to wait for)."""
    x = t.to(device)
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return x * 1 + 0
    return x.clone()


def scenario_collectives(rank: int, world: int) -> None:
    global ref_group
    ref_group = dist.new_group(backend="gloo")
    assert dist.get_backend() == "tpu_dist", dist.get_backend()
    info = torch.tpu.distributed_info()
    check("distributed_info", [info["backend"], info["transport"], info["world_size"], info["rank"]],
          ["tpu_dist", "gloo-host-staged", world, rank])

    for dtype, ops in ((torch.float32, FLOAT_OPS), (torch.bfloat16, FLOAT_OPS), (torch.int64, INT_OPS),
                       (torch.bool, ["SUM", "MIN", "MAX", "BAND", "BOR"])):
        for op in ops:
            def allreduce(device, group, dtype=dtype, op=op):
                x = produced(data(rank, (3, 5), dtype), device)
                dist.all_reduce(x, op=getattr(dist.ReduceOp, op), group=group)
                return x
            on_both(f"all_reduce {dtype} {op}", allreduce)

    # dtypes Gloo lacks: int16 reduces in int32, complex sums on the real view
    for op in INT_OPS:
        x = produced(data(rank, (4,), torch.int16), "tpu")
        dist.all_reduce(x, op=getattr(dist.ReduceOp, op))
        want = data(rank, (4,), torch.int32)
        dist.all_reduce(want, op=getattr(dist.ReduceOp, op), group=ref_group)
        check(f"all_reduce int16 {op}", x, want.to(torch.int16))
    z = produced(data(rank, (3,), torch.complex64), "tpu")
    dist.all_reduce(z)
    check("all_reduce complex64 SUM", z, sum(data(r, (3,), torch.complex64) for r in range(world)))

    def allreduce_async(device, group):
        x = produced(data(rank, (7,), torch.float32), device)
        work = dist.all_reduce(x, async_op=True, group=group)
        assert work.wait() and work.is_completed()
        fut = work.get_future().wait()
        return [x, fut[0]]
    on_both("all_reduce async_op", allreduce_async)

    # a non-contiguous view, written back in place (Gloo itself takes only contiguous tensors)
    base = produced(data(rank, (4, 6), torch.float32), "tpu")
    dist.all_reduce(base[:, ::2])
    want = data(rank, (4, 6), torch.float32)
    want[:, ::2] = sum(data(r, (4, 6), torch.float32) for r in range(world))[:, ::2]
    check("all_reduce of a strided view", base, want)

    def allreduce_scalar_and_empty(device, group):
        s, e = produced(data(rank, (), torch.float32), device), torch.empty(0, 3, device=device)
        dist.all_reduce(s, group=group)
        dist.all_reduce(e, group=group)
        return [s, e]
    on_both("all_reduce 0-dim and empty", allreduce_scalar_and_empty)

    def allreduce_matmul(device, group):
        a = data(rank, (64, 64), torch.float32).to(device)
        with torch.tpu.precision("highest"):
            x = a @ a @ a  # launched asynchronously: the collective must wait for it
        dist.all_reduce(x, group=group)
        return x
    on_both("all_reduce of a matmul's result", allreduce_matmul, rtol=1e-6)

    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        for src in range(world):
            def broadcast(device, group, dtype=dtype, src=src):
                x = produced(data(rank, (2, 3), dtype), device)
                dist.broadcast(x, src=src, group=group)
                return x
            on_both(f"broadcast {dtype} from {src}", broadcast)

        for op in ("SUM", "MAX"):
            def reduce(device, group, dtype=dtype, op=op):
                x = produced(data(rank, (5,), dtype), device)
                dist.reduce(x, dst=world - 1, op=getattr(dist.ReduceOp, op), group=group)
                return x
            on_both(f"reduce {dtype} {op}", reduce)

        def all_gather(device, group, dtype=dtype):
            outs = [torch.zeros(2, 3, dtype=dtype, device=device) for _ in range(world)]
            dist.all_gather(outs, produced(data(rank, (2, 3), dtype), device), group=group)
            return outs
        on_both(f"all_gather {dtype}", all_gather)

        def all_gather_into_tensor(device, group, dtype=dtype):
            out = torch.zeros(world * 4, dtype=dtype, device=device)
            dist.all_gather_into_tensor(out, produced(data(rank, (4,), dtype), device), group=group)
            return out
        on_both(f"all_gather_into_tensor {dtype}", all_gather_into_tensor)

        def reduce_scatter(device, group, dtype=dtype):
            out = torch.zeros(3, dtype=dtype, device=device)
            ins = [produced(data(rank, (3,), dtype, salt=r), device) for r in range(world)]
            dist.reduce_scatter(out, ins, group=group)
            return out
        on_both(f"reduce_scatter {dtype}", reduce_scatter)

        def reduce_scatter_tensor(device, group, dtype=dtype):
            out = torch.zeros(2, 3, dtype=dtype, device=device)
            dist.reduce_scatter_tensor(out, produced(data(rank, (2 * world, 3), dtype), device),
                                       op=dist.ReduceOp.MAX, group=group)
            return out
        on_both(f"reduce_scatter_tensor {dtype}", reduce_scatter_tensor)

        def all_to_all_single(device, group, dtype=dtype):
            # uneven: rank r sends r + 1 + j rows to rank j
            in_splits = [rank + 1 + j for j in range(world)]
            out_splits = [r + 1 + rank for r in range(world)]
            x = produced(data(rank, (sum(in_splits), 2), dtype), device)
            out = torch.zeros(sum(out_splits), 2, dtype=dtype, device=device)
            dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
            return out
        on_both(f"all_to_all_single uneven {dtype}", all_to_all_single)

        def all_to_all(device, group, dtype=dtype):
            ins = [produced(data(rank, (2, 3), dtype, salt=j), device) for j in range(world)]
            outs = [torch.zeros(2, 3, dtype=dtype, device=device) for r in range(world)]
            dist.all_to_all(outs, ins, group=group)
            return outs
        on_both(f"all_to_all {dtype}", all_to_all)

        # uneven sizes, which Gloo's own list all_to_all refuses: rank r sends r + 1 + j values to j
        ins = [produced(data(rank, (rank + 1 + j,), dtype, salt=j), "tpu") for j in range(world)]
        outs = [torch.zeros(r + 1 + rank, dtype=dtype, device="tpu") for r in range(world)]
        dist.all_to_all(outs, ins)
        check(f"all_to_all uneven {dtype}", outs, [data(r, (r + 1 + rank,), dtype, salt=rank) for r in range(world)])

        def gather(device, group, dtype=dtype):
            outs = [torch.zeros(3, dtype=dtype, device=device) for _ in range(world)] if rank == 0 else None
            dist.gather(produced(data(rank, (3,), dtype), device), outs, dst=0, group=group)
            return outs or []
        on_both(f"gather {dtype}", gather)

        def scatter(device, group, dtype=dtype):
            src = world - 1
            ins = [produced(data(rank, (4,), dtype, salt=r), device) for r in range(world)] if rank == src else None
            out = torch.zeros(4, dtype=dtype, device=device)
            dist.scatter(out, ins, src=src, group=group)
            return out
        on_both(f"scatter {dtype}", scatter)

    # movement collectives take dtypes Gloo lacks as bytes
    for dtype in (torch.int16, torch.complex64, torch.float64):
        outs = [torch.zeros(2, 2, dtype=dtype, device="tpu") for _ in range(world)]
        dist.all_gather(outs, produced(data(rank, (2, 2), dtype), "tpu"))
        check(f"all_gather {dtype}", outs, [data(r, (2, 2), dtype) for r in range(world)])
        x = produced(data(rank, (3,), dtype), "tpu")
        dist.broadcast(x, src=1)
        check(f"broadcast {dtype}", x, data(1, (3,), dtype))

    # point to point, in pairs (0, 1), (2, 3), ...
    peer = rank ^ 1
    if rank % 2 == 0:
        dist.send(produced(data(rank, (6,), torch.float32), "tpu"), dst=peer)
    else:
        got = torch.zeros(6, device="tpu")
        dist.recv(got, src=peer)
        check("send/recv", got, data(peer, (6,), torch.float32))
    outgoing = produced(data(rank, (5,), torch.int64), "tpu")
    incoming = torch.zeros(5, dtype=torch.int64, device="tpu")
    # each rank receives first: this deadlocks unless the operations are truly asynchronous
    works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, incoming, peer), dist.P2POp(dist.isend, outgoing, peer)])
    for w in works:
        w.wait()
    check("batch_isend_irecv", incoming, data(peer, (5,), torch.int64))
    if rank == 1:
        dist.send(produced(data(1, (2,), torch.float32), "tpu"), dst=0)
    elif rank == 0:
        got = torch.zeros(2, device="tpu")
        sender = dist.recv(got)  # from any source
        check("recv from any source", [got, sender], [data(1, (2,), torch.float32), 1])

    dist.barrier()

    # subgroups: every rank, and rank 1 alone
    pair = dist.new_group([0, 1])
    alone = dist.new_group([1])
    x = produced(data(rank, (3,), torch.float32), "tpu")
    dist.all_reduce(x, group=pair)  # (a rank outside the group: nothing happens)
    check("new_group all_reduce", x, sum(data(r, (3,), torch.float32) for r in (0, 1)) if rank < 2 else
          data(rank, (3,), torch.float32))
    mine, _ = dist.new_subgroups(group_size=2)  # (0, 1), (2, 3), ...
    z = produced(data(rank, (2,), torch.float32), "tpu")
    dist.all_reduce(z, group=mine)
    check("new_subgroups all_reduce", z, sum(data(r, (2,), torch.float32) for r in (rank & ~1, rank | 1)))
    if rank == 1:
        y = produced(data(rank, (3,), torch.float32), "tpu")
        dist.all_reduce(y, group=alone)
        check("one-rank group", [y, torch.tpu.distributed_info(alone)["world_size"]],
              [data(rank, (3,), torch.float32), 1])

    # the coalesced forms (FSDP's all-gathers and reduce-scatters of several tensors at once),
    # called on the group as c10d's coalescing manager does
    pg = dist.group.WORLD
    ins = [produced(data(rank, (2, 3), torch.float32, salt=k), "tpu") for k in range(2)]
    outs = [torch.empty(world * 2, 3, device="tpu") for _ in range(2)]
    from torch._C._distributed_c10d import AllgatherOptions, ReduceScatterOptions

    opts = AllgatherOptions()
    pg.allgather_into_tensor_coalesced(outs, ins, opts).wait()
    check("allgather_into_tensor_coalesced", outs,
          [torch.cat([data(r, (2, 3), torch.float32, salt=k) for r in range(world)]) for k in range(2)])
    ins = [produced(data(rank, (world * 2,), torch.float32, salt=k), "tpu") for k in range(2)]
    outs = [torch.empty(2, device="tpu") for _ in range(2)]
    ropts = ReduceScatterOptions()
    ropts.reduceOp = dist.ReduceOp.SUM
    pg.reduce_scatter_tensor_coalesced(outs, ins, ropts).wait()
    check("reduce_scatter_tensor_coalesced", outs,
          [sum(data(r, (world * 2,), torch.float32, salt=k) for r in range(world))[2 * rank:2 * rank + 2]
           for k in range(2)])

    # objects (staged through CPU tensors on the same group) and functional collectives (DTensor's)
    objs: list[object] = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    check("all_gather_object", objs, [{"rank": r} for r in range(world)])
    import torch.distributed._functional_collectives as fc

    y = fc.all_reduce(produced(data(rank, (4,), torch.float32), "tpu"), "sum", dist.group.WORLD)
    check("functional all_reduce", fc.wait_tensor(y) * 1, sum(data(r, (4,), torch.float32) for r in range(world)))
    z = fc.all_gather_tensor(produced(data(rank, (2,), torch.float32), "tpu"), 0, dist.group.WORLD)
    check("functional all_gather_tensor", fc.wait_tensor(z) * 1,
          torch.cat([data(r, (2,), torch.float32) for r in range(world)]))


# -- initialization paths ------------------------------------------------------------------------

def scenario_init_device_id(rank: int, world: int) -> None:
    """init_process_group() with device_id only (TORCH_TPU_NUM_DEVICES=world: rank r uses tpu:r)
    picks tpu_dist; init_device_mesh("tpu") builds on it."""
    from torch.distributed.device_mesh import init_device_mesh

    check("backend picked for device_id", dist.get_backend(), "tpu_dist")
    device = torch.device("tpu", rank)
    x = data(rank, (3,), torch.float32).to(device)
    dist.all_reduce(x)
    check("device tpu:rank", [x.device, x], [device, sum(data(r, (3,), torch.float32) for r in range(world))])
    mesh = init_device_mesh("tpu", (world,))
    group = mesh.get_group()
    check("init_device_mesh backend", [dist.get_backend(group), torch.tpu.distributed_info(group)["transport"]],
          ["tpu_dist", "gloo-host-staged"])
    y = data(rank, (2,), torch.float32).to(device)
    dist.all_reduce(y, group=group, op=dist.ReduceOp.MAX)
    check("device mesh all_reduce", [y.device, y],
          [device, torch.maximum(*[data(r, (2,), torch.float32) for r in range(world)])])


def scenario_init_default(rank: int, world: int) -> None:
    """init_process_group() with no backend and no device: the accelerator (tpu) picks tpu_dist
    (c10d records the group's backend as "undefined", as it does for cuda's nccl)."""
    info = torch.tpu.distributed_info()
    check("backend picked for the accelerator", [info["backend"], info["transport"]], ["tpu_dist", "gloo-host-staged"])
    x = torch.full((2,), float(rank + 1), device="tpu")
    dist.all_reduce(x)
    check("all_reduce", x, torch.full((2,), float(sum(range(1, world + 1)))))


# -- DDP -----------------------------------------------------------------------------------------

def scenario_ddp(rank: int, world: int) -> None:
    """DDP on 2 ranks (half the batch each) against one process training on the whole batch."""
    from torchtpu.examples.gpt import GPT, GPTConfig, make_batch

    cfg = GPTConfig(vocab=32, seq=8, d_model=16, heads=2, layers=1)
    with torch.tpu.precision("highest"):
        torch.manual_seed(0)
        reference = GPT(cfg).to("tpu")
        torch.manual_seed(rank)  # rank 1 starts elsewhere: DDP's construction broadcasts rank 0's
        model = GPT(cfg).to("tpu")
        compiled = os.environ.get("TORCH_TPU_TEST_COMPILE") == "1"
        # several buckets in eager; compiled, Dynamo's DDPOptimizer splits the graph at buckets and
        # wants none smaller than the first (1 MB)
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1 if compiled else 0.01)
        run = torch.compile(ddp, backend="tpu") if compiled else ddp
        check("parameters broadcast at construction", [p.detach() for p in model.parameters()],
              [p.detach().cpu() for p in reference.parameters()])
        opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
        gen = torch.Generator().manual_seed(42)
        per_rank = 2
        for step in range(3):
            idx, tgt = make_batch(cfg, per_rank * world, gen)
            idx, tgt = idx.to("tpu"), tgt.to("tpu")
            mine = slice(rank * per_rank, (rank + 1) * per_rank)
            opt.zero_grad()
            logits = run(idx[mine])
            torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), tgt[mine].reshape(-1)).backward()
            opt.step()
            ref_opt.zero_grad()
            reference.loss(idx, tgt).backward()
            ref_opt.step()
            check(f"DDP step {step} parameters", [p.detach() for p in model.parameters()],
                  [p.detach().cpu() for p in reference.parameters()], rtol=1e-5, atol=1e-6)


def _same_two_gpts(cfg):
    """A GPT on tpu to train in one process, and the same GPT to parallelize."""
    from torchtpu.examples.gpt import GPT

    torch.manual_seed(0)
    reference = GPT(cfg).to("tpu")
    torch.manual_seed(0)
    return reference, GPT(cfg).to("tpu")


# -- FSDP2 ---------------------------------------------------------------------------------------

def scenario_fsdp2(rank: int, world: int) -> None:
    """FSDP2 (``fully_shard`` per block and at the root: parameters sharded as DTensors, gathered
    for forward and backward, gradients reduce-scattered) on 2 ranks, half the batch each, against
    one process training on the whole batch."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from torchtpu.examples.gpt import GPTConfig, make_batch

    cfg = GPTConfig(vocab=32, seq=8, d_model=16, heads=2, layers=2)
    with torch.tpu.precision("highest"):
        reference, model = _same_two_gpts(cfg)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        shards = [p for p in model.parameters() if isinstance(p, DTensor)]
        check("every parameter sharded", len(shards), len(list(model.parameters())))
        check("shards live on tpu", {p.to_local().device.type for p in shards}, {"tpu"})
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
        gen = torch.Generator().manual_seed(42)
        per_rank = 2
        for step in range(3):
            idx, tgt = make_batch(cfg, per_rank * world, gen)
            idx, tgt = idx.to("tpu"), tgt.to("tpu")
            mine = slice(rank * per_rank, (rank + 1) * per_rank)
            opt.zero_grad()
            model.loss(idx[mine], tgt[mine]).backward()
            opt.step()
            ref_opt.zero_grad()
            reference.loss(idx, tgt).backward()
            ref_opt.step()
            check(f"FSDP2 step {step} parameters", [p.full_tensor().detach() for p in model.parameters()],
                  [p.detach().cpu() for p in reference.parameters()], rtol=1e-5, atol=1e-6)


def scenario_fsdp2_llama(rank: int, world: int) -> None:
    """FSDP2 of a tiny Hugging Face Llama (each decoder layer and the root), one row of the batch
    per rank, against one process on the whole batch: the same losses and parameters."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from torchtpu.conformance import model_zoo

    with torch.tpu.precision("highest"):
        torch.manual_seed(0)
        reference, (_, batch), _ = model_zoo.HF_MODELS["llama"]()
        torch.manual_seed(0)
        model, _, _ = model_zoo.HF_MODELS["llama"]()
        reference, model = reference.to("tpu"), model.to("tpu")
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        check("every parameter sharded", all(isinstance(p, DTensor) for p in model.parameters()), True)
        rows = batch["input_ids"].shape[0]
        batch = {k: v.to("tpu") for k, v in batch.items()}
        mine = {k: v[rank * rows // world:(rank + 1) * rows // world] for k, v in batch.items()}
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
        for step in range(2):
            opt.zero_grad()
            loss = model(**mine).loss
            loss.backward()
            opt.step()
            ref_opt.zero_grad()
            with torch.no_grad():
                ref_loss = reference(**mine).loss
            reference(**batch).loss.backward()
            ref_opt.step()
            check(f"Llama FSDP2 step {step} loss", loss.detach(), ref_loss.cpu(), rtol=1e-5, atol=1e-6)
            check(f"Llama FSDP2 step {step} parameters", [p.full_tensor().detach() for p in model.parameters()],
                  [p.detach().cpu() for p in reference.parameters()], rtol=1e-4, atol=1e-6)


# -- DTensor and distributed checkpoints -----------------------------------------------------------

def scenario_dtensor_dcp(rank: int, world: int) -> None:
    """DTensor on a ``tpu`` device mesh (distribute, compute, redistribute) against the same
    computation on CPU, and a distributed checkpoint of sharded state saved and loaded back."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("tpu", (world,))
    check("mesh device type", mesh.device_type, "tpu")
    with torch.tpu.precision("highest"):
        torch.manual_seed(0)  # the same full tensors on every rank
        a, w = torch.randn(8, 6), torch.randn(6, 4)
        da = distribute_tensor(a.to("tpu"), mesh, [Shard(0)])
        dw = distribute_tensor(w.to("tpu"), mesh, [Replicate()])
        check("local shard", da.to_local(), a.chunk(world)[rank])
        out = torch.relu(da @ dw) + 1
        check("sharded result's placement", out.placements, (Shard(0),))
        check("redistributed to replicate", out.redistribute(mesh, [Replicate()]).to_local(),
              torch.relu(a @ w) + 1, rtol=1e-6, atol=1e-6)
        total = distribute_tensor(a.to("tpu"), mesh, [Shard(1)]).sum()  # a partial sum reduced
        check("sum of a column-sharded tensor", total.full_tensor(), a.sum(), rtol=1e-6, atol=1e-5)
        path = sys.argv[4] + ".ckpt"  # the init file's name: shared by the ranks, new per test
        dcp.save({"a": da, "w": dw}, checkpoint_id=path)
        back = {"a": distribute_tensor(torch.zeros(8, 6, device="tpu"), mesh, [Shard(0)]),
                "w": distribute_tensor(torch.zeros(6, 4, device="tpu"), mesh, [Replicate()])}
        dcp.load(back, checkpoint_id=path)
        check("checkpoint round trip", [back["a"].full_tensor(), back["w"].to_local()], [a, w])


# -- tensor parallelism, 2-D (FSDP x TP), and resharded checkpoints ---------------------------------

def _tp_plan() -> dict:
    """Megatron-style plan for one GPT block: the MLP's first layer column-sharded and its second
    row-sharded (one all-reduce); the attention's fused qkv column-sharded with its output gathered
    (the heads are split from it), its projection row-sharded."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"fc": ColwiseParallel(), "out": RowwiseParallel(),
            "qkv": ColwiseParallel(output_layouts=Replicate()), "proj": RowwiseParallel(input_layouts=Replicate())}


def _train_against_reference(model, reference, cfg, shard_of_batch, steps: int = 3) -> None:
    """SGD steps of ``model`` on its part of each batch and of ``reference`` on the whole batch:
    the same losses and parameters after each step."""
    from torch.distributed.tensor import DTensor

    from torchtpu.examples.gpt import make_batch

    # (not foreach: tensor parallelism leaves a mix of DTensor and plain parameters, which PyTorch's
    # foreach kernels refuse on any device)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, foreach=False)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(42)
    for step in range(steps):
        idx, tgt = (t.to("tpu") for t in make_batch(cfg, 4, gen))
        mine = shard_of_batch(4)
        opt.zero_grad()
        loss = model.loss(idx[mine], tgt[mine])
        loss.backward()
        opt.step()
        ref_opt.zero_grad()
        ref_loss = reference.loss(idx[mine], tgt[mine])  # the loss of the same rows, before the step
        reference.loss(idx, tgt).backward()
        ref_opt.step()
        check(f"step {step} loss", loss.detach(), ref_loss.detach().cpu(), rtol=1e-5, atol=1e-6)
        full = [p.full_tensor() if isinstance(p, DTensor) else p for p in model.parameters()]
        check(f"step {step} parameters", [p.detach() for p in full],
              [p.detach().cpu() for p in reference.parameters()], rtol=1e-5, atol=1e-6)


def scenario_tensor_parallel(rank: int, world: int) -> None:
    """ColwiseParallel / RowwiseParallel on every block's MLP and attention on a (world,) tpu
    mesh, every rank on the whole batch, against one process."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    from torchtpu.examples.gpt import GPTConfig

    cfg = GPTConfig(vocab=32, seq=8, d_model=16, heads=2, layers=2)
    mesh = init_device_mesh("tpu", (world,))
    with torch.tpu.precision("highest"):
        reference, model = _same_two_gpts(cfg)
        for block in model.blocks:
            parallelize_module(block, mesh, _tp_plan())
        fc = model.blocks[0].fc.weight
        check("fc weight is a row-sharded DTensor on tpu", (isinstance(fc, DTensor), fc.to_local().device.type,
              tuple(fc.to_local().shape)), (True, "tpu", (4 * cfg.d_model // world, cfg.d_model)))
        _train_against_reference(model, reference, cfg, lambda n: slice(0, n))


def scenario_fsdp_tp(rank: int, world: int) -> None:
    """2-D parallelism on a (2, world / 2) tpu mesh: tensor parallelism inside each block on the
    "tp" dimension, FSDP2 over the "dp" dimension (each dp rank on its half of the batch)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from torchtpu.examples.gpt import GPTConfig

    cfg = GPTConfig(vocab=32, seq=8, d_model=16, heads=2, layers=2)
    mesh = init_device_mesh("tpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    dp = mesh["dp"].get_local_rank()
    with torch.tpu.precision("highest"):
        reference, model = _same_two_gpts(cfg)
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], _tp_plan())
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        _train_against_reference(model, reference, cfg, lambda n: slice(dp * n // 2, (dp + 1) * n // 2))


def _checkpoint_state(world: int) -> tuple[dict, dict]:
    """The state a checkpoint holds (full tensors, the same on every rank) and, for this world,
    empty DTensors sharded over it to load into."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.manual_seed(0)
    full = {"a": torch.randn(12, 6), "w": torch.randn(6, 4), "b": torch.randn(5)}
    mesh = init_device_mesh("tpu", (world,))
    places = {"a": [Shard(0)], "w": [Shard(1)], "b": [Replicate()]}
    empty = {k: distribute_tensor(torch.zeros_like(v).to("tpu"), mesh, places[k]) for k, v in full.items()}
    return full, empty


def scenario_dcp_save(rank: int, world: int) -> None:
    """Save sharded state from ``world`` ranks (then loaded by scenario_dcp_load on other worlds)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import distribute_tensor

    full, empty = _checkpoint_state(world)
    state = {k: distribute_tensor(v.to("tpu"), e.device_mesh, e.placements) for (k, v), e in
             zip(full.items(), empty.values())}
    dcp.save(state, checkpoint_id=os.environ["TORCH_TPU_TEST_CHECKPOINT"])


def scenario_dcp_load(rank: int, world: int) -> None:
    """Load a checkpoint saved on another number of ranks: resharded to this world's shards."""
    import torch.distributed.checkpoint as dcp

    full, state = _checkpoint_state(world)
    dcp.load(state, checkpoint_id=os.environ["TORCH_TPU_TEST_CHECKPOINT"])
    check(f"loaded on {world} ranks, full", [state[k].full_tensor() for k in full], list(full.values()))
    check(f"loaded on {world} ranks, this rank's shard of a", state["a"].to_local(), full["a"].chunk(world)[rank])


# -- MPMD: ranks running different code -----------------------------------------------------------

def scenario_mpmd(rank: int, world: int) -> None:
    """Rank 0 evaluates and logs every other step (ops and reads rank 1 never runs) between the
    collectives both make; then a 2-stage pipeline, each rank one stage of a small MLP, sends
    activations forward and their gradients back. Nothing hangs (in DeferAndFuse each rank's
    recorded work differs until the collective materializes it); results equal one process's."""
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(8, 8, generator=gen)
    x = torch.randn(4, 8, generator=gen)
    torch.set_float32_matmul_precision("highest")  # products as the CPU reference's
    state = x.to("tpu")
    logged = []
    for step in range(4):
        state = torch.tanh(state @ w.to("tpu")) + rank  # each rank's own work
        if rank == 0 and step % 2 == 0:  # evaluation only rank 0 does, with reads
            logged.append(round(float((state * state).mean().item()), 4))
        total = state.clone()
        dist.all_reduce(total)
        want = sum(_mpmd_state(x, w, r, step) for r in range(world))
        check(f"mpmd step {step} all_reduce", total, want, rtol=1e-5, atol=1e-5)
        state = total / world
    check("mpmd evaluation ran on rank 0 only", len(logged), 2 if rank == 0 else 0)

    # pipeline: rank 0 holds layer 1, rank 1 layer 2 and the loss
    w1, w2 = torch.randn(8, 16, generator=gen), torch.randn(16, 3, generator=gen)
    xb, yb = torch.randn(6, 8, generator=gen), torch.randint(0, 3, (6,), generator=gen)
    ref = [w1.clone().requires_grad_(), w2.clone().requires_grad_()]
    ref_loss = torch.nn.functional.cross_entropy(torch.relu(xb @ ref[0]) @ ref[1], yb)
    ref_loss.backward()
    with torch.tpu.precision("highest"):
        if rank == 0:
            p1 = w1.to("tpu").requires_grad_()
            h = torch.relu(xb.to("tpu") @ p1)
            dist.send(h.detach(), dst=1)
            grad_h = torch.empty_like(h)
            dist.recv(grad_h, src=1)
            h.backward(grad_h)
            check("pipeline stage 1 gradient", p1.grad, ref[0].grad, rtol=1e-5, atol=1e-6)
        elif rank == 1:
            h = torch.empty(6, 16, device="tpu")
            dist.recv(h, src=0)
            h.requires_grad_()
            p2 = w2.to("tpu").requires_grad_()
            loss = torch.nn.functional.cross_entropy(h @ p2, yb.to("tpu"))
            loss.backward()
            dist.send(h.grad, dst=0)
            check("pipeline loss", loss.detach(), ref_loss.detach(), rtol=1e-5, atol=1e-6)
            check("pipeline stage 2 gradient", p2.grad, ref[1].grad, rtol=1e-5, atol=1e-6)


def _mpmd_state(x: torch.Tensor, w: torch.Tensor, rank: int, step: int) -> torch.Tensor:
    """Rank ``rank``'s state after ``step`` + 1 rounds of the MPMD loop, on the CPU (all ranks
    average their states each round, so each round starts from the same mean)."""
    state = x
    for s in range(step + 1):
        mine = [torch.tanh(state @ w) + r for r in range(2)]
        if s == step:
            return mine[rank]
        state = sum(mine) / 2
    raise AssertionError("unreachable")


# -- failure -------------------------------------------------------------------------------------

def scenario_dead_peer(rank: int, world: int) -> None:
    """A peer that died makes a collective raise (Gloo sees the closed connection), not hang."""
    x = torch.ones(4, device="tpu")
    dist.all_reduce(x)  # the connection is up
    if rank == 1:
        sys.stdout.flush()
        os._exit(0)  # dies without destroying the group
    time.sleep(1.0)
    start = time.monotonic()
    try:
        dist.all_reduce(x)
    except RuntimeError as e:
        print(f"raised after {time.monotonic() - start:.1f} s: {str(e)[:200]}")
        return
    failures.append("all_reduce with a dead peer returned")


def scenario_mismatch(rank: int, world: int) -> None:
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL, collectives that differ between ranks (shape, dtype,
    kind) raise on every rank, as c10d's wrapper makes them raise for Gloo and NCCL, instead of
    hanging or mixing data; a matching collective afterwards still works."""
    cases = {
        "shape": lambda: dist.all_reduce(torch.ones(4 + rank, device="tpu")),
        "dtype": lambda: dist.all_reduce(torch.ones(4, device="tpu", dtype=torch.float32 if rank else torch.int64)),
        "kind": lambda: dist.all_reduce(torch.ones(4, device="tpu")) if rank else dist.broadcast(
            torch.ones(4, device="tpu"), src=0),
    }
    for name, call in cases.items():
        try:
            call()
            torch.tpu.synchronize()
        except RuntimeError as e:
            if "mismatch" not in str(e).lower() and "detected" not in str(e).lower():
                failures.append(f"{name}: raised without naming the mismatch: {str(e)[:300]}")
            print(f"{name} mismatch raised: {str(e).splitlines()[0][:160]}")
        else:
            failures.append(f"{name} mismatch did not raise")
    x = torch.full((3,), float(rank + 1), device="tpu")
    dist.all_reduce(x)
    check("after the mismatches, all_reduce", x, torch.full((3,), float(sum(range(1, world + 1)))))


def main() -> None:
    scenario, rank, world, init_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    init = f"file://{init_file}"
    if scenario == "init_device_id":
        dist.init_process_group(init_method=init, rank=rank, world_size=world, timeout=TIMEOUT,
                                device_id=torch.device("tpu", rank))
    elif scenario == "init_default":
        dist.init_process_group(init_method=init, rank=rank, world_size=world, timeout=TIMEOUT)
    else:
        dist.init_process_group("tpu_dist", init_method=init, rank=rank, world_size=world,
                                timeout=timedelta(seconds=20) if scenario == "dead_peer" else TIMEOUT)
    globals()[f"scenario_{scenario}"](rank, world)
    if scenario != "dead_peer":
        dist.barrier()
        dist.destroy_process_group()
    if failures:
        print(f"rank {rank}: {len(failures)} failed checks:\n" + "\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"rank {rank}: ok")


if __name__ == "__main__":
    main()
