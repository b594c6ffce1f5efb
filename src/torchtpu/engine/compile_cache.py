"""The three-tier compile cache: StableHLO text -> loaded PJRT executable.

``compile(text)`` is the one entry point the engine uses instead of
``client.compile(text)``. Lookup order:

1. **tier 1**, in-process memory: a dict of ``concurrent.futures.Future``, so
   concurrent requests for the same program compile it once (the first caller
   compiles, the others wait on its future).
2. **tier 2**, host-shared: files under ``/dev/shm/<name>``, shared by the
   processes of one machine. ``TORCH_TPU_TIER2_COMPILATION_CACHE`` = a name
   (one path component), or ``disabled``; default ``torchtpu-<uid>``.
3. **tier 3**, persistent: ``TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT`` = a
   directory or an fsspec URL (``gs://bucket/dir``, ``memory://x``); unset or
   ``disabled``: off.

A tier-2/3 hit is loaded with ``client.deserialize``; a hit in tier 3 is also
copied into tier 2. A miss everywhere compiles, then serializes into tiers 2/3.

**Keys** (tiers 2/3) are sha256 over the program text and everything else that
decides the machine code: the plugin's identity (see ``plugin_identity``), its
PJRT C API version and attributes, ``client.platform_name/platform_version``,
the client's create options, the compile options bytes actually passed to
``PJRT_Client_Compile``, ``XLA_FLAGS``/``LIBTPU_INIT_ARGS`` (read by the plugin,
they change code generation), the host CPU architecture and feature flags
(XLA:CPU generates code for the host's ISA extensions), and ``FORMAT_VERSION``.
An executable from another plugin build may load and silently compute wrong
numbers, so anything that could differ must be in the key. Tier-1 keys only
need the client, the compile options and the text (the rest is fixed in a process).

**Entries** are ``<key>.xla`` files: a header (magic, format version, payload
length, sha256 of the payload, the key) then ``Executable.serialize()`` bytes.
Writes go to a temporary file in the same directory and are ``os.replace``d
into place, so readers see a whole entry or none, and two processes writing
the same key both succeed (the last rename wins; both entries are valid).
A corrupt or truncated entry (or one the plugin refuses to load) is never
handed to ``deserialize`` unverified: it is deleted (if possible), warned about
once per key, and recompiled. Directories are created with mode 0o700; a
directory or entry not owned by the current user is refused with a warning.
An unusable tier (uncreatable or unwritable root) costs one warning per
process; compilation goes on without it.

Knows nothing of PyTorch: imports only ``torchtpu.runtime`` and
``torchtpu._device_state`` (and fsspec, lazily, when tier 3 is configured).
"""

from __future__ import annotations

import collections
import errno
import functools
import hashlib
import json
import logging
import os
import platform
import re
import stat
import struct
import threading
import time
import warnings
from concurrent.futures import Future
from typing import Any

from .. import _device_state, runtime
from ..backend_config import backend
from ..runtime import env, host_cpu
from ..runtime.errors import RESOURCE_EXHAUSTED
from . import cache_dir
from .bounded import BoundedCache

_log = logging.getLogger("torchtpu")

__all__ = [
    "ENV_TIER2",
    "ENV_TIER3",
    "FORMAT_VERSION",
    "CompileCacheWarning",
    "CompileError",
    "cache_key",
    "clear",
    "compile",
    "compile_program",
    "cpu_features",
    "plugin_identity",
    "reset_stats",
    "stats",
    "tier_report",
]

ENV_TIER2 = "TORCH_TPU_TIER2_COMPILATION_CACHE"
ENV_TIER3 = "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"
ENV_TIER2_MAX_MB = "TORCH_TPU_TIER2_CACHE_MAX_MB"
ENV_TIER3_MAX_MB = "TORCH_TPU_TIER3_CACHE_MAX_MB"
# "stat" (default): size + mtime of the plugin file; "content": its full sha256.
ENV_PLUGIN_ID = "TORCH_TPU_COMPILE_CACHE_PLUGIN_ID"

