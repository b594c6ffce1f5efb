// The PrivateUse1 kernel of every lowered ATen op: a boxed C++ kernel in front of the engine.
//
// Registered from Python (torch.library's impl), each op's kernel was a Python function behind
// PyTorch's PythonKernelHolder: IValues to an args tuple and kwargs dict, a second copy of both
// for the `*args, **kwargs` call, a Python frame whose first act was a call back into this
// module (DeferAndFuse's record), and the result converted back: 3-5 us of an op's 8-13 us in
// DeferAndFuse. Without it the tiny GPT step's host CPU went from 11.6 to 10.1 ms in Strict
// and from 7.4 to 7.1 ms in DeferAndFuse. This kernel converts the arguments once, the way
// PythonKernelHolder does (positional arguments up to the last one not at its default,
// keyword-only ones not at their default), records the op natively when DeferAndFuse can, and
// otherwise calls executor.run_plan, the reference path of every mode.
#include <torch/extension.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <vector>

#include "engine_native.h"
#include "py_helpers.h"

namespace torchtpu {
namespace {

// Set once by _kernel_front_setup (leaked on purpose, like the engine's other globals). The
// executor's functions are looked up per call (off the recording path), so that replacing them
// on the module, as tests do, takes effect.
PyObject *g_executor = nullptr, *s_run_plan = nullptr, *s_check_bounds = nullptr, *s_index_bounds = nullptr;

// Libraries holding the registrations; leaked so that no deregistration runs at exit.
auto* g_libraries = new std::vector<std::unique_ptr<torch::Library>>();

bool at_default(const c10::Argument& arg, const c10::IValue& value) {
  return arg.default_value().has_value() && *arg.default_value() == value;
}

bool has_kind(const c10::Argument& arg, c10::TypeKind kind) {
  const auto& t = arg.real_type();
  if (t->kind() == kind) return true;
  if (auto optional = t->cast<c10::OptionalType>()) return optional->getElementType()->kind() == kind;
  return false;
}

// The Python number of a wrapped-number tensor (`x + 1.0` passes 1.0 as one) that has no Python
// object yet; an empty object otherwise. torch::jit::toPyObject gives the same number, but first
// wraps the tensor in a new Python object to look for a `_wrapped_number` attribute, which only
// an existing Python object can carry: the failed lookup raises and clears an AttributeError,
// ~8% of DeferAndFuse's per-op host time in a chain of `y = y + 1.0`.
py::object wrapped_number(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!impl->is_wrapped_number() || !t.device().is_cpu() || impl->pyobj_slot()->load_pyobj() != nullptr) {
    return py::object();
  }
  switch (t.scalar_type()) {
    case at::ScalarType::Bool:
      return py::bool_(*t.const_data_ptr<bool>());
    case at::ScalarType::Long:
      return py::int_(*t.const_data_ptr<int64_t>());
    case at::ScalarType::Double:
      return py::float_(*t.const_data_ptr<double>());
    case at::ScalarType::ComplexDouble: {
      const auto c = *t.const_data_ptr<c10::complex<double>>();
      return steal(PyComplex_FromDoubles(c.real(), c.imag()));
    }
    default:  // anything else toPyObject handles (or rejects) itself
      return py::object();
  }
}

// An argument as Python sees it: dtypes, layouts and memory formats travel as ints in IValues.
py::object to_python(const c10::Argument& arg, const c10::IValue& value) {
  if (value.isNone()) return py::none();
  if (has_kind(arg, c10::ScalarTypeType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(value.toInt()))));
  }
  if (has_kind(arg, c10::LayoutType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(value.toInt()))));
  }
  if (has_kind(arg, c10::MemoryFormatType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(value.toInt())));
  }
  if (value.isTensor()) {
    py::object number = wrapped_number(value.toTensor());
    if (number) return number;
  }
  return torch::jit::toPyObject(value);
}

