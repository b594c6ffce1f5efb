"""Save the OpInfo samples on which tpu and CPU disagree, to study them off the TPU host.

    python3 tools/tpu_suite/dump_mismatches.py OUT_DIR OP:DTYPE[:kind] ...   # kind: forward (default) or backward

For each mismatching sample, ``OUT_DIR/<op>.<dtype>.<kind>.<i>.pt`` holds the sample (input, args,
kwargs) and both results; a summary line per (op, dtype) goes to stdout. The comparison is the
conformance sweep's own (``torchtpu.conformance.core.compare``, same tolerances). A TPU round
runs this on the few ops its sweep left unexplained, with ``LIBTPU_INIT_ARGS=--xla_dump_to=...``
where the compiler's own view of the programs is wanted too.
"""

from __future__ import annotations

import os
import sys
import traceback

import torch

import torchtpu  # noqa: F401  (registers the device)
from torchtpu.conformance import core


def _run(op: object, sample: object, device_copy: bool, cots_from: object = None) -> object:
    """The op's output; with ``cots_from`` (the sweep's cotangent generator, or the cotangents the
    CPU run drew from it) its gradients and the cotangents they were taken for, as the sweep's
    backward check draws them: sample after sample from one generator per (op, dtype)."""
    if device_copy:
        x, args, kwargs = core._sample_to_tpu(sample, grad=cots_from is not None, key=core.op_key(op))
    else:
        x, args, kwargs = sample.input, sample.args, sample.kwargs
    fn = core._variant(op)
    if cots_from is None:
        return fn(x, *args, **kwargs)
    leaves = core._grad_leaves([x, args, kwargs])
    if not leaves:
        raise ValueError("no differentiable input")  # the sweep skips such samples without drawing
    outs = core._float_outputs(sample.output_process_fn_grad(op.gradcheck_wrapper(fn, x, *args, **kwargs)))
    cots = core.cotangents(outs, cots_from) if isinstance(cots_from, torch.Generator) else cots_from
    grads = torch.autograd.grad(outs, leaves, [c.to(o.device) for c, o in zip(cots, outs)], allow_unused=True,
                                materialize_grads=True)
    return list(grads), cots


def dump(out_dir: str, key: str, dtype: torch.dtype, kind: str) -> None:
    op = core.opinfo_by_key()[key]
    backward = kind == "backward"
    samples = core._samples(op, dtype, backward, core.SAMPLES_PER_OP)
    tol = core.BACKWARD_TOL if backward else core.FORWARD_TOL
    bad = 0
    gen = core.cotangent_generator() if backward else None
    for i, sample in enumerate(samples):
        try:
            want = _run(op, sample, False, gen)
        except Exception:  # noqa: BLE001, S112  (a sample CPU rejects)
            continue
        cots = None
        if backward:
            want, cots = want
        try:
            got = _run(op, sample, True, cots)
            if backward:
                got = got[0]
            try:
                core.compare(got, want, tol)
                status = "ok"
            except core.Mismatch:
                # the sweep's float64 rule: a float value nearer float64 than CPU's is not a mismatch
                if backward:
                    note = core.gradients_nearer_float64_than_cpu(op, sample, dtype, cots, got, want)
                else:
                    note = core.nearer_float64_than_cpu(core._variant(op), sample, dtype, got, want)
                if note is None:
                    raise
                status = "ok: " + note
        except Exception as e:  # noqa: BLE001
            status = core.first_line(e)
            bad += 1
            path = os.path.join(out_dir, f"{key}.{core.dtype_name(dtype)}.{kind}.{i}.pt")
            got_cpu = None
            try:
                got_cpu = [t.detach().cpu() if isinstance(t, torch.Tensor) else t for t in core._leaves(got)]
            except Exception:  # noqa: BLE001
                traceback.print_exc()
            torch.save({"input": sample.input, "args": sample.args, "kwargs": sample.kwargs,
                        "cpu": [t.detach() if isinstance(t, torch.Tensor) else t for t in core._leaves(want)],
                        "tpu": got_cpu, "status": status}, path)
        print(f"{key} {core.dtype_name(dtype)} {kind} sample {i} {core.describe(sample.input)} "
              f"{core.describe(tuple(sample.args))} {core.describe(sample.kwargs)}: {status}", flush=True)
    print(f"== {key} {core.dtype_name(dtype)} {kind}: {bad} of {len(samples)} samples differ", flush=True)


def main(argv: list[str]) -> None:
    out_dir = argv[0]
    os.makedirs(out_dir, exist_ok=True)
    for spec in argv[1:]:
        key, dtype_s, *kind = spec.split(":")
        with torch.tpu.precision("highest"):  # as the sweep runs
            dump(out_dir, key, getattr(torch, dtype_s), kind[0] if kind else "forward")


if __name__ == "__main__":
    main(sys.argv[1:])
