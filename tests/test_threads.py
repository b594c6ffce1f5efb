"""tpu ops from several Python threads at once (a threaded conformance sweep; users' threads)."""

import threading

import torch


def test_threads_lowering_decomposed_ops_at_once_each_get_their_result():
    """Regression: ops without a hand-written lowering are lowered by tracing PyTorch's
    decomposition with make_fx, which keeps its state in module globals; two threads lowering such
    ops at once failed ("CURRENT_PATCHER is None in finally block") or traced each other's ops."""
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def work(t: int) -> None:
        try:
            start.wait()
            for j in range(12):
                n = 3 + 17 * t + j  # a new shape each call: each call lowers anew
                x = torch.linspace(-2, 2, n).log_softmax(0)
                y = torch.linspace(0.1, 1, n).softmax(0)
                got = torch.nn.functional.kl_div(x.to("tpu"), y.to("tpu"), reduction="sum")
                torch.testing.assert_close(got.cpu(), torch.nn.functional.kl_div(x, y, reduction="sum"))
        except BaseException as e:  # noqa: BLE001  (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]


def _run_threads(work, n: int) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(t: int) -> None:
        try:
            work(t)
        except BaseException as e:  # noqa: BLE001  (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return errors


def test_synchronize_while_other_threads_update_tensors_in_place():
    """Regression: synchronize() waits on the output of the device's latest launch; another
    thread's in-place op could donate that very buffer between the wait's check and its ready
    event ("GetReadyFuture() called on deleted or donated buffer": six ops of an eight-thread
    conformance sweep on the TPU failed so)."""
    stop = threading.Event()

    def work(t: int) -> None:
        if t < 2:  # updaters
            x = torch.zeros(64, device="tpu")
            for _ in range(1500):
                x.add_(1)
            stop.set()
            assert x.cpu()[0].item() == 1500
        else:  # synchronizers, and events recorded on what the updaters launched
            while not stop.is_set():
                torch.tpu.synchronize()
                torch.tpu.Event().record()

    errors = _run_threads(work, 4)
    assert not errors, errors[0]


def test_an_index_error_is_raised_in_the_thread_whose_op_it_was():
    """Regression: the device-side index checks of every thread folded into one flag per device,
    so whichever thread synchronized first raised another thread's error (a threaded TPU sweep
    counted a scatter's error against scatter_add, and the scatter's own check saw no error)."""
    launched, main_synchronized = threading.Event(), threading.Event()
    seen: list[str] = []

    def work(t: int) -> None:
        x = torch.zeros(3, device="tpu")
        x.scatter_(0, torch.tensor([34], device="tpu"), torch.ones(1, device="tpu"))  # out of range
        launched.set()
        main_synchronized.wait(60)
        try:
            torch.tpu.synchronize()
        except RuntimeError as e:
            seen.append(str(e))

    th = threading.Thread(target=work, args=(0,))
    th.start()
    launched.wait(60)
    try:
        torch.tpu.synchronize()  # the other thread's error is not this thread's
        torch.ones(2, device="tpu").cpu()
    finally:
        main_synchronized.set()
        th.join()
    assert len(seen) == 1 and "index 34 is out of bounds" in seen[0], seen


def test_an_ended_threads_index_error_is_not_lost():
    """A thread that ended with an unread failed check leaves it to the next synchronization
    of any thread."""
    def work(t: int) -> None:
        x = torch.zeros(3, device="tpu")
        x.scatter_(0, torch.tensor([7], device="tpu"), torch.ones(1, device="tpu"))

    assert not _run_threads(work, 1)
    try:
        torch.tpu.synchronize()
    except RuntimeError as e:
        assert "index 7 is out of bounds" in str(e)
    else:
        raise AssertionError("the ended thread's index error was not raised")


def test_a_hook_inside_a_donating_launch_may_synchronize(monkeypatch):
    """Regression: with the lock that donating launches hold, a hook around ``execute`` that waits
    for the device on the launching thread (bench/step_profile.py's meter) deadlocked."""
    from torchtpu.runtime import executable

    real = executable.Executable.execute

    def waiting_execute(exe, *args, **kwargs):
        torch.tpu.synchronize()
        return real(exe, *args, **kwargs)

    x = torch.zeros(8, device="tpu")
    monkeypatch.setattr(executable.Executable, "execute", waiting_execute)
    done = threading.Event()

    def work(t: int) -> None:
        for _ in range(3):
            x.add_(1)  # donates x's buffer
        torch.tpu.synchronize()
        done.set()

    th = threading.Thread(target=work, args=(0,), daemon=True)
    th.start()
    assert done.wait(60), "a launch's own synchronize deadlocked"
    monkeypatch.undo()
    assert x.cpu()[0].item() == 3
