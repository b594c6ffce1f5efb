"""``python -m torchtpu.conformance``: the OpInfo sweep and its report.

The sweep runs ops in a worker process and gives each op a wall-clock
budget: a hang inside a compile, or a crash of the XLA runtime, then costs one
op (recorded as failing) instead of the whole sweep.

    python -m torchtpu.conformance                      # everything -> docs/
    python -m torchtpu.conformance --ops sin,nn.functional.conv2d
    python -m torchtpu.conformance --dtypes float32,int64 --limit 3
    python -m torchtpu.conformance --ops none --models all   # only the model checks
    python -m torchtpu.conformance --shard 3/8               # the 3rd of 8 interleaved parts
    python -m torchtpu.conformance --merge 8                 # the report from parts 1..8

On a TPU (the tpu plugin) the report is ``op_coverage_tpu.md`` and names the chip and the
plugin's version. Shards let a sweep run in pieces of a few minutes each (one process at a
time may hold a TPU): each writes its part, ``--merge N`` writes the report from all N.

A full run also trains every model of ``torchtpu.conformance.model_zoo`` (Hugging
Face architectures and plain-PyTorch CNN/recommender families) against CPU.

With ``--ops``, the results are merged into an existing report (only those
ops' rows are replaced), so a fix can be re-checked without a full sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import report

OP_BUDGET_S = 240


def _parse_dtypes(text: str) -> list[str]:
    return [d.strip() for d in text.split(",") if d.strip()]


# ---------------------------------------------------------------------------
# worker
# ---------------------------------------------------------------------------
def worker(dtypes: list[str], limit: int, kinds: list[str]) -> None:
    # The protocol goes to the original stdout; anything ops print goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import torch

    from .. import _device_state
    from .core import check_op, opinfo_by_key

    ops = opinfo_by_key()
    dts = tuple(getattr(torch, d) for d in dtypes)
    client = _device_state.client()
    proto.write(json.dumps({"ready": True, "device": torch.tpu.get_device_name(),
                            "platform": f"{client.platform_name} {client.platform_version}"}) + "\n")
    for line in sys.stdin:
        key = line.strip()
        if not key:
            continue
        try:
            results = [r.as_dict() for r in check_op(ops[key], dts, tuple(kinds), limit)]
        except BaseException as e:  # noqa: BLE001  (report, keep serving)
            results = [{"op": key, "dtype": "-", "kind": "forward", "status": "fail",
                        "detail": f"conformance runner: {type(e).__name__}: {e}"[:300], "samples": 0,
                        "seconds": 0.0}]
        # executables of one op are never reused by the next: free them (tier 1 only: tiers 2 and 3
        # keep them for the next sweep, and tier 3 may be a user's persistent cache)
        torch.tpu.clear_compile_cache(1)
        proto.write(json.dumps({"op": key, "results": results}) + "\n")


class _Worker:
    def __init__(self, dtypes: list[str], limit: int, kinds: list[str]) -> None:
        cmd = [sys.executable, "-m", "torchtpu.conformance", "--worker", "--dtypes", ",".join(dtypes),
               "--limit", str(limit), "--kinds", ",".join(kinds)]
        # the worker's stderr: its last lines explain a worker that does not start
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (lives as long as the worker)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, bufsize=1)
        msg = self._read(300)
        if msg is None or not msg.get("ready"):
            self._stderr.seek(0)
            tail = self._stderr.read()[-1500:]
            raise RuntimeError(f"conformance worker did not start:\n{tail}")
        self.device = {"device": msg.get("device", ""), "platform": msg.get("platform", "")}

    def _read(self, timeout: float) -> dict | None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        if not line:
            return None
        return json.loads(line)

    def run(self, key: str, timeout: float) -> tuple[list[dict] | None, str]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(key + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return None, "worker died"
        msg = self._read(timeout)
        if msg is None:
            if self.proc.poll() is None:
                return None, f"timed out after {timeout:.0f}s (per-op budget)"
            return None, f"worker crashed (exit code {self.proc.returncode})"
        return msg["results"], ""

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._stderr.close()


def sweep(keys: list[str], dtypes: list[str], limit: int, kinds: list[str], budget: float,
          progress: bool = True, device: dict | None = None) -> list[dict]:
    """Every op's results; ``device`` (if given) receives what the worker runs on."""
    results: list[dict] = []
    w: _Worker | None = None
    start = time.perf_counter()
    for i, key in enumerate(keys):
        if w is None:
            w = _Worker(dtypes, limit, kinds)
            if device is not None:
                device.update(w.device)
        t0 = time.perf_counter()
        res, why = w.run(key, budget)
        if res is None:
            w.close()
            w = None
            res = [{"op": key, "dtype": "-", "kind": "forward", "status": "fail", "detail": why, "samples": 0,
                    "seconds": time.perf_counter() - t0}]
        results.extend(res)
        if progress:
            bad = sum(r["status"] != "pass" for r in res)
            print(f"[{i + 1}/{len(keys)} {time.perf_counter() - start:6.0f}s] {key}: "
                  f"{len(res) - bad}/{len(res)} pass", file=sys.stderr, flush=True)
    if w is not None:
        w.close()
    return results


