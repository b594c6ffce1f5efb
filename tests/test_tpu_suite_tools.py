"""The TPU round's own tools (tools/tpu_suite/), checked where they can be without a TPU: a typo in
what a round runs costs minutes of borrowed device time."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest
import torch

from torchtpu.conformance.core import opinfo_by_key

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join(ROOT, "tools", "tpu_suite")


def _verify_lines() -> list[str]:
    with open(os.path.join(SUITE, "verify.txt")) as f:
        return [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]


@pytest.mark.fresh_process
def test_verify_list_names_existing_samples_functions_and_tests():
    ops = opinfo_by_key()
    for line in _verify_lines():
        if line.startswith("fn "):
            assert callable(getattr(torch, line[3:], None)), line
        elif line.startswith("probe "):
            assert os.path.isfile(os.path.join(SUITE, line[6:])), line
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
    for script in ("steps.sh", "suite_run.sh", "pin_tree.sh"):
        assert subprocess.run(["bash", "-n", os.path.join(SUITE, script)], check=False).returncode == 0, script


def _suite_call(tmp_path: pathlib.Path, test_b_body: str, seconds: int, available_kb: int = 40_000_000
                ) -> tuple[subprocess.CompletedProcess, pathlib.Path, float]:
    """suite_run.sh in a tree of two tests: test_a passes, test_b runs ``test_b_body``; the memory it
    sees is a meminfo file (MEMINFO in the body) holding ``available_kb``. The run, its OUT and seconds."""
    work = tmp_path / "tree"
    shutil.copytree(SUITE, work / ".tpu" / "suite")
    (work / "tests").mkdir()
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(f"MemAvailable: {available_kb} kB\n")
    (work / "tests" / "test_x.py").write_text(
        f"import time\n\nMEMINFO = {str(meminfo)!r}\n\ndef test_a():\n    pass\n\ndef test_b():\n{test_b_body}")
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), TPU_SUITE_MARGIN="0", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               SUITE_MEMINFO=str(meminfo),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    start = time.monotonic()
    r = subprocess.run(["bash", ".tpu/suite/suite_run.sh", "t", str(seconds), "tests"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    return r, out, time.monotonic() - start


def test_a_suite_call_kills_pytest_at_its_deadline_and_keeps_what_finished(tmp_path):
    """suite_run.sh: a test still running at the deadline (in C, where pytest's own stop cannot reach:
    round 27's cut call, which brought nothing back) is killed with pytest; the tests that finished
    stay in done.txt and outcomes.txt, the one cut short is not there, so the next call runs it."""
    r, out, seconds = _suite_call(tmp_path, "    time.sleep(60)\n", 15)
    assert seconds < 40, r.stdout[-1000:]
    assert "killed at the deadline" in r.stdout, r.stdout[-1000:] + r.stderr[-1000:]
    assert (out / "done.txt").read_text().split() == ["tests/test_x.py::test_a"]
    assert (out / "outcomes.txt").read_text().split() == ["passed", "tests/test_x.py::test_a"]


def test_a_suite_call_kills_a_test_that_exhausts_the_hosts_memory_and_goes_on_past_it(tmp_path):
    """suite_run.sh's memory watchdog: a test that takes the host's memory below the floor (the 30th
    session's `steps.sh changed` filled the chip host's 40 GiB, and the device tool gave the machine back
    with nothing of the call) is killed with pytest, named in memory.txt, and recorded failed and done."""
    r, out, seconds = _suite_call(
        tmp_path, "    open(MEMINFO, 'w').write('MemAvailable: 1000 kB\\n')\n    time.sleep(60)\n", 50)
    assert seconds < 30, r.stdout[-1000:]
    assert "killed pytest in tests/test_x.py::test_b" in r.stdout, r.stdout[-1000:] + r.stderr[-1000:]
    assert (out / "done.txt").read_text().split() == ["tests/test_x.py::test_a", "tests/test_x.py::test_b"]
    assert (out / "outcomes.txt").read_text().split() == [
        "passed", "tests/test_x.py::test_a", "failed", "tests/test_x.py::test_b"]


def test_a_step_out_of_memory_is_killed_and_its_results_still_come_back(tmp_path):
    """steps.sh's memory guard, for steps that run no tests (benches, probes): the step's processes are
    killed below the floor and the call returns its results with memory.txt, instead of the host running
    out (which the device tool answers by giving the machine back with nothing)."""
    work = tmp_path / "tree"
    shutil.copytree(SUITE, work / "tools" / "tpu_suite")
    for probe in ("probe_compile_effort.py", "probe_gather_compile.py"):  # the `jax` step's probes
        (work / "tools" / "tpu_suite" / probe).write_text("import time\nprint('probe started', flush=True)\ntime.sleep(60)\n")
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemAvailable: 1000 kB\n")
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, OUT=str(out), SUITE_MEMINFO=str(meminfo),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    start = time.monotonic()
    r = subprocess.run(["bash", "tools/tpu_suite/steps.sh", "jax", "100"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert time.monotonic() - start < 30, r.stdout[-1000:] + r.stderr[-1000:]
    assert "results: jax.tgz" in r.stdout, r.stdout[-1000:] + r.stderr[-1000:]
    back = tmp_path / "back"
    back.mkdir()
    subprocess.run(["tar", "xzf", str(out / "jax.tgz"), "-C", str(back)], check=True)
    assert "step memory guard" in (back / "memory.txt").read_text()


def _calls(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` calls one of ``names``, or starts a Python child (``sys.executable`` in a
    subprocess call's arguments: the second test of the decode probe did, and this missed it)."""
    for n in ast.walk(node):
        if not isinstance(n, ast.Call):
            continue
        name = getattr(n.func, "id", getattr(n.func, "attr", None))
        if name in names:
            return True
        if isinstance(n.func, ast.Attribute) and getattr(n.func.value, "id", None) == "subprocess" \
                and "sys.executable" in ast.unparse(n):
            return True
    return False


def _marked(decorators: list[ast.expr]) -> bool:
    return any("fresh_process" in ast.unparse(d) or "emulator_only" in ast.unparse(d) for d in decorators)


def test_every_test_starting_a_child_process_is_marked_fresh_process():
    """On a TPU host a child process cannot open the chip once the test process holds it: a test
    that starts one must carry fresh_process (run first) or emulator_only. An unmarked one cost a
    failure in the twelfth TPU round, found only there."""
    unmarked = []
    for path in sorted(pathlib.Path(ROOT, "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_marked = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                            and _marked([n.value]) for n in tree.body)
        helpers = {"run_python"}  # and this module's own functions that call it
        helpers |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("test_")
                    and _calls(n, helpers)}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and _calls(node, helpers) \
                    and not module_marked and not _marked(node.decorator_list):
                unmarked.append(f"{path.relative_to(ROOT)}::{node.name}")
    assert not unmarked, unmarked


@pytest.mark.fresh_process
def test_fresh_done_lists_existing_fresh_process_tests():
    """steps.sh fresh skips the ids of tools/tpu_suite/fresh_done.txt: each must name a collected
    fresh_process test (a stale id would leave its renamed test to run again, a wrong one hides nothing)."""
    with open(os.path.join(SUITE, "fresh_done.txt")) as f:
        ids = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                        "-m", "fresh_process", *sorted({i.split("::")[0] for i in ids})],
                       cwd=ROOT, capture_output=True, text=True, check=False)
    collected = {ln.strip() for ln in r.stdout.splitlines() if "::" in ln}
    assert ids and set(ids) <= collected, set(ids) - collected


