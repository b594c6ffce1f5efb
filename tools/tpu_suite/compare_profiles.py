"""Sort two device profiles' op times into kinds of work, side by side (off the chip).

    python3 tools/tpu_suite/compare_profiles.py DIR/program_00 [DIR/program_02 ...] --vs DIR/jax_step

Each NAME stands for ``NAME.ops.tsv`` (``probe_device_profile.py``'s table of every op: us per run,
events per run, the op's event name, which begins with its HLO instruction) and ``NAME.opt.hlo``
(the compiler's optimized module). Several names on one side are summed (a torch step of several
programs). Each top-level instruction is given one kind from its opcode and, for a fusion, from
what its fused computation holds:

- ``matmul``: a fusion holding a ``convolution`` or ``dot`` (the matrix unit's work, and what XLA
  fused into it);
- ``kernel``: a ``custom-call`` to a Mosaic kernel (``tpu_custom_call``);
- ``copy``: ``copy`` / ``transpose`` (relayouts) and the copy-start/done pairs of prefetches;
- ``broadcast``: a materialized ``broadcast``;
- ``reduce``: a fusion holding a ``reduce`` (and no product);
- ``movement``: slices, dynamic slices and updates, concatenations, gathers, scatters, pads, reshapes;
- ``elementwise``: any other fusion, ``convert``s and lone arithmetic;
- ``other``: the rest (scalar bookkeeping, collectives, ...).

The table says, per kind, the milliseconds and op count of each side and the difference: where one
side pays what the other does not. ``--sources N`` adds each side's N costliest sources, (kind, the
instruction's ``op_name``): for torchtpu the PyTorch op and module it lowers (``blocks.*.attn/aten.mm``,
layer numbers folded; lowering/builder.py's ``Builder.located``), for JAX its traced function path.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from collections.abc import Iterator

MATMUL_OPS = {"convolution", "dot"}
COPY_OPS = {"copy", "transpose", "copy-start", "copy-done"}
MOVEMENT_OPS = {"slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "gather", "scatter", "pad",
                "reshape", "slice-start", "slice-done", "reverse"}
ELEMENTWISE_OPS = {"convert", "add", "multiply", "subtract", "divide", "select", "compare", "exponential",
                   "maximum", "minimum", "negate", "rsqrt", "sqrt", "tanh", "log", "and", "or", "not"}
KINDS = ("matmul", "kernel", "copy", "broadcast", "reduce", "movement", "elementwise", "other")

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?(%?[\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\((.*)$")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?(%?[\w.\-]+)\s*[({]")


_OP_NAME = re.compile(r'op_name="([^"]*)"')


def op_names(text: str) -> dict[str, str]:
    """Each instruction's ``op_name`` metadata (where its module has it)."""
    names: dict[str, str] = {}
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        n = _OP_NAME.search(line) if m else None
        if n:
            names[m.group(1).lstrip("%")] = n.group(1)
    return names


def source_of(op_name: str) -> str:
    """An op_name made comparable across layers: numbered modules folded (``blocks.3.attn`` ->
    ``blocks.*.attn``), a default overload dropped, a long traced path cut to its last 3 parts."""
    name = re.sub(r"\.\d+(?=[./;]|$)", ".*", op_name.split(";")[0]).replace(".default", "")
    parts = name.split("/")
    return "/".join(parts[-3:]) if len(parts) > 3 else name


def parse_hlo(text: str) -> tuple[dict[str, tuple[str, str]], dict[str, set[str]]]:
    """(every instruction's (opcode, called computation), every computation's opcodes)."""
    instructions: dict[str, tuple[str, str]] = {}
    computations: dict[str, set[str]] = collections.defaultdict(set)
    current = ""
    for line in text.splitlines():
        if not line.startswith(" ") and line.rstrip().endswith("{"):
            m = _COMPUTATION.match(line)
            current = m.group(1).lstrip("%") if m else ""
            continue
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        name, opcode, rest = m.group(1).lstrip("%"), m.group(2), m.group(3)
        called = re.search(r"calls=%?([\w.\-]+)", rest)
        instructions[name] = (opcode, called.group(1) if called else "")
        computations[current].add(opcode)
        if called:  # a nested fusion: its computation's opcodes count as this one's (_holds)
            computations[current].add("calls=" + called.group(1))
        if opcode == "custom-call" and "tpu_custom_call" in rest:
            computations[current].add("tpu_custom_call")
            instructions[name] = ("tpu_custom_call", "")
    return instructions, computations


