from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import weakref

import numpy as np
import pytest

EXIT_SCRIPT = textwrap.dedent(
    """
    import threading
    import numpy as np
    from torchtpu.runtime import Client, load_plugin, resolve_plugin_path
    client = Client(load_plugin(resolve_plugin_path("cpu")), {"cpu_device_count": 2})
    src = '''module @m {
      func.func public @main(%a: tensor<512x512xf32>) -> tensor<512x512xf32> {
        %0 = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : (tensor<512x512xf32>, tensor<512x512xf32>) -> tensor<512x512xf32>
        return %0 : tensor<512x512xf32>
      }
    }'''
    exe = client.compile(src)
    a = client.buffer_from_host(np.ones((512, 512), np.float32), 1)
    (out,), event = exe.execute([a], 1)
    event.on_ready(lambda err: None)
    (out2,), event2 = exe.execute([out], 1)  # still running at exit
    # exit with live client, executable, buffers and pending events
    print("bye")
    """
)


@pytest.mark.emulator_only("a second client or process on the plugin; one process holds a TPU chip, with one client")
def test_interpreter_exit_with_live_objects():
    proc = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT], check=False, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "bye"


def test_objects_are_collected(client, add_exe):
    b = client.buffer_from_host(np.ones(4, np.float32))
    outs, event = add_exe.execute([b, b])
    refs = [weakref.ref(x) for x in (b, outs[0], event)]
    del b, outs, event
    gc.collect()
    assert all(r() is None for r in refs)


@pytest.mark.emulator_only("a second client or process on the plugin; one process holds a TPU chip, with one client")
def test_executable_and_client_keep_each_other_right(plugin):
    from torchtpu.runtime import Client

    c = Client(plugin, {"cpu_device_count": 1})
    buf = c.buffer_from_host(np.arange(3, dtype=np.int32))
    ref = weakref.ref(c)
    del c
    gc.collect()
    assert ref() is not None  # the buffer keeps its client alive
    np.testing.assert_array_equal(buf.to_host(), [0, 1, 2])
    del buf
    gc.collect()
    assert ref() is None


@pytest.fixture
def destroying_threads(monkeypatch) -> list[str]:
    """The names of the threads that destroy buffer handles, in order, from now on."""
    from torchtpu.runtime import buffer

    seen: list[str] = []
    real = buffer._destroy_handle
    monkeypatch.setattr(buffer, "_destroy_handle",
                        lambda plugin, h: (seen.append(threading.current_thread().name), real(plugin, h)))
    return seen


def test_buffers_freed_in_a_batch_are_destroyed_on_the_reaper(client, destroying_threads):
    """A captured step's replay replaces ~30 buffers; destroyed one by one on the launching
    thread they cost a TPU ~10 us each. Inside ``batched_destroys`` they stop counting at once
    and are destroyed together on the reaper thread as the block ends; outside, as before."""
    from torchtpu.runtime import batched_destroys, buffer, live_bytes

    seen = destroying_threads
    bufs = [client.buffer_from_host(np.ones(64, np.float32)) for _ in range(5)]
    before = live_bytes()[0]
    with batched_destroys():
        with batched_destroys():  # nested: the outer block owns the batch
            del bufs
        assert seen == [] and live_bytes()[0] == before - 5 * 256
    buffer.drain_reaper()
    assert seen == ["torchtpu-buffer-reaper"] * 5
    one = client.buffer_from_host(np.ones(4, np.float32))
    del one
    assert seen[-1] == threading.current_thread().name


def test_a_batch_takes_only_its_own_threads_buffers(client, destroying_threads):
    """A buffer another thread frees while a batch is open is destroyed there and then: a batch
    handed to the reaper never gains handles afterwards."""
    from torchtpu.runtime import batched_destroys

    seen = destroying_threads
    other = [client.buffer_from_host(np.ones(4, np.float32))]
    with batched_destroys():
        t = threading.Thread(target=other.clear, name="elsewhere")
        t.start()
        t.join()
        assert seen == ["elsewhere"]
