"""Model checks: whole models train on ``tpu`` and must match CPU step by step.

``check_model(name)`` builds a model from :mod:`.model_zoo`, copies it to
``tpu``, and for each training step compares the model output, the loss, the
gradient of every parameter and, at the end, every buffer (batch-norm running
statistics) and an eval-mode forward.  ``check_generate(name)`` compares greedy
``generate()``.  Failures raise :class:`ModelMismatch` naming the stage
(forward or backward) so the report can say where a model breaks.
"""

from __future__ import annotations

import copy
import traceback
from dataclasses import asdict, dataclass
from typing import Any

import torch

from . import model_zoo

FORWARD_TOL = (1e-4, 1e-4)  # at precision "highest": f32-accurate products
GRAD_TOL = (1e-3, 1e-4)


class ModelMismatch(AssertionError):
    def __init__(self, stage: str, message: str) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage = stage


@dataclass
class ModelResult:
    model: str
    kind: str  # forward | backward | generate | compiled
    status: str  # pass | fail | unsupported
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_names() -> list[str]:
    return [*model_zoo.HF_MODELS, *model_zoo.PLAIN_MODELS]


def _builder(name: str):
    return model_zoo.HF_MODELS.get(name) or model_zoo.PLAIN_MODELS[name]


def _to(value: Any, device: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _primary(out: Any) -> torch.Tensor:
    """The tensor to compare from a model output: logits for Hugging Face models."""
    if isinstance(out, torch.Tensor):
        return out
    for attr in ("logits", "logits_per_image"):
        value = getattr(out, attr, None)
        if value is not None:
            return value
    raise TypeError(f"no logits in {type(out).__name__}")


def disable_dropout(model: torch.nn.Module) -> None:
    """Zero every dropout, module or functional (float attributes such as ``attention_dropout``),
    so train mode is deterministic and CPU and tpu see the same computation."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for attr, value in vars(module).items():
            if "drop" in attr and isinstance(value, float):
                setattr(module, attr, 0.0)


def _close(stage: str, what: str, got: torch.Tensor, want: torch.Tensor, tol: tuple[float, float]) -> None:
    if got.device.type != "tpu":
        raise ModelMismatch(stage, f"{what} is on {got.device}, not tpu")
    try:
        torch.testing.assert_close(got.cpu(), want, rtol=tol[0], atol=tol[1])
    except AssertionError as e:
        raise ModelMismatch(stage, f"{what}: {e}") from None


def _stage(stage: str, fn, *args: Any) -> Any:
    """Run one stage; an exception from an op is reported as a mismatch of that stage."""
    try:
        return fn(*args)
    except ModelMismatch:
        raise
    except Exception as e:
        raise ModelMismatch(stage, f"{type(e).__name__}: {e}") from e


def check_model(name: str, steps: int = 2, compile_kwargs: dict | None = None) -> None:
    """Train ``steps`` SGD steps on CPU and on tpu; raise ModelMismatch at the first difference.

    ``compile_kwargs``: run the tpu model through ``torch.compile(backend="tpu", **kwargs)``.
    """
    torch.manual_seed(0)
    cpu_model, (args, kwargs), loss_fn = _builder(name)()
    cpu_model.train()
    disable_dropout(cpu_model)
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    run_model = tpu_model
    if compile_kwargs is not None:
        run_model = torch.compile(tpu_model, backend="tpu", **compile_kwargs)
    tpu_args, tpu_kwargs = _to(args, "tpu"), _to(kwargs, "tpu")
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.05, momentum=0.9)
    tpu_opt = torch.optim.SGD(tpu_model.parameters(), lr=0.05, momentum=0.9)
    with torch.tpu.precision("highest"):
        for _ in range(steps):
            cpu_out = cpu_model(*args, **kwargs)
            cpu_loss = loss_fn(cpu_out)
            tpu_out = _stage("forward", lambda: run_model(*tpu_args, **tpu_kwargs))
            tpu_loss = _stage("forward", loss_fn, tpu_out)
            _close("forward", "output", _primary(tpu_out), _primary(cpu_out), FORWARD_TOL)
            _close("forward", "loss", tpu_loss, cpu_loss, (FORWARD_TOL[0], 1e-5))
            cpu_loss.backward()
            _stage("backward", tpu_loss.backward)
            _compare_grads(tpu_model, cpu_model)
            cpu_opt.step()
            _stage("backward", tpu_opt.step)
            cpu_opt.zero_grad()
            tpu_opt.zero_grad()
        for (bname, buf), ref in zip(tpu_model.named_buffers(), cpu_model.buffers()):
            _close("forward", f"buffer {bname}", buf, ref, (FORWARD_TOL[0], 1e-5))
        cpu_model.eval()
        tpu_model.eval()
        with torch.no_grad():
            want = _primary(cpu_model(*args, **kwargs))
            got = _stage("forward", lambda: _primary(run_model(*tpu_args, **tpu_kwargs)))
            _close("forward", "eval output after training", got, want, FORWARD_TOL)


def _compare_grads(tpu_model: torch.nn.Module, cpu_model: torch.nn.Module) -> None:
    cpu_params = dict(cpu_model.named_parameters())
    checked = 0
    for pname, p in tpu_model.named_parameters():
        ref = cpu_params[pname].grad
        if ref is None:
            if p.grad is not None:
                raise ModelMismatch("backward", f"{pname} has a gradient on tpu but none on CPU")
            continue
        if p.grad is None:
            raise ModelMismatch("backward", f"{pname} has no gradient on tpu")
        _close("backward", f"grad of {pname}", p.grad, ref, GRAD_TOL)
        checked += 1
    if checked == 0:
        raise ModelMismatch("backward", "no parameter received a gradient")


def check_compiled(name: str) -> None:
    """The same training steps through ``torch.compile(backend="tpu")``."""
    check_model(name, compile_kwargs={})


def check_generate(name: str, new_tokens: int = 8) -> None:
    """Greedy ``generate()`` of a decoder-only model gives the same tokens as on CPU."""
    torch.manual_seed(0)
    cpu_model, (_, batch), _ = model_zoo.HF_MODELS[name]()
    cpu_model.eval()
    tpu_model = copy.deepcopy(cpu_model).to("tpu")
    prompt = batch["input_ids"][:1, :5]
    kwargs = {"max_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}
    with torch.tpu.precision("highest"):
        expected = cpu_model.generate(prompt, **kwargs)
        got = _stage("generate", lambda: tpu_model.generate(prompt.to("tpu"), **kwargs))
    if got.device.type != "tpu" or not torch.equal(got.cpu(), expected):
        raise ModelMismatch("generate", f"tokens {got.cpu().tolist()} != CPU {expected.tolist()}")


def run_all(names: list[str] | None = None) -> list[dict[str, Any]]:
    """Every model check as report rows (forward/backward per model, generate, and the
    same training steps under torch.compile)."""
    rows: list[dict[str, Any]] = []
    try:
        import transformers
    except ImportError:
        transformers = None
    for name in names or model_names():
        if name in model_zoo.HF_MODELS and transformers is None:
            rows += [ModelResult(name, k, "unsupported", "transformers is not installed").as_dict()
                     for k in ("forward", "backward")]
            continue
        rows += _rows(name, check_model, ("forward", "backward"))
        if name in model_zoo.GENERATE_MODELS and transformers is not None:
            rows += _rows(name, check_generate, ("generate",))
        rows += _rows(name, check_compiled, ("compiled",))
    return rows


def _rows(name: str, check, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    try:
        check(name)
    except ModelMismatch as e:
        failed = kinds.index(e.stage) if e.stage in kinds else 0
        first = str(e).splitlines()[0][:300]
        return [ModelResult(name, k, "pass" if i < failed else "fail", first if i == failed else
                            f"not reached ({kinds[failed]} failed)").as_dict() for i, k in enumerate(kinds)]
    except Exception as e:  # noqa: BLE001  (a broken builder still gets a row)
        line = traceback.format_exception_only(e)[-1].strip()[:300]
        return [ModelResult(name, k, "fail", line).as_dict() for k in kinds]
    return [ModelResult(name, k, "pass").as_dict() for k in kinds]
