"""The three-tier compile cache (engine/compile_cache.py) on the real CPU client."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import warnings

import numpy as np
import pytest

from torchtpu import _device_state, runtime
from torchtpu.engine import compile_cache as cc

X = np.array([1.0, -2.0, 3.5, 4.25], np.float32)
_counter = itertools.count(1)


def module(c: float) -> str:
    """A small program computing x + c (a distinct c is a distinct key)."""
    return textwrap.dedent(
        f"""\
        module @m {{
          func.func public @main(%a: tensor<4xf32>) -> (tensor<4xf32>) {{
            %c = stablehlo.constant dense<{c!r}> : tensor<4xf32>
            %0 = stablehlo.add %a, %c : tensor<4xf32>
            return %0 : tensor<4xf32>
          }}
        }}
        """
    )


def fresh() -> tuple[str, float]:
    c = float(next(_counter)) + 0.5
    return module(c), c


def run(exe: runtime.Executable) -> np.ndarray:
    client = _device_state.client()
    (out,), ev = exe.execute([client.buffer_from_host(X)])
    ev.wait()
    return out.to_host()


def check(exe: runtime.Executable, c: float) -> None:
    np.testing.assert_array_equal(run(exe), X + np.float32(c))


def _reset() -> None:
    cc.clear(1)
    cc.reset_stats()
    cc._warned.clear()
    cc._tiers.clear()
    cc._serialize_supported = True


@pytest.fixture
def tiers(tmp_path, monkeypatch):
    """Tier 2 under a unique /dev/shm name, tier 3 in tmp_path; both empty."""
    name = f"torchtpu-test-{uuid.uuid4().hex[:12]}"
    t2 = os.path.join(cc.TIER2_BASE, name)
    t3 = str(tmp_path / "tier3")
    monkeypatch.setenv(cc.ENV_TIER2, name)
    monkeypatch.setenv(cc.ENV_TIER3, t3)
    _reset()
    yield {"name": name, "t2": t2, "t3": t3}
    _reset()
    shutil.rmtree(t2, ignore_errors=True)


def entries(d: str) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(cc.ENTRY_SUFFIX))


def entry_ok(path: str) -> bool:
    key = os.path.basename(path)[: -len(cc.ENTRY_SUFFIX)]
    with open(path, "rb") as f:
        data = f.read()
    try:
        cc._unpack(key, data)
    except cc._Corrupt:
        return False
    return True


def cache_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, cc.CompileCacheWarning)]


# -- in-process ---------------------------------------------------------------
def test_hits_and_misses_per_tier(tiers):
    text, c = fresh()
    check(cc.compile(text), c)
    s = cc.stats()
    assert (s["tier1_misses"], s["tier2_misses"], s["tier3_misses"], s["compiles"]) == (1, 1, 1, 1)
    assert (s["tier2_writes"], s["tier3_writes"], s["tier2_enabled"], s["tier3_enabled"]) == (1, 1, 1, 1)
    assert s["compile_seconds"] > 0
    key = cc.cache_key(text)
    assert entries(tiers["t2"]) == entries(tiers["t3"]) == [key + cc.ENTRY_SUFFIX]
    assert os.stat(tiers["t2"]).st_mode & 0o777 == 0o700
    assert os.stat(tiers["t3"]).st_mode & 0o777 == 0o700

    exe = cc.compile(text)  # tier 1
    assert cc.compile(text) is exe
    assert cc.stats()["tier1_hits"] == 2

    cc.clear(1)  # tier 2
    check(cc.compile(text), c)
    s = cc.stats()
    assert (s["tier2_hits"], s["tier3_hits"], s["compiles"]) == (1, 0, 1)
    assert s["tier2_load_seconds"] > 0

    cc.clear(1)
    cc.clear(2)  # tier 3, copied back into tier 2
    assert entries(tiers["t2"]) == []
    check(cc.compile(text), c)
    s = cc.stats()
    assert (s["tier2_misses"], s["tier3_hits"], s["tier2_writes"], s["compiles"]) == (2, 1, 2, 1)
    assert entries(tiers["t2"]) == [key + cc.ENTRY_SUFFIX]


def test_the_compile_log_lists_real_compiles_with_what_they_compiled(tiers):
    """torch.tpu.compile_log(): each XLA compile with what it compiled and its seconds; a program
    from tier 1 or 2 is not a compile and adds nothing."""
    import torch

    text, c = fresh()
    before = len(cc.compile_log())
    check(cc.compile_program(text, "the test's program"), c)
    log = cc.compile_log()
    assert len(log) == before + 1 or len(log) == cc.COMPILE_LOG_SIZE
    entry = log[-1]
    assert entry["what"] == "the test's program" and entry["seconds"] > 0 and entry["text_bytes"] == len(text)
    assert entry["thread"] == threading.current_thread().name and abs(entry["started"] - time.time()) < 600
    cc.compile_program(text, "again")  # tier 1
    cc.clear(1)
    cc.compile_program(text, "again")  # tier 2
    assert cc.compile_log()[-1] is not None and cc.compile_log()[-1]["what"] == "the test's program"
    assert torch.tpu.compile_log()[-1] == entry
    text2, _ = fresh()
    cc.compile(text2)  # not through compile_program: no name
    assert cc.compile_log()[-1]["what"] == "program"


def test_disabled_tiers(tiers, monkeypatch):
    monkeypatch.setenv(cc.ENV_TIER2, "disabled")
    monkeypatch.delenv(cc.ENV_TIER3)
    text, c = fresh()
    check(cc.compile(text), c)
    cc.clear(1)
    check(cc.compile(text), c)
    s = cc.stats()
    assert s["compiles"] == 2 and s["tier2_enabled"] == s["tier3_enabled"] == 0
    assert s["tier2_misses"] == s["tier3_misses"] == 0


def test_concurrent_requests_compile_once(tiers):
    text, c = fresh()
    barrier = threading.Barrier(8)
    results = []

    def worker():
        barrier.wait()
        results.append(cc.compile(text))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 8 and all(r is results[0] for r in results)
    s = cc.stats()
    assert (s["compiles"], s["tier1_misses"], s["tier1_hits"]) == (1, 1, 7)
    check(results[0], c)


def test_compile_error_is_not_cached(tiers):
    with pytest.raises(runtime.PjrtError):
        cc.compile("module @broken { this is not stablehlo }")
    assert cc.stats()["tier1_entries"] == 0
    with pytest.raises(runtime.PjrtError):
        cc.compile("module @broken { this is not stablehlo }")
    assert entries(tiers["t2"]) == [] and entries(tiers["t3"]) == []


def test_a_failure_after_the_compile_leaves_no_entry_to_wait_on(tiers, monkeypatch):
    """What follows the compile (binding to the device, noting its scratch size) ran outside the
    try that resolves the tier-1 entry: an exception there left the entry unresolved, and every
    later compile of the program waited on it forever."""
    text, c = fresh()

    def fail(exe):
        raise RuntimeError("after the compile")

    note_temp = cc._note_temp
    monkeypatch.setattr(cc, "_note_temp", fail)
    with pytest.raises(RuntimeError, match="after the compile"):
        cc.compile(text)
    monkeypatch.setattr(cc, "_note_temp", note_temp)
    results = []
    again = threading.Thread(target=lambda: results.append(cc.compile(text)), daemon=True)
    again.start()
    again.join(timeout=120)
    assert results, "the second compile of the program waited on the first one's entry"
    check(results[0], c)


@pytest.mark.parametrize("tier", [2, 3])
@pytest.mark.parametrize("damage", ["flip", "truncate", "bad_payload"])
def test_damaged_entry_is_discarded_and_rewritten(tiers, monkeypatch, tier, damage):
    # only the damaged tier in use
    if tier == 2:
        monkeypatch.delenv(cc.ENV_TIER3)
    else:
        monkeypatch.setenv(cc.ENV_TIER2, "disabled")
    d = tiers["t2"] if tier == 2 else tiers["t3"]
    text, c = fresh()
    cc.compile(text)
    path = os.path.join(d, entries(d)[0])
    with open(path, "rb") as f:
        data = bytearray(f.read())
    if damage == "flip":
        mid = len(data) // 2
        data[mid : mid + 4] = bytes(b ^ 0xFF for b in data[mid : mid + 4])
    elif damage == "truncate":
        data = data[: len(data) - 100]
    else:  # a well-formed entry whose payload the plugin refuses
        key = os.path.basename(path)[: -len(cc.ENTRY_SUFFIX)]
        data = bytearray(cc._pack(key, b"not an executable" * 10))
    with open(path, "wb") as f:
        f.write(bytes(data))
    assert entry_ok(path) == (damage == "bad_payload")

    cc.clear(1)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        exe = cc.compile(text)
        cc.clear(1)
        cc.compile(text)  # the rewritten entry loads
    check(exe, c)
    msgs = cache_warnings(rec)
    assert len(msgs) == 1 and "bad tier" in msgs[0], msgs
    s = cc.stats()
    assert (s["compiles"], s[f"tier{tier}_errors"], s[f"tier{tier}_hits"]) == (2, 1, 1)
    assert entry_ok(path)


def _owned_by_another_user(monkeypatch, path: str) -> None:
    """chown to uid 12345 where the tests run as root; elsewhere (a TPU host's ordinary user) the
    cache's stat calls report that owner for this file, found by its inode."""
    if os.getuid() == 0:
        os.chown(path, 12345, 12345)
        return
    inode = os.stat(path).st_ino

    def foreign(real):
        def call(target, *args, **kwargs):
            st = real(target, *args, **kwargs)
            if st.st_ino != inode:
                return st
            return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, 12345, 12345, *st[6:10]))
        return call

    for name in ("stat", "lstat", "fstat"):
        monkeypatch.setattr(cc.os, name, foreign(getattr(os, name)))


