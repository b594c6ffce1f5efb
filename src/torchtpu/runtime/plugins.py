"""Choosing which PJRT plugin .so to load (pure functions, nothing is loaded).

Selection: an explicit ``choice``, else env ``TORCH_TPU_PJRT_PLUGIN``, else the TPU where
the machine has one and libtpu is installed, else "cpu". A choice is a path to any plugin
.so or one of the names below.
"""

from __future__ import annotations

import glob
import importlib.util
import os

from . import env

ENV_VAR = "TORCH_TPU_PJRT_PLUGIN"
ENV_CPU_DEVICES = "TORCH_TPU_CPU_DEVICE_COUNT"
KINDS = ("cpu", "tpu", "cuda")


def tpu_present() -> bool:
    """A TPU VM exposes /dev/accel* (v4 and older) or /dev/vfio/* (v5e and later)."""
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/*"))


def tpu_chip_count() -> int:
    """TPU chips on this machine, counted from their device nodes (without opening them)."""
    accel = glob.glob("/dev/accel*")
    if accel:
        return len(accel)
    return sum(os.path.basename(p).isdigit() for p in glob.glob("/dev/vfio/*"))


def _package_dirs(name: str) -> list[str]:
    """Search locations of a top-level package without executing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)
    return [os.path.dirname(spec.origin)] if spec.origin else []


def cpu_plugin_path() -> str:
    """The .so of the ``xla-cpu-pjrt`` wheel."""
    try:
        # Imports only the trivial namespace parent ``xla_plugins``.
        spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    except ImportError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for d in spec.submodule_search_locations:
            path = os.path.join(d, "xla_cpu_pjrt.so")
            if os.path.isfile(path):
                return path
    raise RuntimeError("PJRT CPU plugin not found: pip install xla-cpu-pjrt")


def tpu_plugin_path() -> str:
    """libtpu.so, only on a machine that has a TPU.

    Never load libtpu elsewhere: its PJRT_Plugin_Initialize retries GCE
    metadata requests for minutes before failing.
    """
    if not tpu_present():
        raise RuntimeError(
            "no TPU on this machine (no /dev/accel* or /dev/vfio/*); refusing to load "
            f"libtpu. Use {ENV_VAR}=cpu or a plugin path."
        )
    for d in _package_dirs("libtpu"):
        path = os.path.join(d, "libtpu.so")
        if os.path.isfile(path):
            return path
    raise RuntimeError("TPU present but libtpu.so not found: pip install libtpu")


def cuda_plugin_path() -> str:
    """The .so of jax-cuda12-pjrt, found without importing jax_plugins (it imports jax)."""
    for d in _package_dirs("jax_plugins"):
        path = os.path.join(d, "xla_cuda12", "xla_cuda_plugin.so")
        if os.path.isfile(path):
            return path
    raise RuntimeError("PJRT CUDA plugin not found: pip install jax-cuda12-pjrt")


def libtpu_installed() -> bool:
    """Whether the ``libtpu`` package's .so is importable (found without loading it)."""
    return any(os.path.isfile(os.path.join(d, "libtpu.so")) for d in _package_dirs("libtpu"))


def default_choice() -> str:
    """The plugin when none is named: a machine with a TPU and libtpu gets the TPU; any other
    the CPU emulator (libtpu is never loaded where no TPU device node exists)."""
    return "tpu" if tpu_present() and libtpu_installed() else "cpu"


def resolve_plugin_path(choice: str | None = None) -> str:
    """Path of the plugin .so for a name ("cpu", "tpu", "cuda") or a path; by default
    ``TORCH_TPU_PJRT_PLUGIN``, else :func:`default_choice`."""
    if choice is None:
        choice = env.read(ENV_VAR) or default_choice()
    name = choice.strip().lower()
    if name == "cpu":
        return cpu_plugin_path()
    if name == "tpu":
        return tpu_plugin_path()
    if name in ("cuda", "gpu"):
        return cuda_plugin_path()
    path = os.path.expanduser(choice)
    if os.path.isfile(path):
        return os.path.abspath(path)
    raise RuntimeError(f"PJRT plugin {choice!r} is neither one of {KINDS} nor an existing file")


def selected_kind() -> str:
    """The kind of plugin this process would load (:func:`resolve_plugin_path`), found without
    loading it; "cpu" where none can be found."""
    try:
        return plugin_kind(resolve_plugin_path())
    except RuntimeError:
        return "cpu"


def plugin_kind(path: str) -> str:
    """Best guess of the kind of a plugin file ("cpu", "tpu", "cuda" or "other")."""
    base = os.path.basename(path).lower()
    if "tpu" in base:
        return "tpu"
    if "cuda" in base or "gpu" in base:
        return "cuda"
    if "cpu" in base:
        return "cpu"
    return "other"


def default_client_options(kind: str, num_devices: int | None = None) -> dict[str, int | str | bool | float]:
    """PJRT_Client_Create options that suit a plugin kind.

    cpu: ``cpu_device_count`` (the plugin defaults to 4 devices) from
    ``num_devices``, else env TORCH_TPU_CPU_DEVICE_COUNT, else 1.
    """
    if kind == "cpu":
        if num_devices is None:
            num_devices = env.read(ENV_CPU_DEVICES) or 1
        if num_devices < 1:
            raise ValueError("num_devices must be >= 1")
        return {"cpu_device_count": num_devices}
    return {}
