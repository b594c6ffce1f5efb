// The C++ part of torchtpu: only what PyTorch cannot accept from Python.
//
// * an allocator whose storages own no host memory (device data lives in PJRT
//   buffers held by the Python layer on the storage object); it also counts
//   bytes per device so torch.accelerator.memory_* work;
// * a DeviceGuardImpl (several devices, thread-local current device);
// * the PrivateUse1 hooks: generators, pinned host memory, storage resize;
// * the structural kernels that only touch tensor metadata (empty, views,
//   resize_, set_), which are ~20x cheaper in C++ than through Python.
//
// Everything that computes is in Python. The engine's hot loops are also in this module:
// collect.cpp walks op arguments into cache keys, op_key.cpp makes those keys, record.cpp
// and defer.cpp record DeferAndFuse ops.
#include <torch/extension.h>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/EmptyTensor.h>
#include <ATen/InferSize.h>
#include <ATen/NestedTensorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace torchtpu {

constexpr int kMaxDevices = 64;
constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

std::atomic<int> g_device_count{1};
thread_local c10::DeviceIndex tl_current_device = 0;

c10::DeviceIndex current_device() {
  return tl_current_device;
}

void check_device_index(c10::DeviceIndex index) {
  TORCH_CHECK(
      index >= 0 && index < g_device_count.load(),
      "Invalid device index ",
      static_cast<int>(index),
      " for tpu: ",
      g_device_count.load(),
      " device(s) available (set TORCH_TPU_NUM_DEVICES to change the count on the CPU emulator)");
}

// Python callback that waits for all outstanding device work; set by the
// Python layer so torch.accelerator.synchronize() really synchronizes.
py::object* g_synchronize_callback = nullptr;

void call_synchronize(c10::DeviceIndex index) {
  if (g_synchronize_callback == nullptr || !Py_IsInitialized()) {
    return;
  }
  py::gil_scoped_acquire gil;
  (*g_synchronize_callback)(static_cast<int>(index));
}

// (free, total) bytes of a device's memory, from the Python layer (torch.tpu.mem_get_info): the
// plugin's limit on a TPU, the host's memory on the CPU emulator. Set once.
py::object* g_memory_info_callback = nullptr;

// Device-generic events (torch.Event, c10::Event) are torchtpu.streams.Event objects kept by
// the Python layer (streams.GuardEvents): an event handle here is the key of one. Set once.
py::object* g_event_callbacks = nullptr;

uintptr_t event_key(void* event) {
  return reinterpret_cast<uintptr_t>(event);
}

// A call into the Python event registry; `fallback` where there is none (before the backend
// is set up, or during interpreter teardown). The guard may be called without the GIL (torch.Event
// releases it before destroying its c10::Event), so every Python object is made after taking it.
template <typename T, typename... Args>
T call_events(const char* method, T fallback, Args... args) {
  if (g_event_callbacks == nullptr || !Py_IsInitialized() || _Py_IsFinalizing()) {
    return fallback;  // (at interpreter exit the registry may already be torn down)
  }
  py::gil_scoped_acquire gil;
  return g_event_callbacks->attr(method)(args...).template cast<T>();
}

// ---------------------------------------------------------------------------
// Allocator: storages get unique, never-dereferenced addresses. Device data is
// a PJRT buffer owned by the Python storage object, so nothing here maps memory.
// ---------------------------------------------------------------------------
struct DeviceCounters {
  int64_t allocated_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t allocations = 0;  // currently live
  int64_t total_allocations = 0;
  int64_t total_frees = 0;
};

struct AllocationContext {
  c10::DeviceIndex device;
  size_t nbytes;
};

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    unit += 1;
  }
  char out[32];
  std::snprintf(out, sizeof(out), unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return out;
}

class TpuAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current_device();
    const c10::Device dev(kTpu, device);
    if (nbytes == 0) {
      return {nullptr, nullptr, &c10::detail::deleteNothing, dev};
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& c = counters_[device];
      const int64_t limit = limits_[device];
      if (limit >= 0 && c.allocated_bytes + static_cast<int64_t>(nbytes) > limit) {
        // As CUDA's caching allocator: at the allocation, as torch.OutOfMemoryError.
        TORCH_CHECK_WITH(OutOfMemoryError, false, "tpu out of memory. Tried to allocate ", format_bytes(nbytes),
                         ". tpu ", static_cast<int>(device), " allows this process ", format_bytes(limit),
                         " (its memory, times torch.tpu.set_per_process_memory_fraction), of which ",
                         format_bytes(limit - c.allocated_bytes), " is free; ", format_bytes(c.allocated_bytes),
                         " is held by live tpu tensors.");
      }
      c.allocated_bytes += static_cast<int64_t>(nbytes);
      c.peak_bytes = std::max(c.peak_bytes, c.allocated_bytes);
      c.allocations += 1;
      c.total_allocations += 1;
    }
    // 64-byte spacing keeps distinct storages at distinct addresses.
    const uint64_t address = next_address_.fetch_add((nbytes + 63) & ~uint64_t{63});
    auto* context = new AllocationContext{device, nbytes};
    return {reinterpret_cast<void*>(address), context, &TpuAllocator::release, dev};
  }

  TpuAllocator() {
    limits_.fill(-1);
  }

  // Bytes live tpu storages of a device may hold; -1: no limit.
  void set_limit(c10::DeviceIndex device, int64_t bytes) {
    check_device_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    limits_[device] = bytes;
  }
  int64_t limit(c10::DeviceIndex device) {
    check_device_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    return limits_[device];
  }

  static void release(void* ptr);

  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TORCH_CHECK(false, "tpu storage is not host-addressable; copy through a tensor instead");
  }

  bool initialized() override {
    return true;
  }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}

  // torch.accelerator.get_memory_info()
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    check_device_index(device);
    TORCH_CHECK(g_memory_info_callback != nullptr && Py_IsInitialized(), "the tpu backend is not set up");
    py::gil_scoped_acquire gil;
    auto info = (*g_memory_info_callback)(static_cast<int>(device)).cast<std::pair<size_t, size_t>>();
    return info;
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device_index(device);
    DeviceCounters c;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      c = counters_[device];
    }
    c10::CachingDeviceAllocator::DeviceStats stats;
    for (auto* arr : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes, &stats.requested_bytes}) {
      auto& s = (*arr)[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
      s.current = c.allocated_bytes;
      s.peak = c.peak_bytes;
    }
    auto& a = stats.allocation[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
    a.current = c.allocations;
    a.allocated = c.total_allocations;
    a.freed = c.total_frees;
    a.peak = c.allocations;
    return stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    counters_[device].total_allocations = 0;
    counters_[device].total_frees = 0;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    std::lock_guard<std::mutex> lock(mutex_);
    counters_[device].peak_bytes = counters_[device].allocated_bytes;
  }

  DeviceCounters counters(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(mutex_);
    return counters_[device];
  }

  void on_release(const AllocationContext& ctx) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& c = counters_[ctx.device];
    c.allocated_bytes -= static_cast<int64_t>(ctx.nbytes);
    c.allocations -= 1;
    c.total_frees += 1;
  }

 private:
  std::atomic<uint64_t> next_address_{uint64_t{1} << 44};
  std::mutex mutex_;
  std::array<DeviceCounters, kMaxDevices> counters_{};
  std::array<int64_t, kMaxDevices> limits_{};
};

TpuAllocator g_allocator;

void TpuAllocator::release(void* ptr) {
  auto* ctx = static_cast<AllocationContext*>(ptr);
  g_allocator.on_release(*ctx);
  delete ctx;
}

REGISTER_ALLOCATOR(kTpu, &g_allocator);

