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
  std::vector<int> waiting_for;
  if (const auto* c = dynamic_cast<const CommError*>(&e)) waiting_for = c->waiting_for;
  std::ofstream(path) << nlohmann::json{{"time_ns", now}, {"message", e.what()}, {"secondary", secondary}, {"waiting_for", waiting_for}}
                             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                      << "\n";
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
    if (j.contains("waiting_for") && j["waiting_for"].is_array())
      for (const auto& r : j["waiting_for"])
        if (r.is_number_integer()) w.waiting_for.push_back(r.get<int>());
  } catch (const std::exception&) {
  }
  return w;
}

}  // namespace distlab
