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
