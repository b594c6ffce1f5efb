// torch.tpu.precision(...) overrides, carried where PyTorch carries its thread-local state, and
// the precision every op's cache key includes (precision_current), answered here for the default.
//
// The override is thread-local (engine/precision.py), but autograd may run a backward pass on
// one of its own threads: from a Python thread other than the main one it does. PyTorch hands
// its ThreadLocalState, ThreadLocalDebugInfo included, to the thread that runs each graph
// task, so an override also pushed here reaches the backward ops of a backward() called inside
// it, as autocast's state does.
#include <torch/extension.h>

#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace torchtpu {
namespace {

constexpr std::string_view kPrecisionName = "TORCHTPU_MATMUL_PRECISION";
const c10::DebugInfoKind kPrecision(&kPrecisionName);

struct PrecisionInfo : c10::DebugInfoBase {
  PrecisionInfo(std::string level, bool quiet, const PrecisionInfo* prev)
      : level(std::move(level)), quiet(quiet), prev(prev) {}
  const std::string level;
  const bool quiet;
  // Cleared when a with-block exits while another debug info was pushed over this one (a profiler
  // started inside it and stopped outside): the node stays in the chain, and lookups skip it.
  std::atomic<bool> active{true};
  // The override this one shadows; it lies deeper in the same chain, which keeps it alive.
  const PrecisionInfo* const prev;
};

thread_local std::vector<std::shared_ptr<PrecisionInfo>> tl_pushed;

const PrecisionInfo* effective() {
  const auto* info = static_cast<const PrecisionInfo*>(c10::ThreadLocalDebugInfo::get(kPrecision));
  while (info != nullptr && !info->active.load()) info = info->prev;
  return info;
}

void push(const std::string& level, bool quiet) {
  auto info = std::make_shared<PrecisionInfo>(level, quiet, effective());
  c10::ThreadLocalDebugInfo::_push(kPrecision, info);
  tl_pushed.push_back(std::move(info));
}

void pop() {
  TORCH_CHECK(!tl_pushed.empty(), "torchtpu: precision pop without a push on this thread");
  std::shared_ptr<PrecisionInfo> info = std::move(tl_pushed.back());
  tl_pushed.pop_back();
  if (c10::ThreadLocalDebugInfo::get(kPrecision) == info.get()) {
    try {
      c10::ThreadLocalDebugInfo::_pop(kPrecision);
      return;
    } catch (const c10::Error&) {
      // another kind was pushed over it: fall through
    }
  }
  info->active.store(false);
}

// The global level (engine/precision.py set_global) and, for any level but the default, the
// Python lookup that warns about its cost once: set by _precision_setup.
PyObject* g_medium = nullptr;
bool g_global_is_medium = true;
PyObject* g_current_slow = nullptr;

py::object propagated() {
  const PrecisionInfo* info = effective();
  if (info == nullptr) return py::none();
  return py::make_tuple(info->level, info->quiet);
}

}  // namespace

// precision.current() of the calling thread. Every op's key includes it, so it runs once per op
// in every mode: the default level is answered here without entering Python (an override or a
// global level other than "medium" takes the Python path, which warns about its cost once).
py::object precision_current() {
  const PrecisionInfo* info = effective();
  const bool medium = info == nullptr ? g_global_is_medium : info->level == "medium";
  if (medium && g_medium != nullptr) return py::reinterpret_borrow<py::object>(g_medium);
  TORCH_CHECK(g_current_slow != nullptr, "torchtpu._C._precision_setup was not called");
  return py::reinterpret_steal<py::object>(PyObject_CallNoArgs(g_current_slow));
}

void register_precision(py::module& m) {
  m.def("_precision_setup", [](py::object current_slow) {
    g_medium = py::str("medium").release().ptr();  // kept for the module's life
    PyUnicode_InternInPlace(&g_medium);
    Py_XDECREF(g_current_slow);
    g_current_slow = current_slow.release().ptr();
  });
  m.def("_precision_set_global", [](const std::string& level) { g_global_is_medium = level == "medium"; },
        "mirror of engine/precision.py's global level");
  m.def("_precision_current", [] {
    py::object out = precision_current();
    if (!out) throw py::error_already_set();
    return out;
  }, "the matmul precision of the calling thread (engine/precision.py current)");
  m.def("_precision_push", &push, "push a precision override onto this thread's propagated state");
  m.def("_precision_pop", &pop, "pop this thread's latest precision override");
  m.def("_precision_propagated", &propagated,
        "(precision, quiet) of the innermost override this thread runs under, or None");
}

}  // namespace torchtpu