def test_entry_owned_by_another_user_is_refused(tiers, monkeypatch):
    monkeypatch.setenv(cc.ENV_TIER2, "disabled")
    text, c = fresh()
    cc.compile(text)
    path = os.path.join(tiers["t3"], entries(tiers["t3"])[0])
    _owned_by_another_user(monkeypatch, path)
    cc.clear(1)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        exe = cc.compile(text)
    check(exe, c)
    msgs = cache_warnings(rec)
    assert len(msgs) == 1 and "owned by uid 12345" in msgs[0], msgs
    s = cc.stats()
    assert (s["compiles"], s["tier3_hits"], s["tier3_errors"]) == (2, 0, 1)
    assert os.stat(path).st_uid == os.getuid() and entry_ok(path)  # replaced by ours


def test_directory_owned_by_another_user_is_refused(tiers, monkeypatch):
    monkeypatch.setenv(cc.ENV_TIER2, "disabled")
    os.makedirs(tiers["t3"])
    _owned_by_another_user(monkeypatch, tiers["t3"])
    text, c = fresh()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        check(cc.compile(text), c)
        check(cc.compile(fresh()[0]), c + 1)
    msgs = cache_warnings(rec)
    assert len(msgs) == 1 and "owned by uid 12345" in msgs[0], msgs
    assert os.listdir(tiers["t3"]) == [] and cc.stats()["tier3_enabled"] == 0


