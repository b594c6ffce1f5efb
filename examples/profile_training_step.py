"""Profile one training step of the demo GPT with torch.profiler: CPU ops and, on the tpu device,
the device time of each launched program (a "tpu:0" row in the trace).

    python examples/profile_training_step.py                 # Strict mode, trace in gpt_step_trace.json
    python examples/profile_training_step.py --mode defer_and_fuse
    python examples/profile_training_step.py --tiny

Open the trace in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from torchtpu.examples.gpt import GPT, GPTConfig, make_batch


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="tpu")
    p.add_argument("--mode", choices=["strict", "debug", "defer_and_fuse"], default="strict")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--trace", default="gpt_step_trace.json")
    p.add_argument("--tiny", action="store_true", help="a 1-layer model (the smoke test)")
    args = p.parse_args(argv)

    torch.manual_seed(0)
    cfg = GPTConfig(layers=1, d_model=64, seq=32) if args.tiny else GPTConfig()
    model = GPT(cfg).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.Generator().manual_seed(0)

    def step() -> float:
        x, y = make_batch(cfg, args.batch, data)
        loss = model.loss(x.to(args.device), y.to(args.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    activities = [ProfilerActivity.CPU]
    if args.device != "cpu":
        activities.append(ProfilerActivity.PrivateUse1)
    mode = torch.tpu.eager_mode(args.mode) if args.device == "tpu" else None
    if mode is not None:
        mode.__enter__()
    try:
        step()  # the first steps compile (the second too in DeferAndFuse: AdamW's state now exists)
        step()
        start = time.perf_counter()
        with profile(activities=activities) as prof:
            loss = step()
        seconds = time.perf_counter() - start
    finally:
        if mode is not None:
            mode.__exit__(None, None, None)
    sort = "device_time_total" if args.device != "cpu" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=12))
    prof.export_chrome_trace(args.trace)
    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    kernels = [e for e in events if e.get("cat") == "kernel"]
    device_rows = sorted({rows.get(k["pid"], str(k["pid"])) for k in kernels})
    device_ms = sum(k["dur"] for k in kernels) / 1e3
    print(f"loss {loss:.4f}; step {seconds * 1e3:.1f} ms with the profiler on; {len(kernels)} programs on "
          f"{', '.join(device_rows) or 'no device row'}, {device_ms:.2f} ms of device time; trace: {args.trace}")
    return {"loss": loss, "programs": len(kernels), "device_rows": device_rows, "device_ms": device_ms}


if __name__ == "__main__":
    main()
