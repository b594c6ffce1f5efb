"""A small StableHLO text builder.

Everything is printed in MLIR's *generic* op syntax (``"stablehlo.add"(%a, %b)
: (...) -> ...``): it is the most stable textual form across StableHLO
versions, and the oldest plugin we support (xla-cpu-pjrt, StableHLO 1.13.3)
parses it. Values carry their shape and torch dtype so lowerings can reason
about types without asking MLIR.
"""

from __future__ import annotations

import contextlib
import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from . import target

# torch dtype -> StableHLO element type.
ELEMENT_TYPES: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "ui8",
    torch.uint16: "ui16",
    torch.uint32: "ui32",
    torch.uint64: "ui64",
    torch.bool: "i1",
    torch.complex64: "complex<f32>",
    torch.complex128: "complex<f64>",
    torch.float8_e4m3fn: "f8E4M3FN",
    torch.float8_e5m2: "f8E5M2",
    torch.float8_e4m3fnuz: "f8E4M3FNUZ",
    torch.float8_e5m2fnuz: "f8E5M2FNUZ",
}

_FLOAT_BITS = {torch.float32: ("<f", "<I", 8), torch.float64: ("<d", "<Q", 16), torch.float16: ("<e", "<H", 4)}


def tensor_type(shape: Sequence[int], dtype: torch.dtype) -> str:
    et = ELEMENT_TYPES.get(dtype)
    if et is None:
        raise NotImplementedError(f"dtype {dtype} is not supported on tpu")
    if not shape:
        return f"tensor<{et}>"
    return "tensor<" + "x".join(str(int(d)) for d in shape) + f"x{et}>"


def _i64_array(values: Sequence[int]) -> str:
    return "array<i64" + (": " + ", ".join(str(int(v)) for v in values) if len(values) else "") + ">"


def _float_literal(value: float, dtype: torch.dtype) -> str:
    """Bit-exact hex literal: sidesteps decimal round-trips, inf and nan."""
    if dtype == torch.bfloat16:
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        if math.isnan(value):
            return "0x7FC0"
        # round-to-nearest-even to bf16
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return f"0x{bits & 0xFFFF:04X}"
    if dtype.itemsize == 1:  # float8: torch's own rounding to the format, then its bits
        bits = int(torch.tensor(value, dtype=torch.float32).to(dtype).view(torch.uint8))
        return f"0x{bits:02X}"
    ffmt, ifmt, width = _FLOAT_BITS[dtype]
    if dtype == torch.float16:
        bits = int(np.array(value, dtype=np.float16).view(np.uint16))
    else:
        bits = struct.unpack(ifmt, struct.pack(ffmt, value))[0]
    return f"0x{bits:0{width}X}"


