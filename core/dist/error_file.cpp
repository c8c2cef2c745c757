#include "core/dist/error_file.h"

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/dist/errors.h"

namespace distlab {

void record_worker_error(const std::exception& e) {
  const char* path = std::getenv("DISTLAB_ERROR_FILE");
  if (!path || !*path) return;
  const long long now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
  const bool secondary = dynamic_cast<const PeerLostError*>(&e) != nullptr;
  std::ofstream(path) << nlohmann::json{{"time_ns", now}, {"message", e.what()}, {"secondary", secondary}}.dump() << "\n";
}

WorkerError read_worker_error(const std::string& path) {
  WorkerError w;
  std::ifstream in(path);
  if (!in) return w;
  try {
    auto j = nlohmann::json::parse(in);
    w.present = true;
    w.time_ns = j.value("time_ns", 0LL);
    w.secondary = j.value("secondary", false);
    w.message = j.value("message", "");
  } catch (const std::exception&) {
  }
  return w;
}

}  // namespace distlab
