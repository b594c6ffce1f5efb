"""Summary figures and the Markdown report of a conformance sweep."""

from __future__ import annotations

import collections
import datetime
import re
from typing import Any

HEADLINE = ("float32", "bfloat16", "int64", "bool")
ALL_DTYPES = ("float32", "bfloat16", "int64", "bool", "float16", "int32")
_SYMBOL = {"pass": "✓", "fail": "✗", "unsupported": "U", "skip": "S", "untested": "?"}


def _rate(rows: list[dict]) -> dict[str, Any]:
    """pass / (everything but untested): skipped, failing and unsupported entries all count against."""
    counted = [r for r in rows if r["status"] != "untested"]
    passed = sum(r["status"] == "pass" for r in counted)
    by = collections.Counter(r["status"] for r in rows)
    return {"passed": passed, "total": len(counted), "rate": passed / len(counted) if counted else 0.0,
            "by_status": dict(sorted(by.items()))}


def _cause(detail: str) -> str:
    """A failure's first line with the sample-specific numbers taken out, for grouping."""
    m = re.search(r"operator '([^']+)'", detail)
    if m:
        return f"not implemented: {m.group(1)}"
    text = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", detail)
    return text[:160]


def build(results: list[dict], config: dict, seconds: float, models: list[dict] | None = None,
          device: dict | None = None) -> dict[str, Any]:
    """The report; ``device`` names what ran it ({"device": ..., "platform": ...})."""
    import torch

    fwd = [r for r in results if r["kind"] == "forward" and r["dtype"] in HEADLINE]
    bwd = [r for r in results if r["kind"] == "backward" and r["dtype"] in HEADLINE]
    fwd_all = [r for r in results if r["kind"] == "forward" and r["dtype"] != "-"]
    bwd_all = [r for r in results if r["kind"] == "backward"]
    err = [r for r in results if r["kind"] == "errors"]
    bad = [r for r in results if r["status"] in ("fail", "unsupported", "skip")]
    causes = collections.Counter(_cause(r["detail"]) for r in bad)
    summary = {
        "forward": _rate(fwd),
        "backward": _rate(bwd),
        "forward_all_dtypes": _rate(fwd_all),
        "backward_all_dtypes": _rate(bwd_all),
        "errors": _rate(err),
        "ops": len({r["op"] for r in results}),
        "models": _rate(models or []),
    }
    return {
        "generated_by": "python -m torchtpu.conformance",
        "generated_at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "device": device or {},
        "config": config,
        "sweep_seconds": round(seconds, 1),
        "summary": summary,
        "top_causes": causes.most_common(60),
        "results": results,
        "models": models or [],
    }


def differences(doc: dict, reference: dict) -> list[dict]:
    """The rows whose status differs between ``doc`` and ``reference`` (another platform's report of
    the same sweep): op rows by (op, dtype, check), model rows by (model, check); a row one report
    lacks has the status "absent" there."""
    def rows(d: dict) -> dict[tuple[str, str, str], dict]:
        out = {(r["op"], r["dtype"], r["kind"]): r for r in d.get("results", [])}
        out.update({(f"model {m['model']}", "-", m["kind"]): m for m in d.get("models", [])})
        return out

    here, there = rows(doc), rows(reference)
    diffs = []
    for key in sorted(here.keys() | there.keys()):
        a, b = here.get(key, {}), there.get(key, {})
        status, ref_status = a.get("status", "absent"), b.get("status", "absent")
        if status != ref_status:
            diffs.append({"op": key[0], "dtype": key[1], "kind": key[2], "status": status,
                          "reference_status": ref_status, "detail": a.get("detail", "") or b.get("detail", "")})
    return diffs


def _differences_section(doc: dict) -> list[str]:
    diffs = doc.get("differences_from_cpu")
    if diffs is None:
        return []
    lines = ["## Differences from the CPU report", "",
             f"Rows whose status differs from `op_coverage.md` (the CPU plugin's report): {len(diffs)}.", ""]
    if diffs:
        lines += ["| op | dtype | check | here | CPU | first line |", "|---|---|---|---|---|---|"]
        lines += [f"| `{d['op']}` | {d['dtype']} | {d['kind']} | {d['status']} | {d['reference_status']} | "
                  f"{_md(d['detail'])} |" for d in diffs]
    return [*lines, ""]


def _fmt(s: dict) -> str:
    return f"{s['passed']} / {s['total']} | {s['rate']:.1%}"


def _device_note(doc: dict) -> str:
    dev = doc.get("device") or {}
    parts = [dev[k] for k in ("device", "platform") if dev.get(k)]
    return (", on " + ", ".join(parts)) if parts else ""


