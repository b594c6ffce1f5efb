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
    python -m torchtpu.conformance --merge 40 --platform tpu --parts docs/tpu_shards   # a TPU's parts, merged here

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
import collections
import contextlib
import faulthandler
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from . import report

OP_BUDGET_S = 240


def _parse_dtypes(text: str) -> list[str]:
    return [d.strip() for d in text.split(",") if d.strip()]


# ---------------------------------------------------------------------------
# worker
# ---------------------------------------------------------------------------
# An item is an OpInfo key, or "model:NAME" for a model check (run in the worker too: the parent
# never touches the device, so the worker may hold it, as a TPU's one process must).
MODEL_PREFIX = "model:"


def worker(dtypes: list[str], limit: int, kinds: list[str], threads: int = 1) -> None:
    # The protocol goes to the original stdout; anything ops print goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    # the sweep asks for every thread's stack before it kills a worker past an item's budget:
    # a hang then says where it hung
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    import torch

    from .. import _device_state
    from .core import check_op, opinfo_by_key
    from .models import run_all

    ops = opinfo_by_key()
    dts = tuple(getattr(torch, d) for d in dtypes)
    client = _device_state.client()
    proto.write(json.dumps({"ready": True, "device": torch.tpu.get_device_name(),
                            "platform": f"{client.platform_name} {client.platform_version}"}) + "\n")
    out_lock = threading.Lock()
    served = [0]
    turns = _Turns()

    def serve(item: str) -> None:
        msg: dict[str, Any] = {"item": item}
        try:
            if item.startswith(MODEL_PREFIX):
                with turns.alone():
                    msg["models"] = run_all([item.removeprefix(MODEL_PREFIX)])
            else:
                with turns.shared():
                    msg["results"] = [r.as_dict() for r in check_op(ops[item], dts, tuple(kinds), limit)]
        except BaseException as e:  # noqa: BLE001  (report, keep serving)
            msg["results"] = _failed_rows(item, f"conformance runner: {type(e).__name__}: {e}"[:300], 0.0)
        with out_lock:
            served[0] += 1
            # executables of one op are never reused by the next: free them now and then (tier 1
            # only: tiers 2 and 3 keep them for the next sweep, and tier 3 may be a user's cache)
            if served[0] % threads == 0:
                torch.tpu.clear_compile_cache(1)
            proto.write(json.dumps(msg) + "\n")

    items = (line.strip() for line in sys.stdin)
    if threads == 1:  # on the main thread, where a sample's time box is a signal
        for item in items:
            if item:
                serve(item)
        return
    with ThreadPoolExecutor(threads, thread_name_prefix="conformance") as pool:
        for item in items:
            if item:
                pool.submit(serve, item)


