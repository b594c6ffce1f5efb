"""torch.distributed on tpu: all_reduce bus bandwidth and DDP scaling of ``tpu_dist`` (issue 41; not a test).

    python bench/distributed.py [--quick] [--max-bytes 268435456] [--world 2] [--skip-ddp]
                                [--out distributed_bench.json] [--timeout 900]
    python bench/distributed.py --worker KIND RANK WORLD INIT_FILE ...   (one rank; started by the above)

Two parts, each run as ``--world`` rank processes of this script (one process per rank, each with
its own ``tpu`` device), rendezvousing through a ``file://`` init_method in a temporary directory
as tests/test_distributed.py does. Rank 0 of each launch reports one ``BENCH_RESULT {json}`` line;
the driver prints the tables and writes the JSON.

1. ``all_reduce``: float32 SUM of 1 KiB .. ``--max-bytes`` (default 256 MiB; ``--quick``: 4 MiB)
   in powers of 4, on tpu tensors over the ``tpu_dist`` group, against the same all_reduce of CPU
   tensors over a Gloo group (``dist.new_group(backend="gloo")``) in the same processes. A rep
   starts after a barrier, runs one all_reduce (messages under 1 MiB: 1 MiB's worth back to back,
   at most 32) and ends when the result is complete (for tpu tensors: after
   ``torch.tpu.synchronize()``); a rep's time is its slowest rank's, per op; the median over reps
   after warmup is reported (the JSON also has the minimum). Bus bandwidth as NCCL-tests define it
   for all_reduce (GB = 1e9 bytes): ``algbw = bytes / time``, ``busbw = algbw * 2 * (n - 1) / n``.
2. ``ddp``: the demo GPT (``torchtpu.examples.gpt`` defaults, as ``gpt_demo`` in bench/tpu.py:
   batch 8 per rank, AdamW lr 3e-3) wrapped in ``DistributedDataParallel`` on tpu, on 1 rank and on
   ``--world`` ranks with the same per-rank batch (weak scaling). Median ms per step (forward,
   backward with DDP's gradient all-reduce, AdamW, ``torch.tpu.synchronize()``) after warmup; the
   ratio world/1 and the scaling efficiency t1/tN (1.0: perfect). The 1-rank launch also times the
   same step without DDP, which shows DDP's own cost on one rank.

The eager mode comes from the environment (``TORCH_TPU_DEFER_AND_FUSE=1`` for DeferAndFuse); the
transport the group used (``torch.tpu.distributed_info()["transport"]``) is printed. On the CPU
emulator every rank's "device" is host memory and the ranks share the host's cores: the figures
say what the staging and Gloo cost there, not what a TPU host would do.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULT_PREFIX = "BENCH_RESULT "
REPO = Path(__file__).resolve().parent.parent
DEFAULT_MAX_BYTES = 256 << 20
QUICK_MAX_BYTES = 4 << 20
DEMO = {"vocab": 256, "seq": 64, "d_model": 128, "heads": 4, "layers": 2}  # bench/tpu.py's gpt_demo
DEMO_BATCH, DEMO_LR = 8, 3e-3


# ---------------------------------------------------------------------------------------------
# sizes and formulas


def message_sizes(max_bytes: int) -> list[int]:
    """1 KiB, 4 KiB, 16 KiB, ... up to ``max_bytes`` (inclusive)."""
    sizes, n = [], 1024
    while n <= max_bytes:
        sizes.append(n)
        n *= 4
    return sizes


def reps_for(nbytes: int) -> tuple[int, int, int]:
    """(warmup, timed reps, ops per rep) for one message size. A rep of a small message runs several
    ops back to back, as NCCL-tests time a loop: one op of a few KiB takes well under a millisecond,
    less than the scheduling jitter of a loaded host and the skew with which ranks leave the barrier
    before it. Large messages get fewer reps: they take seconds each on the emulator, and the 256 MiB
    default run should stay within minutes."""
    ops = min(max((1 << 20) // nbytes, 1), 32)
    if nbytes <= 1 << 20:
        return 2, 15, ops
    if nbytes <= 16 << 20:
        return 2, 10, ops
    return 1, 5, ops


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of an all_reduce of ``nbytes`` taking ``seconds`` on ``world`` ranks,
    as NCCL-tests define them (busbw: what each rank's link carries in a ring all-reduce)."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * 2 * (world - 1) / world


def size_label(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


# ---------------------------------------------------------------------------------------------
# rank workers (import torch only here: the driver never opens a device)


def time_reps(run: Callable[[], None], warmup: int, reps: int, barrier: Callable[[], None]) -> list[float]:
    """Seconds of each of ``reps`` calls of ``run`` after ``warmup`` untimed ones. Every rep starts
    after a barrier, so that it times the operation, not a peer still finishing the previous one."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(reps):
        barrier()
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return times