def test_the_examples_runner_names_every_example_and_reads_its_figures_line():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import run_examples

    scripts = {str(p.relative_to(pathlib.Path(ROOT) / "examples"))[:-3]
               for p in (pathlib.Path(ROOT) / "examples").rglob("*.py") if not p.name.startswith("_")}
    assert set(run_examples.EXAMPLES) == scripts
    out = ("dlrm on tpu: 10 steps, loss 0.7 -> 0.2\n/x/matmul.py:128: UserWarning: torchtpu: float32 ...\n"
           "  precision.note_float32_product(ctx.precision)\n")
    assert run_examples._figures(out) == "dlrm on tpu: 10 steps, loss 0.7 -> 0.2"


def test_the_example_step_probe_counts_each_optimizer_steps_launches_and_compiles():
    sys.path.insert(0, os.path.join(ROOT, "tools", "tpu_suite"))
    import probe_example_steps

    rows = probe_example_steps.main(["dlrm", "--tiny", "--steps", "3"])
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["launches"] > 0 and r["wall_ms"] > 0 and r["reads"] >= 0 for r in rows)
    assert all(isinstance(r["compiles"], int) for r in rows)  # (0 where an earlier test compiled them)


def test_the_suite_plugin_records_each_tests_outcome(tmp_path, monkeypatch):
    import importlib
    import types

    sys.path.insert(0, SUITE)
    monkeypatch.setenv("TPU_SUITE_OUTCOMES", str(tmp_path / "outcomes.txt"))
    import suite_resume

    suite_resume = importlib.reload(suite_resume)  # it reads the environment at import

    def report(nodeid: str, when: str, outcome: str) -> types.SimpleNamespace:
        return types.SimpleNamespace(nodeid=nodeid, when=when, outcome=outcome, passed=outcome == "passed",
                                     skipped=outcome == "skipped", failed=outcome == "failed")

    for r in (report("t::a", "setup", "passed"), report("t::a", "call", "passed"), report("t::a", "teardown", "passed"),
              report("t::b", "setup", "skipped"), report("t::c", "call", "failed"),
              report("t::d", "setup", "failed"), report("t::e", "call", "passed"),
              report("t::e", "teardown", "failed")):
        suite_resume.pytest_runtest_logreport(r)
    lines = (tmp_path / "outcomes.txt").read_text().splitlines()
    assert lines == ["passed t::a", "skipped t::b", "failed t::c", "error t::d", "passed t::e", "error t::e"]
    monkeypatch.delenv("TPU_SUITE_OUTCOMES")
    importlib.reload(suite_resume)


