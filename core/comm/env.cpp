#include "core/comm/env.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "core/comm/errors.h"
#include "core/comm/slurm.h"

namespace distlab {

static int int_var(const char* name, bool required, int fallback, long max = 1 << 30) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (required)
      throw CommError(fmt::format("environment variable {} is not set", name),
                      "start workers with `distlab run -n N ...` (it sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
    return fallback;
  }
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (*end || x < 0 || x > max || errno == ERANGE)
    throw CommError(fmt::format("environment variable {}='{}' is not an integer in 0..{}", name, v, max));
  return int(x);
}

// RANK or WORLD_SIZE in a task srun started, with no MASTER_PORT beside them: not a launcher's worker (distlab
// run and torchrun set all three), but a job script's leftover or a torchrun habit. They used to win over
// Slurm's and fail on the missing MASTER_PORT; now they must agree with Slurm's, which then rule.
static bool stale_torch_vars(const SlurmStep& s) {
  const char* port = std::getenv("MASTER_PORT");
  if ((!std::getenv("RANK") && !std::getenv("WORLD_SIZE")) || (port && *port) || !s.inside || s.ntasks <= 1) return false;
  const int rank = int_var("RANK", false, s.procid), world = int_var("WORLD_SIZE", false, s.ntasks);
  if (rank != s.procid || world != s.ntasks)
    throw CommError(fmt::format("RANK={} and WORLD_SIZE={} are set, but srun started this task as SLURM_PROCID={} of SLURM_STEP_NUM_TASKS={} "
                                "(and no MASTER_PORT says where the ranks of RANK/WORLD_SIZE would meet)",
                                std::getenv("RANK") ? std::getenv("RANK") : "(unset)", std::getenv("WORLD_SIZE") ? std::getenv("WORLD_SIZE") : "(unset)",
                                s.procid, s.ntasks),
                    "under srun distlab takes its ranks from Slurm: unset RANK and WORLD_SIZE in the job script (or set DISTLAB_SLURM=0 "
                    "and give all of RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT yourself)");
  return true;
}

LaunchEnv read_launch_env() {
  LaunchEnv e;
  const bool torch_vars = std::getenv("RANK") || std::getenv("WORLD_SIZE");
  if (!torch_vars || stale_torch_vars(read_slurm_step())) {
    const SlurmStep s = read_slurm_step();
    if (!s.inside || s.ntasks == 1) return e;
    e.launched = e.from_slurm = true;
    e.rank = s.procid;
    e.world_size = s.ntasks;
    e.local_rank = s.localid;
    e.local_world_size = s.local_tasks;
    e.master_addr = slurm_master_addr(s);
    const std::vector<int> ports = slurm_master_ports(s);
    e.master_port = e.store_port = ports.front();
    if (ports.size() > 1) e.store_ports = ports;
    e.hosts_store = e.rank == 0;
    const char* t = std::getenv("DISTLAB_STORE_TOKEN");
    e.store_token = t && *t ? t : slurm_job_token(s);
    e.token_derived = !(t && *t);
    return e;
  }
  e.launched = true;
  e.rank = int_var("RANK", true, 0);
  e.world_size = int_var("WORLD_SIZE", true, 1);
  e.local_rank = int_var("LOCAL_RANK", false, e.rank);
  e.local_world_size = int_var("LOCAL_WORLD_SIZE", false, e.world_size);
  if (e.world_size < 1 || e.rank >= e.world_size)
    throw CommError(fmt::format("RANK={} is not below WORLD_SIZE={}", e.rank, e.world_size), "each rank must be in 0..WORLD_SIZE-1");
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) e.master_addr = a;
  e.master_port = int_var("MASTER_PORT", e.world_size > 1, 0, 65535);
  e.store_port = int_var("DISTLAB_STORE_PORT", false, e.master_port, 65535);
  if (const char* t = std::getenv("DISTLAB_STORE_TOKEN")) e.store_token = t;
  e.launcher_pid = int_var("DISTLAB_LAUNCHER_PID", false, 0);
  return e;
}

std::unique_ptr<TcpStoreServer> serve_store_if_first(const LaunchEnv& e) {
  if (!e.hosts_store) return nullptr;
  if (e.token_derived)
    std::cerr << "distlab: warning: the rendezvous store on port " << e.store_port << " asks for the token " << e.store_token
              << ", which anyone can guess (export DISTLAB_STORE_TOKEN=<random string> before srun to require a secret one)\n";
  if (e.store_ports.size() > 1) return serve_on_first_free("0.0.0.0", e.store_ports, e.store_token, false);  // the step's derived ports
  try {
    return std::make_unique<TcpStoreServer>("0.0.0.0", e.store_port, e.store_token);
  } catch (const Error& err) {
    throw StoreError(fmt::format("srun task 0 cannot serve the rendezvous store on port {}: {}", e.store_port, err.what()),
                     "another job may hold the port: export MASTER_PORT=<a free port> before srun");
  }
}

std::unique_ptr<TcpStore> connect_store(const LaunchEnv& e, Millis timeout) {
  if (e.store_ports.size() > 1) return std::make_unique<TcpStore>(e.master_addr, e.store_ports, timeout, e.store_token);
  return std::make_unique<TcpStore>(e.master_addr, e.store_port, timeout, e.store_token);
}

std::string local_address_for(const std::string& master_addr) {
  if (master_addr == "localhost" || master_addr.rfind("127.", 0) == 0) return "127.0.0.1";
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (getaddrinfo(master_addr.c_str(), "9", &hints, &res) != 0 || !res)
    throw CommError(fmt::format("cannot resolve MASTER_ADDR '{}'", master_addr), "use an IP address or a name this machine resolves");
  // a UDP "connect" sends nothing; it only picks the route, whose source address is ours
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  std::string ip = "127.0.0.1";
  if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in me{};
    socklen_t len = sizeof me;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      ip = inet_ntop(AF_INET, &me.sin_addr, buf, sizeof buf);
    }
  }
  ::close(fd);
  freeaddrinfo(res);
  return ip;
}

}  // namespace distlab
