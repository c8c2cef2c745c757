#include "core/comm/store.h"

#include <fmt/format.h>

#include <cstdint>

#include "core/comm/errors.h"

namespace distlab {

void store_timeout(const std::vector<std::string>& missing, Millis timeout, const std::string& where) {
  std::string keys;
  for (size_t i = 0; i < missing.size() && i < 8; i++) keys += (i ? ", " : "") + missing[i];
  if (missing.size() > 8) keys += fmt::format(" and {} more", missing.size() - 8);
  throw StoreError(fmt::format("{}: timed out after {:.1f} s waiting for key(s) {}", where, timeout.count() / 1000.0, keys),
                   "a rank that should have written them did not start, or died: check every rank's output "
                   "(distlab run --log-dir), MASTER_ADDR/MASTER_PORT, and that all ranks run the same job");
}

void MemoryStore::set(const std::string& key, const std::vector<char>& value) {
  {
    std::lock_guard<std::mutex> g(mu_);
    data_[key] = value;
  }
  cv_.notify_all();
}

std::vector<char> MemoryStore::get(const std::string& key) {
  std::unique_lock<std::mutex> l(mu_);
  if (!cv_.wait_for(l, timeout_, [&] { return aborted_ || data_.count(key) > 0; })) {
    l.unlock();
    store_timeout({key}, timeout_, "store get");
  }
  if (!data_.count(key)) throw StoreError("the rendezvous store shut down");
  return data_.at(key);
}

void MemoryStore::wait(const std::vector<std::string>& keys, const Millis& timeout) {
  std::unique_lock<std::mutex> l(mu_);
  auto all = [&] {
    if (aborted_) return true;
    for (const auto& k : keys)
      if (!data_.count(k)) return false;
    return true;
  };
  if (!cv_.wait_for(l, timeout, all)) {
    std::vector<std::string> missing;
    for (const auto& k : keys)
      if (!data_.count(k)) missing.push_back(k);
    l.unlock();
    store_timeout(missing, timeout, "store wait");
  }
  if (aborted_) throw StoreError("the rendezvous store shut down");
}

void MemoryStore::abort_waits() {
  {
    std::lock_guard<std::mutex> g(mu_);
    aborted_ = true;
  }
  cv_.notify_all();
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = data_.find(key);
    if (it != data_.end()) {
      const std::string text(it->second.begin(), it->second.end());
      size_t used = 0;
      try {
        v = std::stoll(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != text.size())
        throw StoreError(fmt::format("store add on key '{}': its value is not an integer", key.substr(0, 200)),
                         "add works on keys written by add (counters); use another key name");
    }
    if ((delta > 0 && v > INT64_MAX - delta) || (delta < 0 && v < INT64_MIN - delta))
      throw StoreError(fmt::format("store add on key '{}': {} + {} overflows a 64-bit integer", key.substr(0, 200), v, delta));
    v += delta;
    std::string s = std::to_string(v);
    data_[key] = std::vector<char>(s.begin(), s.end());
  }
  cv_.notify_all();
  return v;
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> g(mu_);
  for (const auto& k : keys)
    if (!data_.count(k)) return false;
  return true;
}

size_t MemoryStore::size() {
  std::lock_guard<std::mutex> g(mu_);
  return data_.size();
}

}  // namespace distlab