def test_uncreatable_tier3_root_warns_once(tiers, tmp_path, monkeypatch):
    monkeypatch.setenv(cc.ENV_TIER2, "disabled")
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(cc.ENV_TIER3, str(blocker / "cache"))  # mkdir fails even as root
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(3):
            text, c = fresh()
            check(cc.compile(text), c)
    msgs = cache_warnings(rec)
    assert len(msgs) == 1 and "tier 3 disabled" in msgs[0], msgs
    assert cc.stats()["compiles"] == 3


def test_unwritable_fsspec_root_warns_once(tiers, monkeypatch):
    import fsspec.implementations.memory as memfs

    monkeypatch.setenv(cc.ENV_TIER2, "disabled")
    monkeypatch.setenv(cc.ENV_TIER3, f"memory://ttpu-{uuid.uuid4().hex[:8]}/cache")

    def refuse(self, *args, **kwargs):
        raise PermissionError("read-only filesystem")

    monkeypatch.setattr(memfs.MemoryFileSystem, "pipe_file", refuse)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(3):
            text, c = fresh()
            check(cc.compile(text), c)
    msgs = cache_warnings(rec)
    assert len(msgs) == 1 and "read-only" in msgs[0], msgs
    s = cc.stats()
    assert (s["compiles"], s["tier3_writes"], s["tier3_misses"]) == (3, 0, 3)


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_fsspec_url_tier3(tiers, monkeypatch, scheme):
    monkeypatch.setenv(cc.ENV_TIER2, "disabled")
    if scheme == "memory":
        monkeypatch.setenv(cc.ENV_TIER3, f"memory://ttpu-{uuid.uuid4().hex[:8]}/cache")
    else:  # through fsspec's LocalFileSystem, then the same checked local I/O
        monkeypatch.setenv(cc.ENV_TIER3, "file://" + tiers["t3"])
    text, c = fresh()
    cc.compile(text)
    cc.clear(1)
    check(cc.compile(text), c)
    s = cc.stats()
    assert (s["compiles"], s["tier3_hits"], s["tier3_writes"]) == (1, 1, 1)
    if scheme == "file":
        assert len(entries(tiers["t3"])) == 1
        assert os.stat(tiers["t3"]).st_mode & 0o777 == 0o700
    cc.clear(3)
    cc.clear(1)
    cc.compile(text)
    assert cc.stats()["compiles"] == 2


