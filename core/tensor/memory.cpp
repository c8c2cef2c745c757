#include "core/tensor/memory.h"

#include <fmt/format.h>

#include <sys/mman.h>

#include <cstdlib>

#include "core/util/error.h"
#include "core/util/units.h"

namespace distlab {

const char* category_name(Category c) {
  switch (c) {
    case Category::params: return "params";
    case Category::grads: return "grads";
    case Category::optim_state: return "optim_state";
    case Category::activations: return "activations";
    case Category::comm_buffers: return "comm_buffers";
    case Category::other: return "other";
    case Category::host: return "host";
  }
  return "?";
}

int64_t MemoryAccountant::allocate(int64_t bytes, Category c, const std::string& what) {
  const bool on_device = c != Category::host;
  if (on_device && capacity_ >= 0 && stats_.current_total + bytes > capacity_) {
    int64_t free_bytes = capacity_ - stats_.current_total;
    throw OutOfMemoryError(
        fmt::format("out of memory: tried to allocate {} for {} ({}) on rank {} ({}; {} total capacity; "
                    "{} already allocated; {} free)\n  allocated by category: {}",
                    format_bytes(double(bytes)), category_name(c), what, rank_, device_,
                    format_bytes(double(capacity_)), format_bytes(double(stats_.current_total)),
                    format_bytes(double(free_bytes)), breakdown()),
        "climb the OOM ladder: smaller train.micro_batch (keep the total with train.accum_steps), "
        "then shard (ZeRO/FSDP), then offload; or give the device more memory with --device-mem");
  }
  int i = int(c);
  stats_.current[i] += bytes;
  if (stats_.current[i] > stats_.peak[i]) stats_.peak[i] = stats_.current[i];
  if (!on_device) return -1;
  stats_.current_total += bytes;
  if (stats_.current_total > stats_.peak_total) {
    stats_.peak_total = stats_.current_total;
    stats_.at_peak = stats_.current;
  }
  if (bytes == 0) return -1;  // PyTorch hands out no block for an empty tensor
  const int64_t id = model_.allocate(bytes, c == Category::comm_buffers ? CachingAllocatorModel::StreamId::comm : CachingAllocatorModel::StreamId::compute,
                                     capacity_);
  stats_.reserved_current = model_.reserved();
  stats_.reserved_peak = std::max(stats_.reserved_peak, stats_.reserved_current);
  return id;
}

void MemoryAccountant::release(int64_t bytes, Category c, int64_t model_block) {
  stats_.current[int(c)] -= bytes;
  if (c != Category::host) stats_.current_total -= bytes;
  if (model_block >= 0) model_.free(model_block);
  DL_ASSERT(stats_.current[int(c)] >= 0, "memory accounting went negative");
}

void MemoryAccountant::reset_peaks() {
  stats_.reserved_peak = stats_.reserved_current;  // segments are kept: what is reserved now stays reserved
  stats_.peak = stats_.current;
  stats_.peak_total = stats_.current_total;
  stats_.at_peak = stats_.current;
  if (device_memory_) device_memory_->reset_held_peak();
}

static int64_t round_block(int64_t bytes) { return (bytes + 4095) / 4096 * 4096; }

// Blocks of 2 MiB and more are mapped on their own, starting on a 2 MiB boundary, and offered to the
// kernel's transparent huge pages (madvise, as glibc.malloc.hugetlb=1 does): the first touch of a block
// then faults once per 2 MiB instead of once per 4 KiB. Measured on the 2-core VMs this project runs on,
// first touch costs 2.6 ms per MiB in 4 KiB pages and 0.06-0.16 ms per MiB in huge ones; the short
// training jobs of tests and grading touch their activations once or a few times. A block's tail past its
// last 2 MiB boundary stays in 4 KiB pages, so no block holds more memory than it asked for. Where the
// kernel has no huge pages (THP "never"), madvise fails and the block is an ordinary mapping.
static constexpr int64_t kHugePage = int64_t(2) << 20;

static void* map_block(int64_t size) {
  if (size < kHugePage) return std::aligned_alloc(64, size_t(size));
  // map a huge page more than asked, keep the part that starts on a 2 MiB boundary
  void* raw = mmap(nullptr, size_t(size + kHugePage), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (base + uintptr_t(kHugePage) - 1) & ~uintptr_t(kHugePage - 1);
  if (start > base) munmap(raw, start - base);
  const uintptr_t end = base + uintptr_t(size + kHugePage);
  if (end > start + uintptr_t(size)) munmap(reinterpret_cast<void*>(start + uintptr_t(size)), end - start - uintptr_t(size));
  madvise(reinterpret_cast<void*>(start), size_t(size), MADV_HUGEPAGE);  // a hint: ignored where THP is off
  return reinterpret_cast<void*>(start);
}

static void unmap_block(void* p, int64_t size) {
  if (size < kHugePage) std::free(p);
  else munmap(p, size_t(size));
}

void* MemoryAccountant::host_alloc(int64_t bytes) {
  const int64_t size = round_block(bytes);
  auto it = free_blocks_.find(size);
  if (it != free_blocks_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    return p;
  }
  void* p = map_block(size);
  if (p) reserved_ += size;
  return p;
}

void MemoryAccountant::host_free(void* p, int64_t bytes) {
  if (p) free_blocks_[round_block(bytes)].push_back(p);
}

void MemoryAccountant::empty_cache() {
  model_.empty_cache();
  stats_.reserved_current = model_.reserved();
  for (auto& [size, blocks] : free_blocks_) {
    for (void* p : blocks) unmap_block(p, size);
    reserved_ -= size * int64_t(blocks.size());
  }
  free_blocks_.clear();
}

MemoryAccountant::~MemoryAccountant() {
  for (auto& [size, blocks] : free_blocks_)
    for (void* p : blocks) unmap_block(p, size);
}

std::string MemoryAccountant::breakdown() const {
  std::string s;
  for (int i = 0; i < kNumCategories; i++) {
    if (i) s += ", ";
    s += fmt::format("{} {}", category_name(Category(i)), format_bytes(double(stats_.current[i])));
  }
  return s;
}

}  // namespace distlab
