// torch.tpu.precision(...) overrides, carried where PyTorch carries its thread-local state.
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

py::object propagated() {
  const PrecisionInfo* info = effective();
  if (info == nullptr) return py::none();
  return py::make_tuple(info->level, info->quiet);
}

}  // namespace

void register_precision(py::module& m) {
  m.def("_precision_push", &push, "push a precision override onto this thread's propagated state");
  m.def("_precision_pop", &pop, "pop this thread's latest precision override");
  m.def("_precision_propagated", &propagated,
        "(precision, quiet) of the innermost override this thread runs under, or None");
}

}  // namespace torchtpu
