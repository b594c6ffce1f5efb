"""Where the CPU time of a GPT training step goes, per XLA:CPU kernel (not a test).

    python bench/xla_cpu_kernels.py [--mode compile|defer_and_fuse|strict] [--seconds 4] [--top 30]

Needs Linux ``perf`` (``apt install linux-perf``) and permission to sample this
process. XLA:CPU compiles each fusion into machine code at run time, so ``perf``
alone reports those samples as unknown addresses. The plugin announces every
object it JIT-links through the GDB JIT interface (``__jit_debug_descriptor``),
so this script walks that list, reads each in-memory object's symbol table (the
kernels are named after their HLO fusions, e.g. ``copy_bitcast_fusion.2``), and
attributes ``perf``'s samples of the step loop to them. Everything else is
attributed to its shared-object symbol (YNNPACK dot kernels, the Eigen thread
pool, Python, malloc), or, for other code generated at run time, to the anonymous
executable region it runs in.

Kernel names repeat across executables (the forward and the backward both have a
``copy_bitcast_fusion``); samples are attributed by address, then reported by
name. Compare with the HLO of the same run: add
``XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text``.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import ctypes
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

# The compile caches would hand back serialized executables; compile here instead so
# that the JIT registrations are made in this process, whatever the caches hold.
os.environ["TORCH_TPU_TIER2_COMPILATION_CACHE"] = "disabled"
_TIER3 = tempfile.mkdtemp(prefix="xla_cpu_kernels_")
os.environ["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] = _TIER3

import torch
from eager import _train_step_fn  # the same step as bench/eager.py (a sibling script)

from torchtpu.examples.gpt import GPT, GPTConfig, make_batch
from torchtpu.runtime import plugins

_STT_FUNC = 2
_SHT_SYMTAB = 2


def elf_symbols(data: bytes) -> list[tuple[str, int, int, int, int]]:
    """(name, value, size, section index, type) of every symbol in an ELF64 little-endian image."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not an ELF64 little-endian image")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    out = []
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != _SHT_SYMTAB or not entsize:
            continue
        strtab_offset = sections[link][4]
        for k in range(size // entsize):
            st_name, st_info, _other, shndx, value, sym_size = struct.unpack_from("<IBBHQQ", data, offset + k * entsize)
            end = data.index(b"\0", strtab_offset + st_name)
            out.append((data[strtab_offset + st_name:end].decode(errors="replace"), value, sym_size, shndx,
                        st_info & 0xF))
    return out


def section_addresses(data: bytes) -> list[int]:
    """sh_addr of every section (where the JIT linker loaded it, in a registered object)."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    return [struct.unpack_from("<Q", data, shoff + i * shentsize + 0x10)[0] for i in range(shnum)]


def _plugin_base(path: str) -> int:
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and parts[2] == "00000000" and os.path.realpath(parts[5]) == real:
                return int(parts[0].split("-")[0], 16)
    raise RuntimeError(f"{path} is not mapped into this process")


def jit_kernels(plugin_path: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of every function XLA:CPU has JIT-linked in this process so far."""
    with open(plugin_path, "rb") as f:
        image = f.read()
    descriptor = next((value for name, value, *_ in elf_symbols(image) if name == "__jit_debug_descriptor"), None)
    if descriptor is None:
        raise RuntimeError("the plugin has no __jit_debug_descriptor symbol (stripped?)")
    # struct jit_descriptor { uint32 version, action; jit_code_entry *relevant, *first; }
    entry = ctypes.c_uint64.from_address(_plugin_base(plugin_path) + descriptor + 16).value
    kernels = []
    while entry:
        # struct jit_code_entry { next, prev; const char *symfile_addr; uint64 symfile_size; }
        nxt, _prev, addr, size = (ctypes.c_uint64.from_address(entry + 8 * i).value for i in range(4))
        obj = ctypes.string_at(addr, size)
        bases = section_addresses(obj)  # sections as loaded: the registered copy carries their addresses
        for name, value, sym_size, shndx, kind in elf_symbols(obj):
            if kind == _STT_FUNC and sym_size and 0 < shndx < len(bases):
                start = bases[shndx] + value
                kernels.append((start, start + sym_size, name))
        entry = nxt
    return sorted(kernels)


def anonymous_code_regions() -> list[tuple[int, int, str]]:
    """(start, end, label) of this process's executable mappings that have no file.

    Code generated at run time outside XLA's GDB-announced objects lands there; perf
    can only call it ``perf-PID.map:[unknown]``. With f32 dots on an AVX2 machine a
    single read-write-execute region of a few MB took 27-29% of a DeferAndFuse step's
    samples: a JIT GEMM library's code buffer, by its shape.
    """
    regions = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if "x" not in parts[1] or (len(parts) > 5 and parts[5]):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            regions.append((start, end, f"anonymous {parts[1]} region of {(end - start) // 1024} KB"))
    return regions


def _category(name: str) -> str:
    if name.startswith("xla:"):
        return "XLA fusion kernels (JIT)"
    if name.startswith("anonymous "):
        return "anonymous JIT code (not announced)"
    if "ynn::" in name or "xnn" in name:
        return "YNNPACK / XNNPACK (dots)"
    if "Eigen" in name or "ThreadPool" in name or "Slinky" in name:
        return "XLA thread pool"
    if "python" in name:
        return "Python"
    if any(k in name for k in ("malloc", "free", "unlink_chunk", "consolidate")):
        return "malloc"
    if "memmove" in name or "memcpy" in name or "memset" in name:
        return "memcpy/memset"
    if name.startswith(("libtorch", "libc10")):
        return "PyTorch (C++)"
    if name.startswith("xla_cpu_pjrt.so:"):
        return "XLA runtime (other)"
    if name.startswith("[kernel"):
        return "OS kernel"
    return "other"


def step_loop(mode: str) -> tuple[Callable[[], float], str]:
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=mode == "compile")
    x, y = make_batch(cfg, 8, torch.Generator().manual_seed(0))
    x, y = x.to("tpu"), y.to("tpu")

    step = _train_step_fn(model, opt)
    if mode == "compile":
        step = torch.compile(step, backend="tpu")
    eager = "defer_and_fuse" if mode == "defer_and_fuse" else "strict"
    return (lambda: step(x, y).item()), eager


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("compile", "defer_and_fuse", "strict"), default="compile")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    perf = shutil.which("perf")
    if perf is None:
        sys.exit("perf is not installed (Debian: apt install linux-perf)")
    run, eager = step_loop(args.mode)
    with torch.tpu.eager_mode(eager):
        for _ in range(5):
            run()
        kernels = jit_kernels(plugins.cpu_plugin_path())
        starts = [k[0] for k in kernels]
        data = os.path.join(_TIER3, "perf.data")
        rec = subprocess.Popen([perf, "record", "-q", "-F", "4000", "-p", str(os.getpid()), "-o", data,
                                "--", "sleep", str(args.seconds)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        steps = 0
        done = threading.Event()
        threading.Thread(target=lambda: (rec.wait(), done.set()), daemon=True).start()
        t0 = time.perf_counter()
        while not done.is_set():
            run()
            steps += 1
        elapsed = time.perf_counter() - t0
        anonymous = anonymous_code_regions()
    anonymous_starts = [r[0] for r in anonymous]
    if rec.returncode != 0:
        sys.exit(f"perf record failed: {rec.stderr.read().decode().strip()}")
    script = subprocess.run([perf, "script", "-i", data, "-F", "ip,sym,dso"], capture_output=True, text=True,
                            check=True)
    by_name: collections.Counter[str] = collections.Counter()
    line_re = re.compile(r"\s*([0-9a-f]+)\s+(.*?)\s+\((.*)\)\s*$")
    for line in script.stdout.splitlines():
        m = line_re.match(line)
        if not m:
            continue
        ip = int(m.group(1), 16)
        i = bisect.bisect_right(starts, ip) - 1
        j = bisect.bisect_right(anonymous_starts, ip) - 1
        if i >= 0 and kernels[i][0] <= ip < kernels[i][1]:
            by_name["xla:" + kernels[i][2]] += 1
        elif j >= 0 and anonymous[j][0] <= ip < anonymous[j][1] and anonymous[j][1] - anonymous[j][0] > 4096:
            # (XLA's own JIT objects sit in single pages, named by the kernel list above)
            by_name[anonymous[j][2]] += 1
        else:
            by_name[f"{os.path.basename(m.group(3))}:{m.group(2)}"] += 1
    total = sum(by_name.values())
    if not total:
        sys.exit("perf recorded no samples")
    print(f"mode {args.mode}: {steps} steps in {elapsed:.1f} s ({elapsed / max(steps, 1) * 1e3:.2f} ms/step), "
          f"{total} samples, {len(kernels)} JIT kernels")
    cats: collections.Counter[str] = collections.Counter()
    for name, n in by_name.items():
        cats[_category(name)] += n
    print("\nby category (% of all samples, every thread):")
    for name, n in cats.most_common():
        print(f"  {n / total * 100:6.2f}%  {name}")
    families: collections.Counter[str] = collections.Counter()
    for name, n in by_name.items():
        if name.startswith("xla:"):
            families[re.sub(r"\.\d+$", "", name[4:])] += n
    print("\nXLA fusion kernels by kind:")
    for name, n in families.most_common(args.top):
        print(f"  {n / total * 100:6.2f}%  {name}")
    print(f"\ntop {args.top} symbols:")
    for name, n in by_name.most_common(args.top):
        print(f"  {n / total * 100:6.2f}%  {name[:120]}")
    shutil.rmtree(_TIER3, ignore_errors=True)


if __name__ == "__main__":
    main()