def test_clear_removes_only_cache_files(tiers):
    texts = [fresh()[0] for _ in range(2)]
    for t in texts:
        cc.compile(t)
    for d in (tiers["t2"], tiers["t3"]):
        with open(os.path.join(d, "keep.txt"), "w") as f:
            f.write("not ours")
        assert len(entries(d)) == 2
    cc.clear(2)
    assert entries(tiers["t2"]) == [] and len(entries(tiers["t3"])) == 2
    assert cc.stats()["tier1_entries"] == 2
    cc.clear()
    assert entries(tiers["t3"]) == [] and cc.stats()["tier1_entries"] == 0
    for d in (tiers["t2"], tiers["t3"]):
        assert os.listdir(d) == ["keep.txt"]
    with pytest.raises(ValueError):
        cc.clear(4)


def test_key_covers_plugin_cpu_options_and_flags(tiers, monkeypatch):
    text, c = fresh()
    base = cc.cache_key(text)
    assert cc.cache_key(text) == base and len(base) == 64
    assert cc.cache_key(fresh()[0]) != base
    monkeypatch.setattr(cc, "_PLUGIN_IDENTITY_OVERRIDE", "another-plugin-build")
    assert cc.cache_key(text) != base
    monkeypatch.setattr(cc, "_PLUGIN_IDENTITY_OVERRIDE", None)
    monkeypatch.setattr(cc, "_CPU_FEATURES_OVERRIDE", "x86_64;no-avx512")
    assert cc.cache_key(text) != base
    monkeypatch.setattr(cc, "_CPU_FEATURES_OVERRIDE", None)
    assert cc.cache_key(text, options=runtime.compile_options(device_ordinal=0, portable=False)) != base
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    assert cc.cache_key(text) != base
    monkeypatch.delenv("XLA_FLAGS")
    assert cc.cache_key(text) == base

    # end to end: another plugin identity misses tiers 2/3 and adds its own entry
    cc.compile(text)
    monkeypatch.setattr(cc, "_PLUGIN_IDENTITY_OVERRIDE", "another-plugin-build")
    cc.clear(1)
    check(cc.compile(text), c)
    s = cc.stats()
    assert (s["compiles"], s["tier2_hits"], s["tier3_hits"]) == (2, 0, 0)
    assert len(entries(tiers["t3"])) == 2