def _run_models(spec: str, parser: argparse.ArgumentParser) -> list[dict]:
    from .models import model_names, run_all

    if spec == "none":
        return []
    names = model_names() if spec == "all" else _parse_dtypes(spec)
    unknown = [n for n in names if n not in model_names()]
    if unknown:
        parser.error(f"unknown models: {', '.join(unknown)} (known: {', '.join(model_names())})")
    rows = []
    for name in names:
        rows += run_all([name])
        print(f"[model] {name}: " + ", ".join(f"{r['kind']} {r['status']}" for r in rows if r["model"] == name),
              file=sys.stderr, flush=True)
    return rows


def _report_stem() -> str:
    """op_coverage, or op_coverage_tpu where the suite's plugin is a TPU (found without loading it)."""
    from ..runtime import plugins

    kind = plugins.selected_kind()
    return "op_coverage" if kind == "cpu" else f"op_coverage_{kind}"


def _parse_shard(text: str, parser: argparse.ArgumentParser) -> tuple[int, int]:
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        parser.error(f"--shard takes K/N, got {text!r}")
    if not 1 <= k <= n:
        parser.error(f"--shard K/N needs 1 <= K <= N, got {text!r}")
    return k, n


def _shard_path(out: Path, stem: str, k: int, n: int) -> Path:
    return out / f"{stem}.shard{k}-of-{n}.json"


