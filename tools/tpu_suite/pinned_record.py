"""The record of one default-suite run on the TPU at a pinned commit, kept in the repository.

A session's checkout is new each time and `.tpu/` does not survive it, so the list of tests the
pinned run has finished, with their outcomes, lives in `tools/tpu_suite/pinned_run.txt`: a header
`# pinned <commit>` and one line `OUTCOME NODE_ID` per test (passed, failed, error, skipped).

    python3 tools/tpu_suite/pinned_record.py new COMMIT            # start a record (pin_tree.sh)
    python3 tools/tpu_suite/pinned_record.py update RESULT...      # merge a call's suite.tgz / junit xml
    python3 tools/tpu_suite/pinned_record.py stage                 # .tpu/tree_done.txt, tree_outcomes.txt
    python3 tools/tpu_suite/pinned_record.py summary               # counts, and the failures by id
"""

from __future__ import annotations

import argparse
import collections
import io
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "tools" / "tpu_suite" / "pinned_run.txt"
OUTCOMES = ("passed", "failed", "error", "skipped")


def read_record(path: Path = RECORD) -> tuple[str, dict[str, str]]:
    """(pinned commit, outcome by node id) of the record."""
    commit, outcomes = "", {}
    for line in path.read_text().splitlines():
        if line.startswith("# pinned "):
            commit = line.split()[2]
        elif line and not line.startswith("#"):
            outcome, nodeid = line.split(" ", 1)
            outcomes[nodeid] = outcome
    return commit, outcomes


def write_record(commit: str, outcomes: dict[str, str], path: Path = RECORD) -> None:
    lines = [f"# pinned {commit}",
             "# the default suite on the TPU at that commit (tools/tpu_suite/README.md): OUTCOME NODE_ID"]
    lines += [f"{outcomes[n]} {n}" for n in sorted(outcomes)]
    path.write_text("\n".join(lines) + "\n")


def outcomes_from_junit(text: bytes) -> dict[str, str]:
    """Outcome by node id from a junit file of pytest (a call before outcomes.txt existed)."""
    found = {}
    for case in ET.fromstring(text).iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
            elif child.tag == "skipped":
                outcome = "skipped"
        path = case.get("classname", "").replace(".", "/") + ".py"
        found[f"{path}::{case.get('name')}"] = outcome
    return found


def outcomes_from_lines(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        outcome, _, nodeid = line.partition(" ")
        if outcome in OUTCOMES and nodeid:
            found[nodeid] = outcome
    return found


def outcomes_from_result(path: Path) -> dict[str, str]:
    """A returned suite.tgz (its outcomes.txt, else its junit files), or an outcomes/xml file."""
    found: dict[str, str] = {}
    if path.suffix == ".tgz":
        with tarfile.open(path) as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            if "outcomes.txt" in members:
                return outcomes_from_lines(tar.extractfile(members["outcomes.txt"]).read().decode())
            for name, member in sorted(members.items()):
                if name.endswith(".xml"):
                    found.update(outcomes_from_junit(tar.extractfile(member).read()))
        return found
    if path.suffix == ".xml":
        return outcomes_from_junit(path.read_bytes())
    return outcomes_from_lines(path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("new").add_argument("commit")
    sub.add_parser("update").add_argument("results", nargs="+", type=Path)
    sub.add_parser("stage")
    sub.add_parser("summary")
    args = parser.parse_args(argv)
    if args.cmd == "new":
        write_record(args.commit, {})
        return 0
    commit, outcomes = read_record()
    if args.cmd == "update":
        for result in args.results:
            outcomes.update(outcomes_from_result(result))
        write_record(commit, outcomes)
    elif args.cmd == "stage":
        tpu = ROOT / ".tpu"
        tpu.mkdir(exist_ok=True)
        (tpu / "tree_done.txt").write_text("".join(f"{n}\n" for n in sorted(outcomes)))
        (tpu / "tree_outcomes.txt").write_text("".join(f"{o} {n}\n" for n, o in sorted(outcomes.items())))
    counts = collections.Counter(outcomes.values())
    out = io.StringIO()
    print(f"pinned {commit}: {len(outcomes)} tests: " + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES), file=out)
    for nodeid, outcome in sorted(outcomes.items()):
        if outcome in ("failed", "error"):
            print(f"  {outcome} {nodeid}", file=out)
    sys.stdout.write(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
