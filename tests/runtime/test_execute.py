from __future__ import annotations

import threading

import numpy as np
import pytest

from torchtpu.runtime import Buffer, Event, PjrtError
from torchtpu.runtime.compile_options import compile_options

ADD_F32 = """module @m {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> (tensor<4xf32>) {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}"""
X = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
Y = np.array([10.0, 20.0, 30.0, 40.0], np.float32)

# HIGHEST: float32-accurate on every plugin (a TPU's default is one bf16 pass).
DOT_2048 = """module @dot {
  func.func public @main(%a: tensor<2048x2048xf32>, %b: tensor<2048x2048xf32>) -> tensor<2048x2048xf32> {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] : (tensor<2048x2048xf32>, tensor<2048x2048xf32>) -> tensor<2048x2048xf32>
    return %0 : tensor<2048x2048xf32>
  }
}"""

# tf.aliasing_output lets PJRT reuse (donate) %a's buffer for result 0.
DONATING_ADD = ADD_F32.replace("%a: tensor<4xf32>", "%a: tensor<4xf32> {tf.aliasing_output = 0 : i32}")

TWO_OUTPUTS = """module @two {
  func.func public @main(%a: tensor<2x3xbf16>, %b: tensor<i64>) -> (tensor<2x3xf32>, tensor<i64>, tensor<2x3xi1>) {
    %0 = stablehlo.convert %a : (tensor<2x3xbf16>) -> tensor<2x3xf32>
    %1 = stablehlo.add %b, %b : tensor<i64>
    %2 = stablehlo.compare GT, %0, %0 : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xi1>
    return %0, %1, %2 : tensor<2x3xf32>, tensor<i64>, tensor<2x3xi1>
  }
}"""


def test_add(client, add_exe, run):
    (out,) = run(client, add_exe, X, Y)
    np.testing.assert_array_equal(out, X + Y)
    assert add_exe.num_outputs == 1
    assert add_exe.output_shapes == [(4,)]
    assert add_exe.output_dtypes == [np.dtype(np.float32)]


def test_outputs_feed_next_launch(client, add_exe):
    a, b = client.buffer_from_host(X), client.buffer_from_host(Y)
    (c,), _ = add_exe.execute([a, b])  # no wait: outputs are futures
    (d,), ev = add_exe.execute([c, c])
    ev.wait()
    np.testing.assert_array_equal(d.to_host(), 2 * (X + Y))


def test_multiple_outputs_and_dtypes(client, run):
    import ml_dtypes

    exe = client.compile(TWO_OUTPUTS)
    assert exe.num_outputs == 3
    assert exe.output_shapes == [(2, 3), (), (2, 3)]
    a = np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16)
    f, i, p = run(client, exe, a, np.array(21, np.int64))
    np.testing.assert_array_equal(f, a.astype(np.float32))
    assert i.shape == () and i == 42 and i.dtype == np.int64
    assert p.dtype == np.bool_ and not p.any()


def test_async_large_dot(client):
    exe = client.compile(DOT_2048)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2048, 2048), dtype=np.float32)
    b = rng.standard_normal((2048, 2048), dtype=np.float32)
    ba, bb = client.buffer_from_host(a), client.buffer_from_host(b)
    (out,), event = exe.execute([ba, bb])
    assert isinstance(event, Event)
    event.wait()
    assert event.is_ready()
    assert event.error() is None
    ref = a[:64].astype(np.float64) @ b.astype(np.float64)
    got = out.to_host()[:64]
    np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-2)


def test_on_ready_callback(client, add_exe):
    a, b = client.buffer_from_host(X), client.buffer_from_host(Y)
    (out,), event = add_exe.execute([a, b])
    fired = threading.Event()
    seen = []

    def callback(error):
        seen.append(error)
        fired.set()

    event.on_ready(callback)
    assert fired.wait(10)
    assert seen == [None]
    np.testing.assert_array_equal(out.to_host(), X + Y)


def test_without_event(client, add_exe):
    a, b = client.buffer_from_host(X), client.buffer_from_host(Y)
    (out,), event = add_exe.execute([a, b], with_event=False)
    assert event is None
    out.ready_event().wait()
    np.testing.assert_array_equal(out.to_host(), X + Y)
    (out,), event = add_exe.execute([a, b])  # back to the default
    event.wait()


def test_execute_on_device_1(client, add_exe, other_device):
    a, b = client.buffer_from_host(X, other_device), client.buffer_from_host(Y, other_device)
    (out,), event = add_exe.execute([a, b], device_index=other_device)
    event.wait()
    assert out.device_index == other_device  # asked from PJRT, not our bookkeeping
    np.testing.assert_array_equal(out.to_host(), X + Y)
    (out0,), _ = add_exe.execute([client.buffer_from_host(X), client.buffer_from_host(Y)], 0)
    assert out0.device_index == 0


def test_inputs_on_wrong_device(client, add_exe, other_device):
    a, b = client.buffer_from_host(X, 0), client.buffer_from_host(Y, 0)
    with pytest.raises(PjrtError, match="device"):
        add_exe.execute([a, b], device_index=other_device)


