// torch.profiler's device rows for tpu: a Kineto activity profiler for PrivateUse1.
//
// PyTorch hands Kineto the IActivityProfiler registered for PrivateUse1 (its
// PrivateUse1ProfilerRegistry) and starts a session of it whenever a profile asks for
// ProfilerActivity.PrivateUse1 (torch.profiler's default activities include it once the backend
// is renamed). The session:
//   * keeps, per thread, the correlation ids Kineto pushes as each profiled op begins: a program
//     launched inside an op (Strict), a fused graph launched at a materialization point
//     (DeferAndFuse) or a compiled graph's program belongs to the op on top of that stack;
//   * takes the device events the engine reports (record(): one per launched program, with its
//     device start and end), and hands them to Kineto as kernel activities linked to their op,
//     so that key_averages() shows device time per op and the Chrome trace a device row.
// The engine (Python) asks active() before timing a launch, so an idle profiler costs one call.
#include <torch/extension.h>

#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <libkineto.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace torchtpu {
namespace {

struct DeviceEvent {
  std::string name;
  uint64_t correlation;
  int64_t device;
  int64_t start_ns;
  int64_t end_ns;
};

std::atomic<bool> g_recording{false};
std::mutex g_mutex;
std::vector<DeviceEvent> g_events;           // guarded by g_mutex
thread_local std::vector<uint64_t> tl_correlation;

class Session final : public libkineto::IActivityProfilerSession {
 public:
  // Kineto configures every registered profiler for each trace: a profile that did not ask for
  // device activities (ProfilerActivity.CPU alone) gets a session that records nothing.
  explicit Session(bool enabled) : span_(0, 0, "tpu"), enabled_(enabled) {}

  void start() override {
    if (!enabled_) return;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_events.clear();
    }
    g_recording.store(true);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    if (!enabled_) return;
    g_recording.store(false);
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t /*startTime*/, int64_t /*endTime*/) override {
    std::vector<DeviceEvent> events;
    if (enabled_) {
      std::lock_guard<std::mutex> lock(g_mutex);
      events.swap(g_events);
    }
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = span_;
    for (const auto& e : events) {
      buffer_->emplace_activity(buffer_->span, libkineto::ActivityType::CONCURRENT_KERNEL, e.name);
      auto& a = *buffer_->activities.back();
      a.startTime = e.start_ns;
      a.endTime = e.end_ns;
      a.id = static_cast<int32_t>(e.correlation);
      a.device = static_cast<int32_t>(e.device);
      a.resource = 0;  // one stream per device
      a.linked = e.correlation ? linked(static_cast<int32_t>(e.correlation)) : nullptr;
      a.flow.id = static_cast<uint32_t>(e.correlation);
      a.flow.type = libkineto::kLinkAsyncCpuGpu;
      a.flow.start = false;
      a.addMetadataQuoted("device", "tpu:" + std::to_string(e.device));
      a.log(logger);
      devices_.insert(e.device);
    }
    status_ = libkineto::TraceStatus::READY;
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    const int64_t device = devices_.empty() ? 0 : *devices_.begin();
    return std::make_unique<libkineto::DeviceInfo>(
        libkineto::DeviceInfo{device, device, "tpu:" + std::to_string(device), "TPU"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (int64_t d : devices_) out.push_back(libkineto::ResourceInfo{0, 0, d, "programs"});
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(uint64_t id) override { tl_correlation.push_back(id); }

  void popCorrelationId() override {
    if (!tl_correlation.empty()) tl_correlation.pop_back();
  }

 private:
  libkineto::TraceSpan span_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::set<int64_t> devices_;
  const bool enabled_;
};

class TpuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<libkineto::ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& activity_types, const libkineto::Config& /*config*/) override {
    return std::make_unique<Session>(activity_types.count(libkineto::ActivityType::CONCURRENT_KERNEL) > 0);
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/, int64_t /*duration_ms*/, const std::set<libkineto::ActivityType>& activity_types,
      const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_{"torchtpu"};
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL};
};

REGISTER_PRIVATEUSE1_PROFILER(TpuActivityProfiler);

bool active() { return g_recording.load(std::memory_order_relaxed); }

uint64_t correlation_id() { return tl_correlation.empty() ? 0 : tl_correlation.back(); }

void record(const std::string& name, uint64_t correlation, int64_t device, int64_t start_ns, int64_t end_ns) {
  if (!g_recording.load()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.push_back(DeviceEvent{name, correlation, device, start_ns, end_ns});
}

}  // namespace
}  // namespace torchtpu

PYBIND11_MODULE(_profiler, m) {
  m.doc() = "torch.profiler device events for tpu (a Kineto PrivateUse1 activity profiler)";
  m.def("active", &torchtpu::active, "Whether a profile with device activities is recording.");
  m.def("correlation_id", &torchtpu::correlation_id,
        "The correlation id of the profiled op running on this thread (0: none).");
  m.def("record", &torchtpu::record, "Add one device event (ns since the Unix epoch).", pybind11::arg("name"),
        pybind11::arg("correlation"), pybind11::arg("device"), pybind11::arg("start_ns"), pybind11::arg("end_ns"));
  m.def("registered", [] { return torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().hasFactory(); },
        "Whether the activity profiler is registered with PyTorch.");
}
