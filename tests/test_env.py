"""TORCH_TPU_* environment variables: one table, one parser; a bad value warns, never breaks."""

from __future__ import annotations

import pathlib
import re
import warnings

import pytest
from helpers import run_python

from torchtpu.runtime import env


@pytest.fixture(autouse=True)
def _fresh_warnings():
    env._warned.clear()
    yield
    env._warned.clear()


def test_flags_integers_and_choices(monkeypatch):
    monkeypatch.setenv("TORCH_TPU_CHECK_NAN", " Yes ")
    assert env.read("TORCH_TPU_CHECK_NAN") is True
    monkeypatch.setenv("TORCH_TPU_CHECK_NAN", "off")
    assert env.read("TORCH_TPU_CHECK_NAN") is False
    monkeypatch.setenv("TORCH_TPU_CHECK_NAN", "")
    assert env.read("TORCH_TPU_CHECK_NAN") is False  # empty: the default
    monkeypatch.delenv("TORCH_TPU_DEBUG_CHECKS", raising=False)
    assert env.read("TORCH_TPU_DEBUG_CHECKS") is None  # unset: decided elsewhere
    monkeypatch.setenv("TORCH_TPU_NUM_DEVICES", "3")
    assert env.read("TORCH_TPU_NUM_DEVICES") == 3
    monkeypatch.setenv("TORCH_TPU_COMPILE_CACHE_PLUGIN_ID", "CONTENT")
    assert env.read("TORCH_TPU_COMPILE_CACHE_PLUGIN_ID") == "content"
    monkeypatch.setenv("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", "  /tmp/x ")
    assert env.read("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT") == "/tmp/x"


def test_alias(monkeypatch):
    monkeypatch.delenv("TORCH_TPU_LAUNCH_BLOCKING", raising=False)
    monkeypatch.setenv("TPU_LAUNCH_BLOCKING", "1")
    assert env.read("TORCH_TPU_LAUNCH_BLOCKING") is True
    monkeypatch.setenv("TORCH_TPU_LAUNCH_BLOCKING", "0")  # the documented name wins
    assert env.read("TORCH_TPU_LAUNCH_BLOCKING") is False


@pytest.mark.parametrize(("name", "value", "default"), [
    ("TORCH_TPU_NUM_DEVICES", "two", 1),
    ("TORCH_TPU_NUM_DEVICES", "0", 1),
    ("TORCH_TPU_XLA_THREAD_NICE", "25", 0),
    ("TORCH_TPU_DEFER_AND_FUSE", "maybe", False),
    ("TORCH_TPU_COMPILE_CACHE_PLUGIN_ID", "md5", "stat"),
])
def test_a_bad_value_warns_once_and_keeps_the_default(monkeypatch, name, value, default):
    monkeypatch.setenv(name, value)
    with pytest.warns(RuntimeWarning, match=f"{name}={value!r}.*default, {default!r}"):
        assert env.read(name) == default
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert env.read(name) == default
    assert not again  # said once per value


@pytest.mark.fresh_process
def test_import_torch_survives_malformed_variables():
    r = run_python("""
        import torch
        print((torch.ones(3, device="tpu") * 2).cpu().tolist(), torch.tpu.device_count())
    """, {"TORCH_TPU_NUM_DEVICES": "two", "TORCH_TPU_DEFER_AND_FUSE": "sure", "TORCH_TPU_DEFER_CHUNK_NODES": "-4"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "[2.0, 2.0, 2.0] 1" in r.stdout
    for name in ("TORCH_TPU_NUM_DEVICES='two'", "TORCH_TPU_DEFER_AND_FUSE='sure'", "TORCH_TPU_DEFER_CHUNK_NODES='-4'"):
        assert name in r.stderr, (name, r.stderr[-2000:])


def test_bad_bucket_sizes_warn_and_keep_pow2(monkeypatch):
    from torchtpu.engine import bucketing

    monkeypatch.setenv("TORCH_TPU_DYNAMIC_BUCKETS", "a,b")
    try:
        with pytest.warns(RuntimeWarning, match="TORCH_TPU_DYNAMIC_BUCKETS='a,b'.*default, 'pow2'"):
            bucketing._buckets_from_environment()
        assert bucketing.bucket_for(5, None) == 8
        monkeypatch.setenv("TORCH_TPU_DYNAMIC_BUCKETS", "16,64")
        bucketing._buckets_from_environment()
        assert bucketing.bucket_for(5, None) == 16
    finally:
        bucketing.set_dynamic_buckets("pow2")


def test_every_variable_the_code_reads_is_in_the_table():
    src = pathlib.Path(env.__file__).parents[1]
    seen = set()
    for path in src.rglob("*.py"):
        seen |= {n for n in re.findall(r"\bTORCH_TPU_[A-Z0-9_]+", path.read_text()) if not n.endswith("_")}
    assert seen <= set(env.VARIABLES), sorted(seen - set(env.VARIABLES))


def test_docs_table_is_current():
    doc = (pathlib.Path(__file__).parents[1] / "docs" / "environment.md").read_text()
    assert env.markdown_table() in doc, "regenerate docs/environment.md: python -m torchtpu.runtime.env"
