from __future__ import annotations

import os
import sys

import pytest

from torchtpu.runtime import plugin as plugin_module
from torchtpu.runtime import plugins


@pytest.mark.emulator_only("resolves or loads the CPU plugin, which a TPU host need not install")
def test_cpu_default(monkeypatch):
    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    monkeypatch.setattr(plugins, "tpu_present", lambda: False)
    path = plugins.resolve_plugin_path(None)
    assert path.endswith("xla_cpu_pjrt.so") and os.path.isfile(path)
    assert plugins.resolve_plugin_path("cpu") == path
    assert plugins.resolve_plugin_path("CPU") == path


@pytest.mark.emulator_only("resolves or loads the CPU plugin, which a TPU host need not install")
def test_env_var(monkeypatch):
    cpu = plugins.resolve_plugin_path("cpu")
    monkeypatch.setenv(plugins.ENV_VAR, cpu)  # a path
    assert plugins.resolve_plugin_path(None) == cpu
    monkeypatch.setenv(plugins.ENV_VAR, "cpu")  # a name
    assert plugins.resolve_plugin_path(None) == cpu
    monkeypatch.setenv(plugins.ENV_VAR, "/no/such/plugin.so")
    with pytest.raises(RuntimeError, match="neither"):
        plugins.resolve_plugin_path(None)
    # an explicit choice beats the environment
    assert plugins.resolve_plugin_path("cpu") == cpu


def test_tpu_refused_without_tpu(monkeypatch):
    monkeypatch.setattr(plugins, "tpu_present", lambda: False)  # also on a TPU host

    def boom(*args, **kwargs):
        raise AssertionError("libtpu must not be looked up or loaded")

    monkeypatch.setattr(plugins, "_package_dirs", boom)
    monkeypatch.setattr(plugin_module, "Plugin", boom)
    with pytest.raises(RuntimeError, match="no TPU"):
        plugins.resolve_plugin_path("tpu")
    monkeypatch.setenv(plugins.ENV_VAR, "tpu")
    with pytest.raises(RuntimeError, match="no TPU"):
        plugins.resolve_plugin_path(None)


def test_tpu_lookup_when_present(monkeypatch, tmp_path):
    (tmp_path / "libtpu").mkdir()
    # a regular package: on a TPU host the installed libtpu (a regular package, perhaps imported
    # already) would otherwise win over a namespace directory earlier on the path
    (tmp_path / "libtpu" / "__init__.py").write_text("")
    so = tmp_path / "libtpu" / "libtpu.so"
    so.write_bytes(b"")
    monkeypatch.setattr(plugins, "tpu_present", lambda: True)
    monkeypatch.delitem(sys.modules, "libtpu", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert plugins.resolve_plugin_path("tpu") == str(so)


def test_cuda_lookup_does_not_import(monkeypatch, tmp_path):
    pkg = tmp_path / "jax_plugins" / "xla_cuda12"
    pkg.mkdir(parents=True)
    # importing this package would fail loudly
    (pkg / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (pkg / "xla_cuda_plugin.so").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert plugins.resolve_plugin_path("cuda") == str(pkg / "xla_cuda_plugin.so")


def test_default_client_options(monkeypatch):
    monkeypatch.delenv(plugins.ENV_CPU_DEVICES, raising=False)
    assert plugins.default_client_options("cpu") == {"cpu_device_count": 1}
    assert plugins.default_client_options("cpu", 4) == {"cpu_device_count": 4}
    monkeypatch.setenv(plugins.ENV_CPU_DEVICES, "2")
    assert plugins.default_client_options("cpu") == {"cpu_device_count": 2}
    assert plugins.default_client_options("tpu") == {}
    assert plugins.plugin_kind("/site/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so") == "cpu"
    assert plugins.plugin_kind("/site/libtpu/libtpu.so") == "tpu"


@pytest.mark.emulator_only("resolves or loads the CPU plugin, which a TPU host need not install")
def test_create_client(monkeypatch):
    from torchtpu.runtime import create_client

    monkeypatch.delenv(plugins.ENV_VAR, raising=False)
    c = create_client(num_devices=3)
    assert c.platform_name == "cpu"
    assert len(c.devices) == 3
    c.close()
    assert c.is_closed
