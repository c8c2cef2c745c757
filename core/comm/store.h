// The rendezvous store: a small key/value service every rank of a job can reach (set, blocking get, add,
// wait). It carries Gloo's connection addresses, collective fingerprints in debug mode, and which ranks
// reached a collective (for timeout messages). Our Store *is* a gloo::rendezvous::Store, so Gloo's
// connectFullMesh uses it directly.
//
// Two implementations: MemoryStore (ranks as threads in one process, for unit tests — Gloo's own tests
// use a HashStore the same way) and TcpStore (ranks as processes; the launcher hosts the server).
#pragma once
#include <gloo/rendezvous/store.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace distlab {

using Millis = std::chrono::milliseconds;

class Store : public gloo::rendezvous::Store {
 public:
  explicit Store(Millis timeout = Millis(300000)) : timeout_(timeout) {}
  // gloo's interface (get blocks until the key exists or the timeout passes)
  void set(const std::string& key, const std::vector<char>& value) override = 0;
  std::vector<char> get(const std::string& key) override = 0;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const Millis& timeout) override = 0;
  // ours
  virtual int64_t add(const std::string& key, int64_t delta) = 0;  // atomic; returns the new value
  virtual bool check(const std::vector<std::string>& keys) = 0;     // all exist, without waiting
  void set_string(const std::string& key, const std::string& v) { set(key, std::vector<char>(v.begin(), v.end())); }
  std::string get_string(const std::string& key) {
    auto v = get(key);
    return std::string(v.begin(), v.end());
  }
  Millis timeout() const { return timeout_; }
  void set_timeout(Millis t) { timeout_ = t; }

 protected:
  Millis timeout_;
};

// Keys prefixed with "<prefix>/": one store shared by several groups or jobs without collisions.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, Store& inner) : Store(inner.timeout()), prefix_(std::move(prefix)), inner_(inner) {}
  void set(const std::string& k, const std::vector<char>& v) override { inner_.set(key(k), v); }
  std::vector<char> get(const std::string& k) override { return inner_.get(key(k)); }
  using Store::wait;
  void wait(const std::vector<std::string>& keys, const Millis& t) override { inner_.wait(keys_of(keys), t); }
  int64_t add(const std::string& k, int64_t d) override { return inner_.add(key(k), d); }
  bool check(const std::vector<std::string>& keys) override { return inner_.check(keys_of(keys)); }

 private:
  std::string key(const std::string& k) const { return prefix_ + "/" + k; }
  std::vector<std::string> keys_of(const std::vector<std::string>& ks) const {
    std::vector<std::string> r;
    for (const auto& k : ks) r.push_back(key(k));
    return r;
  }
  std::string prefix_;
  Store& inner_;
};

class MemoryStore : public Store {
 public:
  using Store::Store;
  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, const Millis& timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::vector<std::string>& keys) override;
  void abort_waits();  // wakes every blocked get/wait with a StoreError (server shutdown)
  size_t size();       // the keys it holds

 private:
  bool aborted_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> data_;
};

// Throws a StoreError naming the keys still missing after the timeout.
[[noreturn]] void store_timeout(const std::vector<std::string>& missing, Millis timeout, const std::string& where);

}  // namespace distlab