def test_plugin_identity_modes(tmp_path, monkeypatch):
    class FakePlugin:
        path = str(tmp_path / "fake_plugin.so")

    p = FakePlugin()
    with open(p.path, "wb") as f:
        f.write(b"build one")
    cc._plugin_ids.clear()
    monkeypatch.delenv(cc.ENV_PLUGIN_ID, raising=False)
    first = cc.plugin_identity(p)
    assert first.startswith("size=9;mtime_ns=")
    monkeypatch.setenv(cc.ENV_PLUGIN_ID, "content")
    assert cc.plugin_identity(p) == f"size=9;sha256={hashlib.sha256(b'build one').hexdigest()}"
    # computed once per process: later changes to the file are not re-read
    with open(p.path, "wb") as f:
        f.write(b"build two")
    assert cc.plugin_identity(p).endswith(hashlib.sha256(b"build one").hexdigest())
    cc._plugin_ids.clear()
    os.utime(p.path, ns=(1, 1))
    monkeypatch.delenv(cc.ENV_PLUGIN_ID)
    assert cc.plugin_identity(p) == "size=9;mtime_ns=1" != first
    cc._plugin_ids.clear()
    assert ";" in cc.cpu_features()


# -- across processes -----------------------------------------------------------------
_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    from torchtpu import _device_state
    from torchtpu.engine import compile_cache as cc
    text, go = sys.argv[1], sys.argv[2]
    client = _device_state.client()
    if go:
        open(go + "." + str(os.getpid()), "w").close()
        while not os.path.exists(go):
            time.sleep(0.001)
    exe = cc.compile(text)
    x = np.array([1.0, -2.0, 3.5, 4.25], np.float32)
    (out,), ev = exe.execute([client.buffer_from_host(x)])
    ev.wait()
    torn = 0
    if go:  # hammer the entry: every read sees a whole entry, never a torn one
        key = cc.cache_key(text)
        data = cc._pack(key, exe.serialize())
        for tier in cc._active_tiers():
            for _ in range(300):
                cc._store(tier, key, data)
                got = tier.read(key)
                try:
                    cc._unpack(key, got[0])
                except cc._Corrupt:
                    torn += 1
    print(json.dumps({"out": out.to_host().tolist(), "stats": cc.stats(), "torn": torn}))
    """
)


def _child_env(tiers: dict, **extra: str) -> dict:
    env = dict(os.environ)
    env.update({cc.ENV_TIER2: tiers["name"], cc.ENV_TIER3: tiers["t3"]}, **extra)
    return env


def _spawn(text: str, env: dict, go: str = "") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, text, go],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen, c: float) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    res = json.loads(out.strip().splitlines()[-1])
    np.testing.assert_array_equal(np.array(res["out"], np.float32), X + np.float32(c))
    assert "CompileCacheWarning" not in err, err
    return res


@pytest.mark.parametrize("filled", [2, 3])
@pytest.mark.fresh_process
def test_second_process_compiles_nothing(tiers, filled):
    text, c = fresh()
    env = _child_env(tiers)
    if filled == 2:
        env[cc.ENV_TIER3] = "disabled"
    else:
        env[cc.ENV_TIER2] = "disabled"
    first = _result(_spawn(text, env), c)["stats"]
    assert first["compiles"] == 1 and first[f"tier{filled}_writes"] == 1
    second = _result(_spawn(text, env), c)["stats"]
    assert second["compiles"] == 0, second
    assert second[f"tier{filled}_hits"] == 1 and second[f"tier{filled}_misses"] == 0


@pytest.mark.fresh_process
@pytest.mark.emulator_only("two processes use the device at once; a TPU chip admits one")
def test_two_processes_write_the_same_key(tiers, tmp_path):
    text, c = fresh()
    go = str(tmp_path / "go")
    env = _child_env(tiers)
    procs = [_spawn(text, env, go) for _ in range(2)]
    deadline = time.monotonic() + 120
    while len([n for n in os.listdir(tmp_path) if n.startswith("go.")]) < 2:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    open(go, "w").close()
    results = [_result(p, c) for p in procs]
    for r in results:
        assert r["torn"] == 0
        assert r["stats"]["tier2_errors"] == r["stats"]["tier3_errors"] == 0
    for d in (tiers["t2"], tiers["t3"]):
        (name,) = entries(d)
        assert entry_ok(os.path.join(d, name))
        assert [n for n in os.listdir(d) if n.endswith(".tmp")] == []


@pytest.mark.fresh_process
@pytest.mark.emulator_only("two processes use the device at once; a TPU chip admits one")
def test_a_process_waits_for_another_compiling_the_same_program(tiers):
    """Processes of one machine compile a program once between them (issue 43: two processes
    compiling the same program both compiled it): while one holds the program's lock, another
    waits, then loads the entry the first stored."""
    from torchtpu.engine import cache_dir

    text, c = fresh()
    cc.compile(fresh()[0])  # makes the tier directories
    key = cc.cache_key(text)
    env = _child_env(tiers)
    env[cc.ENV_TIER3] = "disabled"
    with cache_dir.program_lock(tiers["t2"], key):
        child = _spawn(text, env)
        lock = os.path.join(tiers["t2"], f".{key}.lock")
        deadline = time.monotonic() + 120
        while not _has_open(child.pid, lock):  # the child starts, misses tier 2 and waits on the lock
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.02)
        client = _device_state.client()
        exe = client.compile(text)  # what the first process compiles, stored under the lock
        cc._store(cc._tier2(), key, cc._pack(key, exe.serialize()))
    stats = _result(child, c)["stats"]
    assert stats["compiles"] == 0 and stats["tier2_hits_after_wait"] == 1, stats
    assert not os.path.exists(lock)


def _has_open(pid: int, path: str) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                return True
        except OSError:
            pass
    return False


def test_tier_size_bound_evicts_least_recently_used(tiers, monkeypatch):
    """A local tier keeps its entries within TORCH_TPU_TIER{2,3}_CACHE_MAX_MB, dropping those no
    process loaded for longest (issue 43: tier 2 grew to 216 MB with no bound)."""
    monkeypatch.setenv(cc.ENV_TIER3, "disabled")
    monkeypatch.setenv(cc.ENV_TIER2_MAX_MB, "5")
    first, c_first = fresh()
    check(cc.compile(first), c_first)
    t2 = cc._tier2()
    assert t2.bound.max_bytes == 5 * 2**20
    size = os.path.getsize(os.path.join(tiers["t2"], entries(tiers["t2"])[0]))
    t2.bound.max_bytes = int(3.5 * size)  # room for three entries
    t2.bound._written = None  # scan at the next write
    old = time.time() - 100
    for name in entries(tiers["t2"]):
        os.utime(os.path.join(tiers["t2"], name), (old, old))
    texts = [fresh() for _ in range(2)]
    for i, (text, c) in enumerate(texts):
        check(cc.compile(text), c)
        for name in entries(tiers["t2"]):
            if name != cc.cache_key(first) + cc.ENTRY_SUFFIX:
                os.utime(os.path.join(tiers["t2"], name), (old + 10 + i, old + 10 + i))
    cc.clear(1)
    check(cc.compile(first), c_first)  # a tier-2 hit: now the most recently used
    assert cc.stats()["tier2_hits"] == 1
    t2.bound._written = None
    last, c_last = fresh()
    check(cc.compile(last), c_last)
    kept = set(entries(tiers["t2"]))
    assert cc.cache_key(first) + cc.ENTRY_SUFFIX in kept and cc.cache_key(last) + cc.ENTRY_SUFFIX in kept
    assert cc.cache_key(texts[0][0]) + cc.ENTRY_SUFFIX not in kept  # the least recently used
    assert sum(os.path.getsize(os.path.join(tiers["t2"], n)) for n in kept) <= t2.bound.max_bytes
    assert cc.stats()["tier2_evictions"] >= 1
    assert next(r for r in cc.tier_report() if r["tier"] == 2)["max_bytes"] == t2.bound.max_bytes


def test_python_m_torchtpu_cache_lists_and_clears(tiers, capsys):
    """``python -m torchtpu cache`` / ``--clear-cache``: the tiers' entries, sizes and bounds,
    without opening a device (the TPU may be held by another process)."""
    from torchtpu.__main__ import main

    cc.compile(fresh()[0])
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"{tiers['t2']}: 1 entries" in out and f"{tiers['t3']}: 1 entries" in out and "bound 1.00 GiB" in out, out
    assert main(["--clear-cache", "2"]) == 0
    out = capsys.readouterr().out
    assert f"{tiers['t2']}: 0 entries" in out and f"{tiers['t3']}: 1 entries" in out, out
    assert main(["--clear-cache", "all"]) == 0
    assert f"{tiers['t3']}: 0 entries" in capsys.readouterr().out


def test_program_caches_drop_their_oldest_entries_past_the_bound(monkeypatch):
    """Regression: every compiled program stayed cached, each holding a few memory mappings of XLA's
    JIT code, so a process compiling ~21,000 (eager ops over ever-new shapes) failed with XLA's
    "Cannot allocate memory". Past the bound the oldest quarter goes; results stay right."""
    import torch

    from torchtpu.engine import bounded, executor

    monkeypatch.setattr(bounded, "MAX_PROGRAMS", 8)
    before = bounded.BoundedCache.evictions
    for n in range(1, 30):
        x = torch.arange(float(n)).to("tpu")
        assert (x * 3 + 1).cpu().tolist() == [3 * i + 1 for i in range(n)]
        assert executor.cache_size() <= 8
        assert torch.tpu.compile_cache_stats()["tier1_entries"] <= 8
    assert bounded.BoundedCache.evictions > before
    assert torch.tpu.compile_cache_stats()["evicted_programs"] > before


def test_eager_compile_effort_reaches_the_options_of_one_ops_program(monkeypatch):
    """TORCH_TPU_EAGER_COMPILE_EFFORT asks XLA for less effort on Strict's per-op programs (for a
    TPU, where each small program compiled for 0.15 to 1.35 s): the options then carry
    ExecutableBuildOptions' exec_time_optimization_effort (field 20) or optimization_level (24);
    unset, the default options; results unchanged either way."""
    import torch

    from torchtpu import _device_state
    from torchtpu.engine import compile_cache

    seen = []
    real = compile_cache._default_options
    monkeypatch.setattr(compile_cache, "_default_options",
                        lambda client, index, effort="default": seen.append(real(client, index, effort)) or seen[-1])
    for i, (effort, field) in enumerate((("fast", b"\xa5\x01\x00\x00\x80\xbf"), ("o0", b"\xc0\x01\x09"),
                                         ("default", None))):
        monkeypatch.setenv("TORCH_TPU_EAGER_COMPILE_EFFORT", effort)
        seen.clear()
        x = torch.arange(7 * 3 * (11 + i), dtype=torch.float32).reshape(7, 3, 11 + i)  # new shapes: new programs
        got = ((x.to("tpu") * 1.75 - 0.5).sum(1)).cpu()
        torch.testing.assert_close(got, (x * 1.75 - 0.5).sum(1))
        assert seen, effort
        if field is None:
            assert all(o == real(_device_state.client(), 0) for o in seen)
            assert not any(f in o for o in seen for f in (b"\xa5\x01", b"\xc0\x01")), seen
        else:
            assert all(field in o for o in seen), (effort, seen)


def test_a_cached_program_is_compiled_for_its_device_alone(tiers):
    """Regression (TPU): a portable executable, launched with ``execute_device``, costs a v5e
    ~210 us of host time per launch against ~90 us compiled for the device alone (a fixed
    assignment, launched with none; ``tools/tpu_suite/probe_execute_cost.py``). The cache's
    programs carry the assignment, are bound to the device, and launch without naming one."""
    from torchtpu.runtime._pjrt_ffi import ffi

    text, c = fresh()
    exe = cc.compile(text)
    assert exe.bound_device == 0
    check(exe, c)
    assert exe._scratch.args.execute_device == ffi.NULL
    client = _device_state.client()
    device_id = client.devices[0].id
    assert cc._default_options(client, 0) == runtime.compile_options(
        device_ordinal=client.devices[0].local_hardware_id, portable=False, device_ids=[[device_id]],
        env_overrides={**client.compile_overrides, "xla_allow_excess_precision": cc.backend.allow_excess_precision})
    portable = cc.compile(text, options=runtime.compile_options())  # explicit options: as given
    assert portable.bound_device is None
    check(portable, c)
    assert portable._scratch.args.execute_device != ffi.NULL


def _two_device_client() -> runtime.Client:
    """The process's client where it has two devices or more, else the CPU plugin's with two; on a
    one-chip TPU host (no CPU plugin installed: a v5e failed here on its absence) there is none."""
    own = _device_state.client()
    if len(own.devices) >= 2:
        return own
    try:
        path = runtime.resolve_plugin_path("cpu")
    except RuntimeError:
        pytest.skip("needs a client with two devices: this host has one and no CPU plugin")
    return runtime.Client(runtime.load_plugin(path), {"cpu_device_count": 2})


def test_a_bound_program_launched_on_another_device_runs_there(tiers):
    """With several devices, a program compiled for device 0 and launched on device 1 runs as
    the same program compiled for device 1 (made once, kept), its output on device 1."""
    client = _two_device_client()
    text, c = fresh()
    exe = cc.compile(text, client=client)
    assert exe.bound_device == 0
    for _ in range(2):
        (out,), ev = exe.execute([client.buffer_from_host(X, 1)], 1)
        ev.wait()
        np.testing.assert_array_equal(out.to_host(), X + np.float32(c))
        assert out.device_index == 1
    assert list(exe._siblings) == [1] and exe._siblings[1].bound_device == 1
    (out,), ev = exe.execute([client.buffer_from_host(X, 0)], 0)
    ev.wait()
    assert out.device_index == 0
    np.testing.assert_array_equal(out.to_host(), X + np.float32(c))
    alone = cc.compile(text)  # one device: nothing to compile again from
    assert alone._sibling is None
    with pytest.raises(runtime.PjrtError, match="compiled for device 0 alone"):
        alone._for_device(1)


def test_unset_eager_compile_effort_is_fast_on_a_tpu_only(monkeypatch):
    """Unset, Strict's per-op programs ask a TPU for exec_time_optimization_effort -1 (a v5e
    compiled small programs 33-53% faster so, with the same run time); XLA:CPU keeps its
    default; the variable, when set, decides everywhere."""
    from types import SimpleNamespace

    tpu, cpu = SimpleNamespace(platform_name="tpu"), SimpleNamespace(platform_name="cpu")
    monkeypatch.delenv("TORCH_TPU_EAGER_COMPILE_EFFORT", raising=False)
    assert (cc._eager_effort(tpu), cc._eager_effort(cpu)) == ("fast", "default")
    monkeypatch.setenv("TORCH_TPU_EAGER_COMPILE_EFFORT", "default")
    assert cc._eager_effort(tpu) == "default"
    monkeypatch.setenv("TORCH_TPU_EAGER_COMPILE_EFFORT", "o1")
    assert cc._eager_effort(cpu) == "o1"