def markdown(doc: dict) -> str:
    s = doc["summary"]
    cfg = doc["config"]
    lines = [
        "# Op coverage: PyTorch OpInfo conformance on `tpu`",
        "",
        ("> **Generated** by `python -m torchtpu.conformance` "
         f"({doc['generated_at']}, torch {doc['torch']}{_device_note(doc)}); do not edit by hand."),
        "",
        ("Every OpInfo entry of `torch.testing._internal.common_methods_invocations.op_db` runs on CPU and on "
        "`tpu` (under `torch.tpu.precision(\"highest\")`) with the same sample inputs "
        f"(first {cfg.get('samples_per_op')} per op and dtype). *forward*: values, dtype, shape and device of "
        "every output; *backward*: gradients of every differentiable input from a fixed random cotangent "
        "(in both, a float16/bfloat16/float32 value beyond the tolerance of CPU's passes only if it is at "
        "least as close as CPU's to the op's float64 result on the same values: CPU's 16-bit kernels round "
        "some intermediates, and on ill-conditioned values CPU's float32 is itself off float64; such rows "
        "say so); "
        "*errors*: each `op.error_inputs` that raises on CPU raises the same exception type on `tpu`. "
        "Skipped and unsupported entries count as failures; *untested* entries (no usable sample, or on a "
        "TPU only samples holding complex128, which it refuses by design) are listed but not counted."),
        "",
        "## Summary",
        "",
        "| check | passed / counted | rate |",
        "|---|---|---|",
        f"| forward, (op, dtype) over {', '.join(HEADLINE)} | {_fmt(s['forward'])} |",
        f"| backward, differentiable (op, dtype) over float32, bfloat16 | {_fmt(s['backward'])} |",
        f"| forward, all swept dtypes ({', '.join(cfg.get('dtypes', []))}) | {_fmt(s['forward_all_dtypes'])} |",
        f"| backward, all swept dtypes | {_fmt(s['backward_all_dtypes'])} |",
        f"| error inputs, per op | {_fmt(s['errors'])} |",
        f"| model checks (forward, backward, generate, compiled) | {_fmt(s['models'])} |",
        "",
        f"{s['ops']} OpInfo entries; status counts (forward, headline dtypes): "
        + ", ".join(f"{k} {v}" for k, v in s["forward"]["by_status"].items())
        + "; (backward): " + ", ".join(f"{k} {v}" for k, v in s["backward"]["by_status"].items()) + ".",
        f"Sweep time: {doc['sweep_seconds']:.0f} s.",
        "",
        *_model_section(doc.get("models", [])),
        *_differences_section(doc),
        "## Most common failure causes",
        "",
        "| entries | cause (first line of the error) |",
        "|---|---|",
    ]
    for cause, n in doc["top_causes"]:
        lines.append(f"| {n} | {_md(cause)} |")
    lines += [
        "",
        "## Per op",
        "",
        ("Each cell is forward/backward: ✓ pass, ✗ fail, U unsupported (torchtpu has no lowering), "
         "S skipped (see `src/torchtpu/conformance/skips.py`), ? untested, · not checked "
         "(dtype not supported by the op on CPU, or not differentiable)."),
        "",
        "| op | " + " | ".join(ALL_DTYPES) + " | errors |",
        "|---|" + "---|" * (len(ALL_DTYPES) + 1),
    ]
    by_op: dict[str, dict[tuple[str, str], dict]] = collections.defaultdict(dict)
    for r in doc["results"]:
        by_op[r["op"]][(r["dtype"], r["kind"])] = r
    for op, cells in by_op.items():
        row = [f"`{op}`"]
        for dt in ALL_DTYPES:
            f = cells.get((dt, "forward"))
            b = cells.get((dt, "backward"))
            if f is None and b is None:
                row.append("·")
                continue
            row.append(_SYMBOL[f["status"]] if f else "·")
            row[-1] += "/" + (_SYMBOL[b["status"]] if b else "·")
        e = cells.get(("-", "errors"))
        row.append(_SYMBOL[e["status"]] if e else "·")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "## Failures", "", "| op | dtype | check | status | first line |", "|---|---|---|---|---|"]
    for r in doc["results"]:
        if r["status"] in ("fail", "unsupported", "skip"):
            lines.append(f"| `{r['op']}` | {r['dtype']} | {r['kind']} | {r['status']} | {_md(r['detail'])} |")
    notes = sorted({(r["op"], r["detail"]) for r in doc["results"] if r["status"] == "pass"
                    and r["detail"].startswith("metadata only")})
    if notes:
        lines += ["", "## Compared by metadata only", "",
                  "Values of these entries cannot match CPU by construction; device, dtype and shape are checked.",
                  ""]
        seen = set()
        for op, detail in notes:
            if op not in seen:
                seen.add(op)
                lines.append(f"- `{op}`: {detail.removeprefix('metadata only: ')}")
    untested = [r for r in doc["results"] if r["status"] == "untested"]
    if untested:
        lines += ["", "## Untested", "", "| op | dtype | check | why |", "|---|---|---|---|"]
        for r in untested:
            lines.append(f"| `{r['op']}` | {r['dtype']} | {r['kind']} | {_md(r['detail'])} |")
    return "\n".join(lines) + "\n"


def _model_section(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    lines = [
        "## Models",
        "",
        ("Each model (`torchtpu.conformance.model_zoo`: Hugging Face architectures at tiny random "
         "configurations, and plain-PyTorch families) trains two SGD steps on CPU and on `tpu`; *forward* "
         "compares outputs, losses, buffers and an eval-mode forward, *backward* every parameter gradient, "
         "*generate* greedy decoding, *compiled* the same training steps through `torch.compile(backend=\"tpu\")`. "
         "A failure names the first differing tensor or the failing op."),
        "",
        "| model | forward | backward | generate | compiled | first failure |",
        "|---|---|---|---|---|---|",
    ]
    by_model: dict[str, dict[str, dict]] = collections.defaultdict(dict)
    for r in rows:
        by_model[r["model"]][r["kind"]] = r
    for name, kinds in by_model.items():
        cells = [_SYMBOL[kinds[k]["status"]] if k in kinds else "·" for k in ("forward", "backward", "generate", "compiled")]
        detail = next((r["detail"] for r in kinds.values() if r["status"] != "pass" and r["detail"]), "")
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {_md(detail)} |")
    return lines + [""]


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
