#include "core/comm/error_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/comm/errors.h"

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

void record_worker_stop(const std::string& message, bool secondary) {
  const char* path = std::getenv("DISTLAB_ERROR_FILE");
  if (!path || !*path) return;
  const long long now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
  std::ofstream(path) << nlohmann::json{{"time_ns", now}, {"message", message}, {"secondary", secondary}, {"waiting_for", nlohmann::json::array()}}
                             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                      << "\n";
}

void note_collective_entered() {
  // the process's one mapping of its progress page (an OS resource of this worker, like its error file)
  static std::atomic<uint64_t>* const counter = []() -> std::atomic<uint64_t>* {
    const char* path = std::getenv("DISTLAB_ERROR_FILE");
    if (!path || !*path) return nullptr;
    const std::string file = std::string(path) + ".progress";
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return nullptr;
    void* p = MAP_FAILED;
    if (::ftruncate(fd, sizeof(uint64_t)) == 0) p = ::mmap(nullptr, sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    return p == MAP_FAILED ? nullptr : static_cast<std::atomic<uint64_t>*>(p);
  }();
  if (counter) counter->fetch_add(1, std::memory_order_relaxed);
}

long long read_worker_progress(const std::string& error_file) {
  const int fd = ::open((error_file + ".progress").c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -1;
  uint64_t v = 0;
  const ssize_t n = ::read(fd, &v, sizeof v);
  ::close(fd);
  return n == ssize_t(sizeof v) && v < (uint64_t(1) << 62) ? (long long)v : -1;
}

namespace {

[[noreturn]] void on_terminate() {
  std::string what = "an unknown error";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      what = x.what();
      record_worker_error(x);
    } catch (...) {
    }
  }
  std::cout.flush();
  std::cerr << "distlab: error: a communication thread failed: " << what
            << "\n  hint: ranks that call collectives of different sizes or ops end like this: rerun with "
               "DISTLAB_DEBUG=detail to compare every collective across ranks\n";
  std::cerr.flush();
  std::_Exit(1);
}

}  // namespace

void install_terminate_handler() { std::set_terminate(on_terminate); }

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