class KernelFront final : public c10::OperatorKernel {
 public:
  explicit KernelFront(py::object plan_of) : plan_of_(plan_of.release().ptr()) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    const auto& schema = op.schema();
    const auto& arguments = schema.arguments();
    const size_t n = arguments.size();
    py::gil_scoped_acquire gil;
    py::object result;
    {
      const c10::IValue* values = &*(stack->end() - static_cast<std::ptrdiff_t>(n));
      size_t keyword_start = n;
      while (keyword_start > 0 && arguments[keyword_start - 1].kwarg_only()) --keyword_start;
      size_t positional = keyword_start;
      while (positional > 0 && at_default(arguments[positional - 1], values[positional - 1])) --positional;
      py::tuple args(positional);
      for (size_t i = 0; i < positional; ++i) {
        PyTuple_SET_ITEM(args.ptr(), i, to_python(arguments[i], values[i]).release().ptr());
      }
      py::object kwargs = py::none();
      for (size_t i = keyword_start; i < n; ++i) {
        if (at_default(arguments[i], values[i])) continue;
        if (kwargs.is_none()) kwargs = py::dict();
        check(PyDict_SetItemString(kwargs.ptr(), arguments[i].name().c_str(), to_python(arguments[i], values[i]).ptr()));
      }
      result = call(args, kwargs);
    }
    torch::jit::drop(*stack, n);
    push_result(op, stack, result);
  }

 private:
  py::object call(const py::tuple& args, const py::object& kwargs) {
    if (plan_ == nullptr) {  // looked up at the first call: most registered ops are never called
      py::object plan = steal(PyObject_CallNoArgs(plan_of_));
      py::object bounds = plan.attr(s_index_bounds);
      has_index_bounds_ = !bounds.is_none();
      plan_ = plan.release().ptr();
    }
    py::handle plan(plan_);
    // DeferAndFuse records an op key seen before natively; anything else returns NotImplemented
    // having done nothing (defer.cpp), and executor.run_plan takes the call.
    py::object recorded = defer_record(plan, args, kwargs);
    if (recorded.ptr() != Py_NotImplemented) {
      if (has_index_bounds_) call_executor(s_check_bounds, args, kwargs);
      return recorded;
    }
    return call_executor(s_run_plan, args, kwargs);
  }

  // executor.<name>(plan, args, kwargs); the Python side takes a dict, as `**kwargs` gives.
  py::object call_executor(PyObject* name, const py::tuple& args, const py::object& kwargs) {
    py::object fn = steal(PyObject_GetAttr(g_executor, name));
    const py::object kwargs_dict = kwargs.is_none() ? py::dict() : kwargs;
    return steal(PyObject_CallFunctionObjArgs(fn.ptr(), plan_, args.ptr(), kwargs_dict.ptr(), nullptr));
  }

  // The kernel's return value onto the stack, per the schema's returns (as PythonKernelHolder).
  static void push_result(const c10::OperatorHandle& op, torch::jit::Stack* stack, const py::object& out) {
    const auto& returns = op.schema().returns();
    if (returns.empty()) {
      TORCH_CHECK(out.is_none(), "torchtpu: the kernel of ", op.operator_name(), " returned a value, expected None");
      return;
    }
    if (returns.size() == 1) {
      torch::jit::push(stack, torch::jit::toIValue(out, returns[0].real_type()));
      return;
    }
    py::sequence outs = py::reinterpret_borrow<py::sequence>(out);
    TORCH_CHECK(outs.size() == returns.size(), "torchtpu: the kernel of ", op.operator_name(), " returned ",
                outs.size(), " values, expected ", returns.size());
    for (size_t i = 0; i < returns.size(); ++i) {
      torch::jit::push(stack, torch::jit::toIValue(outs[i], returns[i].real_type()));
    }
  }

  PyObject* plan_of_;  // () -> the op's OpPlan
  PyObject* plan_ = nullptr;
  bool has_index_bounds_ = false;
};

}  // namespace

void register_kernel_front(py::module& m) {
  m.def("_kernel_front_setup", [](py::object executor) {
    g_executor = executor.release().ptr();
    intern_all({{&s_index_bounds, "index_bounds"}, {&s_run_plan, "run_plan"},
                {&s_check_bounds, "check_recorded_index_bounds"}});
  });
  m.def(
      "_register_kernel_front",
      [](const std::string& ns, const std::vector<std::pair<std::string, py::object>>& kernels) {
        TORCH_CHECK(g_executor != nullptr, "torchtpu._C._kernel_front_setup was not called");
        auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, ns, c10::DispatchKey::PrivateUse1,
                                                    __FILE__, __LINE__);
        for (const auto& [name, plan_of] : kernels) {
          lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::make_unique<KernelFront>(plan_of)));
        }
        g_libraries->push_back(std::move(lib));
      },
      "register, per (overload name, () -> OpPlan), the native PrivateUse1 kernel of a lowered op in "
      "namespace ns");
}

}  // namespace torchtpu