def test_fixed_device_assignment(client, run, other_device):
    device_id = client.devices[other_device].id
    exe = client.compile(ADD_F32, options=compile_options(portable=False, device_ids=[[device_id]]))
    (out,) = run(client, exe, X, Y, device=other_device)
    np.testing.assert_array_equal(out, X + Y)
    with pytest.raises(PjrtError):
        run(client, exe, X, Y, device=0)


def test_donation(client):
    exe = client.compile(DONATING_ADD)
    # Default: nothing is donated, inputs stay valid.
    a, b = client.buffer_from_host(X), client.buffer_from_host(Y)
    (out,), ev = exe.execute([a, b])
    ev.wait()
    assert not a.is_deleted and not b.is_deleted
    np.testing.assert_array_equal(out.to_host(), X + Y)
    np.testing.assert_array_equal(a.to_host(), X)
    # Donating position 0: PJRT reuses a's memory and marks it deleted.
    (out,), ev = exe.execute([a, b], donate=[0])
    ev.wait()
    assert a.is_deleted and not b.is_deleted
    np.testing.assert_array_equal(out.to_host(), X + Y)
    with pytest.raises(PjrtError, match="deleted or donated"):
        exe.execute([a, b])
    # Donating an argument the module does not alias is a no-op.
    c = client.buffer_from_host(X)
    (out,), ev = exe.execute([c, b], donate=[1])
    ev.wait()
    assert not b.is_deleted and not c.is_deleted


def test_wrong_arity_raises(client, add_exe):
    a = client.buffer_from_host(X)
    # (the CPU plugin: "expected 2 buffers"; libtpu: "... but compiled program expected 2")
    with pytest.raises(PjrtError, match="expected 2") as info:
        add_exe.execute([a])
    assert info.value.code == 3  # INVALID_ARGUMENT
    with pytest.raises(PjrtError):
        add_exe.execute([a, a, a])


@pytest.mark.emulator_only("the CPU plugin checks argument byte sizes; libtpu 0.0.42.1 does not (measured on a "
                           "v5e): the engine keys every program by its arguments' shapes and dtypes")
def test_argument_size_mismatch_raises(client, add_exe):
    # PJRT's CPU plugin checks byte sizes (memory safety), not dtypes: a same-size
    # reinterpretation (i32[4] for f32[4]) would run, so callers must match.
    small = client.buffer_from_host(np.arange(2, dtype=np.float32))
    with pytest.raises(PjrtError, match="size"):
        add_exe.execute([small, small])
    wide = client.buffer_from_host(np.arange(4, dtype=np.float64))
    with pytest.raises(PjrtError, match="size"):
        add_exe.execute([wide, wide])


def test_on_ready_callback_exception_is_contained(client, add_exe, caplog):
    a, b = client.buffer_from_host(X), client.buffer_from_host(Y)
    _, event = add_exe.execute([a, b])
    event.wait()
    done = threading.Event()

    def bad_callback(error):
        done.set()
        raise RuntimeError("boom")

    event.on_ready(bad_callback)  # ready already: runs here, error is logged
    assert done.wait(10)
    assert any("on_ready callback" in r.getMessage() for r in caplog.records)
    (out,), event = add_exe.execute([a, b])
    event.wait()
    np.testing.assert_array_equal(out.to_host(), X + Y)


def test_deleted_argument(client, add_exe):
    a, b = client.buffer_from_host(X), client.buffer_from_host(Y)
    b.delete()
    with pytest.raises(PjrtError, match="deleted"):
        add_exe.execute([a, b])


@pytest.mark.emulator_only("a second client or process on the plugin; one process holds a TPU chip, with one client")
def test_foreign_argument(client, add_exe, plugin):
    a = client.buffer_from_host(X)
    other = type(client)(plugin, {"cpu_device_count": 1})
    c = other.buffer_from_host(Y)
    with pytest.raises(PjrtError, match="another client"):
        add_exe.execute([a, c])


def test_malformed_module(client):
    with pytest.raises(PjrtError) as info:
        client.compile("module @m { func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {")
    assert "error" in info.value.message
    assert info.value.code != 0
    with pytest.raises(PjrtError, match="stablehlo.no_such_op|no_such_op"):
        client.compile(ADD_F32.replace("stablehlo.add", "stablehlo.no_such_op"))


def test_empty_options_refused(client):
    with pytest.raises(ValueError):
        client.compile(ADD_F32, options=b"")


def test_fingerprint_and_name(add_exe):
    fp = add_exe.fingerprint()
    assert fp is None or (isinstance(fp, str) and fp)
    assert add_exe.name == "m"


def test_many_launches_free_memory(client, add_exe):
    a, b = client.buffer_from_host(X), client.buffer_from_host(Y)
    for _ in range(2000):
        outs, ev = add_exe.execute([a, b])
    ev.wait()
    assert isinstance(outs[0], Buffer)


