"""Where a training example's step time goes on the device in use: per optimizer step, wall time,
program launches, host time inside PJRT execute, compiles, and device-to-host reads.

    python3 tools/tpu_suite/probe_example_steps.py resnet_amp_channels_last --steps 6
    python3 tools/tpu_suite/probe_example_steps.py dlrm --steps 6

The example (a module of examples/, by name, as tools/run_examples.py names them) runs its own
``main`` with the arguments after its name; every optimizer step ends a row (a global optimizer
step post-hook; a row runs from the previous step's end, so it holds the example's own read of
the loss, its next batch, forward and backward). A step whose wall time is mostly inside execute
is launch-bound (libtpu's cost per launch, or a device that is busy); one with compiles pays them in
its wall time (the examples time steps after the first).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit(__doc__)
    name, example_args = argv[0], argv[1:]
    sys.path[:0] = [os.path.join(ROOT, "examples"), os.path.join(ROOT, "bench")]
    import step_profile  # bench/step_profile.py: counts PJRT executions and the host time in them
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from torchtpu.engine import executor
    from torchtpu.runtime import buffer

    meter = step_profile.LaunchMeter()
    reads = [0]
    to_host = buffer.Buffer.to_host

    def counted_to_host(self: Any, *args: Any, **kwargs: Any) -> Any:
        reads[0] += 1
        return to_host(self, *args, **kwargs)

    buffer.Buffer.to_host = counted_to_host
    rows: list[dict[str, Any]] = []
    # (compiles from the process's count so far: an earlier run in the process is not this one's first step)
    last = {"t": time.perf_counter(), "launches": 0, "exec": 0.0, "compiles": executor.stats.misses, "reads": 0}

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        now = {"t": time.perf_counter(), "launches": meter.count, "exec": meter.seconds,
               "compiles": executor.stats.misses, "reads": reads[0]}
        rows.append({"step": len(rows), "wall_ms": (now["t"] - last["t"]) * 1e3,
                     "launches": now["launches"] - last["launches"],
                     "execute_ms": (now["exec"] - last["exec"]) * 1e3,
                     "compiles": now["compiles"] - last["compiles"], "reads": now["reads"] - last["reads"]})
        last.update(now)

    handle = register_optimizer_step_post_hook(after_step)
    try:
        importlib.import_module(name.replace("/", ".")).main(example_args)
    finally:
        handle.remove()
        buffer.Buffer.to_host = to_host
        meter._cls.execute = meter._execute  # (LaunchMeter wraps every execution of the process)
    print("step | wall ms | launches | ms inside execute | compiles | device-to-host reads")
    for r in rows:
        print(f"{r['step']:4d} | {r['wall_ms']:8.1f} | {r['launches']:8d} | {r['execute_ms']:17.1f} | "
              f"{r['compiles']:8d} | {r['reads']:4d}")
    return rows


if __name__ == "__main__":
    main()
