"""bench/tpu.py end to end at --small: its flash-attention workloads, every cell a worker process."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).parents[1] / "bench" / "tpu.py"


@pytest.mark.fresh_process  # the workers open the device (on a TPU host: before this process does)
def test_flash_workloads_small(tmp_path):
    # JAX both for its cells and for torchtpu's kernel (without it the compiled cell raises).
    # --flash-dq-block reaches torchtpu's workers and leaves JAX's alone (it once imported torchtpu
    # before torch in every worker, and each failed loading the backend twice); at flash_s2048's
    # small length, 256, it splits the dq half's keys in two blocks
    pytest.importorskip("jax.experimental.pallas")
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(BENCH), "--small", "--only", "flash_s512,flash_s2048",
                        "--flash-dq-block", "128", "--timeout", "300", "--out", str(out)], capture_output=True, text=True,
                       env=dict(os.environ), timeout=900, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads(out.read_text())
    for workload in ("flash_s512", "flash_s2048"):
        cells = results["results"][workload]
        assert set(cells) == {"jax_jit", "jax_flash", "compiled", "compiled_math"}
        for mode, cell in cells.items():
            assert "error" not in cell, (workload, mode, cell)
            assert cell["step_ms"] > 0 and cell["mfu_pct"] > 0 and cell["peak_mem_source"]
        for mode in ("compiled", "compiled_math"):
            assert cells[mode]["peak_mem_mib"] > 0 and cells[mode]["temp_mib"] > 0
            assert cells[mode]["peak_total_mib"] == cells[mode]["peak_mem_mib"] + cells[mode]["temp_mib"]
        for mode in ("jax_jit", "jax_flash"):  # the step's compiled memory_analysis, read (a v5e
            # gives the small steps no scratch at all: 0 there, 12.6 GiB for JAX jit's full flash_s2048)
            temp = cells[mode]["temp_mib"]
            assert isinstance(temp, float) and (temp > 0 or "TPU" in cells[mode]["platform"]), cells[mode]
        # the same model and batch: flash and the math lowering give the same first loss
        assert cells["compiled"]["loss0"] == pytest.approx(cells["compiled_math"]["loss0"], rel=1e-3)
        assert cells["jax_flash"]["loss0"] == pytest.approx(cells["jax_jit"]["loss0"], rel=1e-3)
    pairs = [e for e in results["table"] if e.get("pairs")]
    assert {(e["workload"], e["row"]) for e in pairs} == {
        (w, row) for w in ("flash_s512", "flash_s2048")
        for row in ("train step ms", "peak device MiB", "largest program scratch MiB", "peak + scratch MiB")}
    assert "compiled vs compiled math" in r.stdout


@pytest.mark.fresh_process
def test_decode_replayed_from_a_tpu_graph_generates_the_compiled_steps_tokens(tmp_path):
    """decode's compiled_graph cell (the step captured once, one replay per token) generates the
    same tokens as the compiled step called per token."""
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(BENCH), "--small", "--only", "decode_b8", "--modes",
                        "compiled,compiled_graph", "--timeout", "300", "--out", str(out)],
                       capture_output=True, text=True, env=dict(os.environ), timeout=900, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    cells = json.loads(out.read_text())["results"]["decode_b8"]
    for mode, cell in cells.items():
        assert "error" not in cell, (mode, cell)
        assert cell["tokens_per_s"] > 0
    assert cells["compiled_graph"]["tokens_seq0"] == cells["compiled"]["tokens_seq0"]
    assert all(isinstance(cell["slowest_compiles"], list) for cell in cells.values())  # (may be empty: tier 2)
    assert len(cells["compiled"]["tokens_seq0"]) > 1



def test_compiled_math_turns_the_kernel_off_in_any_workload(tmp_path, monkeypatch):
    """``compiled_math`` is the math lowering's cell in every workload (it once was only in the flash_*
    ones, so on a TPU the bf16 100M step's compiled_math cell took the kernel as compiled does)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_tpu", BENCH)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # (its dataclasses look their module up)
    spec.loader.exec_module(bench)
    monkeypatch.delenv("TORCH_TPU_FLASH_ATTENTION", raising=False)
    for workload in ("gpt_100m_bf16", "flash_s512"):
        assert bench.worker_env("compiled_math", str(tmp_path), False, workload)["TORCH_TPU_FLASH_ATTENTION"] == "0"
    assert bench.worker_env("compiled", str(tmp_path), False, "flash_s512")["TORCH_TPU_FLASH_ATTENTION"] == "1"
    assert "TORCH_TPU_FLASH_ATTENTION" not in bench.worker_env("compiled", str(tmp_path), False, "gpt_100m_bf16")
    head_major = bench.worker_env("compiled_head_major", str(tmp_path), False, "gpt_100m_bf16")
    assert (head_major["TORCH_TPU_FLASH_ATTENTION"], head_major["TORCH_TPU_FLASH_LANES"]) == ("1", "0")
    # the attention variants of the 100M step run when asked for (they once were silently left out)
    wl = bench.WORKLOADS["gpt_100m_bf16"]
    assert bench.selected_modes(wl, ["jax_jit", "compiled", "compiled_math", "compiled_head_major"]) == \
        ["jax_jit", "compiled", "compiled_math", "compiled_head_major"]
    assert "compiled_math" not in bench.selected_modes(wl, None) and "compiled" in bench.selected_modes(wl, [])
    unchunked = bench.worker_env("defer_unchunked", str(tmp_path), False, "gpt_100m_bf16")
    assert unchunked["TORCH_TPU_DEFER_CHUNK_NODES"] == "0" and unchunked["TORCH_TPU_DEFER_AND_FUSE"] == "1"
    long_cuts = bench.worker_env("defer_long_cuts", str(tmp_path), False, "gpt_100m")
    assert (long_cuts["TORCH_TPU_DEFER_CHUNK_NODES"], long_cuts["TORCH_TPU_DEFER_MIN_CUT_NODES"]) == ("0", "400")
    assert "defer_long_cuts" in bench.selected_modes(wl, ["defer_long_cuts"])
    assert "TORCH_TPU_DEFER_CHUNK_NODES" not in bench.worker_env("defer", str(tmp_path), False, "gpt_100m_bf16") \
        or os.environ.get("TORCH_TPU_DEFER_CHUNK_NODES")