def test_threads_share_an_executable(client, add_exe):
    a, b = client.buffer_from_host(X), client.buffer_from_host(Y)
    errors = []

    def worker():
        try:
            for _ in range(300):
                (out,), ev = add_exe.execute([a, b])
                ev.wait()
                np.testing.assert_array_equal(out.to_host(), X + Y)
        except (AssertionError, PjrtError) as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_closed_executable(client):
    exe = client.compile(ADD_F32)
    exe.close()
    exe.close()
    with pytest.raises(PjrtError, match="closed"):
        exe.execute([client.buffer_from_host(X), client.buffer_from_host(Y)])


def test_donated_handles_are_destroyed_later(client):
    """Destroying a donated PJRT buffer waits for the execution that consumed it, so a
    dead donated Buffer's handle is queued and destroyed at release_donated()."""
    from torchtpu.runtime import buffer as buffer_mod
    from torchtpu.runtime import release_donated

    release_donated()
    exe = client.compile(DONATING_ADD)
    a, b = client.buffer_from_host(X), client.buffer_from_host(Y)
    (out,), ev = exe.execute([a, b], donate=[0])
    del a  # donated: queued, not destroyed
    assert len(buffer_mod._DONATED_HANDLES) == 1
    del b  # not donated: destroyed at once
    assert len(buffer_mod._DONATED_HANDLES) == 1
    ev.wait()
    release_donated()
    assert buffer_mod._DONATED_HANDLES == []
    np.testing.assert_array_equal(out.to_host(), X + Y)


def test_donated_handles_are_destroyed_off_the_calling_thread(client, monkeypatch):
    """A training step donates ~100 buffers: their destroys run on the reaper thread, not on the
    thread that launches the next step; release_donated(wait=True) returns once they are done."""
    import threading

    from torchtpu.runtime import buffer as buffer_mod

    buffer_mod.release_donated(wait=True)
    destroyed_on = []
    real = buffer_mod._destroy_handle
    monkeypatch.setattr(buffer_mod, "_destroy_handle",
                        lambda plugin, h: (destroyed_on.append((threading.current_thread().name, h)), real(plugin, h)))
    exe = client.compile(DONATING_ADD)
    for _ in range(3):
        a, b = client.buffer_from_host(X), client.buffer_from_host(Y)
        (out,), ev = exe.execute([a, b], donate=[0])
        del a
    ev.wait()
    donated = [h for _, h in buffer_mod._DONATED_HANDLES]
    assert len(donated) == 3
    before = len(destroyed_on)  # (earlier destroys: the operands not donated; addresses get reused)
    buffer_mod.release_donated(wait=True)
    assert buffer_mod._DONATED_HANDLES == []
    assert destroyed_on[before:] == [("torchtpu-buffer-reaper", h) for h in donated]
    np.testing.assert_array_equal(out.to_host(), X + Y)


DOT_RHS = """module @dot_rhs {
  func.func public @main(%g: tensor<256x256xf32>, %w: tensor<256x128xf32>) -> tensor<256x128xf32> {
    %0 = stablehlo.dot_general %g, %w, contracting_dims = [1] x [0], precision = [HIGHEST, HIGHEST] : (tensor<256x256xf32>, tensor<256x128xf32>) -> tensor<256x128xf32>
    return %0 : tensor<256x128xf32>
  }
}"""
# w + 1 written over w's own memory (its buffer donated), as an in-place op or an optimizer step does
ADD_ONE_IN_PLACE = """module @add_one {
  func.func public @main(%w: tensor<256x128xf32> {tf.aliasing_output = 0 : i32}) -> tensor<256x128xf32> {
    %one = stablehlo.constant dense<1.0> : tensor<256x128xf32>
    %0 = stablehlo.add %w, %one : tensor<256x128xf32>
    return %0 : tensor<256x128xf32>
  }
}"""


def test_a_product_sees_its_operand_updated_in_place(client):
    """Regression: on the CPU plugin XNNPACK kept a float32 dot's right-hand operand packed,
    keyed by its address; updated in place (same memory), the next product used the old values
    (a weight after an optimizer step). The CPU client compiles without XNNPACK."""
    rng = np.random.default_rng(0)
    g = rng.standard_normal((256, 256)).astype(np.float32)  # (XNNPACK took it from 256 rows, not 64)
    w = rng.standard_normal((256, 128)).astype(np.float32)
    dot, add_one = client.compile(DOT_RHS), client.compile(ADD_ONE_IN_PLACE)
    gb, wb = client.buffer_from_host(g), client.buffer_from_host(w)
    for step in range(3):
        (out,), ev = dot.execute([gb, wb])
        ev.wait()
        want = g.astype(np.float64) @ (w.astype(np.float64) + step)
        np.testing.assert_allclose(out.to_host(), want, rtol=1e-5, atol=1e-3)  # was 0.55 off at step 1
        (wb,), ev = add_one.execute([wb], donate=[0])
        ev.wait()