// Pinned host memory: ordinary 64-byte-aligned host memory that we remember,
// so is_pinned() answers truthfully. 64-byte alignment is what PJRT's
// zero-copy host buffers need. It is also the tpu device type's host allocator
// (at::getHostAllocator), which torch.accelerator.empty_host_cache() and the
// host memory statistics reach: without one registered, those calls used the
// plain c10::Allocator above as an at::HostAllocator and crashed the process.
// Nothing is cached: every block goes back to the system when freed.
class PinnedAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nullptr;
    if (nbytes > 0) {
      TORCH_CHECK(posix_memalign(&data, 64, nbytes) == 0, "pinned allocation of ", nbytes, " bytes failed");
      std::lock_guard<std::mutex> lock(mutex_);
      live_.emplace(data, nbytes);
      stats_.active_requests.increase(1);
      stats_.active_bytes.increase(nbytes);
      stats_.allocations.increase(1);
      stats_.allocated_bytes.increase(nbytes);
      stats_.num_host_alloc += 1;
    }
    return {data, data, &PinnedAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }
  static void release(void* data);
  c10::DeleterFnPtr raw_deleter() const override {
    return &PinnedAllocator::release;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  bool is_pinned(const void* data) {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_.count(const_cast<void*>(data)) > 0;
  }
  void forget(void* data) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(data);
    if (it == live_.end()) {
      return;
    }
    stats_.active_requests.decrease(1);
    stats_.active_bytes.decrease(it->second);
    stats_.allocations.decrease(1);
    stats_.allocated_bytes.decrease(it->second);
    stats_.num_host_free += 1;
    live_.erase(it);
  }

  // at::HostAllocator. Transfers from host memory complete before their call
  // returns (PJRT copies at once), so no block waits on a stream.
  bool record_event(void*, void*, c10::Stream) override {
    return true;
  }
  void empty_cache() override {}  // nothing is cached
  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }
  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* stat : {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes}) {
      stat->reset_accumulated();
    }
    stats_.num_host_alloc = 0;
    stats_.num_host_free = 0;
  }
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* stat : {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations, &stats_.allocated_bytes}) {
      stat->reset_peak();
    }
  }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, size_t> live_;
  at::HostStats stats_;
};

PinnedAllocator g_pinned_allocator;

void PinnedAllocator::release(void* data) {
  if (data != nullptr) {
    g_pinned_allocator.forget(data);
    free(data);
  }
}

REGISTER_HOST_ALLOCATOR(kTpu, &g_pinned_allocator)

// ---------------------------------------------------------------------------
// Device guard. Streams and events are placeholders: PJRT orders work per
// device itself, and synchronization goes through the Python callback.
// ---------------------------------------------------------------------------
struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kTpu;
  }
  // torch.accelerator.get_device_capability(): the dtypes tpu tensors take (every one but the
  // quantized types, which torchtpu does not implement).
  c10::DeviceCapability getDeviceCapability(c10::Device) const override {
    c10::DeviceCapability cap;
    auto& t = cap.capability_data.supported_scalar_types;
    t.has_QInt8 = t.has_QUInt8 = t.has_QInt32 = t.has_QUInt4x2 = t.has_QUInt2x4 = false;
    return cap;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    return c10::Device(kTpu, tl_current_device);
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kTpu, "expected a tpu device, got ", d);
    if (d.has_index()) {
      check_device_index(d.index());
      tl_current_device = d.index();
    }
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index()) {
      tl_current_device = d.index();
    }
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(g_device_count.load());
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex, const c10::EventFlag flag)
      const override {
    // The work launched so far on the stream's device (one in-order queue per device); torch.Event
    // asks for timing with BACKEND_DEFAULT. A re-recorded event keeps its handle.
    const bool timing = flag == c10::EventFlag::BACKEND_DEFAULT;
    const uintptr_t key =
        call_events<uintptr_t>("record", 0, event_key(*event), static_cast<int>(stream.device_index()), timing);
    *event = reinterpret_cast<void*>(key);
  }
  void block(void*, const c10::Stream&) const override {}  // one in-order queue: already ordered
  bool queryEvent(void* event) const override {
    return event == nullptr || call_events<bool>("query", true, event_key(event));
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event == nullptr) {
      return;
    }
    try {
      call_events<bool>("destroy", true, event_key(event));
    } catch (...) {  // noexcept: an event dropped during teardown is simply forgotten
    }
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "Both events must be recorded before calculating elapsed time.");
    return call_events<double>("elapsed_time", 0.0, event_key(start), event_key(end));
  }
  bool queryStream(const c10::Stream&) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream& s) const override {
    call_synchronize(s.device_index());
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) {
      call_events<bool>("synchronize", true, event_key(event));
    }
  }
  void synchronizeDevice(const c10::DeviceIndex index) const override {
    call_synchronize(index);
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl);

