from __future__ import annotations

import pytest

from torchtpu.runtime import PjrtError, Plugin, load_plugin, plugins, resolve_plugin_path
from torchtpu.runtime._pjrt_ffi import PJRT_HEADER_VERSION, ffi


def test_version_and_attributes(plugin):
    assert PJRT_HEADER_VERSION == (0, 81)
    attrs = plugin.attributes()
    if plugins.selected_kind() == "cpu":  # the pinned plugin
        assert plugin.api_version == (0, 81)
        assert attrs["stablehlo_current_version"] == [1, 13, 3]
        assert "xla_version" in attrs
    else:  # a newer plugin speaks our (older) minor version of the C API
        assert plugin.api_version[0] == 0 and plugin.api_version[1] >= 81
        assert len(attrs["stablehlo_current_version"]) == 3
    assert plugin.initialized


def test_load_plugin_is_shared(plugin):
    assert load_plugin(resolve_plugin_path()) is plugin
    plugin.initialize()  # idempotent


@pytest.mark.emulator_only("loads a second copy of the CPU plugin's library")
def test_has_respects_struct_size():
    # A second Plugin object on the same .so (no Initialize) to fake an
    # older plugin whose table ends before PJRT_Client_DmaMap.
    p = Plugin(resolve_plugin_path("cpu"))
    assert p.has("PJRT_Client_DmaMap")
    assert p.has("PJRT_Executable_Fingerprint")
    p.api_size = ffi.offsetof("PJRT_Api", "PJRT_Client_DmaMap")
    assert not p.has("PJRT_Client_DmaMap")
    assert not p.has("PJRT_LoadedExecutable_GetDeviceAssignment")
    assert p.has("PJRT_Client_Create")
    with pytest.raises(PjrtError) as info:
        p.fn("PJRT_Client_DmaMap")
    assert info.value.code == 12  # UNIMPLEMENTED
    assert not p.has("PJRT_No_Such_Function")


def test_call_turns_errors_into_exceptions(plugin, client):
    with pytest.raises(PjrtError) as info:
        plugin.call("PJRT_Client_LookupDevice", client=client._handle, id=12345)
    assert info.value.code != 0
    assert info.value.message
