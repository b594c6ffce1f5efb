"""torch.profiler shows device time on tpu (issue 43): a Kineto activity profiler for PrivateUse1
(``csrc/profiler.cpp``) gets one event per launched program, timed by ``engine/device_trace``,
linked to the op that launched it: ``key_averages()`` has device time per op and the Chrome
trace a device row, in Strict, DeferAndFuse, Debug and compiled code."""

from __future__ import annotations

import itertools
import json
import pathlib

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from torchtpu.engine import device_trace
from torchtpu.runtime import xspace

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


# -- the plugin's device timeline (libtpu's profiler extension) -------------------------------------

V5E_XSPACE = pathlib.Path(__file__).parent / "data" / "v5e_xspace_10_launches.pb"


def test_a_v5e_timeline_reads_as_device_events():
    """What a v5e's plugin profiler returned for 10 launches of a 1024x1024 matmul-tanh-matmul
    program (tools/tpu_suite/probe_plugin_profiler.py, round 18): 10 module runs of ~25 us on
    tpu 0, 40 op events."""
    data = V5E_XSPACE.read_bytes()
    modules = xspace.device_events(data)
    assert len(modules) == 10 and {m.device for m in modules} == {0}
    assert all(m.name.startswith("m(") and 24_000_000 < m.duration_ps < 26_000_000 for m in modules)
    assert all(a.start_ps + a.duration_ps <= b.start_ps for a, b in itertools.pairwise(modules))
    ops = xspace.device_events(data, ("XLA Ops",))
    assert len(ops) == 40 and any("fusion" in o.name for o in ops)
    with pytest.raises(ValueError, match="XSpace"):
        xspace.device_events(data[:-3])


def _timed(device: int, launched_ns: int, start_ns: int, end_ns: int) -> device_trace._Timed:
    return device_trace._Timed("prog", 7, device, launched_ns, start_ns, end_ns)


def test_launches_take_their_module_runs_times_on_the_host_clock():
    """The k-th launch on a device gets the k-th module run; the timeline's origin sits at the
    profiler's start unless a program would then start before its launch."""
    runs = [xspace.DeviceEvent(0, "XLA Modules", "m(1)", ps, 5_000_000) for ps in (50_000_000, 60_000_000)]
    launches = [_timed(0, 1_000_040_000, 0, 0), _timed(0, 1_000_050_000, 0, 0)]
    times = device_trace.device_times(launches, runs, started_ns=1_000_000_000)
    assert times == [("prog", 7, 0, 1_000_050_000, 1_000_055_000), ("prog", 7, 0, 1_000_060_000, 1_000_065_000)]
    # a launch later than its run would start: the origin moves so that it starts at its launch
    launches = [_timed(0, 1_000_052_000, 0, 0), _timed(0, 1_000_053_000, 0, 0)]
    times = device_trace.device_times(launches, runs, started_ns=1_000_000_000)
    assert [t[3] for t in times] == [1_000_052_000, 1_000_062_000]


def test_launches_that_do_not_pair_with_the_timeline_keep_their_completion_times(monkeypatch):
    monkeypatch.setattr(device_trace, "_warned", set())
    runs = [xspace.DeviceEvent(0, "XLA Modules", "m(1)", 50_000_000, 5_000_000)]
    launches = [_timed(0, 10, 11, 20), _timed(0, 30, 31, 40)]
    with pytest.warns(RuntimeWarning, match="1 program runs for 2 launches"):
        times = device_trace.device_times(launches, runs, started_ns=0)
    assert [(t[3], t[4]) for t in times] == [(11, 20), (31, 40)]
    assert [(t[3], t[4]) for t in device_trace.device_times(launches, None, 0)] == [(11, 20), (31, 40)]


_field = xspace.encode_field


def _one_device_xspace(runs: int, duration_ps: int) -> bytes:
    """An XSpace with ``runs`` module runs on /device:TPU:0, one per 100 us, as libtpu lays it out."""
    meta = _field(4, _field(1, 1) + _field(2, _field(1, 1) + _field(2, b"m(42)")))
    events = b"".join(_field(4, _field(1, 1) + _field(2, 10**9 + k * 10**8) + _field(3, duration_ps))
                      for k in range(runs))
    line = _field(3, _field(1, 2) + _field(2, b"XLA Modules") + events)
    return _field(1, _field(1, 1) + _field(2, b"/device:TPU:0") + line + meta)


class _FakePluginProfiler:
    """Stands in for libtpu's profiler on the CPU plugin: its timeline has one 7 us module run per
    launch made while it ran."""
    created = 0

    def __init__(self, api, options=b""):
        _FakePluginProfiler.created += 1
        self.state = "created"

    def start(self):
        self.state = "started"

    def stop(self):
        assert self.state == "started"
        self.state = "stopped"

    def collect(self):
        assert self.state == "stopped"
        return _one_device_xspace(len(device_trace._session.launches), 7_000_000)

    def close(self):
        self.state = "closed"


def test_a_plugin_timeline_gives_the_device_rows_their_times(monkeypatch, tmp_path):
    """On a plugin with a profiler (a TPU's), each program on the device row has its run's time
    from the plugin's timeline; on the CPU plugin this runs with a stand-in profiler."""
    monkeypatch.setattr(device_trace, "_timeline_api", lambda plugin: object())
    monkeypatch.setattr(device_trace.plugin_profiler, "PluginProfiler", _FakePluginProfiler)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(16, 32).to("tpu")
    _train_step(model, opt, x).item()
    created = _FakePluginProfiler.created
    with profile(activities=ACTIVITIES) as prof:
        _train_step(model, opt, x).item()
    assert _FakePluginProfiler.created == created + 1
    kernels, rows = _kernels(prof, tmp_path)
    assert len(kernels) > 3 and {rows[k["pid"]] for k in kernels} == {"tpu:0"}
    assert all(abs(k["dur"] - 7.0) < 1e-3 for k in kernels), [k["dur"] for k in kernels]
    starts = sorted(k["ts"] for k in kernels)
    assert all(b - a >= 99.9 for a, b in itertools.pairwise(starts))  # the timeline's spacing, 100 us
    ops = {e.key: e.device_time_total for e in prof.key_averages()}
    assert ops["aten::addmm"] > 0


def test_without_the_timeline_variable_device_times_come_from_completion_events(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_TPU_PROFILER_PLUGIN_TIMELINE", "0")
    monkeypatch.setattr(device_trace, "_timeline_api", lambda plugin: object())
    monkeypatch.setattr(device_trace.plugin_profiler, "PluginProfiler", _FakePluginProfiler)
    created = _FakePluginProfiler.created
    x = torch.randn(8, 8).to("tpu")
    with profile(activities=ACTIVITIES) as prof:
        (x + 1).cpu()
    assert _FakePluginProfiler.created == created
    kernels, _ = _kernels(prof, tmp_path)
    assert kernels


def test_the_cpu_plugin_has_no_timeline_and_a_tpu_plugin_has_one():
    from torchtpu import _device_state
    from torchtpu.runtime import plugin_profiler

    api = plugin_profiler.profiler_api(_device_state.client().plugin)
    assert (api is not None) == (_device_state.client().platform_name == "tpu")
