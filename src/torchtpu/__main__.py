"""``python -m torchtpu``: what this process's tpu device is, and a quick self-test.

    python -m torchtpu            # devices, plugin, PJRT API, cache tiers, mode, precision, versions
    python -m torchtpu --check    # also a ~10-second self-test against the CPU (exit status 1 on a failure)
    python -m torchtpu cache      # the compile cache's tiers 2 and 3 (--clear-cache 2|3|all empties them)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import sys
import time
from collections.abc import Callable

import torch


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _size(nbytes: int | None) -> str:
    if nbytes is None:
        return "-"
    return f"{nbytes / 2**30:.2f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


def report() -> list[tuple[str, str]]:
    """(what, value) rows describing the device, its plugin and torchtpu's settings."""
    from . import _device_state
    from .runtime import env

    client = _device_state.client()
    plugin = client.plugin
    attrs = plugin.attributes()
    rows = [
        ("torchtpu", _version("torchtpu")),
        ("torch", torch.__version__),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("numpy / ml_dtypes / cffi", " / ".join(_version(p) for p in ("numpy", "ml_dtypes", "cffi"))),
        ("plugin", f"{_device_state.plugin_kind()}: {plugin.path}"),
        ("PJRT C API", "{}.{}".format(*plugin.api_version)),
        ("platform", f"{client.platform_name} {client.platform_version}"),
        ("StableHLO accepted", ".".join(str(v) for v in attrs.get("stablehlo_current_version", [])) or "-"),
        ("devices", str(torch.tpu.device_count())),
    ]
    for index in range(torch.tpu.device_count()):
        free, total = torch.tpu.mem_get_info(index)
        name = torch.tpu.get_device_name(index)
        rows.append((f"  tpu:{index}", f"{name}; memory {_size(total)}, {_size(free)} free"))
    rows += [
        ("eager mode", torch.tpu.get_eager_mode()),
        ("float32 matmul precision", torch.tpu.get_precision()),
    ]
    rows += cache_rows()
    set_vars = [f"{name}={os.environ[name]}" for name in env.VARIABLES if os.environ.get(name)]
    rows.append(("TORCH_TPU_* set", ", ".join(set_vars) or "none"))
    return rows


def cache_rows() -> list[tuple[str, str]]:
    """(what, value) rows of the compile cache's tiers 2 and 3: where, entries, size, bound."""
    from .engine import compile_cache

    rows = []
    for tier in compile_cache.tier_report():
        where = tier["location"] or "disabled"
        state = "" if tier["usable"] or tier["location"] is None else " (unusable)"
        count = "" if tier["entries"] is None else f": {tier['entries']} entries, {_size(tier['bytes'])}"
        bound = f" (bound {_size(tier['max_bytes'])})" if tier["max_bytes"] else ""
        rows.append((f"compile cache, tier {tier['tier']}", f"{where}{state}{count}{bound}"))
    return rows


def _print_rows(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _checks() -> list[tuple[str, Callable[[], None]]]:
    def elementwise() -> None:
        x = torch.linspace(-3, 3, 1000)
        got = (torch.tanh(x.to("tpu")) * 2 + 1).cpu()
        torch.testing.assert_close(got, torch.tanh(x) * 2 + 1)

    def matmul_highest() -> None:
        a, b = torch.randn(128, 256, dtype=torch.float64), torch.randn(256, 64, dtype=torch.float64)
        exact = a @ b
        with torch.tpu.precision("highest"):
            got = (a.float().to("tpu") @ b.float().to("tpu")).cpu().double()
        err = ((got - exact).abs().max() / exact.abs().max()).item()
        assert err < 1e-5, f"max error {err:.2e} of the largest value, over 1e-5"

    def training(mode: str) -> Callable[[], None]:
        def run() -> None:
            torch.manual_seed(0)
            ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
            model.load_state_dict(ref.state_dict())
            model.to("tpu")
            x, y = torch.randn(8, 16), torch.randn(8, 4)
            with torch.tpu.eager_mode(mode), torch.tpu.precision("highest"):
                for m, xs, ys in ((ref, x, y), (model, x.to("tpu"), y.to("tpu"))):
                    opt = torch.optim.SGD(m.parameters(), lr=0.1)
                    for _ in range(3):
                        loss = torch.nn.functional.mse_loss(m(xs), ys)
                        opt.zero_grad()
                        loss.backward()
                        opt.step()
                torch.tpu.synchronize()
            for p, q in zip(ref.parameters(), model.parameters()):
                torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)
        return run

    def compiled() -> None:
        fn = torch.compile(lambda a: torch.sin(a) * a.sum(), backend="tpu")
        x = torch.randn(64)
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), torch.sin(x) * x.sum(), rtol=1e-5, atol=1e-5)

    return [("elementwise", elementwise), ("matmul at highest", matmul_highest),
            ("training step, strict", training("strict")),
            ("training step, defer_and_fuse", training("defer_and_fuse")),
            ("torch.compile(backend='tpu')", compiled)]


def check() -> bool:
    """Run the self-test, printing a line per check; True when all pass."""
    ok = True
    for name, fn in _checks():
        start = time.perf_counter()
        try:
            fn()
            print(f"  pass  {name} ({time.perf_counter() - start:.1f} s)")
        except Exception as e:  # noqa: BLE001  (a self-test reports every failure and goes on)
            ok = False
            print(f"  FAIL  {name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchtpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="run a ~10-second self-test against the CPU")
    parser.add_argument("command", nargs="?", choices=("cache",),
                        help="`cache`: the same as --cache")
    parser.add_argument("--cache", action="store_true",
                        help="only the compile cache's tiers 2 and 3 (opens no device: safe while another "
                             "process holds the TPU)")
    parser.add_argument("--clear-cache", choices=("2", "3", "all"),
                        help="delete the entries of compile-cache tier 2, 3 or both (opens no device)")
    args = parser.parse_args(argv)
    if args.cache or args.clear_cache or args.command == "cache":
        if args.clear_cache:
            from .engine import compile_cache

            for tier in (2, 3) if args.clear_cache == "all" else (int(args.clear_cache),):
                compile_cache.clear(tier)
        _print_rows(cache_rows())
        return 0
    _print_rows(report())
    if args.check:
        print("self-test:")
        return 0 if check() else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
