// PyTorch's caching allocator, as a model of the bytes it reserves. See allocator_model.h for the rules.
#include "core/tensor/allocator_model.h"

#include "core/util/error.h"

namespace distlab {

namespace {
constexpr int64_t kMinBlockSize = 512;            // every size rounds up to a multiple of this
constexpr int64_t kSmallSize = int64_t(1) << 20;  // ≤ 1 MiB: the small pool
constexpr int64_t kSmallBuffer = int64_t(2) << 20;   // a small pool's segment
constexpr int64_t kLargeBuffer = int64_t(20) << 20;  // a large pool's segment for requests under 10 MiB
constexpr int64_t kMinLargeAlloc = int64_t(10) << 20;
constexpr int64_t kRoundLarge = int64_t(2) << 20;    // larger requests: their own segment, rounded to 2 MiB
}  // namespace

int64_t CachingAllocatorModel::round_size(int64_t bytes) {
  if (bytes < kMinBlockSize) return kMinBlockSize;
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

int64_t CachingAllocatorModel::segment_size(int64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

int64_t CachingAllocatorModel::new_id() {
  if (!spare_ids_.empty()) {
    const int64_t id = spare_ids_.back();
    spare_ids_.pop_back();
    blocks_[size_t(id)] = Block{};
    return id;
  }
  blocks_.push_back(Block{});
  return int64_t(blocks_.size()) - 1;
}

int64_t CachingAllocatorModel::allocate(int64_t bytes, StreamId stream, int64_t capacity) {
  DL_ASSERT(bytes >= 0, "allocator model: a negative size");
  const int64_t size = round_size(bytes);
  const bool large = size > kSmallSize;
  const int pool = int(stream) * 2 + (large ? 1 : 0);
  // best fit: the smallest free block of the pool that holds `size`, the lowest address among equals
  int64_t id = -1;
  auto it = free_[pool].lower_bound({size, INT64_MIN, INT64_MIN});
  if (it != free_[pool].end()) {
    id = std::get<2>(*it);
    free_[pool].erase(it);
  } else {  // no block: a new segment (cudaMalloc), one free block as big as the segment
    const int64_t seg = segment_size(size);
    if (capacity >= 0 && reserved_ + seg > capacity) empty_cache();  // cudaMalloc failed: free the cached segments, retry
    id = new_id();
    blocks_[size_t(id)] = Block{next_addr_, seg, pool, false, -1, -1};
    next_addr_ += seg;
    reserved_ += seg;
    segment_count_++;
  }
  Block& b = blocks_[size_t(id)];
  const int64_t rest = b.size - size;
  if (large ? rest > kSmallSize : rest >= kMinBlockSize) {  // split: the rest stays free, after the block
    const int64_t rest_id = new_id();
    Block& b2 = blocks_[size_t(id)];  // new_id may have moved the vector
    blocks_[size_t(rest_id)] = Block{b2.addr + size, rest, pool, false, id, b2.next};
    if (b2.next >= 0) blocks_[size_t(b2.next)].prev = rest_id;
    b2.next = rest_id;
    b2.size = size;
    insert_free(rest_id);
  }
  Block& used = blocks_[size_t(id)];
  used.in_use = true;
  allocated_ += used.size;
  return id;
}

void CachingAllocatorModel::free(int64_t id) {
  DL_ASSERT(id >= 0 && id < int64_t(blocks_.size()) && blocks_[size_t(id)].in_use, "allocator model: freeing a block not in use");
  Block& b = blocks_[size_t(id)];
  b.in_use = false;
  allocated_ -= b.size;
  // merge with the free neighbours of the same segment (a neighbour of a segment is always in its pool)
  for (int64_t other : {b.prev, b.next}) {
    if (other < 0 || blocks_[size_t(other)].in_use) continue;
    erase_free(other);
    Block& me = blocks_[size_t(id)];
    Block& o = blocks_[size_t(other)];
    if (other == me.prev) {  // o, me -> o absorbs me's bytes; me takes o's place
      me.addr = o.addr;
      me.prev = o.prev;
      if (o.prev >= 0) blocks_[size_t(o.prev)].next = id;
    } else {
      me.next = o.next;
      if (o.next >= 0) blocks_[size_t(o.next)].prev = id;
    }
    me.size += o.size;
    spare_ids_.push_back(other);
  }
  insert_free(id);
}

void CachingAllocatorModel::empty_cache() {
  for (auto& pool : free_)
    for (auto it = pool.begin(); it != pool.end();) {
      const int64_t id = std::get<2>(*it);
      const Block& b = blocks_[size_t(id)];
      if (b.prev >= 0 || b.next >= 0) {  // part of a segment that still has a block in use
        ++it;
        continue;
      }
      reserved_ -= b.size;
      segment_count_--;
      spare_ids_.push_back(id);
      it = pool.erase(it);
    }
}

}  // namespace distlab
