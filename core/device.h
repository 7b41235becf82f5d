// Device: where buffers live (host memory, CUDA device memory), with per-category accounting.
//
// Engine code is written once against this interface. CpuDevice is the reference backend; the CUDA
// device (built with ZRT_WITH_CUDA) implements the same interface.
//
// Ownership: a DeviceBuffer owns its allocation and returns it to its Device on destruction; the
// Device must outlive every buffer it handed out. Thread-safety: Allocate/Free and the MemoryTracker
// are thread-safe; a DeviceBuffer is not shared between threads without external synchronisation.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "zrt/core/status.h"

namespace zrt {

enum class MemCategory : uint8_t {
  kParameters = 0,
  kGradients,
  kOptimizerState,
  kCommunication,
  kStaging,
  kOther,
};
inline constexpr int kNumMemCategories = 6;
std::string_view MemCategoryName(MemCategory c);

// Current and peak bytes per category (and in total). Lock-free; peaks are exact per category and for
// the total (each update raises the peak with a CAS loop).
class MemoryTracker {
 public:
  struct Snapshot {
    std::array<int64_t, kNumMemCategories> current{};
    std::array<int64_t, kNumMemCategories> peak{};
    int64_t total_current = 0;
    int64_t total_peak = 0;
    int64_t current_of(MemCategory c) const { return current[static_cast<int>(c)]; }
    int64_t peak_of(MemCategory c) const { return peak[static_cast<int>(c)]; }
    // A small table, one line per category: "parameters   current 1.50 GiB   peak 2.00 GiB".
    std::string ToString() const;
  };

  void Add(MemCategory c, int64_t bytes);
  void Sub(MemCategory c, int64_t bytes);
  // Resets peaks to the current values (e.g. to measure one step).
  void ResetPeaks();
  Snapshot Read() const;

 private:
  static void RaisePeak(std::atomic<int64_t>& peak, int64_t value);
  std::array<std::atomic<int64_t>, kNumMemCategories> current_{};
  std::array<std::atomic<int64_t>, kNumMemCategories> peak_{};
  std::atomic<int64_t> total_current_{0};
  std::atomic<int64_t> total_peak_{0};
};

enum class DeviceKind : uint8_t { kCpu, kCuda };
std::string_view DeviceKindName(DeviceKind k);

class Device;

// Owning, move-only handle to memory allocated by a Device.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  void* data() { return ptr_; }
  const void* data() const { return ptr_; }
  template <typename T>
  T* as() { return static_cast<T*>(ptr_); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(ptr_); }
  size_t size() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }
  MemCategory category() const { return category_; }
  Device* device() const { return device_; }
  // Frees the memory now (the handle becomes empty).
  void Reset();

 private:
  friend class Device;
  DeviceBuffer(Device* d, void* p, size_t bytes, MemCategory c) : device_(d), ptr_(p), bytes_(bytes), category_(c) {}
  Device* device_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  MemCategory category_ = MemCategory::kOther;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  // "cpu" or "cuda:0".
  virtual std::string name() const = 0;

  // Allocates `bytes` (zero is allowed and gives an empty buffer) aligned to `alignment` (a power of
  // two; 64 by default, 4096 for buffers used with O_DIRECT). Contents are unspecified.
  Result<DeviceBuffer> Allocate(size_t bytes, MemCategory category, size_t alignment = 64);

  // Whether the host may read and write this device's buffers directly. When false (CUDA), code
  // that needs the values on the host goes through Copy (or the runtime's Compute).
  virtual bool host_accessible() const { return true; }

  // Synchronous copy between this device's buffers and host memory, in any direction (host pointers
  // only for CpuDevice); dst and src may overlap only on CpuDevice (memmove).
  virtual Status Copy(void* dst, const void* src, size_t bytes) = 0;
  virtual Status Fill(void* dst, uint8_t byte, size_t bytes) = 0;

  MemoryTracker& memory() { return memory_; }
  const MemoryTracker& memory() const { return memory_; }

 protected:
  virtual Result<void*> RawAllocate(size_t bytes, size_t alignment) = 0;
  virtual void RawFree(void* p, size_t bytes) = 0;

 private:
  friend class DeviceBuffer;
  void Release(DeviceBuffer& b);
  MemoryTracker memory_;
};

// Host memory through posix_memalign. Thread-safe.
//
// CpuDevice(false) reports host_accessible() == false: the engine and checkpoints then treat its memory
// as they treat GPU memory (staged copies, the Compute path), so the CPU test suites run the data paths
// of the CUDA backend too. The memory is ordinary host memory either way.
class CpuDevice final : public Device {
 public:
  explicit CpuDevice(bool host_accessible = true) : host_accessible_(host_accessible) {}
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return host_accessible_ ? "cpu" : "cpu (as device memory)"; }
  bool host_accessible() const override { return host_accessible_; }
  Status Copy(void* dst, const void* src, size_t bytes) override;
  Status Fill(void* dst, uint8_t byte, size_t bytes) override;

 protected:
  Result<void*> RawAllocate(size_t bytes, size_t alignment) override;
  void RawFree(void* p, size_t bytes) override;

 private:
  bool host_accessible_;
};

// "1.50 GiB", "12.0 KiB", "17 B".
std::string FormatBytes(int64_t bytes);

// A caching allocator's figures (CudaDevice::allocator_stats).
struct AllocatorStats {
  int64_t live_bytes = 0;     // handed out (rounded sizes)
  int64_t cached_bytes = 0;   // free, kept for reuse
  int64_t backend_allocs = 0; // calls to backend.allocate that succeeded
  int64_t hits = 0;           // requests served from the cache
};

}  // namespace zrt