def test_the_pinned_record_merges_returned_results_later_ones_winning(tmp_path):
    import io
    import tarfile

    sys.path.insert(0, SUITE)
    import pinned_record

    junit = (b'<testsuites><testsuite><testcase classname="tests.test_x" name="test_a[1]"/>'
             b'<testcase classname="tests.test_x" name="test_b"><skipped/></testcase>'
             b'<testcase classname="tests.test_y" name="test_c"><failure/></testcase></testsuite></testsuites>')
    assert pinned_record.outcomes_from_junit(junit) == {
        "tests/test_x.py::test_a[1]": "passed", "tests/test_x.py::test_b": "skipped",
        "tests/test_y.py::test_c": "failed"}
    tgz = tmp_path / "suite.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        data = b"failed tests/test_y.py::test_c\npassed tests/test_y.py::test_c\n"
        info = tarfile.TarInfo("./outcomes.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    record = tmp_path / "pinned_run.txt"
    outcomes = pinned_record.outcomes_from_junit(junit)
    outcomes.update(pinned_record.outcomes_from_result(tgz))
    pinned_record.write_record("abc1234", outcomes, record)
    commit, back = pinned_record.read_record(record)
    assert commit == "abc1234" and back["tests/test_y.py::test_c"] == "passed" and len(back) == 3


def test_the_pinned_record_names_a_commit_and_only_known_outcomes():
    sys.path.insert(0, SUITE)
    import pinned_record

    commit, outcomes = pinned_record.read_record()
    assert re.fullmatch(r"[0-9a-f]{7,40}", commit), commit  # (CI's clone may be shallow: no lookup)
    assert set(outcomes.values()) <= set(pinned_record.OUTCOMES)


def test_the_decode_timeline_probe_reads_busy_and_idle_time_from_program_runs():
    sys.path.insert(0, SUITE)
    import probe_decode_timeline

    from torchtpu.runtime.xspace import DeviceEvent

    # two steps: programs of 100 and 50 us, 20 us idle between runs (times in ps)
    runs = [DeviceEvent(0, "XLA Modules", name, start * 1_000_000, length * 1_000_000)
            for name, start, length in (("step", 0, 100), ("cat", 120, 50), ("step", 190, 100), ("cat", 310, 50))]
    lines = probe_decode_timeline.summarize(runs, steps=2, wall_s=400e-6)
    assert "4 program runs (2.00 a step), busy 150.0 us a step, first start to last end 180.0 us a step (83% busy)" \
        in lines[0]
    assert "median 20.0 us, max 20.0 us, total 30.0 us a step" in lines[1]
    assert "host: 200.0 us a step" in lines[2]
    assert "100.0 us a step" in lines[3] and "step" in lines[3]


@pytest.mark.fresh_process
def test_the_decode_timeline_probe_runs_a_small_generation():
    """The CPU plugin has no device timeline: the probe says so and gives the host's figures; a TPU's
    timeline gives the program runs (this test asserted the CPU plugin's line alone, and failed on the chip)."""
    from torchtpu.runtime import plugins

    r = subprocess.run([sys.executable, os.path.join(SUITE, "probe_decode_timeline.py"), "decode_b1",
                        "compiled_replayed", "--small", "--pack-max-bytes", "0"],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "decode_b1 compiled_replayed (pack_max_bytes 0):" in r.stdout
    if plugins.selected_kind() == "cpu":
        assert "no device timeline in this plugin" in r.stdout
    else:
        assert "program runs" in r.stdout, r.stdout[-2000:]


def test_the_resnet_probe_finds_the_tpu_gradients_as_near_float64_as_cpus(capsys):
    """probe_resnet_steps' one-step comparison on the example's tiny net: in every setting the tpu
    gradients are about as near the float64 step's as the CPU's own (the chip's last loss, 0.920
    against the emulator's 0.600 and CPU's 1.083, is rounding compounded, unless the chip says otherwise)."""
    sys.path.insert(0, SUITE)
    import probe_resnet_steps

    # (the example's setting and float32's: the third, bf16 in the default layout, adds compiles, not checks)
    probe_resnet_steps.compare_one_step(probe_resnet_steps.load_example(), tiny=True,
                                        settings=probe_resnet_steps.SETTINGS[:2])
    ratios = [float(line.rsplit(" ", 1)[1]) for line in capsys.readouterr().out.splitlines() if line.startswith("==")]
    assert len(ratios) == 2 and all(r < 4 for r in ratios), ratios


_PROFILED_HLO = """HloModule step

%fused_product (p0: bf16[8,128], p1: bf16[128,128]) -> f32[8,128] {
  %p0 = bf16[8,128]{1,0} parameter(0)
  %p1 = bf16[128,128]{1,0} parameter(1)
  ROOT %convolution.1 = f32[8,128]{1,0} convolution(%p0, %p1), dim_labels=bf_io->bf
}

%inner_reduce (p0: f32[8,128]) -> f32[8] {
  %p0 = f32[8,128]{1,0} parameter(0)
  %c = f32[] constant(0)
  ROOT %reduce.2 = f32[8]{0} reduce(%p0, %c), dimensions={1}, to_apply=%add
}

%fused_outer (p0: f32[8,128]) -> f32[8] {
  %p0 = f32[8,128]{1,0} parameter(0)
  ROOT %fusion.9 = f32[8]{0} fusion(%p0), kind=kLoop, calls=%inner_reduce
}

ENTRY %main (a: bf16[8,128], b: bf16[128,128]) -> f32[8] {
  %a = bf16[8,128]{1,0} parameter(0)
  %b = bf16[128,128]{1,0} parameter(1)
  %fusion.1 = f32[8,128]{1,0} fusion(%a, %b), kind=kOutput, calls=%fused_product, metadata={op_name="blocks.3.mlp/aten.mm.default"}
  %copy.3 = f32[8,128]{0,1} copy(%fusion.1), metadata={op_name="blocks.10.attn/aten.transpose.int" source_line=1}
  %name.4 = f32[8,128]{1,0} custom-call(%copy.3), custom_call_target="tpu_custom_call", backend_config="{}"
  %broadcast.5 = f32[8,128,4]{2,1,0} broadcast(%name.4), dimensions={0,1}
  %convert.6 = bf16[8,128]{1,0} convert(%name.4)
  ROOT %fusion.7 = f32[8]{0} fusion(%name.4), kind=kLoop, calls=%fused_outer
}
"""


def test_the_profile_comparison_sorts_each_ops_time_into_its_kind_of_work(tmp_path, capsys):
    """compare_profiles.py: a product's fusion, a Mosaic kernel, a relayout copy, a broadcast, a convert
    and a nested reduction fusion each land in their kind; two profiles of one side add up."""
    sys.path.insert(0, SUITE)
    try:
        import compare_profiles
    finally:
        sys.path.remove(SUITE)
    for stem, scale in (("a", 1), ("b", 2)):
        (tmp_path / f"{stem}.opt.hlo").write_text(_PROFILED_HLO)
        rows = [("10.0", "%fusion.1 = f32[8,128]{1,0} fusion(%a, %b), kind=kOutput"), ("4.0", "%copy.3 = f32[8,128]"),
                ("7.5", "%name.4 = f32[8,128] custom-call(%copy.3)"), ("3.0", "%broadcast.5 = f32[8,128,4]"),
                ("1.0", "%convert.6 = bf16[8,128]"), ("2.0", "%fusion.7 = f32[8]{0} fusion(%name.4)")]
        (tmp_path / f"{stem}.ops.tsv").write_text("".join(f"{float(us) * scale}\t1.00\t{op}\n" for us, op in rows))
    got = compare_profiles.side([str(tmp_path / "a"), str(tmp_path / "b")])
    assert {k: v[0] for k, v in got.items() if v[0]} == {
        "matmul": 30.0, "copy": 12.0, "kernel": 22.5, "broadcast": 9.0, "elementwise": 3.0, "reduce": 6.0}
    assert got["matmul"][1] == 2.0
    assert compare_profiles.main([str(tmp_path / "a"), "--vs", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^matmul\s+0\.010\s+1\s+0\.020\s+1\s+-0\.010$", out, re.MULTILINE), out
    # by source: the instructions' op_names, layers folded, the unnamed together
    found = compare_profiles.sources([str(tmp_path / "a"), str(tmp_path / "b")])
    assert found[("matmul", "blocks.*.mlp/aten.mm")] == [30.0, 2.0]
    assert found[("copy", "blocks.*.attn/aten.transpose.int")] == [12.0, 2.0]
    assert found[("kernel", "(unnamed)")] == [22.5, 2.0]
    assert compare_profiles.main([str(tmp_path / "a"), "--vs", str(tmp_path / "b"), "--sources", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\s+0\.015\s+1\s+kernel\s+\(unnamed\)$", out, re.MULTILINE), out


_CHANGED_SOURCE = '''"""A test file."""
import os

CASES = {
    "a": 1,
    # a comment
    "b": 2,
}
LIMIT = 3


def helper():
    return LIMIT


@pytest.fixture
def thing():
    return 1


def test_plain():
    assert 1


@pytest.mark.parametrize("case", CASES)
def test_cases(case):
    assert case


def test_helper():
    assert helper()


def test_fixture(thing):
    assert thing


class TestGroup:
    def test_inside(self):
        assert 1
'''
_CHANGED_IDS = ["t.py::test_plain", "t.py::test_cases[a]", "t.py::test_cases[b]", "t.py::test_helper",
                "t.py::test_fixture", "t.py::TestGroup::test_inside"]


@pytest.mark.parametrize("lines, picked", [
    ({22}, ["t.py::test_plain"]),  # inside a test
    ({25}, ["t.py::test_cases[a]", "t.py::test_cases[b]"]),  # its decorator
    ({7}, ["t.py::test_cases[b]"]),  # one entry of a table of cases
    ({6, 2, 1}, []),  # a comment, an import, the docstring
    ({9}, ["t.py::test_helper"]),  # a constant a helper reads
    ({18}, ["t.py::test_fixture"]),  # a fixture, named as a parameter
    ({40}, ["t.py::TestGroup::test_inside"]),
])
def test_the_changed_test_selector_picks_the_tests_a_change_touches(lines, picked):
    sys.path.insert(0, SUITE)
    import changed_tests

    got = changed_tests.select(_CHANGED_SOURCE, lines, _CHANGED_IDS, set(_CHANGED_IDS))
    assert sorted(got) == sorted(picked), got


def test_the_changed_test_selector_adds_new_ids_and_reads_git_hunks():
    sys.path.insert(0, SUITE)
    import changed_tests

    got = changed_tests.select(_CHANGED_SOURCE, set(), _CHANGED_IDS, set(_CHANGED_IDS[1:]))
    assert got == {"t.py::test_plain": "not in the pinned run"}
    diff = "@@ -3,0 +4,2 @@ x\n+a\n+b\n@@ -10 +12 @@\n-c\n+d\n@@ -20,3 +22,0 @@\n"
    assert changed_tests.changed_lines(diff) == {4, 5, 12, 22}


def test_the_changed_test_selector_takes_a_whole_file_for_a_module_level_statement():
    sys.path.insert(0, SUITE)
    import changed_tests

    source = _CHANGED_SOURCE + "\nif os.environ.get('X'):\n    LIMIT = 4\n"
    n = len(_CHANGED_SOURCE.splitlines())
    assert sorted(changed_tests.select(source, {n + 2}, _CHANGED_IDS, set(_CHANGED_IDS))) == \
        sorted(_CHANGED_IDS)