def _merge(out: Path, stem: str, n: int, parser: argparse.ArgumentParser) -> dict:
    parts = [_shard_path(out, stem, k, n) for k in range(1, n + 1)]
    missing = [str(p) for p in parts if not p.exists()]
    if missing:
        parser.error(f"missing shards: {', '.join(missing)}")
    docs = [json.loads(p.read_text()) for p in parts]
    from .core import opinfo_by_key

    order = {k: i for i, k in enumerate(opinfo_by_key())}
    results = sorted((r for d in docs for r in d["results"]), key=lambda r: order.get(r["op"], len(order)))
    models = [m for d in docs for m in d["models"]]
    device = next((d["device"] for d in docs if d.get("device")), {})
    return report.build(results, docs[0]["config"], sum(d["seconds"] for d in docs), models, device)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchtpu.conformance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="", help="comma-separated OpInfo names (name[.variant]), or none; default: all")
    p.add_argument("--models", default=None,
                   help="comma-separated model names, all, or none; default: all without --ops, none with it")
    p.add_argument("--dtypes", default="float32,bfloat16,int64,bool,float16,int32")
    p.add_argument("--kinds", default="forward,backward,errors")
    p.add_argument("--limit", type=int, default=6, help="samples per (op, dtype)")
    p.add_argument("--budget", type=float, default=OP_BUDGET_S, help="seconds per op before it is abandoned")
    p.add_argument("--out", default="docs", help="directory for op_coverage.md and op_coverage.json")
    p.add_argument("--no-merge", action="store_true", help="with --ops: write only these ops' results")
    p.add_argument("--shard", default=None, help="K/N: run the K-th of N interleaved parts of the ops and models, "
                   "writing only that part (op_coverage*.shardK-of-N.json)")
    p.add_argument("--merge", type=int, default=None, metavar="N", help="write the report from parts 1..N")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    dtypes = _parse_dtypes(a.dtypes)
    kinds = _parse_dtypes(a.kinds)
    if a.worker:
        worker(dtypes, a.limit, kinds)
        return 0
    from .core import opinfo_by_key

    out = Path(a.out)
    stem = _report_stem()
    if a.merge is not None:
        doc = _merge(out, stem, a.merge, p)
        return _write(doc, out, stem)
    all_keys = list(opinfo_by_key())
    if a.ops == "none":
        keys = []
    elif a.ops:
        keys = _parse_dtypes(a.ops)
        unknown = [k for k in keys if k not in opinfo_by_key()]
        if unknown:
            p.error(f"unknown OpInfo names: {', '.join(unknown)}")
    else:
        keys = all_keys
    model_spec = a.models if a.models is not None else ("none" if a.ops else "all")
    shard = _parse_shard(a.shard, p) if a.shard else None
    if shard is not None:
        from .models import model_names

        k, n = shard
        keys = keys[k - 1::n]
        names = model_names() if model_spec == "all" else ([] if model_spec == "none" else _parse_dtypes(model_spec))
        model_spec = ",".join(names[k - 1::n]) or "none"
    t0 = time.perf_counter()
    device: dict[str, str] = {}
    results = sweep(keys, dtypes, a.limit, kinds, a.budget, progress=not a.quiet, device=device)
    model_rows = _run_models(model_spec, p)
    out.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"dtypes": dtypes, "kinds": kinds, "samples_per_op": a.limit,
                              "op_budget_s": a.budget}
    if shard is not None:
        path = _shard_path(out, stem, *shard)
        path.write_text(json.dumps({"config": config, "seconds": round(time.perf_counter() - t0, 1),
                                    "device": device, "results": results, "models": model_rows}) + "\n")
        print(f"shard {a.shard}: {len(keys)} ops, {len(model_rows)} model checks; wrote {path}")
        return 0
    json_path = out / f"{stem}.json"
    if a.ops and not a.no_merge and json_path.exists():
        old = json.loads(json_path.read_text())
        rerun = {r["model"] for r in model_rows}
        model_rows = [r for r in old.get("models", []) if r["model"] not in rerun] + model_rows
        replaced = set(keys)
        results = [r for r in old["results"] if r["op"] not in replaced] + results
        config = old.get("config", config)
        order = {k: i for i, k in enumerate(all_keys)}
        results.sort(key=lambda r: order.get(r["op"], len(order)))
        elapsed = old.get("sweep_seconds", 0.0)
    else:
        elapsed = time.perf_counter() - t0
    doc = report.build(results, config, elapsed, model_rows, device)
    return _write(doc, out, stem)


def _write(doc: dict, out: Path, stem: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / f"{stem}.md").write_text(report.markdown(doc))
    s = doc["summary"]
    print(f"forward {s['forward']['passed']}/{s['forward']['total']} ({s['forward']['rate']:.1%}), "
          f"backward {s['backward']['passed']}/{s['backward']['total']} ({s['backward']['rate']:.1%}), "
          f"errors {s['errors']['passed']}/{s['errors']['total']}, "
          f"models {s['models']['passed']}/{s['models']['total']}; wrote {out}/{stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
