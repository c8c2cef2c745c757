// A small worker for launcher and failure tests: joins the job like distlab train does, then misbehaves
// the way argv[1] says.
//   ok             one all_reduce, prints the sum, exits 0
//   extra          rank 0 calls one more all_reduce than the others (a hang without timeouts)
//   mismatch       rank 0 calls all_reduce, rank 1 broadcast, as collective #1
//   fail-rank R    rank R prints a line and exits 3 after the first all_reduce; the others wait in the next
//   flaky FILE     fails on the first attempt (when FILE doesn't exist yet, it creates it), then succeeds
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "core/dist/env.h"
#include "core/dist/error_file.h"
#include "core/dist/process_group.h"
#include "core/dist/tcp_store.h"

using namespace distlab;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  try {
    LaunchEnv env = read_launch_env();
    const char* t = std::getenv("FIXTURE_TIMEOUT_MS");
    Millis timeout(t ? std::atoi(t) : 3000);
    TcpStore store(env.master_addr, env.master_port, timeout);
    ProcessGroupOptions o = options_from_env(timeout);
    ProcessGroup pg(store, env.rank, env.world_size, o);
    float x[4096];
    for (auto& v : x) v = float(env.rank + 1);
    pg.all_reduce(x, 4096);
    std::cout << fmt::format("rank {} of {}: sum {}", env.rank, env.world_size, x[0]) << std::endl;
    if (mode == "extra") {
      if (env.rank == 0) pg.all_reduce(x, 4096);
      else std::this_thread::sleep_for(std::chrono::seconds(30));  // alive but never joins
    } else if (mode == "mismatch") {
      if (env.rank == 0) pg.all_reduce(x, 4096);
      else pg.broadcast(x, 10, 0);
    } else if (mode == "fail-rank") {
      if (env.rank == std::atoi(argv[2])) {
        std::cout << "about to fail on purpose" << std::endl;
        return 3;
      }
      pg.all_reduce(x, 4096);
    } else if (mode == "flaky") {
      if (env.rank == 0 && !std::filesystem::exists(argv[2])) {
        std::ofstream(argv[2]) << "attempt 1 failed\n";
        std::cout << "first attempt fails" << std::endl;
        return 5;
      }
      pg.barrier();
    } else if (mode == "sleep") {
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
  } catch (const std::exception& e) {
    std::cerr << "fixture: " << e.what() << std::endl;
    record_worker_error(e);
    return 1;
  }
  return 0;
}