// ---------------------------------------------------------------------------
// Generators: the CPU Mersenne Twister, tagged with the tpu device. The
// Python layer draws a 64-bit seed per random op and feeds it to XLA's
// counter-based generator, so results only depend on torch.manual_seed.
// ---------------------------------------------------------------------------
class TpuGeneratorImpl final : public at::CPUGeneratorImpl {
 public:
  explicit TpuGeneratorImpl(c10::DeviceIndex index) {
    device_ = c10::Device(kTpu, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }
};

std::array<at::Generator, kMaxDevices> g_default_generators;
std::once_flag g_generator_flags[kMaxDevices];

const at::Generator& default_generator(c10::DeviceIndex index) {
  if (index < 0) {
    index = current_device();
  }
  check_device_index(index);
  std::call_once(g_generator_flags[index], [index] {
    g_default_generators[index] = at::make_generator<TpuGeneratorImpl>(index);
  });
  return g_default_generators[index];
}

struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    if (index < 0) {
      index = current_device();
    }
    return at::make_generator<TpuGeneratorImpl>(index);
  }
  at::Device getDeviceFromPtr(void*) const override {
    return c10::Device(kTpu, current_device());
  }
  bool isPinnedPtr(const void* data) const override {
    return g_pinned_allocator.is_pinned(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned_allocator;
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(g_device_count.load());
  }
  void setCurrentDevice(c10::DeviceIndex index) const override {
    check_device_index(index);
    tl_current_device = index;
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    auto old = current_device();
    setCurrentDevice(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    // A new identity for the storage; the Python cell on the storage object
    // keeps the old buffer, which reads pad with zeros up to the new size.
    c10::impl::VirtualGuardImpl guard(kTpu);
    c10::Device device = storage.device();
    c10::DeviceIndex old = tl_current_device;
    tl_current_device = device.index();
    auto data = g_allocator.allocate(newsize);
    tl_current_device = old;
    storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(data));
    storage.unsafeGetStorageImpl()->set_nbytes(newsize);
  }
};

// ---------------------------------------------------------------------------
// Structural kernels.
// ---------------------------------------------------------------------------
struct DeviceScope {
  explicit DeviceScope(std::optional<c10::Device> device) : saved_(tl_current_device) {
    if (device.has_value() && device->has_index()) {
      check_device_index(device->index());
      tl_current_device = device->index();
    }
  }
  ~DeviceScope() {
    tl_current_device = saved_;
  }
  c10::DeviceIndex saved_;
};

