from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from torchtpu.runtime import PjrtError

X = np.array([1.5, -2.0, 3.25, 4.0], np.float32)
Y = np.array([0.5, 2.0, -1.25, 8.0], np.float32)


def test_serialize_deserialize_in_process(client, add_exe, run):
    blob = add_exe.serialize()
    assert isinstance(blob, bytes) and len(blob) > 100
    exe2 = client.deserialize(blob)
    assert exe2.num_outputs == 1
    assert exe2.output_shapes == [(4,)]
    (out,) = run(client, exe2, X, Y)
    (ref,) = run(client, add_exe, X, Y)
    np.testing.assert_array_equal(out, ref)
    # still portable: runs on the other device too
    (out1,) = run(client, exe2, X, Y, device=len(client.devices) - 1)
    np.testing.assert_array_equal(out1, ref)
    assert exe2.fingerprint() == add_exe.fingerprint()


@pytest.mark.emulator_only("a second client or process on the plugin; one process holds a TPU chip, with one client")
def test_deserialize_in_fresh_process(client, add_exe, tmp_path, run):
    blob_path = tmp_path / "add.bin"
    blob_path.write_bytes(add_exe.serialize())
    script = textwrap.dedent(
        f"""
        import sys
        import numpy as np
        from torchtpu.runtime import Client, load_plugin, resolve_plugin_path
        client = Client(load_plugin(resolve_plugin_path("cpu")), {{"cpu_device_count": 1}})
        exe = client.deserialize(open({str(blob_path)!r}, "rb").read())
        x = np.array({X.tolist()!r}, np.float32)
        y = np.array({Y.tolist()!r}, np.float32)
        (out,), ev = exe.execute([client.buffer_from_host(x), client.buffer_from_host(y)])
        ev.wait()
        print(repr(out.to_host().tolist()))
        print("torch imported:", "torch" in sys.modules)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    (ref,) = run(client, add_exe, X, Y)
    assert eval(lines[0]) == ref.tolist()
    assert lines[1] == "torch imported: False"  # the runtime never imports torch


def test_deserialize_garbage_raises(client):
    with pytest.raises(PjrtError):
        client.deserialize(b"not an executable")