# Bump when the entry layout or the key recipe changes.
FORMAT_VERSION = 1
MAGIC = b"TTPUXLA\x00"
# magic, format version, reserved, payload length, sha256(payload), key (raw sha256)
_HEADER = struct.Struct("<8sIIQ32s32s")
ENTRY_SUFFIX = ".xla"
_ENTRY_RE = re.compile(r"^[0-9a-f]{64}\.xla$")
_TEMP_RE = re.compile(r"^\.[0-9a-f]{64}\.xla\.[0-9]+\.[0-9a-f]+\.tmp$")
_TIER2_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")

# Where tier-2 directories live (a test may point this elsewhere).
TIER2_BASE = "/dev/shm"

# For tests: replace the plugin identity / CPU feature strings in the key.
_PLUGIN_IDENTITY_OVERRIDE: str | None = None
_CPU_FEATURES_OVERRIDE: str | None = None


class CompileCacheWarning(RuntimeWarning):
    """A cache entry or tier was unusable; the result is still correct."""


class _Refused(Exception):
    """An entry or directory this cache must not read (wrong owner, not a file)."""


class _Corrupt(Exception):
    """An entry whose header, length, key or checksum does not verify."""


# -- stats ------------------------------------------------------------------
_STAT_NAMES = (
    "compiles",
    "compile_seconds",
    "serialize_seconds",
    "tier1_hits",
    "tier1_misses",
    "tier2_hits",
    "tier2_misses",
    "tier2_load_seconds",
    "tier2_writes",
    "tier2_write_seconds",
    "tier2_errors",
    "tier2_evictions",
    "tier2_hits_after_wait",
    "tier3_hits",
    "tier3_misses",
    "tier3_load_seconds",
    "tier3_writes",
    "tier3_write_seconds",
    "tier3_errors",
    "tier3_evictions",
    "tier3_hits_after_wait",
)
_stats_lock = threading.Lock()
_stats: dict[str, float] = dict.fromkeys(_STAT_NAMES, 0)


def _add(name: str, value: float = 1) -> None:
    with _stats_lock:
        _stats[name] += value


# The most recent XLA compiles (``compile_log()``): what each compiled and how long it took, so a
# slow first step names the programs it waited on. ``what`` reaches _compile_and_store through a
# thread-local: each compile runs on its caller's thread (parallel compiles on pool threads).
COMPILE_LOG_SIZE = 256
_compile_log: collections.deque[dict[str, Any]] = collections.deque(maxlen=COMPILE_LOG_SIZE)
_compiling = threading.local()


def compile_log() -> list[dict[str, Any]]:
    """The last ``COMPILE_LOG_SIZE`` XLA compiles of this process, oldest first: ``what`` (the op,
    fused or compiled graph), ``seconds``, ``started`` (``time.time()``), ``text_bytes`` (the
    StableHLO's size) and ``thread`` (its name: side-by-side compiles overlap). Programs taken from
    tier 1, 2 or 3 are not compiles and are not listed."""
    with _stats_lock:
        return [dict(e) for e in _compile_log]  # (copies: a caller's edits stay its own)


def stats() -> dict[str, float]:
    """Counters since start (or ``reset_stats``): per tier hits/misses/seconds.

    ``compiles``/``compile_seconds``: real XLA compilations. ``evicted_programs``: entries the
    in-memory caches dropped past ``TORCH_TPU_MAX_CACHED_PROGRAMS``. ``tierN_load_seconds``:
    time in tier-N lookups (read, verify, deserialize). ``tierN_errors``: corrupt,
    refused or unreadable entries. ``tierN_enabled``: 1 if the tier is in use now.
    """
    with _stats_lock:
        out = dict(_stats)
    with _tier1_lock:
        out["tier1_entries"] = len(_tier1)
    out["evicted_programs"] = BoundedCache.evictions  # (engine/bounded.py, all in-memory caches)
    t2, t3 = _tier2(), _tier3()
    out["tier2_enabled"] = int(t2 is not None and t2.usable)
    out["tier3_enabled"] = int(t3 is not None and t3.usable)
    return out