const c10::DispatchKeySet kTpuKeys(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(
    c10::IntArrayRef size,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Layout> layout,
    std::optional<at::Device> device,
    std::optional<bool> pin_memory,
    std::optional<at::MemoryFormat> memory_format) {
  DeviceScope scope(device);
  return at::detail::empty_generic(
      size, &g_allocator, kTpuKeys, c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(
    c10::IntArrayRef size,
    c10::IntArrayRef stride,
    std::optional<at::ScalarType> dtype,
    std::optional<at::Layout> layout,
    std::optional<at::Device> device,
    std::optional<bool> pin_memory) {
  DeviceScope scope(device);
  return at::detail::empty_strided_generic(
      size, stride, &g_allocator, kTpuKeys, c10::dtype_or_default(dtype));
}

at::Tensor as_strided(
    const at::Tensor& self,
    c10::IntArrayRef size,
    c10::IntArrayRef stride,
    std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

void grow_storage_if_needed(at::TensorImpl* impl) {
  if (impl->numel() == 0) {
    return;
  }
  const size_t needed = at::detail::computeStorageNbytes(
      impl->sizes(), impl->strides(), impl->dtype().itemsize(), impl->storage_offset());
  const c10::Storage& storage = impl->unsafe_storage();
  if (needed > storage.nbytes()) {
    at::native::resize_bytes_nocuda(storage, c10::SymInt(static_cast<int64_t>(needed)));
  }
}

const at::Tensor& resize_(
    const at::Tensor& self,
    c10::SymIntArrayRef size_sym,
    std::optional<at::MemoryFormat> memory_format) {
  auto size = C10_AS_INTARRAYREF_SLOW(size_sym);
  for (auto s : size) {
    TORCH_CHECK(s >= 0, "Trying to create tensor with negative dimension ", s, ": ", size);
  }
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_sizes_contiguous(size);
  if (memory_format.has_value()) {
    TORCH_CHECK(
        *memory_format != at::MemoryFormat::Preserve, "Unsupported memory format ", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  grow_storage_if_needed(impl);
  return self;
}

at::Tensor& set_source_storage_offset(
    at::Tensor& self,
    c10::Storage source,
    c10::SymInt storage_offset,
    c10::SymIntArrayRef size,
    c10::SymIntArrayRef stride) {
  const int64_t offset = storage_offset.expect_int();
  auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  auto strides = C10_AS_INTARRAYREF_SLOW(stride);
  at::native::checkSetStorage(self, source, offset, sizes, strides);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_offset(offset);
  at::OptionalIntArrayRef opt_strides = strides.data() != nullptr ? at::OptionalIntArrayRef(strides) : std::nullopt;
  if (opt_strides.has_value()) {
    impl->set_sizes_and_strides(sizes, *opt_strides);
  } else {
    impl->set_sizes_contiguous(sizes);
  }
  grow_storage_if_needed(impl);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  std::vector<c10::SymInt> size{c10::SymInt(numel)};
  std::vector<c10::SymInt> stride{c10::SymInt(1)};
  return set_source_storage_offset(self, std::move(source), c10::SymInt(0), size, stride);
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.unsafeGetTensorImpl() == source.unsafeGetTensorImpl()) {
    return self;
  }
  return set_source_storage_offset(
      self, source.storage(), source.sym_storage_offset(), source.sym_sizes(), source.sym_strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &g_allocator, true);
  std::vector<c10::SymInt> size{c10::SymInt(0)};
  std::vector<c10::SymInt> stride{c10::SymInt(1)};
  return set_source_storage_offset(self, std::move(storage), c10::SymInt(0), size, stride);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", unfold);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
}

// ---------------------------------------------------------------------------
// Python bindings.
// ---------------------------------------------------------------------------
at::Generator unwrap_generator(py::handle obj) {
  TORCH_CHECK_TYPE(THPGenerator_Check(obj.ptr()), "expected a torch.Generator");
  at::Generator gen = reinterpret_cast<THPGenerator*>(obj.ptr())->cdata;
  TORCH_CHECK(gen.device().type() == kTpu, "expected a tpu generator, got one on ", gen.device());
  return gen;
}

void register_collect(py::module& m);  // collect.cpp
void register_record(py::module& m);   // record.cpp
void register_op_key(py::module& m);   // op_key.cpp
void register_defer(py::module& m);    // defer.cpp
void register_precision(py::module& m);  // precision_tls.cpp
void register_kernel_front(py::module& m);  // kernel_front.cpp

// An op's new output: torch.empty_strided on tpu:index, plus its storage's device data set
// as the storage attribute `attr`. One call instead of three from Python (argument parsing,
// the dispatcher, untyped_storage()), for every op's every output. -> (tensor, storage)
py::tuple new_tensor_with_data(py::handle size_obj, py::handle stride_obj, py::handle dtype, int index,
                               py::handle attr, py::handle data) {
  TORCH_CHECK_TYPE(THPDtype_Check(dtype.ptr()), "expected a torch.dtype");
  TORCH_CHECK_TYPE(PyTuple_Check(size_obj.ptr()) && PyTuple_Check(stride_obj.ptr()),
                   "size and stride must be tuples");
  const auto type = reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
  const auto ints = [](py::handle values) {
    c10::SmallVector<int64_t, 8> out;
    for (py::handle v : values) out.push_back(PyLong_AsLongLong(v.ptr()));
    if (PyErr_Occurred()) throw py::error_already_set();
    return out;
  };
  const auto size = ints(size_obj);
  const auto stride = ints(stride_obj);
  TORCH_CHECK(size.size() == stride.size(), "size and stride differ in length");
  at::Tensor t;
  {
    DeviceScope scope(c10::Device(kTpu, static_cast<c10::DeviceIndex>(index)));
    t = at::detail::empty_strided_generic(size, stride, &g_allocator, kTpuKeys, type);
  }
  py::object storage = py::reinterpret_steal<py::object>(THPStorage_Wrap(t.storage()));
  if (!storage || PyObject_SetAttr(storage.ptr(), attr.ptr(), data.ptr()) != 0) {
    throw py::error_already_set();
  }
  py::object tensor = py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t)));
  return py::make_tuple(tensor, storage);
}

// A strided nested tensor's parts: its storage as a flat tensor and, per component, its
// sizes, strides and storage offset (int64 CPU tensors). PyTorch's nested kernels read them in
// C++ only; the tpu ones (torchtpu/nested.py) are written in Python.
py::tuple nested_parts(const at::Tensor& t) {
  TORCH_CHECK(t.is_nested() && t.layout() == at::kStrided, "expected a strided nested tensor");
  const auto* impl = at::native::get_nested_tensor_impl(t);
  return py::make_tuple(impl->get_unsafe_storage_as_tensor(), impl->get_nested_sizes(),
                        impl->get_nested_strides(), impl->get_storage_offsets());
}

void install() {
  static std::once_flag flag;
  std::call_once(flag, [] { at::RegisterPrivateUse1HooksInterface(new TpuHooks()); });
}

}  // namespace torchtpu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace torchtpu;
  m.doc() = "torchtpu C++ shim: allocator, device guard, hooks, structural kernels";
  m.def("_install", &install, "register the PrivateUse1 hooks");
  m.def("_set_device_count", [](int n) {
    TORCH_CHECK(n >= 1 && n <= kMaxDevices, "tpu device count must be in [1, ", kMaxDevices, "], got ", n);
    g_device_count.store(n);
  });
  m.def("_device_count", [] { return g_device_count.load(); });
  m.def("_current_device", [] { return static_cast<int>(current_device()); });
  m.def("_set_current_device", [](int index) {
    check_device_index(static_cast<c10::DeviceIndex>(index));
    tl_current_device = static_cast<c10::DeviceIndex>(index);
  });
  m.def("_default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(index))));
  });
  m.def("_next_seed", [](py::handle gen_obj) -> uint64_t {
    at::Generator gen = unwrap_generator(gen_obj);
    std::lock_guard<std::mutex> lock(gen.mutex());
    return static_cast<at::CPUGeneratorImpl*>(gen.unsafeGetGeneratorImpl())->random64();
  });
  m.def("_set_event_callbacks", [](py::object registry) {
    g_event_callbacks = new py::object(std::move(registry));  // leaked, as the synchronize callback
  });
  m.def("_set_memory_info_callback", [](py::object fn) {
    g_memory_info_callback = new py::object(std::move(fn));  // leaked, as the synchronize callback
  });
  m.def("_set_synchronize_callback", [](py::object fn) {
    // Leaked on purpose: it must outlive interpreter teardown ordering.
    g_synchronize_callback = new py::object(std::move(fn));
  });
  m.def("_memory_stats", [](int index) {
    check_device_index(static_cast<c10::DeviceIndex>(index));
    auto c = g_allocator.counters(static_cast<c10::DeviceIndex>(index));
    py::dict d;
    d["allocated_bytes"] = c.allocated_bytes;
    d["peak_bytes"] = c.peak_bytes;
    d["allocations"] = c.allocations;
    d["total_allocations"] = c.total_allocations;
    d["total_frees"] = c.total_frees;
    return d;
  });
  // pinned host memory (torch.tpu.host_memory_stats), in torch.cuda.host_memory_stats's names
  m.def("_host_memory_stats", []() {
    at::HostStats st = g_pinned_allocator.get_stats();
    py::dict d;
    auto put = [&d](const std::string& name, const c10::CachingAllocator::Stat& stat) {
      d[py::str(name + ".current")] = stat.current;
      d[py::str(name + ".peak")] = stat.peak;
      d[py::str(name + ".allocated")] = stat.allocated;
      d[py::str(name + ".freed")] = stat.freed;
    };
    put("allocations", st.allocations);
    put("allocated_bytes", st.allocated_bytes);
    put("active_requests", st.active_requests);
    put("active_bytes", st.active_bytes);
    d["num_host_alloc"] = st.num_host_alloc;
    d["num_host_free"] = st.num_host_free;
    return d;
  });
  m.def("_reset_host_memory_stats", [](bool peak) {
    if (peak) {
      g_pinned_allocator.reset_peak_stats();
    } else {
      g_pinned_allocator.reset_accumulated_stats();
    }
  });
  m.def("_set_memory_limit", [](int index, int64_t bytes) {
    g_allocator.set_limit(static_cast<c10::DeviceIndex>(index), bytes);
  });
  m.def("_memory_limit", [](int index) { return g_allocator.limit(static_cast<c10::DeviceIndex>(index)); });
  m.def("_reset_peak_memory", [](int index) {
    g_allocator.resetPeakStats(static_cast<c10::DeviceIndex>(index));
  });
  m.def("_nested_parts", &nested_parts,
        "(storage as a flat tensor, sizes, strides, offsets) of a strided nested tensor");
  m.def("_new_tensor", &new_tensor_with_data,
        "(tensor, storage): a new tpu tensor whose storage attribute `attr` is `data`");
  register_collect(m);
  register_record(m);
  register_op_key(m);
  register_defer(m);
  register_precision(m);
  register_kernel_front(m);
}
