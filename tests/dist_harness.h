// Ranks as threads in one process, over an in-memory store — how Gloo's own tests run collectives.
#pragma once
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/comm/process_group.h"

namespace distlab::testing {

// Runs fn(pg) on `world` ranks; returns each rank's exception (or nullptr).
inline std::vector<std::exception_ptr> run_ranks_collect(int world, const std::function<void(ProcessGroup&)>& fn,
                                                          ProcessGroupOptions opts = {}, Millis store_timeout = Millis(20000)) {
  MemoryStore store(store_timeout);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; r++) {
    threads.emplace_back([&, r] {
      try {
        ProcessGroup pg(store, r, world, opts);
        fn(pg);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// The same, rethrowing the first exception (by rank) after all threads finish.
inline void run_ranks(int world, const std::function<void(ProcessGroup&)>& fn, ProcessGroupOptions opts = {},
                      Millis store_timeout = Millis(20000)) {
  for (auto& e : run_ranks_collect(world, fn, opts, store_timeout))
    if (e) std::rethrow_exception(e);
}

inline std::string message_of(const std::exception_ptr& e) {
  try {
    if (e) std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return "";
}

}  // namespace distlab::testing