class _Turns:
    """Ops check side by side; a model check runs alone. Its torch.compile (Dynamo, AOTAutograd)
    keeps tracing state that eager ops on other threads disturbed ("CURRENT_PATCHER is None",
    Dynamo's internal TypeErrors), seen in threaded sweeps on the workstation."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ops = 0
        self._model = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._model)
            self._ops += 1
        try:
            yield
        finally:
            with self._cond:
                self._ops -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._model)
            self._model = True
            self._cond.wait_for(lambda: self._ops == 0)
        try:
            yield
        finally:
            with self._cond:
                self._model = False
                self._cond.notify_all()


def _failed_rows(item: str, why: str, seconds: float) -> list[dict]:
    if item.startswith(MODEL_PREFIX):
        return [{"model": item.removeprefix(MODEL_PREFIX), "kind": "forward", "status": "fail", "detail": why}]
    return [{"op": item, "dtype": "-", "kind": "forward", "status": "fail", "detail": why, "samples": 0,
             "seconds": seconds}]


class _Worker:
    def __init__(self, dtypes: list[str], limit: int, kinds: list[str], threads: int) -> None:
        cmd = [sys.executable, "-m", "torchtpu.conformance", "--worker", "--dtypes", ",".join(dtypes),
               "--limit", str(limit), "--kinds", ",".join(kinds), "--threads", str(threads)]
        # the worker's stderr: its last lines explain a worker that does not start
        self._stderr = tempfile.TemporaryFile(mode="a+")  # noqa: SIM115  (lives as long as the worker)
        # (appending: the worker writes at the end wherever this side seeks to read)
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, bufsize=1)
        self._unread = b""  # bytes of the worker's output not yet taken as messages (see read)
        msg = self.read(300)
        if msg is None or not msg.get("ready"):
            self._stderr.seek(0)
            tail = self._stderr.read()[-1500:]
            raise RuntimeError(f"conformance worker did not start:\n{tail}")
        self.device = {"device": msg.get("device", ""), "platform": msg.get("platform", "")}

    def read(self, timeout: float) -> dict | None:
        """The worker's next message, or None if none comes within ``timeout`` (or it closed its
        output). Reads the pipe's bytes itself: a buffered ``readline`` after ``select`` kept a
        second message that arrived with the first in its buffer, where ``select`` does not look,
        and a threaded sweep then waited out an op's whole budget for an answer it already had."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._unread:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._unread += chunk
        line, _, self._unread = self._unread.partition(b"\n")
        return json.loads(line)

    def send(self, item: str) -> bool:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(item + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return False
        return True

    def stacks(self) -> str:
        """Every thread's Python stack in the worker, as faulthandler prints it ('' if it died)."""
        if self.proc.poll() is not None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        mark = self._stderr.tell()
        self.proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        self._stderr.seek(mark)
        return self._stderr.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._stderr.close()


def sweep(items: list[str], dtypes: list[str], limit: int, kinds: list[str], budget: float,
          progress: bool = True, device: dict | None = None, threads: int = 1,
          on_done: Callable[[str, list[dict], float], None] | None = None) -> dict[str, list[dict]]:
    """Every item's rows (op results, or model rows for ``model:NAME``), by item.

    ``threads`` items run at once in one worker process. An item past its budget (twice the
    budget for a model) costs that item, and the worker, whose other items run again on a new
    one; after a crash, the items that were running run again one at a time, so a crash is
    charged to the item that causes it. ``device`` (if given) receives what the worker runs on;
    ``on_done(item, rows, seconds)`` is called as each item finishes.
    """
    rows: dict[str, list[dict]] = {}
    queue = collections.deque(items)
    alone: collections.deque[str] = collections.deque()  # run again, one at a time, after a crash
    running: dict[str, float] = {}
    tries: collections.Counter[str] = collections.Counter()
    w: _Worker | None = None
    start = time.perf_counter()

    def finish(item: str, result: list[dict], seconds: float) -> None:
        rows[item] = result
        if on_done is not None:
            on_done(item, result, seconds)
        if progress:
            bad = sum(r["status"] != "pass" for r in result)
            print(f"[{len(rows)}/{len(items)} {time.perf_counter() - start:6.0f}s] {item}: "
                  f"{len(result) - bad}/{len(result)} pass", file=sys.stderr, flush=True)

    def limit_s(item: str) -> float:
        return budget * (2 if item.startswith(MODEL_PREFIX) else 1)

    while queue or alone or running:
        if w is None:
            w = _Worker(dtypes, limit, kinds, threads)
            if device is not None and not device:
                device.update(w.device)
        if alone and not running:
            item = alone.popleft()
            running[item] = time.perf_counter()
            w.send(item)
        while not alone and queue and len(running) < threads:
            # A model check runs alone in the worker: ops sent beside it would wait there behind
            # it, on their own clocks (a threaded TPU round timed out clamp_max and sum_to_size,
            # 240 s each with no sample run, behind a model check's compiles). So it goes once
            # the ops running have finished, and nothing goes with it.
            if any(i.startswith(MODEL_PREFIX) for i in running) or (
                    running and queue[0].startswith(MODEL_PREFIX)):
                break
            item = queue.popleft()
            running[item] = time.perf_counter()
            w.send(item)
        now = time.perf_counter()
        wait = max(0.0, min(t0 + limit_s(i) for i, t0 in running.items()) - now)
        msg = w.read(wait)
        if msg is not None:
            item = msg["item"]
            t0 = running.pop(item)
            finish(item, msg.get("models", msg.get("results", [])), time.perf_counter() - t0)
            continue
        # no answer in time: some item ran past its budget, or the worker died
        now = time.perf_counter()
        try:
            code: int | str = w.proc.wait(timeout=1)
            crashed = True
        except subprocess.TimeoutExpired:  # alive: past the budget (or its output closed: a crash)
            code = "none: output closed"
            crashed = all(now - t0 < limit_s(i) for i, t0 in running.items())
            if not crashed:  # (even when quiet: it is what a hang report needs)
                print(f"worker past an item's budget ({', '.join(running)}); its threads:\n{w.stacks()}",
                      file=sys.stderr, flush=True)
        w.close()
        w = None
        solo = len(running) == 1
        for item, t0 in sorted(running.items(), key=lambda kv: kv[1]):
            tries[item] += 1
            if not crashed and now - t0 >= limit_s(item):
                finish(item, _failed_rows(item, f"timed out after {limit_s(item):.0f}s (per-op budget)",
                                          now - t0), now - t0)
            elif crashed and (solo or tries[item] > 2):
                finish(item, _failed_rows(item, f"worker crashed (exit code {code})", now - t0), now - t0)
            elif crashed:
                alone.append(item)
            else:
                queue.appendleft(item)
        running.clear()
    if w is not None:
        w.close()
    return rows


def _model_names(spec: str, parser: argparse.ArgumentParser) -> list[str]:
    from .models import model_names

    if spec == "none":
        return []
    names = model_names() if spec == "all" else _parse_dtypes(spec)
    unknown = [n for n in names if n not in model_names()]
    if unknown:
        parser.error(f"unknown models: {', '.join(unknown)} (known: {', '.join(model_names())})")
    return names


def _report_stem(kind: str | None = None) -> str:
    """op_coverage, or op_coverage_tpu where the suite's plugin (or ``kind``) is a TPU (found
    without loading it)."""
    from ..runtime import plugins

    kind = kind or plugins.selected_kind()
    return "op_coverage" if kind == "cpu" else f"op_coverage_{kind}"


def _parse_shard(text: str, parser: argparse.ArgumentParser) -> tuple[list[int], int]:
    """``K/N``, a range ``K1-K2/N`` or a list of both ``K1,K3-K4/N``: the parts to run, and N."""
    try:
        ks, n_text = text.split("/")
        n = int(n_text)
        parts: list[int] = []
        for piece in ks.split(","):
            first, _, last = piece.partition("-")
            lo, hi = int(first), int(last or first)
            if not 1 <= lo <= hi <= n:
                raise ValueError(piece)
            parts += [k for k in range(lo, hi + 1) if k not in parts]
    except ValueError:
        parser.error(f"--shard takes K/N, K1-K2/N or a comma-separated list of them with 1 <= K <= N, "
                     f"got {text!r}")
    return parts, n


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
    p.add_argument("--budget", type=float, default=None,
                   help=f"seconds per op before it is abandoned (default {OP_BUDGET_S}; on a TPU twice that)")
    p.add_argument("--out", default="docs", help="directory for op_coverage.md and op_coverage.json")
    p.add_argument("--no-merge", action="store_true", help="with --ops: write only these ops' results")
    p.add_argument("--resume", default=None, help="directory of the partial files (*.partial.jsonl) of an "
                   "earlier --shard run cut short: its finished items are not run again (default: --out)")
    p.add_argument("--shard", default=None, help="K/N: run the K-th of N interleaved parts of the ops and models, "
                   "writing only that part (op_coverage*.shardK-of-N.json); K1-K2/N: parts K1 to K2, in one "
                   "worker, each part's file written as soon as it is complete; K1,K3-K4/N: those parts")
    p.add_argument("--threads", type=int, default=1,
                   help="ops checked at once in the worker (compiles overlap; a TPU host's cores are many)")
    p.add_argument("--merge", type=int, default=None, metavar="N", help="write the report from parts 1..N")
    p.add_argument("--parts", default=None, help="with --merge: the directory of the part files (default: --out)")
    p.add_argument("--platform", default=None, help="the plugin kind the report is for, e.g. tpu to merge a TPU's "
                   "parts on another machine (default: the selected plugin's)")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.budget is None:
        from ..runtime import plugins

        a.budget = OP_BUDGET_S * (2 if plugins.selected_kind() == "tpu" else 1)
    dtypes = _parse_dtypes(a.dtypes)
    kinds = _parse_dtypes(a.kinds)
    if a.worker:
        worker(dtypes, a.limit, kinds, a.threads)
        return 0
    from .core import opinfo_by_key

    out = Path(a.out)
    stem = _report_stem(a.platform)
    if a.merge is not None:
        doc = _merge(Path(a.parts) if a.parts else out, stem, a.merge, p)
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
    names = _model_names(model_spec, p)
    config: dict[str, Any] = {"dtypes": dtypes, "kinds": kinds, "samples_per_op": a.limit,
                              "op_budget_s": a.budget}
    if a.shard:
        return _run_shards(*_parse_shard(a.shard, p), keys, names, a, config, out, stem)
    t0 = time.perf_counter()
    device: dict[str, str] = {}
    rows = sweep(keys + [MODEL_PREFIX + m for m in names], dtypes, a.limit, kinds, a.budget,
                 progress=not a.quiet, device=device, threads=a.threads)
    results = [r for k in keys for r in rows[k]]
    model_rows = [r for m in names for r in rows[MODEL_PREFIX + m]]
    out.mkdir(parents=True, exist_ok=True)
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


def _run_shards(parts: list[int], n: int, keys: list[str], names: list[str], a: argparse.Namespace,
                config: dict[str, Any], out: Path, stem: str) -> int:
    """Parts of an interleaved N-way split, in order, through one worker; each part's file
    is written when its last item finishes (a run cut short keeps the parts it completed).
    A part's ``seconds`` is its items' time over the threads: its share of the run's wall time."""
    out.mkdir(parents=True, exist_ok=True)
    part_items = {k: keys[k - 1::n] + [MODEL_PREFIX + m for m in names[k - 1::n]] for k in parts}
    left = {k: set(items) for k, items in part_items.items()}
    part_of = {item: k for k, items in part_items.items() for item in items}
    rows: dict[str, list[dict]] = {}
    seconds: dict[int, float] = collections.defaultdict(float)
    device: dict[str, str] = {}

    # A cut run keeps its finished items: each goes to the part's partial file as it finishes, and
    # a later run of the part (reading that file from --resume, by default --out) skips them.
    # (Delete a part's partial file, or write to another --out, to run the part afresh.)
    for k in parts:
        earlier = _partial_lines(Path(a.resume or out) / _partial_name(stem, k, n))
        if a.resume and Path(a.resume).resolve() != out.resolve():
            with (out / _partial_name(stem, k, n)).open("a") as f:  # a second cut keeps them too
                f.writelines(json.dumps(line) + "\n" for line in earlier)
        for line in earlier:
            if line["item"] in left[k]:
                rows[line["item"]] = line["rows"]
                seconds[k] += line["seconds"] * a.threads
                left[k].discard(line["item"])
                device.update(line.get("device") or {})

    def on_done(item: str, result: list[dict], took: float) -> None:
        k = part_of[item]
        rows[item] = result
        seconds[k] += took
        left[k].discard(item)
        with (out / _partial_name(stem, k, n)).open("a") as f:
            f.write(json.dumps({"item": item, "rows": result, "seconds": round(took / a.threads, 2),
                                "device": device}) + "\n")
        if not left[k]:
            write_part(k)

    def write_part(k: int) -> None:
        items = part_items[k]
        path = _shard_path(out, stem, k, n)
        path.write_text(json.dumps({
            "config": config, "seconds": round(seconds[k] / a.threads, 1), "threads": a.threads,
            "device": device,
            "results": [r for i in items if not i.startswith(MODEL_PREFIX) for r in rows[i]],
            "models": [r for i in items if i.startswith(MODEL_PREFIX) for r in rows[i]]}) + "\n")
        print(f"shard {k}/{n}: {len(items)} items; wrote {path}", flush=True)

    for k in parts:
        if not left[k] and part_items[k]:  # finished in an earlier run: the part file from its rows
            write_part(k)
    sweep([i for k in parts for i in part_items[k] if i in left[k]], _parse_dtypes(a.dtypes), a.limit, _parse_dtypes(a.kinds),
          a.budget, progress=not a.quiet, device=device, threads=a.threads, on_done=on_done)
    return 0


def _partial_name(stem: str, k: int, n: int) -> str:
    return f"{stem}.shard{k}-of-{n}.partial.jsonl"


def _partial_lines(path: Path) -> list[dict]:
    """The items an earlier run of a part finished (a line cut by a killed run is dropped)."""
    if not path.exists():
        return []
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            continue
    return lines


def _write(doc: dict, out: Path, stem: str) -> int:
    out.mkdir(parents=True, exist_ok=True)
    cpu_report = out / f"{_report_stem('cpu')}.json"
    if stem != _report_stem("cpu") and cpu_report.exists():  # another platform's report lists where it differs
        doc["differences_from_cpu"] = report.differences(doc, json.loads(cpu_report.read_text()))
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