def literal(value: bool | float, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        return _float_literal(float(value), dtype)
    if dtype.is_complex:
        part = torch.float32 if dtype == torch.complex64 else torch.float64
        c = complex(value)
        return f"({_float_literal(c.real, part)}, {_float_literal(c.imag, part)})"
    # an integer out of the type's range wraps, as C's conversion does (clamp(uint8, min=-1) bounds at
    # 255 on CPU, which checks only what overflows: meta_checks._scalar_overflows); XLA refuses the
    # literal -1 for ui8, and a compiled graph passed it on (regression)
    bits = dtype.itemsize * 8
    wrapped = int(value) & ((1 << bits) - 1)
    if dtype.is_signed and wrapped >= 1 << (bits - 1):
        wrapped -= 1 << bits
    return str(wrapped)


# Rows each partial result of a column reduction covers on XLA's CPU backend (Builder._column_partials).
_COLUMN_WINDOW = 32


@dataclass(frozen=True, slots=True)
class Value:
    """An SSA value of the function being built."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def type(self) -> str:
        return tensor_type(self.shape, self.dtype)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


_DEFAULT_LAYOUT = 'mhlo.layout_mode = "default"'
_PRECISIONS = ("DEFAULT", "HIGH", "HIGHEST")
# Elementwise functions that take a result accuracy. A TPU's compiler otherwise picks fast
# approximations (measured on a v5e: log off by 1e-4, tanh by 4e-5, exp by 5e-6 relative);
# HIGHEST asks for its accurate forms, within a few ulp as on a CPU.
_ACCURACY_OPS = frozenset({
    "stablehlo.exponential", "stablehlo.exponential_minus_one", "stablehlo.log", "stablehlo.log_plus_one",
    "stablehlo.logistic", "stablehlo.tanh", "stablehlo.sine", "stablehlo.cosine", "stablehlo.tan",
    "stablehlo.sqrt", "stablehlo.rsqrt", "stablehlo.cbrt"})
_ACCURACY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_UNSIGNED = (torch.uint8, torch.uint16, torch.uint32, torch.uint64)
_HIGHEST_ACCURACY = ("result_accuracy = #stablehlo.result_accuracy<atol = 0.000000e+00, rtol = 0.000000e+00, "
                     "ulps = 0, mode = #stablehlo.result_accuracy_mode<HIGHEST>>")


def _location_literal(name: str) -> str:
    """`` loc("name")``, the name an MLIR string (quotes and backslashes escaped, non-ASCII and
    control characters dropped), or nothing for an empty name."""
    clean = "".join(c for c in name if " " <= c <= "~").replace("\\", "\\\\").replace('"', '\\"')
    return f' loc("{clean}")' if clean else ""


def precision_config(precision: str) -> str:
    """The precision_config attribute of a dot_general or convolution, both operands alike."""
    if precision not in _PRECISIONS:
        raise ValueError(f"precision must be one of {_PRECISIONS}, got {precision!r}")
    p = f"#stablehlo<precision {precision}>"
    return f"precision_config = [{p}, {p}]"


class Builder:
    """Builds one ``func.func @main`` and prints the module."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._args: list[Value] = []
        self._count = 0
        self._indent = "    "
        self.arg_attrs: dict[int, str] = {}
        # transpose results -> (operand, permutation): a later convert moves before the
        # transpose, a transpose of it composes, and dots fold it (see convert, transpose)
        self._transposes: dict[str, tuple[Value, list[int]]] = {}
        # extra top-level functions of the module (custom kernels, torchtpu.kernels): name -> text
        self._functions: dict[str, str] = {}
        # what the ops now emitted lower (see located): their MLIR location, the op_name XLA gives
        # the HLO instructions made from them
        self._location = ""

    # -- bookkeeping ---------------------------------------------------------
    def _fresh(self) -> str:
        self._count += 1
        return f"%v{self._count}"

    def arg(self, shape: Sequence[int], dtype: torch.dtype) -> Value:
        v = Value(f"%arg{len(self._args)}", tuple(int(s) for s in shape), dtype)
        self._args.append(v)
        return v

    @property
    def num_args(self) -> int:
        return len(self._args)

    @contextlib.contextmanager
    def located(self, name: str) -> Iterator[None]:
        """Ops emitted inside carry ``name`` (an ATen op, and in a graph the module that called it)
        as their location. XLA makes it the ``op_name`` of the HLO instructions they become, so a
        TPU profile or an optimized HLO dump says which PyTorch op and module each fusion, copy or
        kernel call came from (as JAX's do). Names only, no file lines: the text is the tiers 2/3
        cache key, and an edit elsewhere in a file must not change it."""
        saved = self._location
        self._location = _location_literal(name)
        try:
            yield
        finally:
            self._location = saved

    def op(
        self,
        name: str,
        operands: Sequence[Value],
        result_shapes: Sequence[tuple[Sequence[int], torch.dtype]],
        attrs: str = "",
        region: str = "",
    ) -> list[Value]:
        results = [Value(self._fresh(), tuple(int(d) for d in s), dt) for s, dt in result_shapes]
        if name in _ACCURACY_OPS and results[0].dtype in _ACCURACY_DTYPES and target.accurate_transcendentals():
            attrs = f"{attrs}, {_HIGHEST_ACCURACY}" if attrs else _HIGHEST_ACCURACY
        lhs = ""
        if len(results) == 1:
            lhs = f"{results[0].name} = "
        elif results:
            base = self._fresh()
            results = [Value(f"{base}#{i}", r.shape, r.dtype) for i, r in enumerate(results)]
            lhs = f"{base}:{len(results)} = "
        ins = ", ".join(v.name for v in operands)
        in_types = ", ".join(v.type for v in operands)
        out_types = ", ".join(r.type for r in results)
        if len(results) != 1:
            out_types = f"({out_types})"
        reg = f" ({region})" if region else ""
        attr = f" {{{attrs}}}" if attrs else ""
        self._lines.append(f'{self._indent}{lhs}"{name}"({ins}){reg}{attr} : ({in_types}) -> {out_types}'
                           f"{self._location}")
        return results

    def op1(self, name: str, operands: Sequence[Value], shape: Sequence[int], dtype: torch.dtype,
            attrs: str = "", region: str = "") -> Value:
        if name == "stablehlo.logistic" and dtype == torch.float32 and target.accurate_transcendentals():
            return self._logistic_from_exp(operands[0])
        if dtype == torch.complex64 and target.accurate_transcendentals():
            from .accurate_math import COMPLEX_FORMS  # it builds on this module

            form = COMPLEX_FORMS.get(name)
            if form is not None and operands[0].dtype == dtype:
                return form(self, operands[0])
        if name == "stablehlo.gather" and dtype == torch.float16 and target.gathers_float16_through_products():
            # A v5e gathered float16 rows (embedding, 2-d indices into a small table) as a one-hot
            # matrix product, whose single pass rounds the values to bf16 (62 of 125 values off,
            # measured). A gather moves bits: done on int16, no compiler pass can round them.
            bits = self.bitcast_convert(operands[0], torch.int16, operands[0].shape)
            moved = self.op1(name, [bits, *operands[1:]], shape, torch.int16, attrs, region)
            return self.bitcast_convert(moved, torch.float16, shape)
        if name in ("stablehlo.abs", "stablehlo.sign") and dtype in _UNSIGNED:
            # StableHLO's abs and sign take signed integers only; on unsigned ones they are the
            # identity and (x != 0), as PyTorch's CPU kernels give them
            x = operands[0]
            if name == "stablehlo.abs":
                return x
            zero = self.constant(0, x.dtype, x.shape)
            return self.convert(self.compare(x, zero, "NE"), x.dtype)
        return self.op(name, operands, [(shape, dtype)], attrs, region)[0]

    def _logistic_from_exp(self, x: Value) -> Value:
        """1 / (1 + e^-|x|), times e^-|x| below 0, from exp and a division at full accuracy: a
        v5e's logistic, even at result_accuracy HIGHEST, was 1.3e-6 off (5e-6 relative in the
        tails) where the CPU's is within an ulp."""
        e = self.unary("exponential", self.neg(self.unary("abs", x)))
        one = self.constant(1.0, x.dtype, x.shape)
        p = self.div(one, self.add(one, e))
        return self.select(self.compare(x, self.constant(0.0, x.dtype, x.shape), "GE"), p, self.mul(e, p))

    def _scalar_region(self, body_op: str, dtype: torch.dtype, nargs: int = 2) -> str:
        """A reducer region ``^bb0(a, b): return body_op(a, b)`` on 0-d tensors."""
        t = tensor_type((), dtype)
        names = [self._fresh() for _ in range(nargs)]
        res = self._fresh()
        params = ", ".join(f"{n}: {t}" for n in names)
        return (
            "{\n"
            f"{self._indent}  ^bb0({params}):\n"
            f'{self._indent}    {res} = "{body_op}"({", ".join(names)}) : ({", ".join([t] * nargs)}) -> {t}\n'
            f'{self._indent}    "stablehlo.return"({res}) : ({t}) -> ()\n'
            f"{self._indent}}}"
        )

    def region(self, params: Sequence[tuple[Sequence[int], torch.dtype]], body) -> str:
        """A region whose body is built by ``body(builder, *params) -> list[Value]``."""
        saved_lines, saved_indent = self._lines, self._indent
        self._lines = []
        self._indent = saved_indent + "    "
        pvals = [Value(self._fresh(), tuple(s), dt) for s, dt in params]
        results = body(self, *pvals)
        if isinstance(results, Value):
            results = [results]
        rets = ", ".join(r.name for r in results)
        rtypes = ", ".join(r.type for r in results)
        self._lines.append(f'{self._indent}"stablehlo.return"({rets}) : ({rtypes}) -> ()')
        body_text = "\n".join(self._lines)
        self._lines, self._indent = saved_lines, saved_indent
        if not pvals:  # an entry block without arguments takes no label (stablehlo.if's branches)
            return "{\n" + body_text + "\n" + self._indent + "}"
        header = ", ".join(f"{p.name}: {p.type}" for p in pvals)
        return "{\n" + f"{self._indent}  ^bb0({header}):\n" + body_text + "\n" + self._indent + "}"

    def add_functions(self, name: str, text: str) -> str:
        """Add private top-level ``func.func``\\ s (``text``, already renamed apart, see
        torchtpu.kernels) under ``name`` once per program; returns ``name``."""
        self._functions.setdefault(name, text)
        return name

    def call(self, callee: str, operands: Sequence[Value],
             result_shapes: Sequence[tuple[Sequence[int], torch.dtype]]) -> list[Value]:
        """``func.call @callee(operands)``: a function added with :meth:`add_functions`."""
        return self.op("func.call", operands, result_shapes, attrs=f"callee = @{callee}")

    def module(self, results: Sequence[Value], name: str = "torchtpu") -> str:
        # Every parameter and result is pinned to the default (row-major) layout. Unpinned, a
        # TPU compiler picks the layouts that suit it (a transpose becomes a column-major
        # result), and the runtime, which moves row-major bytes, reads them scrambled.
        args = []
        for i, a in enumerate(self._args):
            extra = self.arg_attrs.get(i)
            attrs = _DEFAULT_LAYOUT + (f", {extra}" if extra else "")
            args.append(f"{a.name}: {a.type} {{{attrs}}}")
        rtypes = ", ".join(r.type for r in results)
        rdecls = ", ".join(f"{r.type} {{{_DEFAULT_LAYOUT}}}" for r in results)
        body = "\n".join(self._lines)
        ret = f'{self._indent}"func.return"({", ".join(r.name for r in results)}) : ({rtypes}) -> ()'
        return (
            f"module @{name} {{\n"
            f"  func.func public @main({', '.join(args)}) -> ({rdecls}) {{\n"
            f"{body}\n{ret}\n  }}\n{''.join(self._functions.values())}}}\n"
        )

    # -- constants and types -------------------------------------------------
    def constant(self, value: bool | float, dtype: torch.dtype, shape: Sequence[int] = ()) -> Value:
        t = tensor_type((), dtype)
        c = self.op1("stablehlo.constant", [], (), dtype, attrs=f"value = dense<{literal(value, dtype)}> : {t}")
        if shape:
            return self.broadcast_in_dim(c, shape, [])
        return c

    def dense_constant(self, array: np.ndarray, dtype: torch.dtype) -> Value:
        """An n-d constant from host data (small tables, e.g. index maps)."""
        flat = array.reshape(-1)
        shape = tuple(array.shape)
        if flat.size == 0:  # dense<[]> only parses as a rank-1 literal: broadcast to the empty shape
            return self.constant(0, dtype, shape)
        items = ", ".join(literal(x.item(), dtype) for x in flat)
        body = f"[{items}]" if array.ndim else items
        t = tensor_type(shape, dtype)
        if array.ndim > 1:
            c = self.op1("stablehlo.constant", [], (flat.size,), dtype,
                         attrs=f"value = dense<[{items}]> : {tensor_type((flat.size,), dtype)}")
            return self.reshape(c, shape)
        return self.op1("stablehlo.constant", [], shape, dtype, attrs=f"value = dense<{body}> : {t}")

    def convert(self, v: Value, dtype: torch.dtype) -> Value:
        if v.dtype == dtype:
            return v
        moved = self._transposes.get(v.name)
        if moved is not None:
            # convert(transpose(x)) == transpose(convert(x)). The second form lets XLA fold
            # the transpose into a dot's dimension numbers (TPU-precision matmuls convert
            # their operands to bf16): on XLA CPU a materialized transpose in front of a
            # dot costs ~3x the dot itself.
            return self.transpose(self.convert(moved[0], dtype), moved[1])
        if dtype == torch.bool:
            zero = self.constant(0, v.dtype, v.shape)
            return self.compare(v, zero, "NE")
        if dtype == torch.float8_e4m3fn and (v.dtype.is_floating_point or v.dtype.is_complex):
            return self._to_float8(v, dtype)
        return self.op1("stablehlo.convert", [v], v.shape, dtype)

    def rounded_to_bf16(self, v: Value) -> Value:
        """An f32 value rounded to bf16 (to nearest, ties to even; NaN to 0x7FC0 as PyTorch's
        CPU rounds it), in integer arithmetic on a TPU.

        A TPU's compiler narrows f32 work whose every use is a conversion to bf16 to bf16
        itself (XLA's BFloat16Propagation): a bf16 ``mv`` summed products it had rounded to bf16
        (0.33 off CPU on O(100) values) and a bf16 power lost a negative base's sign. A
        bitcast is a use that needs all 32 bits, so the work before it stays f32.
        """
        if not target.narrows_work_used_as_bf16():
            return self.convert(v, torch.bfloat16)
        u32 = torch.uint32
        bits = self.bitcast_convert(v, u32, v.shape)

        def c(value: int) -> Value:
            return self.constant(value, u32, v.shape)

        lsb = self.binary("and", self.binary("shift_right_logical", bits, c(16)), c(1))
        top = self.binary("shift_right_logical", self.add(bits, self.add(c(0x7FFF), lsb)), c(16))
        # NaN found in the integers too: the rounding holds no float operation the compiler could rewrite
        nan = self.compare(self.binary("and", bits, c(0x7FFFFFFF)), c(0x7F800000), "GT")
        top = self.select(nan, c(0x7FC0), top)
        return self.bitcast_convert(self.convert(top, torch.uint16), torch.bfloat16, v.shape)

    def _to_float8(self, v: Value, dtype: torch.dtype) -> Value:
        """A float8_e4m3fn conversion as PyTorch rounds: the format has no infinity, and PyTorch
        saturates (inf and out-of-range values become +-448) where XLA makes them NaN."""
        src = self.real(v)
        top = torch.finfo(dtype).max
        src = self.clamp(self.constant(-top, src.dtype, src.shape), src, self.constant(top, src.dtype, src.shape))
        return self.op1("stablehlo.convert", [src], src.shape, dtype)

    def real(self, v: Value) -> Value:
        """The real part of a complex value; a real value itself."""
        return self.op1("stablehlo.real", [v], v.shape, v.dtype.to_real()) if v.dtype.is_complex else v

    def imag(self, v: Value) -> Value:
        """The imaginary part of a complex value."""
        return self.op1("stablehlo.imag", [v], v.shape, v.dtype.to_real())

    def bitcast_convert(self, v: Value, dtype: torch.dtype, shape: Sequence[int]) -> Value:
        return self.op1("stablehlo.bitcast_convert", [v], shape, dtype)

    # -- elementwise ---------------------------------------------------------
    def unary(self, name: str, v: Value, dtype: torch.dtype | None = None) -> Value:
        return self.op1(f"stablehlo.{name}", [v], v.shape, dtype or v.dtype)

    def binary(self, name: str, a: Value, b: Value, dtype: torch.dtype | None = None) -> Value:
        assert a.shape == b.shape, (name, a.shape, b.shape)
        if name == "power" and a.dtype == b.dtype and dtype is None and target.wide_float_power():
            if a.dtype in (torch.bfloat16, torch.float16):
                # in f32 and rounded once, as CPU kernels compute them (a v5e's bf16 power lost
                # the sign of a negative base: (-2) ** -1 came out 0.5)
                wide = self.binary("power", self.convert(a, torch.float32), self.convert(b, torch.float32))
                return self.rounded_to_bf16(wide) if a.dtype == torch.bfloat16 else self.convert(wide, a.dtype)
            if a.dtype == torch.float32:
                # a TPU's f32 power composes its fast exp and log (3.1e-6 relative off; Adam's
                # 1 - beta2 ** step then loses three digits), and its f64 one compiled for 1.3 s a
                # power: computed in f32 pairs instead (accurate_math.power)
                from . import accurate_math  # (it builds on this module)

                return self._with_power_sign(a, b, accurate_math.power(self, a, b))
        if name == "power" and a.dtype == b.dtype == torch.float64 and dtype is None and target.emulated_float64():
            return self._repaired_f64_power(a, b, self.op1("stablehlo.power", [a, b], a.shape, a.dtype))
        return self.op1(f"stablehlo.{name}", [a, b], a.shape, dtype or a.dtype)

    def _repaired_f64_power(self, a: Value, b: Value, power: Value) -> Value:
        """The emulated float64 ``power`` (float32 pairs, a TPU) with IEEE's special cases put back:
        a v5e's gave NaN for a zero base (``float_power`` of integers: 0 ** 1 and 0 ** 0 came out
        NaN), as the pair's correction term of log(0) is -inf - -inf. Where it is NaN but IEEE's
        pow is a number (zero and infinite bases, results past the pair's float32 range), the
        float32 power takes over (it has IEEE's specials, and no more range than the pairs);
        x ** 0 and 1 ** y are exactly 1, NaNs included, as CPU gives them."""
        f32, f64 = torch.float32, torch.float64
        a32, b32 = self.convert(a, f32), self.convert(b, f32)
        fallback = self.convert(self._with_power_sign(a32, b32, self.binary("power", self.unary("abs", a32), b32)), f64)

        def nan(v: Value) -> Value:
            return self.compare(v, v, "NE")

        repair = self.binary("and", nan(power), self.unary("not", self.binary("or", nan(a), nan(b))))
        one = self.constant(1.0, f64, a.shape)
        exactly_one = self.binary("or", self.compare(b, self.constant(0.0, f64, b.shape), "EQ"),
                                  self.compare(a, one, "EQ"))
        return self.select(exactly_one, one, self.select(repair, fallback, power))

    def _with_power_sign(self, a: Value, b: Value, mag: Value) -> Value:
        """a ** b from mag = |a| ** b, the sign taken from the exponent's parity: a v5e's power
        dropped a negative base's sign ((-2) ** -1 came out +0.5, in its bf16 power and again
        through the f64 form), so no power there ever sees a negative base. As IEEE's pow: a
        finite negative base with a non-integer exponent gives NaN; -0 and -inf keep their sign
        for odd exponents."""
        zero = self.constant(0.0, a.dtype, a.shape)
        half = self.mul(b, self.constant(0.5, b.dtype, b.shape))
        integer = self.compare(self.unary("floor", b), b, "EQ")
        odd = self.binary("and", integer, self.compare(self.unary("floor", half), half, "NE"))
        sign_bit = self.compare(self.bitcast_convert(a, torch.int32, a.shape),
                                self.constant(0, torch.int32, a.shape), "LT")
        finite_negative = self.binary("and", self.compare(a, zero, "LT"),
                                      self.op1("stablehlo.is_finite", [a], a.shape, torch.bool))
        nan = self.constant(float("nan"), a.dtype, a.shape)
        r = self.select(self.binary("and", sign_bit, odd), self.neg(mag), mag)
        return self.select(self.binary("and", finite_negative, self.unary("not", integer)), nan, r)

    def add(self, a: Value, b: Value) -> Value:
        return self.binary("add", a, b)

    def sub(self, a: Value, b: Value) -> Value:
        return self.binary("subtract", a, b)

    def mul(self, a: Value, b: Value) -> Value:
        return self.binary("multiply", a, b)

    def div(self, a: Value, b: Value) -> Value:
        return self.binary("divide", a, b)

    def maximum(self, a: Value, b: Value) -> Value:
        return self._nan_wins(a, b, self.binary("maximum", a, b))

    def minimum(self, a: Value, b: Value) -> Value:
        return self._nan_wins(a, b, self.binary("minimum", a, b))

    def _nan_wins(self, a: Value, b: Value, r: Value) -> Value:
        # stablehlo.maximum/minimum propagate NaN (as a TPU does), but XLA:CPU's drop a NaN
        # second operand: max(1, nan) == 1 there. Make it explicit for floating types.
        if not r.dtype.is_floating_point:
            return r
        nan = self.binary("or", self.compare(a, a, "NE"), self.compare(b, b, "NE"))
        return self.select(nan, self.add(a, b), r)

    def neg(self, v: Value) -> Value:
        return self.unary("negate", v)

    def compare(self, a: Value, b: Value, direction: str) -> Value:
        assert a.shape == b.shape and a.dtype == b.dtype, (a, b)
        if a.dtype == torch.bool or a.dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
            kind = "UNSIGNED"
        elif a.dtype.is_floating_point or a.dtype.is_complex:  # complex: EQ/NE only, as float pairs
            kind = "FLOAT"
        else:
            kind = "SIGNED"
        attrs = (
            f"comparison_direction = #stablehlo<comparison_direction {direction}>, "
            f"compare_type = #stablehlo<comparison_type {kind}>"
        )
        return self.op1("stablehlo.compare", [a, b], a.shape, torch.bool, attrs=attrs)

    def select(self, pred: Value, on_true: Value, on_false: Value) -> Value:
        return self.op1("stablehlo.select", [pred, on_true, on_false], on_true.shape, on_true.dtype)

    def clamp(self, lo: Value, v: Value, hi: Value) -> Value:
        return self.op1("stablehlo.clamp", [lo, v, hi], v.shape, v.dtype)

    # -- shape ---------------------------------------------------------------
    def reshape(self, v: Value, shape: Sequence[int]) -> Value:
        shape = tuple(int(s) for s in shape)
        if v.shape == shape:
            return v
        return self.op1("stablehlo.reshape", [v], shape, v.dtype)

    def transpose(self, v: Value, perm: Sequence[int]) -> Value:
        perm = list(perm)
        inner = self._transposes.get(v.name)
        if inner is not None:
            # A transpose of a transpose is one transpose (often none: ``w.t().t()`` in a
            # backward graph). XLA would merge them too, but only after its CPU backend has
            # decided, on the unmerged form, to run the dot they feed in f32 instead of bf16.
            return self.transpose(inner[0], [inner[1][p] for p in perm])
        if perm == list(range(v.rank)):
            return v
        shape = [v.shape[p] for p in perm]
        r = self.op1("stablehlo.transpose", [v], shape, v.dtype, attrs=f"permutation = {_i64_array(perm)}")
        self._transposes[r.name] = (v, perm)
        return r

    def transpose_source(self, v: Value) -> tuple[Value, list[int]] | None:
        """``(operand, permutation)`` when ``v`` was built by :meth:`transpose`."""
        return self._transposes.get(v.name)

    def broadcast_in_dim(self, v: Value, shape: Sequence[int], dims: Sequence[int]) -> Value:
        shape = tuple(int(s) for s in shape)
        if v.shape == shape and list(dims) == list(range(len(shape))):
            return v
        return self.op1("stablehlo.broadcast_in_dim", [v], shape, v.dtype,
                        attrs=f"broadcast_dimensions = {_i64_array(dims)}")

    def broadcast_to(self, v: Value, shape: Sequence[int]) -> Value:
        """Numpy-style broadcast (trailing alignment)."""
        shape = tuple(int(s) for s in shape)
        if v.shape == shape:
            return v
        offset = len(shape) - v.rank
        # size-1 dims that must expand: drop them first, then broadcast
        keep = [i for i, d in enumerate(v.shape) if d == shape[i + offset]]
        if len(keep) != v.rank:
            v = self.reshape(v, [v.shape[i] for i in keep])
        return self.broadcast_in_dim(v, shape, [i + offset for i in keep])

    def slice(self, v: Value, start: Sequence[int], limit: Sequence[int], strides: Sequence[int] | None = None
              ) -> Value:
        strides = list(strides) if strides is not None else [1] * v.rank
        if list(start) == [0] * v.rank and list(limit) == list(v.shape) and strides == [1] * v.rank:
            return v
        shape = [max(0, -(-(hi - lo) // st)) for lo, hi, st in zip(start, limit, strides)]
        attrs = (f"start_indices = {_i64_array(start)}, limit_indices = {_i64_array(limit)}, "
                 f"strides = {_i64_array(strides)}")
        return self.op1("stablehlo.slice", [v], shape, v.dtype, attrs=attrs)

    def concatenate(self, values: Sequence[Value], dim: int) -> Value:
        if len(values) == 1:
            return values[0]
        shape = list(values[0].shape)
        shape[dim] = sum(v.shape[dim] for v in values)
        return self.op1("stablehlo.concatenate", list(values), shape, values[0].dtype, attrs=f"dimension = {dim} : i64")

    def pad(self, v: Value, value: Value, low: Sequence[int], high: Sequence[int],
            interior: Sequence[int] | None = None) -> Value:
        interior = list(interior) if interior is not None else [0] * v.rank
        shape = [d + lo + hi + max(d - 1, 0) * it for d, lo, hi, it in zip(v.shape, low, high, interior)]
        attrs = (f"edge_padding_low = {_i64_array(low)}, edge_padding_high = {_i64_array(high)}, "
                 f"interior_padding = {_i64_array(interior)}")
        return self.op1("stablehlo.pad", [v, value], shape, v.dtype, attrs=attrs)

    def iota(self, shape: Sequence[int], dim: int, dtype: torch.dtype) -> Value:
        return self.op1("stablehlo.iota", [], shape, dtype, attrs=f"iota_dimension = {dim} : i64")

    def dynamic_slice(self, v: Value, starts: Sequence[Value], sizes: Sequence[int]) -> Value:
        return self.op1("stablehlo.dynamic_slice", [v, *starts], sizes, v.dtype,
                        attrs=f"slice_sizes = {_i64_array(sizes)}")

    def dynamic_update_slice(self, v: Value, update: Value, starts: Sequence[Value]) -> Value:
        return self.op1("stablehlo.dynamic_update_slice", [v, update, *starts], v.shape, v.dtype)

    def reverse(self, v: Value, dims: Sequence[int]) -> Value:
        return self.op1("stablehlo.reverse", [v], v.shape, v.dtype, attrs=f"dimensions = {_i64_array(dims)}")

    # -- reductions ----------------------------------------------------------
    def reduce(self, v: Value, dims: Sequence[int], init: Value, body_op: str) -> Value:
        dims = sorted(int(d) for d in dims)
        if target.xla_cpu():
            v = self._column_partials(v, dims, init, body_op)
        shape = [d for i, d in enumerate(v.shape) if i not in dims]
        region = self._scalar_region(body_op, v.dtype)
        return self.op1("stablehlo.reduce", [v, init], shape, v.dtype, attrs=f"dimensions = {_i64_array(dims)}",
                        region=region)

    def _column_partials(self, v: Value, dims: Sequence[int], init: Value, body_op: str) -> Value:
        """For a reduction over leading dims (a bias gradient's column sum), partial results
        that XLA's CPU backend computes fast; ``v`` itself for any other reduction.

        XLA:CPU rewrites such a reduction into one reduce-window over all the reduced dims
        at once and emits that as a strided scalar loop: ~120 us for 8x64x128 -> 128. A
        window along one reduced dim only, whose partial results the reduce then combines,
        vectorizes along the kept minor dim: ~3x faster. Reductions over the minor dim are
        left alone.
        """
        sized = [i for i, d in enumerate(v.shape) if d != 1]
        if not dims or not sized or sized[-1] in dims:
            return v
        axis = max(dims, key=lambda i: v.shape[i])
        rows = v.shape[axis]
        if rows < 2 * _COLUMN_WINDOW:
            return v
        window = [1] * v.rank
        window[axis] = _COLUMN_WINDOW
        padding = [(0, 0)] * v.rank
        padding[axis] = (0, -rows % _COLUMN_WINDOW)
        return self.reduce_window(v, init, body_op, window, window, padding)

    def reduce_multi(self, values: Sequence[Value], inits: Sequence[Value], dims: Sequence[int], body) -> list[Value]:
        """Variadic reduce (e.g. argmax); ``body(b, *accs, *elems)`` returns the new accumulators."""
        dims = sorted(int(d) for d in dims)
        params = [((), v.dtype) for v in values] * 2
        region = self.region(params, body)
        shape = [d for i, d in enumerate(values[0].shape) if i not in dims]
        return self.op("stablehlo.reduce", [*values, *inits], [(shape, v.dtype) for v in values],
                       attrs=f"dimensions = {_i64_array(dims)}", region=region)

    def reduce_window(self, v: Value, init: Value, body_op: str, window: Sequence[int], strides: Sequence[int],
                      padding: Sequence[tuple[int, int]], base_dilations: Sequence[int] | None = None,
                      window_dilations: Sequence[int] | None = None) -> Value:
        base_dilations = list(base_dilations) if base_dilations else [1] * v.rank
        window_dilations = list(window_dilations) if window_dilations else [1] * v.rank
        shape = []
        for i, d in enumerate(v.shape):
            dd = (d - 1) * base_dilations[i] + 1 + padding[i][0] + padding[i][1]
            wd = (window[i] - 1) * window_dilations[i] + 1
            shape.append(max(0, (dd - wd) // strides[i] + 1))
        pad = ", ".join(f"[{lo}, {hi}]" for lo, hi in padding)
        attrs = (f"window_dimensions = {_i64_array(window)}, window_strides = {_i64_array(strides)}, "
                 f"base_dilations = {_i64_array(base_dilations)}, window_dilations = {_i64_array(window_dilations)}, "
                 f"padding = dense<[{pad}]> : tensor<{len(padding)}x2xi64>")
        region = self._scalar_region(body_op, v.dtype)
        return self.op1("stablehlo.reduce_window", [v, init], shape, v.dtype, attrs=attrs, region=region)

    # -- linear algebra --------------------------------------------------------
    def dot_general(self, a: Value, b: Value, batch: tuple[Sequence[int], Sequence[int]],
                    contract: tuple[Sequence[int], Sequence[int]], out_dtype: torch.dtype,
                    precision: str | None = None) -> Value:
        """``precision`` (DEFAULT, HIGH, HIGHEST) sets both operands' precision_config: the bf16
        passes a TPU's matrix unit makes for f32 operands (XLA's CPU backend ignores it)."""
        lb, rb = list(batch[0]), list(batch[1])
        lc, rc = list(contract[0]), list(contract[1])
        shape = [a.shape[i] for i in lb]
        shape += [d for i, d in enumerate(a.shape) if i not in lb and i not in lc]
        shape += [d for i, d in enumerate(b.shape) if i not in rb and i not in rc]

        def dims(xs: list[int]) -> str:
            return "[" + ", ".join(str(x) for x in xs) + "]"

        attrs = (f"dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = {dims(lb)}, "
                 f"rhs_batching_dimensions = {dims(rb)}, lhs_contracting_dimensions = {dims(lc)}, "
                 f"rhs_contracting_dimensions = {dims(rc)}>")
        if precision is not None:
            attrs += ", " + precision_config(precision)
        return self.op1("stablehlo.dot_general", [a, b], shape, out_dtype, attrs=attrs)

    def custom_call(self, call_target: str, operands: Sequence[Value], shape: Sequence[int],
                    dtype: torch.dtype) -> Value:
        """A typed-FFI (api_version 4) custom call with one result."""
        return self.custom_call_results(call_target, operands, [(shape, dtype)])[0]

    def custom_call_results(self, call_target: str, operands: Sequence[Value],
                            results: Sequence[tuple[Sequence[int], torch.dtype]]) -> list[Value]:
        """A typed-FFI (api_version 4) custom call with any number of results."""
        return self.op("stablehlo.custom_call", operands, results,
                       attrs=f'call_target_name = "{call_target}", api_version = 4 : i32')

    # -- random ----------------------------------------------------------------
    def rng_bit_generator(self, state: Value, shape: Sequence[int], dtype: torch.dtype) -> tuple[Value, Value]:
        new_state, bits = self.op(
            "stablehlo.rng_bit_generator", [state], [(state.shape, state.dtype), (shape, dtype)],
            attrs="rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>")
        return new_state, bits
