"""Each example of examples/ at its default size, one process after another: its figures line.

    python tools/run_examples.py [--timeout 300] [--out figures.json] [NAME ...]

Runs ``python examples/NAME.py`` (every example when no NAME is given) on the default ``tpu``
device (the CPU emulator here, the chip on a TPU host), and prints a Markdown table of each one's
last printed line (its loss and speed) and wall seconds: the figures examples/README.md quotes.
``steps.sh examples`` runs it on a TPU host.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ["dlrm", "resnet_amp_channels_last", "captured_training_step", "generate_static_kv_cache",
            "profile_training_step", "finetune_llama_trainer", "kernels/rmsnorm_llama", "kernels/flash_attention_gpt"]


def _figures(stdout: str) -> str:
    """The example's last line that is not a warning: where each prints its loss and speed."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    lines = [ln for ln in lines if "Warning" not in ln and not ln.startswith(("warnings.warn", "precision."))]
    return lines[-1] if lines else ""


def run(name: str, timeout: float) -> dict:
    t0 = time.perf_counter()
    work = tempfile.mkdtemp(prefix="example-")  # what an example writes (a trace, a Trainer's output) lands here
    try:
        done = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py")], cwd=work, timeout=timeout, check=False,
                              capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        rc, out = done.returncode, done.stdout + (done.stderr if done.returncode else "")
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    return {"example": name, "rc": rc, "wall_s": round(time.perf_counter() - t0, 1), "figures": _figures(out)}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", default=EXAMPLES)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    rows = []
    print("| example | rc | wall s | figures |\n|---|---|---|---|", flush=True)
    for name in args.names:
        row = run(name, args.timeout)
        rows.append(row)
        print(f"| `{name}` | {row['rc']} | {row['wall_s']} | {row['figures']} |", flush=True)
        if args.out:
            pathlib.Path(args.out).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