def reset_stats() -> None:
    with _stats_lock:
        for k in _stats:
            _stats[k] = 0


# -- warnings -----------------------------------------------------------------
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def _warn_once(kind: str, ident: str, message: str) -> None:
    with _warned_lock:
        if (kind, ident) in _warned:
            return
        _warned.add((kind, ident))
    warnings.warn(f"torchtpu compile cache: {message}", CompileCacheWarning, stacklevel=3)


# -- key ----------------------------------------------------------------------
_ident_lock = threading.Lock()
_plugin_ids: dict[tuple[str, str], str] = {}
_cpu_features: str | None = None


def plugin_identity(plugin: runtime.Plugin) -> str:
    """Identity of the plugin build, computed once per process per plugin file.

    A full sha256 of the .so (~250 MB for XLA:CPU, ~0.7 s) is too slow for every
    process start, so by default the file is identified by its size and mtime
    (any reinstall or rebuild changes the mtime: pip does not preserve it), plus
    the PJRT C API version and the plugin's reported attributes (added by the
    key). Processes on one host share tier 2; tier 3 shared across hosts hits
    only where the file's mtime is the same (one image everywhere). Set
    ``TORCH_TPU_COMPILE_CACHE_PLUGIN_ID=content`` to use the file's sha256
    instead (hosts with separately installed, identical plugins then share).
    """
    if _PLUGIN_IDENTITY_OVERRIDE is not None:
        return _PLUGIN_IDENTITY_OVERRIDE
    mode = env.read(ENV_PLUGIN_ID)
    path = os.path.realpath(plugin.path)
    with _ident_lock:
        cached = _plugin_ids.get((path, mode))
        if cached is not None:
            return cached
        st = os.stat(path)
        if mode == "content":
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    h.update(chunk)
            ident = f"size={st.st_size};sha256={h.hexdigest()}"
        else:
            ident = f"size={st.st_size};mtime_ns={st.st_mtime_ns}"
        _plugin_ids[(path, mode)] = ident
        return ident


def cpu_features() -> str:
    """The host's CPU architecture and feature flags (XLA:CPU targets them)."""
    global _cpu_features
    if _CPU_FEATURES_OVERRIDE is not None:
        return _CPU_FEATURES_OVERRIDE
    if _cpu_features is None:
        listed = host_cpu.cpu_flags()
        flags = platform.processor() if listed is None else " ".join(sorted(listed))
        digest = hashlib.sha256(flags.encode()).hexdigest()
        _cpu_features = f"{platform.machine()};{digest}"
    return _cpu_features


def _default_options(client: runtime.Client, device_index: int, effort: str = "default") -> bytes:
    # The program compiled for the device alone (a fixed assignment: Executable.bind says why),
    # with the plugin's and the backend's compiler switches; ``effort``: a
    # TORCH_TPU_EAGER_COMPILE_EFFORT choice (_EFFORTS)
    device = client.devices[device_index]
    ordinal = device.local_hardware_id
    return _options_for(device_index if ordinal is None else ordinal, device.id, backend.allow_excess_precision,
                        tuple(sorted(client.compile_overrides.items())), effort)


# TORCH_TPU_EAGER_COMPILE_EFFORT -> ExecutableBuildOptions fields (compile_options' keywords)
_EFFORTS: dict[str, dict[str, float | int]] = {
    "default": {}, "fast": {"exec_time_effort": -1.0}, "o0": {"optimization_level": 9},
    "o1": {"optimization_level": 19}}


@functools.lru_cache(maxsize=64)
def _options_for(ordinal: int, device_id: int, allow_excess_precision: bool, plugin_overrides: tuple = (),
                 effort: str = "default") -> bytes:
    return runtime.compile_options(
        device_ordinal=ordinal, portable=False, device_ids=[[device_id]],
        env_overrides={**dict(plugin_overrides), "xla_allow_excess_precision": allow_excess_precision},
        **_EFFORTS[effort])


