"""pytest plugin for running the suite on a TPU host in calls of limited length.

TPU_SUITE_DONE names a file of node ids already run (one per line): they are deselected, and each
test that finishes is appended, so the next call goes on where this one stopped.
TPU_SUITE_OUTCOMES, where set, names a file that gets a line "OUTCOME NODE_ID" per test (passed,
failed, error, skipped; a later line for the same test wins), so that a run spanning calls can be
counted (`pinned_record.py`).
TPU_SUITE_CURRENT, where set, names a file holding the node id of the test running now (suite_run.sh's
memory watchdog names it when it has to kill the run).
TPU_SUITE_DEADLINE is a Unix time: once it is near, no further test starts and the session ends
cleanly (junit written), instead of being killed mid-test by the call's time limit.
"""
import os
import time

import pytest

_DONE = os.environ.get("TPU_SUITE_DONE")
_DEADLINE = float(os.environ.get("TPU_SUITE_DEADLINE", "0") or 0)
_OUTCOMES = os.environ.get("TPU_SUITE_OUTCOMES")
_CURRENT = os.environ.get("TPU_SUITE_CURRENT")
_MARGIN_S = float(os.environ.get("TPU_SUITE_MARGIN", "45"))


def _done_ids() -> set:
    if not _DONE or not os.path.exists(_DONE):
        return set()
    with open(_DONE) as f:
        return {line.strip() for line in f if line.strip()}


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    done = _done_ids()
    if not done:
        return
    keep = [it for it in items if it.nodeid not in done]
    dropped = [it for it in items if it.nodeid in done]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_runtest_logstart(nodeid, location):
    if _CURRENT:
        with open(_CURRENT, "w") as f:
            f.write(nodeid + "\n")


def pytest_runtest_logfinish(nodeid, location):
    if _DONE:
        with open(_DONE, "a") as f:
            f.write(nodeid + "\n")


def pytest_runtest_logreport(report):
    """The test's outcome, once known: its call's, or its setup's when that skipped or failed, or an
    error in its teardown."""
    if not _OUTCOMES:
        return
    if report.when == "call":
        outcome = report.outcome
    elif report.when == "setup" and not report.passed:
        outcome = "skipped" if report.skipped else "error"
    elif report.when == "teardown" and report.failed:
        outcome = "error"
    else:
        return
    with open(_OUTCOMES, "a") as f:
        f.write(f"{outcome} {report.nodeid}\n")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    if _DEADLINE and time.time() > _DEADLINE - _MARGIN_S:
        item.session.shouldstop = "TPU_SUITE_DEADLINE reached; the next call goes on from here"
        return True  # do not run this test
    return None
