"""The tests that changed since the pinned suite run: what `steps.sh changed` runs on the TPU.

The pinned run (``pinned_run.txt``) ran the default suite at one commit; tests edited since then
ran there in their old form, or not at all. Rerunning every changed file costs most of a chip
session (one changed table entry in ``test_errors_as_cpu.py`` would rerun its 452 tests), so this
picks the tests themselves:

- every test whose definition (decorators included) holds a changed line;
- every test that names, directly or through other module-level helpers, a changed module-level
  definition (a helper function, a constant), except where the change is inside entries of a
  dict literal keyed by strings (a table of cases): then only the tests whose ids carry a changed
  entry's key;
- every test id collected now that the pinned run does not list (new tests, new cases);
- a whole file where a changed line is a module-level statement of another kind.

Blank and comment-only lines do not count as changes. Deleted lines count as a change to the line
that now stands where they were.

    python3 tools/tpu_suite/changed_tests.py            # node ids, one per line, in collection order
    python3 tools/tpu_suite/changed_tests.py --why      # each with the reason it was picked
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pinned_record

_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", re.MULTILINE)


def changed_lines(diff: str) -> set[int]:
    """The new side's line numbers a ``git diff -U0`` of one file touches (a pure deletion: the
    line now at its place)."""
    lines: set[int] = set()
    for m in _HUNK.finditer(diff):
        start, count = int(m.group(1)), int(m.group(2) or 1)
        lines.update(range(start, start + count) if count else (max(start, 1),))
    return lines


def _span(node: ast.AST) -> range:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
    return range(first, node.end_lineno + 1)


def _names_used(node: ast.AST) -> set[str]:
    """Names a definition reads, its functions' parameters included (how a test names a fixture)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
        {a.arg for n in ast.walk(node) if isinstance(n, ast.arguments) for a in (*n.posonlyargs, *n.args,
                                                                               *n.kwonlyargs)}


def _applies_to_every_test(node: ast.AST) -> bool:
    """``pytestmark``, or an autouse fixture."""
    if "pytestmark" in _defined_names(node):
        return True
    return any(isinstance(d, ast.Call) and any(k.arg == "autouse" and getattr(k.value, "value", False)
                                               for k in d.keywords)
               for d in getattr(node, "decorator_list", ()))


def _defined_names(node: ast.AST) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}


def _tests_of(node: ast.AST) -> list[str]:
    """The test names (``test_x`` or ``TestX::test_y``) a top-level node defines."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
        return [node.name]
    if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
        return [f"{node.name}::{m.name}" for m in node.body
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")]
    return []


def _changed_case_keys(node: ast.AST, lines: set[int]) -> set[str] | None:
    """For an assignment of a dict literal keyed by strings, the keys of the entries holding a changed
    line; None when a changed line lies outside every entry or the value is not such a dict."""
    value = getattr(node, "value", None)
    if not isinstance(value, ast.Dict) or not all(isinstance(k, ast.Constant) and isinstance(k.value, str)
                                                  for k in value.keys):
        return None
    keys, covered = set(), set()
    for k, v in zip(value.keys, value.values):
        entry = set(range(k.lineno, v.end_lineno + 1))
        if entry & lines:
            keys.add(k.value)
            covered |= entry
    inner = lines & set(range(value.lineno + 1, value.end_lineno))
    return keys if inner == lines and covered >= inner else None


def select(source: str, lines: set[int], collected: list[str], pinned: set[str]) -> dict[str, str]:
    """Node id -> why it is picked, for one test file (``source`` at the checkout, ``lines`` its
    changed lines, ``collected`` its node ids now, ``pinned`` the ids the pinned run lists)."""
    text = source.splitlines()
    lines = {n for n in lines if n <= len(text) and text[n - 1].strip() and not text[n - 1].strip().startswith("#")}
    tree = ast.parse(source)
    picked_tests: dict[str, str] = {}  # test name -> why
    picked_keys: dict[str, str] = {}  # a case key -> why
    changed_names: set[str] = set()
    whole_file = ""
    for node in tree.body:
        hit = lines & set(_span(node))
        if not hit:
            continue
        tests = _tests_of(node)
        if tests:
            for t in tests:
                picked_tests[t] = f"its definition changed (line {min(hit)})"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            continue  # a new import changes no test's behaviour by itself
        elif _applies_to_every_test(node):
            whole_file = f"a mark or autouse fixture of every test changed (line {min(hit)})"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)):
            keys = _changed_case_keys(node, hit)
            if keys is not None:
                for k in keys:
                    picked_keys[k] = f"its case {k!r} changed (line {min(hit)})"
            else:
                changed_names |= _defined_names(node)
        elif not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Constant):  # (the docstring)
            whole_file = f"a module-level statement changed (line {min(hit)})"
    # a helper that names a changed helper changed too
    helpers = [(n, _defined_names(n), _names_used(n)) for n in tree.body if not _tests_of(n)]
    grew = True
    while grew:
        grew = False
        for _node, defined, used in helpers:
            if used & changed_names and not defined <= changed_names:
                changed_names |= defined
                grew = True
    for node in tree.body:
        used = _names_used(node) & changed_names
        for t in _tests_of(node):
            if used and t not in picked_tests:
                picked_tests[t] = f"it uses {', '.join(sorted(used))}, changed"
    why: dict[str, str] = {}
    for nodeid in collected:
        name = nodeid.split("::", 1)[1]
        base = name.split("[", 1)[0]
        params = name[len(base):]
        if whole_file:
            why[nodeid] = whole_file
        elif base in picked_tests:
            why[nodeid] = picked_tests[base]
        elif nodeid not in pinned:
            why[nodeid] = "not in the pinned run"
        else:
            key = next((k for k in picked_keys if k in params), None)
            if key is not None:
                why[nodeid] = picked_keys[key]
    return why


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def collect(files: list[str]) -> list[str]:
    """The node ids pytest collects from ``files`` (at the checkout)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                       check=False, capture_output=True, text=True)
    ids = [ln.strip() for ln in r.stdout.splitlines() if "::" in ln and not ln.startswith(" ")]
    if not ids and files:
        raise RuntimeError(f"pytest collected nothing from {files}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return ids


def changed_tests(collector: Callable[[list[str]], list[str]] = collect) -> dict[str, str]:
    """Node id -> why, over every test file changed since the pinned run's commit. A changed support
    module of the tests (conftest.py, helpers.py: what many tests share) is said on stderr: the
    tests it affects are not picked."""
    commit, outcomes = pinned_record.read_record()
    changed = [f for f in _git("diff", "--name-only", f"{commit}..HEAD", "--", "tests").split() if Path(f).exists()]
    files = [f for f in changed if re.search(r"(^|/)test_[^/]*\.py$", f)]
    support = [f for f in changed if f.endswith(".py") and f not in files]
    if support:
        print(f"changed_tests: support modules changed since {commit}, their tests not picked: {' '.join(support)}",
              file=sys.stderr)
    collected = collector(files)
    why: dict[str, str] = {}
    for f in files:
        ids = [i for i in collected if i.split("::", 1)[0] == f]
        lines = changed_lines(_git("diff", "-U0", f"{commit}..HEAD", "--", f))
        why.update(select(Path(f).read_text(), lines, ids, set(outcomes)))
    return why


def _print(why: Iterable[tuple[str, str]], reasons: bool) -> None:
    for nodeid, reason in why:
        print(f"{nodeid}\t{reason}" if reasons else nodeid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--why", action="store_true", help="print each test's reason beside it")
    args = parser.parse_args(argv)
    _print(changed_tests().items(), args.why)
    return 0


if __name__ == "__main__":
    sys.exit(main())
