#include "zrt/core/device.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace zrt {

std::string_view MemCategoryName(MemCategory c) {
  switch (c) {
    case MemCategory::kParameters: return "parameters";
    case MemCategory::kGradients: return "gradients";
    case MemCategory::kOptimizerState: return "optimizer_state";
    case MemCategory::kCommunication: return "communication";
    case MemCategory::kStaging: return "staging";
    case MemCategory::kOther: return "other";
  }
  return "invalid";
}

std::string_view DeviceKindName(DeviceKind k) { return k == DeviceKind::kCpu ? "cpu" : "cuda"; }

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

// ---- MemoryTracker ---------------------------------------------------------------------------------
void MemoryTracker::RaisePeak(std::atomic<int64_t>& peak, int64_t value) {
  int64_t p = peak.load(std::memory_order_relaxed);
  while (value > p && !peak.compare_exchange_weak(p, value, std::memory_order_relaxed)) {
  }
}

void MemoryTracker::Add(MemCategory c, int64_t bytes) {
  const int i = static_cast<int>(c);
  RaisePeak(peak_[i], current_[i].fetch_add(bytes, std::memory_order_relaxed) + bytes);
  RaisePeak(total_peak_, total_current_.fetch_add(bytes, std::memory_order_relaxed) + bytes);
}

void MemoryTracker::Sub(MemCategory c, int64_t bytes) {
  current_[static_cast<int>(c)].fetch_sub(bytes, std::memory_order_relaxed);
  total_current_.fetch_sub(bytes, std::memory_order_relaxed);
}

void MemoryTracker::ResetPeaks() {
  for (int i = 0; i < kNumMemCategories; ++i) peak_[i].store(current_[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
  total_peak_.store(total_current_.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

MemoryTracker::Snapshot MemoryTracker::Read() const {
  Snapshot s;
  for (int i = 0; i < kNumMemCategories; ++i) {
    s.current[i] = current_[i].load(std::memory_order_relaxed);
    s.peak[i] = peak_[i].load(std::memory_order_relaxed);
  }
  s.total_current = total_current_.load(std::memory_order_relaxed);
  s.total_peak = total_peak_.load(std::memory_order_relaxed);
  return s;
}

std::string MemoryTracker::Snapshot::ToString() const {
  std::ostringstream os;
  char line[128];
  for (int i = 0; i < kNumMemCategories; ++i) {
    std::snprintf(line, sizeof(line), "%-16s current %12s   peak %12s\n",
                  std::string(MemCategoryName(static_cast<MemCategory>(i))).c_str(),
                  FormatBytes(current[i]).c_str(), FormatBytes(peak[i]).c_str());
    os << line;
  }
  std::snprintf(line, sizeof(line), "%-16s current %12s   peak %12s\n", "total",
                FormatBytes(total_current).c_str(), FormatBytes(total_peak).c_str());
  os << line;
  return std::move(os).str();
}

// ---- DeviceBuffer / Device -------------------------------------------------------------------------
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    device_ = std::exchange(o.device_, nullptr);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    category_ = o.category_;
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (device_ != nullptr) device_->Release(*this);
  device_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

Result<DeviceBuffer> Device::Allocate(size_t bytes, MemCategory category, size_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return InvalidArgumentError("allocation alignment ", alignment, " is not a power of two");
  }
  if (bytes == 0) return DeviceBuffer();
  ASSIGN_OR_RETURN(void* p, RawAllocate(bytes, alignment), "allocating ", FormatBytes(static_cast<int64_t>(bytes)),
                   " of ", MemCategoryName(category), " on ", name());
  memory_.Add(category, static_cast<int64_t>(bytes));
  return DeviceBuffer(this, p, bytes, category);
}

void Device::Release(DeviceBuffer& b) {
  if (b.ptr_ == nullptr) return;
  RawFree(b.ptr_, b.bytes_);
  memory_.Sub(b.category_, static_cast<int64_t>(b.bytes_));
}

// ---- CpuDevice -------------------------------------------------------------------------------------
Result<void*> CpuDevice::RawAllocate(size_t bytes, size_t alignment) {
  void* p = nullptr;
  const int rc = posix_memalign(&p, alignment < sizeof(void*) ? sizeof(void*) : alignment, bytes);
  if (rc != 0) return ErrnoStatus(rc, "posix_memalign");
  return p;
}

void CpuDevice::RawFree(void* p, size_t /*bytes*/) { std::free(p); }

Status CpuDevice::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes != 0 && (dst == nullptr || src == nullptr)) return InvalidArgumentError("cpu copy: null pointer");
  if (bytes != 0) std::memmove(dst, src, bytes);
  return Status();
}

Status CpuDevice::Fill(void* dst, uint8_t byte, size_t bytes) {
  if (bytes != 0 && dst == nullptr) return InvalidArgumentError("cpu fill: null pointer");
  if (bytes != 0) std::memset(dst, byte, bytes);
  return Status();
}

}  // namespace zrt
