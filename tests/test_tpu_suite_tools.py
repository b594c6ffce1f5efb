"""The TPU round's own tools (tools/tpu_suite/), checked where they can be without a TPU: a typo in
what a round runs costs minutes of borrowed device time."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import torch

from torchtpu.conformance.core import opinfo_by_key

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join(ROOT, "tools", "tpu_suite")


def _verify_lines() -> list[str]:
    with open(os.path.join(SUITE, "verify.txt")) as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]


def test_verify_list_names_existing_samples_functions_and_tests():
    ops = opinfo_by_key()
    for line in _verify_lines():
        if line.startswith("fn "):
            assert callable(getattr(torch, line[3:], None)), line
        elif line.startswith("test "):
            args = shlex.split(line[5:])
            paths = [a for a in args if a.startswith("tests/")]
            assert paths and all(os.path.exists(os.path.join(ROOT, p.split("::")[0])) for p in paths), line
            r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                *args], check=False, cwd=ROOT, capture_output=True, text=True)
            assert r.returncode == 0, (line, r.stdout[-500:])  # 5 when the selection is empty
        else:
            key, dtype, *kind = line.split(":")
            assert key in ops and isinstance(getattr(torch, dtype, None), torch.dtype), line
            assert kind in ([], ["backward"]), line


def test_steps_script_parses():
    for script in ("steps.sh", "suite_run.sh"):
        assert subprocess.run(["bash", "-n", os.path.join(SUITE, script)], check=False).returncode == 0, script