def _holds(comp: str, computations: dict[str, set[str]], seen: set[str] | None = None) -> set[str]:
    """The opcodes of a computation and of the fusions it calls."""
    seen = seen if seen is not None else set()
    if comp in seen:
        return set()
    seen.add(comp)
    ops = set()
    for op in computations.get(comp, ()):
        if op.startswith("calls="):
            ops |= _holds(op[len("calls="):], computations, seen)
        else:
            ops.add(op)
    return ops


def kind_of(name: str, instructions: dict[str, tuple[str, str]], computations: dict[str, set[str]]) -> str:
    opcode, called = instructions.get(name, ("", ""))
    if opcode == "tpu_custom_call":
        return "kernel"
    if opcode in COPY_OPS:
        return "copy"
    if opcode == "broadcast":
        return "broadcast"
    if opcode in ("fusion", "call") and called:
        held = _holds(called, computations)
        if held & MATMUL_OPS:
            return "matmul"
        if "tpu_custom_call" in held:
            return "kernel"
        if "reduce" in held:
            return "reduce"
        return "elementwise"
    if opcode in MATMUL_OPS:
        return "matmul"
    if opcode in ("reduce", "reduce-window"):
        return "reduce"
    if opcode in MOVEMENT_OPS:
        return "movement"
    if opcode in ELEMENTWISE_OPS:
        return "elementwise"
    return "other"


def _timed_ops(names: list[str]) -> Iterator[tuple[str, str, float, float]]:
    """Every profiled op of the named profiles: (kind, source, microseconds per run, events per run)."""
    for stem in names:
        with open(stem + ".opt.hlo") as f:
            text = f.read()
        instructions, computations = parse_hlo(text)
        named = op_names(text)
        with open(stem + ".ops.tsv") as f:
            for line in f:
                us, count, op = line.rstrip("\n").split("\t", 2)
                name = op.split(" = ")[0].strip().lstrip("%")
                source = source_of(named.get(name, "")) or "(unnamed)"
                yield kind_of(name, instructions, computations), source, float(us), float(count)


def side(names: list[str]) -> dict[str, list[float]]:
    """Per kind: [microseconds per run, events per run], summed over the named profiles."""
    totals: dict[str, list[float]] = {k: [0.0, 0.0] for k in KINDS}
    for kind, _, us, count in _timed_ops(names):
        totals[kind][0] += us
        totals[kind][1] += count
    return totals


def sources(names: list[str]) -> dict[tuple[str, str], list[float]]:
    """Per (kind, source): [microseconds per run, events per run], summed over the named profiles."""
    totals: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for kind, source, us, count in _timed_ops(names):
        totals[(kind, source)][0] += us
        totals[(kind, source)][1] += count
    return dict(totals)


def source_table(found: dict[tuple[str, str], list[float]], label: str, top: int) -> str:
    rows = [f"{label}: the {top} costliest sources", f"{'ms':>9}{'ops':>6}  {'kind':<12}source"]
    for (kind, source), (us, count) in sorted(found.items(), key=lambda kv: -kv[1][0])[:top]:
        rows.append(f"{us / 1e3:>9.3f}{count:>6.0f}  {kind:<12}{source}")
    return "\n".join(rows)


def table(ours: dict[str, list[float]], theirs: dict[str, list[float]], labels: tuple[str, str]) -> str:
    rows = [f"{'kind':<12}{labels[0] + ' ms':>14}{'ops':>7}{labels[1] + ' ms':>14}{'ops':>7}{'difference ms':>15}"]
    for k in KINDS:
        a, b = ours[k], theirs[k]
        rows.append(f"{k:<12}{a[0] / 1e3:>14.3f}{a[1]:>7.0f}{b[0] / 1e3:>14.3f}{b[1]:>7.0f}{(a[0] - b[0]) / 1e3:>15.3f}")
    ta, tb = sum(v[0] for v in ours.values()), sum(v[0] for v in theirs.values())
    rows.append(f"{'all':<12}{ta / 1e3:>14.3f}{'':>7}{tb / 1e3:>14.3f}{'':>7}{(ta - tb) / 1e3:>15.3f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ours", nargs="+", help="profile stems of one side (NAME.ops.tsv and NAME.opt.hlo)")
    ap.add_argument("--vs", nargs="+", required=True, help="profile stems of the other side")
    ap.add_argument("--labels", default="torchtpu,JAX")
    ap.add_argument("--sources", type=int, default=0, metavar="N", help="each side's N costliest sources too")
    a = ap.parse_args(argv)
    labels = tuple(a.labels.split(",", 1))
    print(table(side(a.ours), side(a.vs), (labels[0], labels[1])))
    if a.sources:
        for stems, label in ((a.ours, labels[0]), (a.vs, labels[1])):
            print()
            print(source_table(sources(stems), label, a.sources))
    return 0


if __name__ == "__main__":
    sys.exit(main())
