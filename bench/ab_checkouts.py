"""Strict vs DeferAndFuse GPT training step, old code against new, in alternating processes (not a test).

    python bench/ab_checkouts.py OLD_SRC NEW_SRC [--pairs 8] [--rounds 8] [--steps 10] [--tiny]
        [--old-env VAR=VALUE ...] [--new-env VAR=VALUE ...]

OLD_SRC and NEW_SRC are the ``src`` folders of two checkouts, each with its native
extension built in place (``python setup.py build_ext --inplace`` in that checkout), e.g.
``git worktree add /tmp/old <commit>`` for the old one. A change worth a few percent is
smaller than what this shared 2-vCPU machine's speed does from one minute to the next, so
a single run of each says little. This runs ``--pairs`` pairs of fresh processes, old then
new; each process times ``--rounds`` interleaved rounds of ``--steps`` steps of Strict and
DeferAndFuse (``gpt_train`` of ``bench/eager.py``) and reports its medians and main-thread CPU.
Both codes see the same slow and quiet spells, and the medians over processes compare them.

``--tiny`` times the host-bound step instead (``TINY_GPT`` at batch 1, as ``gpt_train_host_bound``
in ``bench/eager.py``): the same ops with next to no device work, so that a change to the host's
per-op cost is not hidden where the emulated device's compute bounds the step.

``--old-env`` and ``--new-env`` set environment variables in the processes of one side
only, so that one checkout can be compared with itself under two settings, e.g.
``bench/ab_checkouts.py src src --old-env TORCH_TPU_DEFER_CHUNK_NODES=40
--new-env TORCH_TPU_DEFER_CHUNK_NODES=100``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = """
import json, sys
sys.path.insert(0, {bench!r})
import torch
from eager import TINY_GPT, gpt_train
from torchtpu.examples.gpt import GPT, GPTConfig
torch.manual_seed(0)
modes = {{"strict": ("tpu", "strict"), "defer_and_fuse": ("tpu", "defer_and_fuse")}}
cfg, batch = (TINY_GPT, 1) if {tiny} else (GPTConfig(), 8)
t = gpt_train(GPT(cfg), modes, {steps}, {rounds}, batch=batch, memory=False)
print(json.dumps({{m: {{"best": v["step_ms"], "median": v["median_step_ms"], "main_cpu": v["main_cpu_ms"]}}
                  for m, v in t.items()}}))
"""


def run_one(src: str, rounds: int, steps: int, extra_env: dict[str, str] | None = None, tiny: bool = False
            ) -> dict[str, dict[str, float]]:
    """One process of the checkout at ``src`` (with ``extra_env`` set): per mode, best and median ms
    per step, main-thread CPU ms (``tiny``: of the host-bound step)."""
    bench = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=src, TORCH_DEVICE_BACKEND_AUTOLOAD="1", **(extra_env or {}))
    code = _CHILD.format(bench=bench, rounds=rounds, steps=steps, tiny=tiny)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _assignments(p: argparse.ArgumentParser, items: list[str]) -> dict[str, str]:
    """``["VAR=VALUE", ...]`` as a dict (a malformed item is a usage error)."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            p.error(f"expected VAR=VALUE, got {item!r}")
        out[name] = value
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old_src")
    p.add_argument("new_src")
    p.add_argument("--pairs", type=int, default=8)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--tiny", action="store_true", help="time the host-bound step (TINY_GPT at batch 1)")
    p.add_argument("--old-env", action="append", default=[], metavar="VAR=VALUE")
    p.add_argument("--new-env", action="append", default=[], metavar="VAR=VALUE")
    args = p.parse_args()
    envs = {"old": _assignments(p, args.old_env), "new": _assignments(p, args.new_env)}
    results: dict[str, list[dict[str, dict[str, float]]]] = {"old": [], "new": []}
    for i in range(args.pairs):
        for name, src in (("old", args.old_src), ("new", args.new_src)):
            r = run_one(src, args.rounds, args.steps, envs[name], args.tiny)
            results[name].append(r)
            s, d = r["strict"], r["defer_and_fuse"]
            print(f"pair {i + 1} {name}: Strict {s['best']:.2f}/{s['median']:.2f} ms, DeferAndFuse "
                  f"{d['best']:.2f}/{d['median']:.2f} ms (main thread {d['main_cpu']:.2f} ms CPU)", flush=True)
    for name, rs in results.items():
        def med(f, rs=rs):  # the median over this checkout's processes
            return statistics.median(f(r) for r in rs)

        print(f"{name}: Strict/DeferAndFuse by medians {med(lambda r: r['strict']['median'] / r['defer_and_fuse']['median']):.3f}, "
              f"by bests {med(lambda r: r['strict']['best'] / r['defer_and_fuse']['best']):.3f}; DeferAndFuse median "
              f"{med(lambda r: r['defer_and_fuse']['median']):.2f} ms, main thread "
              f"{med(lambda r: r['defer_and_fuse']['main_cpu']):.2f} ms CPU; Strict median "
              f"{med(lambda r: r['strict']['median']):.2f} ms")


if __name__ == "__main__":
    main()
