#include "core/parallel/flat_slices.h"

#include <algorithm>

namespace distlab {

std::vector<std::vector<Strategy::Slice>> flat_slices(const std::vector<FlatParam>& flats, int rank) {
  std::vector<std::vector<Strategy::Slice>> out;
  for (const FlatParam& f : flats) {
    std::vector<Strategy::Slice> v;
    const int64_t lo = int64_t(rank) * f.shard, hi = lo + f.shard;  // this rank's elements of the flat vector
    for (size_t i = 0; i < f.params.size(); i++) {
      const int64_t a = std::max(lo, f.offset[i]), b = std::min(hi, f.offset[i] + f.params[i]->data.numel());
      if (a < b) v.push_back({f.params[i], a - f.offset[i], a - lo, b - a});
    }
    out.push_back(std::move(v));  // padding only: an empty list
  }
  return out;
}

}  // namespace distlab
