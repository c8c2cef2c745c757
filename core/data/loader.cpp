#include "core/data/loader.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/util/error.h"

namespace distlab {

DataLoader::DataLoader(const Dataset& d, std::shared_ptr<Sampler> s, int64_t b, bool drop_last)
    : data_(d), sampler_(std::move(s)), batch_(b), drop_last_(drop_last) {
  if (b <= 0) throw ConfigError(fmt::format("batch size {} must be positive", b));
}

int64_t DataLoader::batches_per_epoch() const {
  int64_t n = sampler_->size();
  return drop_last_ ? n / batch_ : (n + batch_ - 1) / batch_;
}

void DataLoader::start_epoch(int64_t epoch) {
  epoch_ = epoch;
  pos_ = 0;
  order_ = sampler_->indices(epoch);
}

void DataLoader::seek(int64_t epoch, int64_t batches) {
  start_epoch(epoch);
  pos_ = std::clamp<int64_t>(batches, 0, batches_per_epoch());
}

bool DataLoader::next(Runtime& rt, Batch& out) {
  if (epoch_ < 0) start_epoch(0);
  if (pos_ >= batches_per_epoch()) return false;
  const int64_t begin = pos_ * batch_;
  const int64_t end = std::min<int64_t>(begin + batch_, int64_t(order_.size()));
  std::vector<int64_t> idx(order_.begin() + begin, order_.begin() + end);
  out = data_.make_batch(rt, idx);
  pos_++;
  return true;
}

}  // namespace distlab
