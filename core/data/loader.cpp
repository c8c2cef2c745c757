#include "core/data/loader.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/tensor/on_host.h"
#include "core/util/error.h"

namespace distlab {

DataLoader::DataLoader(const Dataset& d, std::shared_ptr<Sampler> s, int64_t b, bool drop_last, bool check_finite)
    : data_(d), sampler_(std::move(s)), batch_(b), drop_last_(drop_last), check_finite_(check_finite) {
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
  if (check_finite_) check(out, idx);
  pos_++;
  return true;
}

void DataLoader::check(const Batch& b, const std::vector<int64_t>& idx) const {
  OnHost xh(b.x);  // a GPU rank's batch: a host copy (data.check_finite costs one more copy down)
  const float* x = xh.p;
  if (!x || b.B == 0) return;  // token ids are integers; the meta device has no values
  const int64_t per = b.x.numel() / b.B;
  std::string bad;
  int64_t first_count = 0, records = 0;
  for (int64_t i = 0; i < b.B; i++) {
    int64_t count = 0;
    for (int64_t k = 0; k < per; k++) count += !std::isfinite(x[i * per + k]);
    if (!count) continue;
    if (records++ == 0) first_count = count;
    if (records <= 5) bad += fmt::format("{}{}", bad.empty() ? "" : ", ", data_.source_index(idx[size_t(i)]));
  }
  if (records)
    throw DataError(fmt::format("the input holds NaN or Inf: train record{} {}{} ({} of its {} values) in batch {} of epoch {}", records == 1 ? "" : "s",
                                bad, records > 5 ? fmt::format(" and {} more", records - 5) : "", first_count, per, pos_ + 1, epoch_),
                    "a corrupt record: fix it in the data, or leave it out (data.exclude = [index, ...])");
}

}  // namespace distlab