def cache_key(
    text: str | bytes,
    client: runtime.Client | None = None,
    device_index: int = 0,
    options: bytes | None = None,
) -> str:
    """The tier-2/3 key (hex sha256) of compiling ``text`` with these options."""
    client = client or _device_state.client()
    if options is None:
        options = _default_options(client, device_index)
    code = text.encode() if isinstance(text, str) else bytes(text)
    return _persistent_key(hashlib.sha256(code).hexdigest(), client, options)


def _persistent_key(text_digest: str, client: runtime.Client, options: bytes) -> str:
    plugin = client.plugin
    parts: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "text": text_digest,
        "plugin": plugin_identity(plugin),
        "pjrt_api": list(plugin.api_version),
        "attributes": plugin.attributes(),
        "platform": [client.platform_name, client.platform_version],
        "client_options": client.options,
        "compile_options": options.hex(),
        "cpu": cpu_features(),
        "env": [os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", "")],
    }
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(b"torchtpu-compile-cache\x00" + blob).hexdigest()


# -- entries ------------------------------------------------------------------
def _pack(key: str, payload: bytes) -> bytes:
    header = _HEADER.pack(
        MAGIC, FORMAT_VERSION, 0, len(payload), hashlib.sha256(payload).digest(), bytes.fromhex(key)
    )
    return header + payload


def _unpack(key: str, data: bytes) -> bytes:
    """The verified payload of an entry; raises _Corrupt."""
    if len(data) < _HEADER.size:
        raise _Corrupt(f"truncated header ({len(data)} bytes)")
    magic, version, _, length, digest, raw_key = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise _Corrupt("bad magic")
    if version != FORMAT_VERSION:
        raise _Corrupt(f"format version {version}, expected {FORMAT_VERSION}")
    if raw_key != bytes.fromhex(key):
        raise _Corrupt("entry belongs to another key")
    if len(data) != _HEADER.size + length:
        raise _Corrupt(f"length {len(data) - _HEADER.size}, header says {length}")
    payload = data[_HEADER.size :]
    if hashlib.sha256(payload).digest() != digest:
        raise _Corrupt("checksum mismatch")
    return payload


