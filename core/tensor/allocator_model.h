// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, default settings): what
// it would RESERVE from the driver for a rank's sequence of allocations and frees, beside what the tensors
// hold (MemoryAccountant's "allocated"). torch.cuda.max_memory_reserved() — what torchtitan and most
// training logs report as "memory" — is this number, and it is what must fit on the card.
//
// The rules modeled, each PyTorch's:
//   - sizes round up to 512 B (kMinBlockSize);
//   - requests of ≤ 1 MiB come from the small pool, others from the large pool;
//   - a new segment (one cudaMalloc) is 2 MiB for a small request, 20 MiB for a large one under 10 MiB,
//     and the request rounded up to 2 MiB above that;
//   - a request takes the smallest free block of its pool and stream that is big enough (best fit, then
//     the lowest address), split when the rest is ≥ 512 B (small pool) or > 1 MiB (large pool);
//   - a freed block merges with its free neighbours in the same segment; a segment goes back to the driver
//     only on empty_cache() (torch.cuda.empty_cache(): every segment with nothing in use), or when a new
//     segment would pass the card's capacity (then the free segments go first, as PyTorch's retry does);
//   - one pool per stream: blocks freed by one stream are not handed to another. Collective buffers
//     (Category::comm_buffers: FSDP2's all-gather outputs and reduce-scatter inputs, which PyTorch allocates
//     on the collectives' streams) come from a second stream's pools.
// Not modeled: expandable_segments, max_split_size_mb, garbage_collection_threshold, empty_cache() calls,
// and the CUDA context and libraries' workspaces (outside the allocator: `distlab plan` keeps a margin).
// Read next: core/tensor/memory.h (the accountant that feeds it).
#pragma once
#include <cstddef>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

namespace distlab {

class CachingAllocatorModel {
 public:
  enum class StreamId { compute = 0, comm = 1 };
  // A block id for free(); every allocation of size ≥ 0 gets one.
  // capacity < 0: unlimited; else the free segments are released before a new one would pass it
  int64_t allocate(int64_t bytes, StreamId stream, int64_t capacity = -1);
  void free(int64_t id);
  void empty_cache();  // every segment with nothing in use goes back
  int64_t reserved() const { return reserved_; }   // bytes of all segments (torch.cuda.memory_reserved)
  int64_t allocated() const { return allocated_; }  // bytes of the rounded blocks in use
  int64_t segments() const { return int64_t(segment_count_); }

  static int64_t round_size(int64_t bytes);        // up to a multiple of 512, at least 512
  static int64_t segment_size(int64_t rounded);    // the cudaMalloc a request that finds no block makes

 private:
  struct Block {
    int64_t addr = 0, size = 0;
    int pool = 0;                    // stream * 2 + (large ? 1 : 0)
    bool in_use = false;
    int64_t prev = -1, next = -1;    // neighbours in the same segment
  };
  using FreeKey = std::tuple<int64_t, int64_t, int64_t>;  // size, addr, id
  std::vector<Block> blocks_;
  std::vector<int64_t> spare_ids_;
  std::set<FreeKey> free_[4];
  int64_t next_addr_ = 0, reserved_ = 0, allocated_ = 0;
  size_t segment_count_ = 0;

  int64_t new_id();
  void insert_free(int64_t id) { free_[blocks_[size_t(id)].pool].insert({blocks_[size_t(id)].size, blocks_[size_t(id)].addr, id}); }
  void erase_free(int64_t id) { free_[blocks_[size_t(id)].pool].erase({blocks_[size_t(id)].size, blocks_[size_t(id)].addr, id}); }
};

}  // namespace distlab
