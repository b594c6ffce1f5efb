"""torch.profiler shows device time on tpu (issue 43): a Kineto activity profiler for PrivateUse1
(``csrc/profiler.cpp``) gets one event per launched program, timed by ``engine/device_trace``,
linked to the op that launched it: ``key_averages()`` has device time per op and the Chrome
trace a device row, in Strict, DeferAndFuse, Debug and compiled code."""

from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from torchtpu.engine import device_trace

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to("tpu")


def _kernels(prof, tmp_path) -> tuple[list[dict], dict[int, str]]:
    """The trace's device events, and the names of the processes (rows) they sit on."""
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    return [e for e in events if e.get("cat") == "kernel"], names


@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse", "debug"])
def test_a_training_step_shows_device_time_and_a_device_row(mode, tmp_path):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, 32).to("tpu")
    with torch.tpu.eager_mode(mode):
        _train_step(model, opt, x).item()  # compiled outside the profile
        with profile(activities=ACTIVITIES) as prof:
            _train_step(model, opt, x).item()
    kernels, rows = _kernels(prof, tmp_path)
    assert kernels, "no device events"
    assert {rows[k["pid"]] for k in kernels} == {"tpu:0"}
    assert all(k["dur"] >= 0 for k in kernels)
    # the programs' rows and the ops that launched them both carry the device time
    names = {k["name"] for k in kernels}
    on_device = sum(k["dur"] for k in kernels)
    in_rows = sum(e.self_device_time_total for e in prof.key_averages() if e.key in names)
    assert on_device > 0 and abs(in_rows - on_device) <= 1e-3 * on_device + 1.0
    in_ops = sum(e.self_device_time_total for e in prof.key_averages() if e.key not in names)
    assert abs(in_ops - on_device) <= 1e-3 * on_device + 1.0
    ops = {e.key: e.device_time_total for e in prof.key_averages()}
    if mode == "defer_and_fuse":
        # the step's ops run as fused graphs, launched where a value is needed (.item())
        assert any(k["name"] == "a fused DeferAndFuse graph" for k in kernels)
        assert ops["aten::item"] > 0
    else:
        assert ops["aten::addmm"] > 0 and ops["aten::mm"] > 0  # forward, and backward's weight gradients
        # each program sits inside the op that launched it
        by_id = {}
        path = tmp_path / "trace.json"
        for e in json.loads(path.read_text())["traceEvents"]:
            if e.get("cat") == "cpu_op":
                by_id[e["args"].get("External id")] = e
        for k in kernels:
            op = by_id[k["args"]["External id"]]
            if op["name"] == "torchtpu::optimizer_step":  # the optimizer step, one program (optimizer_steps.py)
                assert k["name"] == "a fused DeferAndFuse graph", k["name"]
                continue
            assert k["name"].startswith(op["name"]), (k["name"], op["name"])
            assert op["ts"] <= k["ts"] + 1.0


def test_compiled_code_shows_its_graph_on_the_device_row(tmp_path):
    model = _model()
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(16, 32).to("tpu")
    compiled(x).sum().item()
    with profile(activities=ACTIVITIES) as prof:
        compiled(x).sum().item()
    kernels, _ = _kernels(prof, tmp_path)
    assert any(k["name"].startswith("the compiled graph") for k in kernels), [k["name"] for k in kernels]


def test_device_time_only_while_a_profile_asks_for_it(tmp_path):
    x = torch.randn(8, 8).to("tpu")
    assert not device_trace.active()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        assert not device_trace.active()
        (x + 1).cpu()
    kernels, _ = _kernels(prof, tmp_path)
    assert not kernels
    assert all(e.device_time_total == 0 for e in prof.key_averages())
    with profile(activities=ACTIVITIES):
        assert device_trace.active()
    assert not device_trace.active()


def test_a_replayed_tpu_graph_shows_its_device_time(tmp_path):
    """torch.tpu.TPUGraph.replay launches as the op torchtpu::graph_replay: its program's device
    time sits in that op's row."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    x = torch.randn(16, 32).to("tpu")
    model(x).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    g = torch.tpu.TPUGraph()
    with torch.tpu.graph(g):
        model(x).sum().backward()
        opt.step()
    g.replay()
    torch.tpu.synchronize()
    with profile(activities=ACTIVITIES) as prof:
        g.replay()
        torch.tpu.synchronize()
    kernels, _ = _kernels(prof, tmp_path)
    assert len(kernels) == 1, [k["name"] for k in kernels]
    ops = {e.key: e.device_time_total for e in prof.key_averages()}
    assert ops["torchtpu::graph_replay"] > 0