# -- tiers --------------------------------------------------------------------
class _Tier:
    """One cache directory: local (os calls, ownership checks) or any fsspec fs."""

    def __init__(self, number: int, location: str, fs: Any, path: str, local: bool) -> None:
        self.number = number
        self.location = location
        self.fs = fs
        self.path = path
        self.local = local
        self.usable = False
        self.writable = True
        self.bound: cache_dir.SizeBound | None = None
        self._setup()
        if local:
            max_mb = env.read(ENV_TIER2_MAX_MB if number == 2 else ENV_TIER3_MAX_MB)
            self.bound = cache_dir.SizeBound(path, _ENTRY_RE, max_mb * 2**20)

    def _setup(self) -> None:
        try:
            if self.local:
                self._setup_local()
            else:
                self.fs.makedirs(self.path, exist_ok=True)
            self.usable = True
        except _Refused as e:
            _warn_once("tier", self.location, f"tier {self.number} disabled: {e}")
        except Exception as e:  # noqa: BLE001  (fsspec backends raise their own errors)
            _warn_once(
                "tier", self.location, f"tier {self.number} disabled: cannot use {self.location!r}: {e}"
            )

    def _setup_local(self) -> None:
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except FileExistsError:
            pass  # checked below (a file, or a dangling link)
        # Tier 2 sits in world-writable /dev/shm: never follow a planted link.
        st = os.lstat(self.path) if self.number == 2 else os.stat(self.path)
        if not stat.S_ISDIR(st.st_mode):
            raise _Refused(f"{self.path!r} is not a directory")
        if st.st_uid != os.getuid():
            raise _Refused(f"{self.path!r} is owned by uid {st.st_uid}, not {os.getuid()}")
        if self.number == 2 and stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(self.path, 0o700)

    def entry(self, key: str) -> str:
        name = key + ENTRY_SUFFIX
        return os.path.join(self.path, name) if self.local else f"{self.path.rstrip('/')}/{name}"

    # reading ----------------------------------------------------------------
    def read(self, key: str) -> tuple[bytes, Any] | None:
        """(entry bytes, file identity) or None when absent; raises _Refused/OSError."""
        path = self.entry(key)
        if not self.local:
            try:
                return self.fs.cat_file(path), None
            except FileNotFoundError:
                return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _Refused(f"{path!r} is a symbolic link") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _Refused(f"{path!r} is not a regular file")
            if st.st_uid != os.getuid():
                raise _Refused(f"{path!r} is owned by uid {st.st_uid}, not {os.getuid()}")
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read()
            return data, (st.st_dev, st.st_ino)
        finally:
            os.close(fd)

    def discard(self, key: str, ident: Any) -> None:
        """Delete a bad entry, unless it was meanwhile replaced by another writer."""
        path = self.entry(key)
        try:
            if self.local:
                st = os.lstat(path)
                if ident is None or (st.st_dev, st.st_ino) == ident:
                    os.unlink(path)
            else:
                self.fs.rm_file(path)
        except Exception:  # noqa: BLE001, S110  (re-verified and overwritten anyway)
            pass

    # writing ----------------------------------------------------------------
    def write(self, key: str, data: bytes) -> None:
        path = self.entry(key)
        if not self.local:
            # Object stores (gs, s3, memory) make an object visible only once
            # whole; elsewhere a torn entry fails verification and is rewritten.
            self.fs.pipe_file(path, data)
            return
        tmp = os.path.join(self.path, f".{key}{ENTRY_SUFFIX}.{os.getpid()}.{os.urandom(6).hex()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(data)
        finally:
            os.close(fd)
        try:
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def clear(self) -> int:
        """Delete the entries (and stale temporaries) this cache wrote."""
        removed = 0
        if self.local:
            try:
                names = os.listdir(self.path)
            except OSError:
                return 0
            for name in names:
                if _ENTRY_RE.match(name) or _TEMP_RE.match(name):
                    p = os.path.join(self.path, name)
                    try:
                        if os.lstat(p).st_uid == os.getuid():
                            os.unlink(p)
                            removed += 1
                    except OSError:
                        pass
            return removed
        try:
            paths = self.fs.ls(self.path, detail=False)
        except Exception:  # noqa: BLE001
            return 0
        for p in paths:
            if _ENTRY_RE.match(p.rstrip("/").rsplit("/", 1)[-1]):
                try:
                    self.fs.rm_file(p)
                    removed += 1
                except Exception:  # noqa: BLE001, S110  (best effort, like the local case)
                    pass
        return removed


_tiers_lock = threading.Lock()
_tiers: dict[tuple[int, str], _Tier | None] = {}


def _tier2() -> _Tier | None:
    name = env.read(ENV_TIER2) or f"torchtpu-{os.getuid()}"
    if name.lower() == "disabled":
        return None
    base = TIER2_BASE
    memo_key = (2, os.path.join(base, name))
    tier = _tiers.get(memo_key, False)
    if tier is not False:
        return tier
    with _tiers_lock:
        if memo_key not in _tiers:
            if not os.path.isdir(base):
                _tiers[memo_key] = None  # no /dev/shm on this OS: tier 2 is simply off
            elif not _TIER2_NAME_RE.match(name):
                _warn_once("tier", name, f"tier 2 disabled: {ENV_TIER2}={name!r} is not a plain name")
                _tiers[memo_key] = None
            else:
                _tiers[memo_key] = _Tier(2, memo_key[1], None, memo_key[1], local=True)
        return _tiers[memo_key]


def _tier3() -> _Tier | None:
    root = env.read(ENV_TIER3) or ""
    if not root or root.lower() == "disabled":
        return None
    memo_key = (3, root)
    tier = _tiers.get(memo_key, False)
    if tier is not False:
        return tier
    with _tiers_lock:
        if memo_key not in _tiers:
            if "://" not in root:
                # A plain directory: no need to import fsspec (~70 ms).
                _tiers[memo_key] = _Tier(3, root, None, os.path.abspath(os.path.expanduser(root)), True)
                return _tiers[memo_key]
            try:
                import fsspec.core
                from fsspec.implementations.local import LocalFileSystem

                fs, path = fsspec.core.url_to_fs(root)
            except Exception as e:  # noqa: BLE001  (unknown protocol, missing backend, ...)
                _warn_once("tier", root, f"tier 3 disabled: cannot open {root!r}: {e}")
                _tiers[memo_key] = None
            else:
                local = isinstance(fs, LocalFileSystem)
                _tiers[memo_key] = _Tier(3, root, fs, os.path.abspath(path) if local else path, local)
        return _tiers[memo_key]


def _active_tiers() -> list[_Tier]:
    return [t for t in (_tier2(), _tier3()) if t is not None and t.usable]


def tier_report() -> list[dict[str, Any]]:
    """Tiers 2 and 3 as configured now: where, whether usable, and for a local directory its
    entries and bytes (a remote tier's size is not listed: that would read the whole bucket)."""
    report = []
    for number, tier in ((2, _tier2()), (3, _tier3())):
        row: dict[str, Any] = {"tier": number, "location": None, "usable": False, "entries": None, "bytes": None,
                               "max_bytes": None}
        if tier is not None:
            row.update(location=tier.location, usable=tier.usable,
                       max_bytes=tier.bound.max_bytes if tier.bound is not None and tier.bound.max_bytes else None)
            if tier.local and os.path.isdir(tier.path):
                listed = cache_dir.entries(tier.path, _ENTRY_RE)
                row.update(entries=len(listed), bytes=sum(size for _, size, _ in listed))
        report.append(row)
    return report


# -- lookup / store -------------------------------------------------------------
def _load(tier: _Tier, key: str, client: runtime.Client, options: bytes) -> tuple[runtime.Executable, bytes] | None:
    n = tier.number
    start = time.perf_counter()
    try:
        try:
            got = tier.read(key)
        except _Refused as e:
            _add(f"tier{n}_errors")
            _warn_once("refused", key, f"refusing tier-{n} entry: {e}")
            return None
        except Exception as e:  # noqa: BLE001  (any read failure is a miss, never an error)
            _add(f"tier{n}_errors")
            _warn_once("unreadable", tier.location, f"cannot read tier-{n} entry {tier.entry(key)!r}: {e}")
            return None
        if got is None:
            return None
        data, ident = got
        try:
            payload = _unpack(key, data)
            exe = client.deserialize(payload, options)
        except (_Corrupt, runtime.PjrtError) as e:
            _add(f"tier{n}_errors")
            tier.discard(key, ident)
            _warn_once("corrupt", key, f"discarded bad tier-{n} entry {tier.entry(key)!r} ({e}); recompiling")
            return None
        if tier.local:
            cache_dir.mark_used(tier.entry(key))
        return exe, payload
    finally:
        _add(f"tier{n}_load_seconds", time.perf_counter() - start)


def _store(tier: _Tier, key: str, data: bytes) -> None:
    if not tier.writable:
        return
    n = tier.number
    start = time.perf_counter()
    try:
        tier.write(key, data)
        _add(f"tier{n}_writes")
        if tier.bound is not None:
            _add(f"tier{n}_evictions", tier.bound.note_write(len(data)))
    except FileNotFoundError:
        pass  # our temporary was removed by a concurrent clear(): skip this write
    except Exception as e:  # noqa: BLE001  (a failed write only costs a later recompile)
        tier.writable = False
        _warn_once("unwritable", tier.location, f"tier {n} is read-only from now on: cannot write: {e}")
    finally:
        _add(f"tier{n}_write_seconds", time.perf_counter() - start)


_serialize_supported = True


def _resolve(text: str | bytes, text_digest: str, client: runtime.Client, options: bytes) -> Any:
    tiers = _active_tiers() if _serialize_supported else []
    key = _persistent_key(text_digest, client, options) if tiers else ""
    missed: list[_Tier] = []
    for tier in tiers:
        got = _load(tier, key, client, options)
        if got is not None:
            _add(f"tier{tier.number}_hits")
            exe, payload = got
            if missed:
                data = _pack(key, payload)
                for t in missed:
                    _store(t, key, data)
            return exe
        _add(f"tier{tier.number}_misses")
        missed.append(tier)
    shared = next((t for t in missed if t.local), None)
    if shared is None:
        return _compile_and_store(text, key, client, options, missed)
    # processes of this machine compile a program once between them: the first holds the lock,
    # the others wait, then load what it stored
    with cache_dir.program_lock(shared.path, key) as waited:
        if waited:
            got = _load(shared, key, client, options)
            if got is not None:
                _add(f"tier{shared.number}_hits_after_wait")
                exe, payload = got
                others = [t for t in missed if t is not shared]
                if others:
                    data = _pack(key, payload)
                    for t in others:
                        _store(t, key, data)
                return exe
        return _compile_and_store(text, key, client, options, missed)


def _compile_and_store(text: str | bytes, key: str, client: runtime.Client, options: bytes,
                       missed: list[_Tier]) -> Any:
    global _serialize_supported
    started, start = time.time(), time.perf_counter()
    exe = client.compile(text, options=options)
    seconds = time.perf_counter() - start
    _add("compiles")
    _add("compile_seconds", seconds)
    entry = {"what": getattr(_compiling, "what", None) or "program", "seconds": seconds, "started": started,
             "text_bytes": len(text), "thread": threading.current_thread().name}
    with _stats_lock:
        _compile_log.append(entry)
    _log.debug("torchtpu: compiled %s in %.2f s (%d bytes of StableHLO)", entry["what"], seconds, len(text))
    if missed:
        start = time.perf_counter()
        try:
            payload = exe.serialize()
        except runtime.PjrtError as e:
            _serialize_supported = False
            _warn_once("serialize", "", f"tiers 2/3 off: the plugin cannot serialize executables ({e})")
            return exe
        finally:
            _add("serialize_seconds", time.perf_counter() - start)
        data = _pack(key, payload)
        for t in missed:
            _store(t, key, data)
    return exe


_tier1_lock = threading.Lock()
_tier1: dict[tuple[int, bytes, str], Future] = BoundedCache()  # (the oldest dropped past a bound)


def compile(
    text: str | bytes,
    *,
    client: runtime.Client | None = None,
    device_index: int = 0,
    options: bytes | None = None,
    effort: str = "default",
) -> runtime.Executable:
    """``client.compile(text)`` through the three cache tiers (thread-safe).

    ``client`` defaults to the process's client. Without ``options``, the program is compiled
    for ``device_index`` alone with ``effort`` (an ``_EFFORTS`` name), and the executable is bound
    to that device (a launch elsewhere compiles it again for its device). Compile errors
    propagate and are not cached.
    """
    client = client or _device_state.client()
    bound = options is None
    if bound:
        options = _default_options(client, device_index, effort)
    code = text.encode() if isinstance(text, str) else bytes(text)
    text_digest = hashlib.sha256(code).hexdigest()
    # An entry's Executable keeps its client alive, so id(client) is not reused
    # while the entry exists.
    k1 = (id(client), options, text_digest)
    with _tier1_lock:
        fut = _tier1.get(k1)
        owner = fut is None
        if owner:
            fut = _tier1[k1] = Future()
    if not owner:
        _add("tier1_hits")
        return fut.result()
    _add("tier1_misses")
    # Everything up to the result inside the try: an entry left unresolved would keep every later
    # compile of the program waiting on it forever.
    try:
        client.note_program(code)  # may refuse the program: inside, so its waiters hear it too
        exe = _resolve(text, text_digest, client, options)
        if bound:  # (other devices: the text is kept only where there are some)
            exe.bind(device_index, None if len(client.devices) == 1 else functools.partial(
                _for_other_device, text, client, effort))
        _note_temp(exe)
    except BaseException as e:
        with _tier1_lock:
            if _tier1.get(k1) is fut:
                del _tier1[k1]
        fut.set_exception(e)
        raise
    fut.set_result(exe)
    return exe


def _for_other_device(text: str | bytes, client: runtime.Client, effort: str, device_index: int) -> runtime.Executable:
    return compile(text, client=client, device_index=device_index, effort=effort)


_largest_temp = 0  # bytes: the largest scratch of a program this process compiled or loaded


def _note_temp(exe: runtime.Executable) -> None:
    global _largest_temp
    stats = exe.compiled_memory_stats()
    if stats is not None:
        _largest_temp = max(_largest_temp, stats["temp"])


def largest_temp_bytes() -> int:
    """The largest device scratch (``temp``, PJRT's compiled memory stats) among the programs this
    process compiled or loaded, 0 where the plugin does not say. A program's intermediates live
    there, not in buffers: a device allocator's count of buffers in use does not include them."""
    return _largest_temp


def clear(tier: int | None = None) -> None:
    """Empty tier 1 (memory), 2 or 3 (only the entries this cache wrote), or all."""
    if tier not in (None, 1, 2, 3):
        raise ValueError(f"tier must be 1, 2, 3 or None, not {tier!r}")
    if tier in (None, 1):
        with _tier1_lock:
            _tier1.clear()
    if tier in (None, 2):
        t2 = _tier2()
        if t2 is not None and t2.usable:
            t2.clear()
    if tier in (None, 3):
        t3 = _tier3()
        if t3 is not None and t3.usable:
            t3.clear()


class CompileError(RuntimeError):
    """XLA refused a program torchtpu built: the message names what the program computes (the
    op and its inputs, or the fused or compiled graph); the plugin's diagnostic is its cause."""


def _eager_effort(client: runtime.Client) -> str:
    """The compile effort of one op's program: TORCH_TPU_EAGER_COMPILE_EFFORT; unset, ``fast`` on a
    TPU, where Strict's compiles dominate (a v5e compiled small programs 33-53% faster at
    exec_time_optimization_effort -1, with the same run time: ``probe_compile_effort.py``), and
    the compiler's default elsewhere."""
    chosen = env.read("TORCH_TPU_EAGER_COMPILE_EFFORT")
    if chosen is None:
        return "fast" if client.platform_name == "tpu" else "default"
    return chosen


def compile_program(text: str | bytes, what: str, eager: bool = False) -> runtime.Executable:
    """:func:`compile`, with a refusal re-raised as :class:`CompileError` naming ``what``.
    ``eager``: one op's program (Strict), compiled with TORCH_TPU_EAGER_COMPILE_EFFORT's effort."""
    _compiling.what = what
    try:
        exe = compile(text, effort=_eager_effort(_device_state.client()) if eager else "default")
    except runtime.UnsupportedDtypeError as e:
        raise runtime.UnsupportedDtypeError(f"{e} (the program of {what})") from None  # a TypeError too
    except runtime.PjrtError as e:
        if e.code == RESOURCE_EXHAUSTED:
            raise  # out of device memory while compiling: the OutOfMemoryError path takes it
        lines = [ln.strip() for ln in e.message.splitlines() if "error" in ln] or e.message.splitlines()[:1]
        raise CompileError(f"torchtpu: XLA could not compile the program of {what}: "
                           f"{lines[0] if lines else e.code_name}") from e
    finally:
        _compiling.what = None
    # the op without its arguments, or the graph: the program's name in profiler traces
    exe.label = what.split("(", 1)[0] if what.startswith("aten::") else what
    return exe