def slowest_rank(times: list[float], group: Any) -> list[float]:
    """Per rep, the largest time over the ranks: a collective is done when every rank has it."""
    import torch.distributed as dist

    every: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, times, group=group)
    return [max(ts) for ts in zip(*every)]


def worker_all_reduce(world: int, max_bytes: int) -> dict[str, Any]:
    """Median seconds per all_reduce of each size: tpu tensors on tpu_dist, CPU tensors on Gloo."""
    import torch
    import torch.distributed as dist

    gloo = dist.new_group(backend="gloo")  # the CPU reference, and the timing's own barriers and gathers
    rows = []
    for nbytes in message_sizes(max_bytes):
        warmup, reps, ops = reps_for(nbytes)
        # zeros: a SUM repeated in place hundreds of times would take any other values to inf (Gloo
        # and the staging do the same work whatever the values are)
        host = torch.zeros(nbytes // 4)
        x = host.to("tpu")
        torch.tpu.synchronize()

        def on_tpu(x: Any = x, ops: int = ops) -> None:
            for _ in range(ops):
                dist.all_reduce(x)
            torch.tpu.synchronize()  # the copies back into the tpu tensor are done too

        def on_gloo(c: Any = host, ops: int = ops) -> None:
            for _ in range(ops):
                dist.all_reduce(c, group=gloo)

        def barrier() -> None:
            dist.barrier(group=gloo)

        row: dict[str, Any] = {"bytes": nbytes, "warmup": warmup, "reps": reps, "ops_per_rep": ops}
        for name, run in (("tpu", on_tpu), ("gloo_cpu", on_gloo)):
            times = [t / ops for t in slowest_rank(time_reps(run, warmup, reps, barrier), gloo)]
            row[f"{name}_s"] = statistics.median(times)
            row[f"{name}_min_s"] = min(times)
            row[f"{name}_algbw_gbps"], row[f"{name}_busbw_gbps"] = bus_bandwidth(nbytes, row[f"{name}_s"], world)
        row["busbw_ratio"] = row["tpu_busbw_gbps"] / row["gloo_cpu_busbw_gbps"]
        rows.append(row)
        del x, host
    return {"rows": rows}


def worker_ddp(world: int, quick: bool) -> dict[str, Any]:
    """Median ms per DDP training step of the demo GPT on this launch's ``world`` ranks (and, on one
    rank, of the same step without DDP)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from torchtpu.examples.gpt import GPT, GPTConfig, make_batch

    warmup, reps = (3, 10) if quick else (5, 30)
    gloo = dist.new_group(backend="gloo")
    cfg = GPTConfig(**DEMO)
    # each rank its own batch of the same size: weak scaling, the global batch grows with world
    x, y = (t.to("tpu") for t in make_batch(cfg, DEMO_BATCH, torch.Generator().manual_seed(dist.get_rank())))

    def stepper(wrap: bool) -> Callable[[], None]:
        torch.manual_seed(0)
        model = GPT(cfg).to("tpu")
        net = torch.nn.parallel.DistributedDataParallel(model) if wrap else model
        opt = torch.optim.AdamW(model.parameters(), lr=DEMO_LR)

        def step() -> None:
            logits = net(x)
            F.cross_entropy(logits.reshape(-1, cfg.vocab), y.reshape(-1)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.tpu.synchronize()

        return step

    def barrier() -> None:
        dist.barrier(group=gloo)

    def median_ms(step: Callable[[], None]) -> float:
        return statistics.median(slowest_rank(time_reps(step, warmup, reps, barrier), gloo)) * 1e3

    out: dict[str, Any] = {"warmup": warmup, "reps": reps, "batch_per_rank": DEMO_BATCH, "cfg": DEMO,
                           "ddp_step_ms": median_ms(stepper(wrap=True))}
    if world == 1:
        out["no_ddp_step_ms"] = median_ms(stepper(wrap=False))
    return out


def worker_main(kind: str, rank: int, world: int, init_file: str, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    import torchtpu  # noqa: F401  (registers the tpu device and tpu_dist even without backend autoload)

    dist.init_process_group("tpu_dist", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    info = torch.tpu.distributed_info()
    if kind == "all_reduce":
        out = worker_all_reduce(world, args.max_bytes)
    else:
        out = worker_ddp(world, args.quick)
    out.update(world=world, backend=info["backend"], transport=info["transport"],
               platform=torch.tpu.get_device_name(), eager_mode=torch.tpu.get_eager_mode(),
               torch=torch.__version__)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(RESULT_PREFIX + json.dumps(out), flush=True)


# ---------------------------------------------------------------------------------------------
# the driver


def rank_env() -> dict[str, str]:
    env = dict(os.environ)
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    return env


def launch(kind: str, world: int, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    """Run ``kind`` on ``world`` rank processes; rank 0's result. Raises with the failing rank's
    stderr if any rank fails or the launch outlasts ``--timeout``."""
    init_file = os.path.join(tmp, f"{kind}-{world}.init")
    extra = ["--max-bytes", str(args.max_bytes), "--timeout", str(args.timeout)] + (["--quick"] if args.quick else [])
    logs = [(Path(tmp, f"{kind}-{world}-{r}.out"), Path(tmp, f"{kind}-{world}-{r}.err")) for r in range(world)]
    procs = []
    with contextlib.ExitStack() as files:
        for r, (out, err) in enumerate(logs):
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, str(r), str(world), init_file,
                   *extra]
            # files, not pipes: a rank blocked on a full pipe would stall its peers' collectives; its
            # own session: on a timeout the rank goes with its children
            procs.append(subprocess.Popen(cmd, stdout=files.enter_context(out.open("w")),
                                          stderr=files.enter_context(err.open("w")), env=rank_env(), cwd=REPO,
                                          start_new_session=True))
        deadline = time.monotonic() + args.timeout
        try:
            for p in procs:
                p.wait(timeout=max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            pass
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    texts = [(out.read_text(), err.read_text()) for out, err in logs]
    for r, (p, (_, err_text)) in enumerate(zip(procs, texts)):
        if p.returncode != 0:
            raise RuntimeError(f"{kind} on {world} ranks: rank {r} exited with {p.returncode}:\n{err_text[-4000:]}")
    results = [ln[len(RESULT_PREFIX):] for ln in texts[0][0].splitlines() if ln.startswith(RESULT_PREFIX)]
    if not results:
        raise RuntimeError(f"{kind} on {world} ranks: rank 0 printed no result")
    return json.loads(results[-1])


def format_table(head: list[str], body: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [head, *body]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def all_reduce_table(rows: list[dict[str, Any]]) -> str:
    head = ["size", "tpu_dist ms", "tpu busbw GB/s", "gloo-CPU ms", "gloo busbw GB/s", "tpu/gloo"]
    body = [[size_label(r["bytes"]), f"{r['tpu_s'] * 1e3:.3f}", f"{r['tpu_busbw_gbps']:.3f}",
             f"{r['gloo_cpu_s'] * 1e3:.3f}", f"{r['gloo_cpu_busbw_gbps']:.3f}", f"{r['busbw_ratio']:.2f}"]
            for r in rows]
    return format_table(head, body)


def ddp_summary(one: dict[str, Any], many: dict[str, Any]) -> dict[str, Any]:
    t1, tn = one["ddp_step_ms"], many["ddp_step_ms"]
    return {"world": many["world"], "step_ms_world1": t1, f"step_ms_world{many['world']}": tn,
            "no_ddp_step_ms_world1": one.get("no_ddp_step_ms"), "ratio": tn / t1, "efficiency": t1 / tn,
            "batch_per_rank": many["batch_per_rank"], "cfg": many["cfg"], "reps": many["reps"],
            "warmup": many["warmup"]}


def ddp_table(s: dict[str, Any]) -> str:
    n = s["world"]
    head = ["DDP demo GPT", "step ms"]
    body = [["1 rank, no DDP", f"{s['no_ddp_step_ms_world1']:.1f}"], ["1 rank", f"{s['step_ms_world1']:.1f}"],
            [f"{n} ranks", f"{s[f'step_ms_world{n}']:.1f}"],
            [f"ratio {n}/1", f"{s['ratio']:.2f}"], ["efficiency t1/t" + str(n), f"{s['efficiency']:.2f}"]]
    return format_table(head, body)


def meta(args: argparse.Namespace) -> dict[str, Any]:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    return {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "commit": commit,
            "host": platform.node(), "cpus": os.cpu_count(), "argv": sys.argv[1:],
            "torch_tpu_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("TORCH_TPU_")}}


def driver_main(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    out: dict[str, Any] = {"meta": meta(args)}
    with tempfile.TemporaryDirectory(prefix="bench-distributed-") as tmp:
        ar = launch("all_reduce", args.world, args, tmp)
        print(f"all_reduce float32 SUM on {args.world} ranks; tpu_dist transport: {ar['transport']}; "
              f"platform {ar['platform']}; eager mode {ar['eager_mode']}")
        print(all_reduce_table(ar["rows"]))
        print("busbw = bytes / time * 2(n-1)/n (NCCL-tests); time: median over reps of the slowest rank;"
              " tpu/gloo: busbw ratio (>1: tpu_dist faster)\n")
        out["all_reduce"] = ar
        if not args.skip_ddp:
            one = launch("ddp", 1, args, tmp)
            many = launch("ddp", args.world, args, tmp)
            out["ddp"] = {"world1": one, f"world{args.world}": many, "summary": ddp_summary(one, many)}
            print(f"DDP, demo GPT {DEMO}, batch {DEMO_BATCH} per rank, AdamW; transport {many['transport']}")
            print(ddp_table(out["ddp"]["summary"]))
    out["meta"]["total_s"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"\n{out['meta']['total_s']:.0f} s in all; wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2, help="ranks (processes) of the multi-rank runs")
    p.add_argument("--max-bytes", type=int, default=None,
                   help=f"largest all_reduce message (default {DEFAULT_MAX_BYTES}; --quick: {QUICK_MAX_BYTES})")
    p.add_argument("--quick", action="store_true", help="messages up to 4 MiB and fewer DDP steps")
    p.add_argument("--skip-ddp", action="store_true", help="only the all_reduce part")
    p.add_argument("--out", default="distributed_bench.json", help="the JSON results file")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per launch of the ranks")
    p.add_argument("--worker", nargs=4, metavar=("KIND", "RANK", "WORLD", "INIT_FILE"), default=None,
                   help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.max_bytes is None:
        args.max_bytes = QUICK_MAX_BYTES if args.quick else DEFAULT_MAX_BYTES
    if args.world < 2:
        p.error("--world must be at least 2 (the DDP part compares it with 1 rank)")
    if args.worker:
        kind, rank, world, init_file = args.worker
        if kind not in ("all_reduce", "ddp"):
            p.error(f"unknown worker kind {kind!r}")
        worker_main(kind, int(rank), int(world), init_file, args)
        return 0
    return driver_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
