// Slurm (core/comm/slurm.h): host lists and task counts as Slurm writes them, a task's world taken from
// srun's variables, the sbatch script `distlab run --slurm-script` prints; and, on a one-node cluster this
// test starts (tests/slurm/cluster.sh: slurmctld + slurmd + munged of its own), srun's ranks training as
// `distlab run`'s do and a class graded as an array job (cli/slurm_grade.h).
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/comm/env.h"
#include "core/comm/errors.h"
#include "core/comm/slurm.h"
#include "core/comm/tcp_store.h"
#include "core/launch/slurm_launch.h"

namespace fs = std::filesystem;
using distlab::CommError;

namespace {

// Sets srun's variables (and clears torchrun's) for one test; puts the environment back afterwards.
class SrunVars {
 public:
  explicit SrunVars(const std::map<std::string, std::string>& vars) {
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DISTLAB_STORE_TOKEN",
                             "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NODELIST",
                             "SLURM_JOB_NODELIST", "SLURMD_NODENAME", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_STEP_ID", "DISTLAB_SLURM", "SLURM_CPUS_PER_TASK", "OMP_NUM_THREADS"}) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      unsetenv(name);
    }
    for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  }
  ~SrunVars() {
    for (const auto& [k, v] : saved_) v ? setenv(k.c_str(), v->c_str(), 1) : unsetenv(k.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// read_launch_env() under `vars` with `changes` made to them
distlab::LaunchEnv launch_env_with(std::map<std::string, std::string> vars, const std::map<std::string, std::string>& changes) {
  for (const auto& [k, v] : changes) vars[k] = v;
  SrunVars set(vars);
  return distlab::read_launch_env();
}

struct SlurmRun {
  int code;
  std::string out;
  double secs;
};

SlurmRun slurm_sh(const std::string& cmd) {
  const auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen((std::string("cd ") + DISTLAB_SOURCE_DIR + " && " + cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

std::string slurm_read(const fs::path& f) {
  std::ifstream in(f);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// every "loss" of a metrics file, as written (bitwise comparisons)
std::vector<std::string> losses_of(const fs::path& metrics) {
  std::vector<std::string> out;
  std::istringstream in(slurm_read(metrics));
  for (std::string line; std::getline(in, line);) {
    const size_t k = line.find("\"loss\":");
    if (k != std::string::npos) out.push_back(line.substr(k + 7, line.find_first_of(",}", k) - k - 7));
  }
  return out;
}

}  // namespace

TEST_CASE("Slurm's host lists and task counts expand as scontrol and srun write them", "[slurm]") {
  using V = std::vector<std::string>;
  CHECK(distlab::expand_hostlist("node01", "t") == V{"node01"});
  CHECK(distlab::expand_hostlist("node[01-03,07],gpu-a", "t") == V{"node01", "node02", "node03", "node07", "gpu-a"});
  CHECK(distlab::expand_hostlist("rack[1-2]-n[8-9]", "t") == V{"rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"});
  CHECK(distlab::expand_hostlist("n[098-101]", "t") == V{"n098", "n099", "n100", "n101"});
  for (const char* bad : {"", "node[1-", "node[3-1]", "a,,b", "n[x]", "n]1", "n[1-2]x[", "a b"}) {
    INFO(bad);
    CHECK_THROWS_AS(distlab::expand_hostlist(bad, "SLURM_STEP_NODELIST"), CommError);
  }
  CHECK(distlab::expand_tasks_per_node("2(x3),1", "t") == std::vector<int>{2, 2, 2, 1});
  CHECK(distlab::expand_tasks_per_node("8", "t") == std::vector<int>{8});
  for (const char* bad : {"", "2(x", "x", "2(x3", "-1"}) {
    INFO(bad);
    CHECK_THROWS_AS(distlab::expand_tasks_per_node(bad, "SLURM_STEP_TASKS_PER_NODE"), CommError);
  }
}

TEST_CASE("a task srun started takes its rank, world, local rank and master from Slurm", "[slurm]") {
  const std::map<std::string, std::string> two_nodes = {
      {"SLURM_STEP_NUM_TASKS", "4"},      {"SLURM_PROCID", "2"},       {"SLURM_LOCALID", "0"},
      {"SLURM_STEP_NUM_NODES", "2"},      {"SLURM_STEP_NODELIST", "gpu[07-08]"}, {"SLURMD_NODENAME", "gpu08"},
      {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"}, {"SLURM_JOB_ID", "12345"}, {"SLURM_STEP_ID", "3"}};
  {
    SrunVars v(two_nodes);
    const distlab::LaunchEnv e = distlab::read_launch_env();
    CHECK(e.launched);
    CHECK(e.from_slurm);
    CHECK(e.rank == 2);
    CHECK(e.world_size == 4);
    CHECK(e.local_rank == 0);
    CHECK(e.local_world_size == 2);
    CHECK(e.master_addr == "gpu07");
    CHECK(e.store_port % 2 == 0);  // and the program's own port after it
    CHECK(e.store_port >= 15000);
    CHECK(e.store_port < 32768);  // below Linux's ephemeral ports
    CHECK(e.store_token == "slurm-12345.3");  // none exported: the job's and step's
    CHECK(e.token_derived);
    CHECK_FALSE(e.hosts_store);
    const distlab::SlurmStep s = distlab::read_slurm_step();
    CHECK(s.node_index == 1);
    CHECK(s.nodes == std::vector<std::string>{"gpu07", "gpu08"});
  }
  {  // neighbouring jobs and steps get different ports (array jobs have consecutive ids and share nodes)
    std::set<int> ports;
    for (int job : {12345, 12346, 12347})
      for (int step : {0, 1, 8, 9}) {
        auto vars = two_nodes;
        vars["SLURM_JOB_ID"] = std::to_string(job);
        vars["SLURM_STEP_ID"] = std::to_string(step);
        SrunVars v(vars);
        ports.insert(distlab::read_launch_env().store_port);
      }
    CHECK(ports.size() == 12);
  }
  {  // task 0 serves the store; MASTER_ADDR and MASTER_PORT, when exported, win
    const distlab::LaunchEnv e =
        launch_env_with(two_nodes, {{"SLURM_PROCID", "0"}, {"SLURMD_NODENAME", "gpu07"}, {"MASTER_PORT", "23456"}, {"MASTER_ADDR", "10.0.0.7"}});
    CHECK(e.hosts_store);
    CHECK(e.store_port == 23456);
    CHECK(e.master_addr == "10.0.0.7");
  }
  {  // one node: loopback, whatever the node's name resolves to
    SrunVars v({{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "1"}, {"SLURM_STEP_NUM_NODES", "1"},
                {"SLURM_STEP_NODELIST", "laptop"}, {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_JOB_ID", "7"}});
    const distlab::LaunchEnv e = distlab::read_launch_env();
    CHECK(e.master_addr == "127.0.0.1");
    CHECK(e.local_rank == 1);
  }
  {  // torchrun's variables (a worker of distlab run inside an allocation) come first
    const distlab::LaunchEnv e = launch_env_with(two_nodes, {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
    CHECK_FALSE(e.from_slurm);
    CHECK(e.rank == 1);
  }
  {  // RANK and WORLD_SIZE left in a job script, without MASTER_PORT: Slurm's when they agree, an error naming both when not
    const distlab::LaunchEnv e = launch_env_with(two_nodes, {{"RANK", "2"}, {"WORLD_SIZE", "4"}});
    CHECK(e.from_slurm);
    CHECK(e.rank == 2);
    CHECK(e.store_port >= 15000);
    auto vars = two_nodes;
    vars["RANK"] = "0";
    vars["WORLD_SIZE"] = "8";
    SrunVars v(vars);
    CHECK_THROWS_WITH(distlab::read_launch_env(), Catch::Contains("RANK=0 and WORLD_SIZE=8 are set") && Catch::Contains("SLURM_PROCID=2") &&
                                                      !Catch::Contains("MASTER_PORT is not set"));
  }
  // DISTLAB_SLURM=0: every task runs on its own (a sweep of separate runs under one srun)
  CHECK_FALSE(launch_env_with(two_nodes, {{"DISTLAB_SLURM", "0"}}).launched);
  {  // a single task is rank 0 of 1, as outside srun
    SrunVars v({{"SLURM_STEP_NUM_TASKS", "1"}, {"SLURM_PROCID", "0"}, {"SLURM_STEP_NODELIST", "a"}});
    CHECK_FALSE(distlab::read_launch_env().launched);
  }
  // variables that contradict each other are errors naming them
  for (const auto& [key, value, says] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"SLURM_PROCID", "4", "SLURM_PROCID=4"},
           {"SLURM_STEP_NODELIST", "gpu[07-09]", "names 3 nodes"},
           {"SLURM_LOCALID", "2", "SLURM_LOCALID=2"},
           {"SLURM_STEP_TASKS_PER_NODE", "2(x3)", "covers 3 nodes"},
           {"SLURM_JOB_ID", "12x", "SLURM_JOB_ID"}}) {
    auto vars = two_nodes;
    vars[key] = value;
    SrunVars v(vars);
    INFO(key << "=" << value);
    CHECK_THROWS_WITH(distlab::read_launch_env(), Catch::Contains(says));
  }
}

TEST_CASE("distlab run under srun: a launcher per node when every node has one task, else one rank per task", "[slurm]") {
  using distlab::GivenOnCommandLine;
  std::map<std::string, std::string> vars = {{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "0"},
                                             {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_STEP_NODELIST", "gpu[1-2]"}, {"SLURMD_NODENAME", "gpu2"},
                                             {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}, {"SLURM_JOB_ID", "77"}, {"SLURM_STEP_ID", "0"},
                                             {"SLURM_CPUS_PER_TASK", "16"}};
  {  // srun --ntasks-per-node=1 distlab run -n 8: node 1 of 2, 8 ranks, 2 threads each
    SrunVars v(vars);
    distlab::LaunchOptions o;
    o.nproc_per_node = 8;
    distlab::take_world_from_slurm(o, distlab::read_slurm_step(), GivenOnCommandLine{.nproc = true});
    CHECK(o.nnodes == 2);
    CHECK(o.node_rank == 1);
    CHECK(o.nproc_per_node == 8);
    CHECK(o.master_addr == "gpu1");
    CHECK(o.master_port >= 15000);
    CHECK(o.store_bind == "0.0.0.0");
    CHECK(o.store_token == "slurm-77.0");
    CHECK(o.threads_per_rank == 2);
    distlab::LaunchOptions no_n;
    CHECK_THROWS_WITH(distlab::take_world_from_slurm(no_n, distlab::read_slurm_step(), {}), Catch::Contains("how many ranks per node"));
  }
  {  // 3 tasks on 2 nodes (2 + 1): every launcher, on either node, is one rank of 3
    vars["SLURM_STEP_NUM_TASKS"] = "3";
    vars["SLURM_STEP_TASKS_PER_NODE"] = "2,1";
    for (const auto& [procid, node, localid] : std::vector<std::tuple<int, std::string, int>>{{0, "gpu1", 0}, {1, "gpu1", 1}, {2, "gpu2", 0}}) {
      vars["SLURM_PROCID"] = std::to_string(procid);
      vars["SLURMD_NODENAME"] = node;
      vars["SLURM_LOCALID"] = std::to_string(localid);
      SrunVars v(vars);
      distlab::LaunchOptions o;
      distlab::take_world_from_slurm(o, distlab::read_slurm_step(), {});
      INFO("task " << procid);
      CHECK(o.nnodes == 3);
      CHECK(o.nproc_per_node == 1);
      CHECK(o.node_rank == procid);
      CHECK(o.local_rank_base == localid);
      CHECK(o.local_world_size == (node == "gpu1" ? 2 : 1));
      distlab::LaunchOptions eight;
      eight.nproc_per_node = 8;
      CHECK_THROWS_WITH(distlab::take_world_from_slurm(eight, distlab::read_slurm_step(), GivenOnCommandLine{.nproc = true}),
                        Catch::Contains("each task is already one rank"));
    }
  }
}

TEST_CASE("two Slurm steps whose derived ports collide both run: the store takes the step's next free port, its clients find it by the token", "[slurm]") {
  // Job ids the cluster test never uses, a fresh one per test process: the ports are this test's alone
  const long job = 900000 + long(getpid()) % 90000;
  const std::map<std::string, std::string> one_node = {{"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"},
                                                       {"SLURM_STEP_NUM_NODES", "1"}, {"SLURM_STEP_NODELIST", "localhost"},
                                                       {"SLURM_STEP_TASKS_PER_NODE", "2"}, {"SLURM_JOB_ID", std::to_string(job)}, {"SLURM_STEP_ID", "0"}};
  std::vector<int> ports;
  {
    SrunVars v(one_node);
    ports = distlab::slurm_master_ports(distlab::read_slurm_step());
    CHECK(distlab::read_launch_env().store_port == ports.front());
    CHECK(distlab::read_launch_env().store_ports == ports);
  }
  REQUIRE(ports.size() == size_t(distlab::kSlurmPortCandidates));
  CHECK(std::set<int>(ports.begin(), ports.end()).size() == ports.size());
  for (int p : ports) CHECK((p % 2 == 0 && p >= 15000 && p < 32767));
  {  // MASTER_PORT exported: that port alone, as before
    auto vars = one_node;
    vars["MASTER_PORT"] = "23456";
    SrunVars v(vars);
    CHECK(distlab::slurm_master_ports(distlab::read_slurm_step()) == std::vector<int>{23456});
    CHECK(distlab::read_launch_env().store_ports.empty());
  }
  // another job's store holds the step's first port; another program the second (it takes connections and
  // never answers); the third's neighbour (a launcher's program port) is taken too
  distlab::TcpStoreServer other("0.0.0.0", ports[0], "slurm-1.0");
  auto listener = [](int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 64) == 0);
    return fd;
  };
  const int silent = listener(ports[1]), neighbour = listener(ports[2] + 1);
  const fs::path d = fs::temp_directory_path() / ("distlab-collide-" + std::to_string(getpid()));
  fs::create_directories(d);
  std::string unset;
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DISTLAB_STORE_TOKEN", "DISTLAB_STORE_PORT",
                           "SLURM_JOB_NODELIST", "SLURM_NODEID", "SLURM_CPUS_PER_TASK", "DISTLAB_SLURM"})
    unset += std::string(" -u ") + name;
  const std::string train = " train configs/gpt-tiny.toml --set train.steps=2 --set train.log_every=1 --set train.eval_batches=1 --set parallel.strategy=ddp";
  // two tasks as srun starts them, in the background; each one's exit code in its own file
  auto two_tasks = [&](const std::string& name, const std::string& vars0, const std::string& vars1, const std::string& cmd) {
    std::string sh;
    for (int t = 0; t < 2; t++)
      sh += "(cd " + std::string(DISTLAB_SOURCE_DIR) + " && env" + unset + " " + (t ? vars1 : vars0) + " timeout 90 " + DISTLAB_BINARY + cmd + " > " + (d / (name + std::to_string(t) + ".out")).string() +
            " 2>&1; echo $? > " + (d / (name + std::to_string(t) + ".rc")).string() + ") & ";
    slurm_sh("true; " + sh + "wait");  // each task in the source folder (slurm_sh's cd is the first's alone)
    for (int t = 0; t < 2; t++) {
      INFO(name << " task " << t << ": " << slurm_read(d / (name + std::to_string(t) + ".out")));
      CHECK(slurm_read(d / (name + std::to_string(t) + ".rc")) == "0\n");
    }
  };
  std::string common;
  for (const auto& [k, v] : one_node)
    if (k != "SLURM_PROCID" && k != "SLURM_LOCALID") common += k + "=" + v + " ";
  // srun -n 2 distlab train: task 0 serves the store at the first free port (the third), both tasks find it
  two_tasks("ranks", common + "SLURM_PROCID=0 SLURM_LOCALID=0", common + "SLURM_PROCID=1 SLURM_LOCALID=1", train);
  CHECK(other.rejected() >= 1);  // the other job's store refused this job's token, and kept serving its own
  // srun --ntasks-per-node=1 distlab run -n 1 on two "nodes" (two addresses of this machine): node 0's store
  // skips the third port too (its neighbour is taken), node 1's launcher finds it at the fourth
  std::string two = "SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NUM_NODES=2 SLURM_STEP_NODELIST='127.0.0.[1-2]' SLURM_STEP_TASKS_PER_NODE='1(x2)' SLURM_LOCALID=0 "
                    "SLURM_JOB_ID=" + std::to_string(job) + " SLURM_STEP_ID=1 ";
  two_tasks("nodes", two + "SLURM_PROCID=0 SLURMD_NODENAME=127.0.0.1", two + "SLURM_PROCID=1 SLURMD_NODENAME=127.0.0.2", " run -n 1 --grace 2" + train);
  {  // every port of the step taken: task 0 says so, and how to choose one
    std::vector<std::unique_ptr<distlab::TcpStoreServer>> held;
    for (size_t k = 2; k < ports.size(); k++) held.push_back(std::make_unique<distlab::TcpStoreServer>("0.0.0.0", ports[k], "slurm-2.0"));
    auto r = slurm_sh("env" + unset + " " + common + "SLURM_PROCID=0 SLURM_LOCALID=0 timeout 30 " + DISTLAB_BINARY + train);
    CHECK(r.code == 1);
    CHECK_THAT(r.out, Catch::Contains("every port this step may use is taken") && Catch::Contains("MASTER_PORT"));
  }
  ::close(silent);
  ::close(neighbour);
  fs::remove_all(d);
}

TEST_CASE("distlab run --slurm-script prints a script sbatch takes, its command intact through the shell", "[slurm][cli]") {
  const std::string bin = DISTLAB_BINARY;
  auto r = slurm_sh(bin + " run --nnodes 2 -n 4 --gpus-per-node 4 --time 90 --job-name gpt.small --log-dir 'my logs' --slurm-script train 'configs/gpt tiny.toml' "
                          "--set \"log.metrics=it's a file.jsonl\"");
  INFO(r.out);
  REQUIRE(r.code == 0);
  for (const char* line : {"#SBATCH --nodes=2\n", "#SBATCH --ntasks-per-node=1\n", "#SBATCH --gpus-per-node=4\n", "#SBATCH --time=90\n",
                           "#SBATCH --job-name=gpt.small\n", "#SBATCH --exclusive\n", "export DISTLAB_STORE_TOKEN="})
    CHECK(r.out.find(line) != std::string::npos);
  // the srun line, with srun and its options replaced by printf: every argument arrives as it was given
  const std::string srun = "srun --kill-on-bad-exit=1 --cpus-per-task=${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE} ";
  const size_t at = r.out.find(srun);
  REQUIRE(at != std::string::npos);
  std::string command = r.out.substr(at + srun.size());
  command = command.substr(0, command.find('\n'));
  const fs::path script = fs::temp_directory_path() / ("distlab-sbatch-" + std::to_string(getpid()) + ".sh");
  std::ofstream(script) << "printf '%s|' " << command << "\n";
  auto args = slurm_sh("bash " + script.string());
  fs::remove(script);
  CHECK(args.out == bin + "|run|-n|4|--log-dir|my logs|train|configs/gpt tiny.toml|--set|log.metrics=it's a file.jsonl|");
  // bash parses the whole script
  const fs::path whole = fs::temp_directory_path() / ("distlab-sbatch-all-" + std::to_string(getpid()) + ".sh");
  std::ofstream(whole) << r.out;
  CHECK(slurm_sh("bash -n " + whole.string()).code == 0);
  fs::remove(whole);
  // what sbatch would refuse, refused here first
  for (const auto& [flags, says] : std::vector<std::pair<std::string, std::string>>{
           {"--time 1:2:3:4", "not a Slurm time limit"}, {"--time 1-", "not a Slurm time limit"}, {"--job-name 'a b'", "--job-name"},
           {"--partition 'x;y'", "--partition"}, {"--node-rank 1", "Slurm gives each node its rank"}, {"--nnodes 2", "give -n N"}}) {
    auto bad = slurm_sh(bin + " run " + (flags == "--nnodes 2" ? "" : "-n 2 ") + flags + " --slurm-script train configs/gpt-tiny.toml");
    INFO(flags << "\n" << bad.out);
    CHECK(bad.code != 0);
    CHECK(bad.out.find(says) != std::string::npos);
  }
}

namespace {

// A one-node cluster for one test: started in a fresh folder, stopped (jobs cancelled, daemons gone) after.
class TestCluster {
 public:
  TestCluster() {
    char tmpl[] = "/tmp/distlab-slurm-XXXXXX";  // short: munge's socket path lives in it
    dir_ = mkdtemp(tmpl);
    // stopped by the destructor, or by cluster.sh itself once this test is gone (killed by its timeout)
    auto r = slurm_sh("timeout 60 bash tests/slurm/cluster.sh start " + dir_.string() + " " + std::to_string(getpid()));
    if (r.code != 0) {
      why_not_ = r.out.empty() ? "cluster.sh exited " + std::to_string(r.code) : r.out;
      return;
    }
    const std::string conf = (dir_ / "slurm.conf").string();
    setenv("SLURM_CONF", conf.c_str(), 1);
  }
  ~TestCluster() {
    slurm_sh("timeout 60 bash tests/slurm/cluster.sh stop " + dir_.string());
    unsetenv("SLURM_CONF");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const std::string& why_not() const { return why_not_; }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
  std::string why_not_;
};

}  // namespace

TEST_CASE("on a one-node Slurm cluster: srun's ranks train as distlab run's, and a class graded as an array job merges", "[slurm][cluster]") {
  TestCluster cluster;
  if (!cluster.why_not().empty()) {
    WARN("skipped, no Slurm cluster on this machine: " << cluster.why_not());
    return;
  }
  const fs::path d = cluster.dir();
  const std::string bin = DISTLAB_BINARY;
  // the host lists as Slurm's own scontrol expands them
  for (const char* list : {"node[01-03,07],gpu-a", "rack[1-2]-n[8-9]", "n[098-101]"}) {
    std::string want;
    for (const auto& h : distlab::expand_hostlist(list, "test")) want += h + "\n";
    CHECK(slurm_sh(std::string("scontrol show hostnames '") + list + "'").out == want);
  }
  const std::string train = " train configs/gpt-tiny.toml --set train.steps=6 --set train.log_every=1 --set train.eval_batches=2 --set parallel.strategy=ddp --metrics ";

  {  // srun -n 2 distlab train, one launcher per node, one launcher per rank: the same losses as distlab run -n 2
    auto ref = slurm_sh("timeout 60 " + bin + " run -n 2" + train + (d / "run.jsonl").string());
    INFO(ref.out);
    REQUIRE(ref.code == 0);
    const std::vector<std::string> want = losses_of(d / "run.jsonl");
    REQUIRE(want.size() >= 6);
    for (const auto& [name, how] : std::vector<std::pair<std::string, std::string>>{
             {"ranks", "srun -n 2 " + bin},                  // each task a rank; task 0 serves the store
             {"per-node", "srun -n 1 " + bin + " run -n 2"},  // one launcher for the node
             {"per-rank", "srun -n 2 " + bin + " run"},       // a launcher per task, each one rank
             // the script --slurm-script prints, submitted as it is
             {"script", bin + " run -n 2 --slurm-script" + train + (d / "script.jsonl").string() + " > " + (d / "job.sbatch").string() +
                            " && sbatch --wait --output=" + (d / "job.out").string() + " " + (d / "job.sbatch").string() + "; cat " + (d / "job.out").string()}}) {
      auto r = slurm_sh(name == "script" ? "timeout 60 bash -c '" + how + "'" : "timeout 60 " + how + train + (d / (name + ".jsonl")).string());
      INFO(name << "\n" << r.out);
      REQUIRE(r.code == 0);
      CHECK(losses_of(d / (name + ".jsonl")) == want);
    }
  }

  {  // four submissions (one hostile) graded as an array job; a lost row and a garbled one named, graded again alone
    const std::string headers = "#include <cstdio>\n#include <cstdlib>\n#include <stdexcept>\n#include <string>\n#include <vector>\n";
    const std::string solution = headers + slurm_read(fs::path(DISTLAB_SOURCE_DIR) / "solutions/01-collectives/ring.cpp");
    const fs::path subs = d / "subs", results = d / "grading", marker = d / "forged";
    const std::string forged_row = "{\"index\":1,\"entry\":\"b_skeleton\",\"grade\":{}}";
    std::map<std::string, std::string> files = {
        {"a_solution", solution},
        {"b_skeleton", headers + slurm_read(fs::path(DISTLAB_SOURCE_DIR) / "labs/01-collectives/student/ring.cpp")},
        {"c_crash", solution + "\nstatic int crash = [] { std::abort(); return 0; }();\n"},  // dies as it loads
        // as it loads, tries to overwrite another student's row and to leave a mark outside its sandbox
        {"d_forger", solution + "\nstatic int forge = [] {\n  for (const char* path : {\"" + (results / "rows/1.json").string() + "\", \"" +
                         marker.string() + "\"})\n    if (FILE* f = std::fopen(path, \"w\")) { std::fputs(R\"(" + forged_row +
                         ")\", f); std::fclose(f); }\n  return 0;\n}();\n"}};
    for (const auto& [name, text] : files) {
      fs::create_directories(subs / name);
      std::ofstream(subs / name / "ring.cpp") << text;
    }
    auto arr = slurm_sh("timeout 150 " + bin + " grade 01 --submissions " + subs.string() + " --require-sandbox --seed 7 --hints always --slurm --results " +
                        results.string() + " --per-task 1 --max-running 2 --cpus-per-task 1 --wait");
    INFO(arr.out);
    REQUIRE(arr.code == 0);
    WARN("timing: 4 submissions of lab 01 as an array job, 2 tasks at once: " << arr.secs << " s");
    // every student's points as the lab gives them: the forger did not reach the skeleton's row, nor leave its mark
    const std::map<std::string, std::string> totals = {{"a_solution", "12"}, {"b_skeleton", "0"}, {"c_crash", "0"}, {"d_forger", "12"}};
    auto check_totals = [&](const std::string& csv) {
      INFO(csv);
      for (const auto& [name, total] : totals) CHECK(csv.find("\"" + name + "\",") != std::string::npos);
      for (const auto& [name, total] : totals) {
        const size_t at = csv.find("\"" + name + "\",");
        if (at == std::string::npos) continue;
        std::string line = csv.substr(at, csv.find('\n', at) - at);
        const std::string header = csv.substr(0, csv.find('\n'));
        // the "points" column, by the header (no field before it holds a comma: names, ids and numbers)
        const std::string before = header.substr(0, header.find(",points,"));
        const long column = std::count(before.begin(), before.end(), ',') + 1;
        for (long k = 0; k < column; k++) line = line.substr(line.find(',') + 1);
        CHECK(line.substr(0, line.find(',')) == total);
      }
    };
    check_totals(slurm_read(results / "grades.csv"));
    CHECK(slurm_read(results / "grades.csv").find("killed by signal 6 (ABRT") != std::string::npos);
    CHECK_FALSE(fs::exists(marker));
    CHECK(fs::exists(results / "feedback/a_solution.txt"));

    // a task that left no row, and a row that is not the lab's: both named, with the command that grades them again
    fs::remove(results / "rows/2.json");
    fs::remove(results / "feedback/c_crash.txt");
    std::ofstream(results / "rows/1.json") << "{\"index\":1,\"entry\":\"b_skeleton\",\"grade\":{\"lab\":\"01-collectives\",\"points\":99}}";
    REQUIRE(mkfifo((results / "rows/0.json.fifo").c_str(), 0600) == 0);  // a row replaced by a FIFO: refused, not waited on
    fs::rename(results / "rows/0.json", results / "rows/0.json.kept");
    fs::rename(results / "rows/0.json.fifo", results / "rows/0.json");
    auto fifo = slurm_sh("timeout 20 " + bin + " grade merge " + results.string());
    INFO(fifo.out);
    CHECK(fifo.code == 1);
    CHECK(fifo.out.find("a_solution (task 0: an unreadable row") != std::string::npos);
    fs::remove(results / "rows/0.json");
    fs::rename(results / "rows/0.json.kept", results / "rows/0.json");
    auto merged = slurm_sh(bin + " grade merge " + results.string());
    INFO(merged.out);
    CHECK(merged.code == 1);
    CHECK(merged.out.find("2 student(s) without a result") != std::string::npos);
    CHECK(merged.out.find("b_skeleton (task 1: ") != std::string::npos);
    CHECK(merged.out.find("c_crash (task 2: no row") != std::string::npos);
    const std::string again = "sbatch --array=1,2 " + (results / "grade.sbatch").string();
    REQUIRE(merged.out.find(again) != std::string::npos);
    CHECK(slurm_read(results / "grades.csv").find("not graded: no row") != std::string::npos);
    CHECK(slurm_read(results / "feedback/c_crash.txt").find("not graded: no row") != std::string::npos);  // none was left: one saying why
    CHECK(slurm_read(results / "feedback/c_crash.txt").find("NOT GRADED: no check ran") != std::string::npos);  // was "BUILD FAILED"
    CHECK(slurm_read(results / "feedback/c_crash.txt").find("BUILD FAILED") == std::string::npos);
    auto rerun = slurm_sh("timeout 100 sbatch --wait" + again.substr(6));
    INFO(rerun.out);
    REQUIRE(rerun.code == 0);
    auto remerged = slurm_sh(bin + " grade merge " + results.string());
    INFO(remerged.out);
    CHECK(remerged.code == 0);
    check_totals(slurm_read(results / "grades.csv"));
    CHECK(slurm_read(results / "feedback/c_crash.txt").find("killed by signal 6") != std::string::npos);
  }
}
