// `distlab run` end to end with real processes: environment, failures, timeouts, restarts, two nodes.
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "grader/bridge/sandbox.h"
#include "shell.h"

using namespace std::string_literals;
namespace fs = std::filesystem;

namespace {

struct LaunchResult {
  int code;
  std::string out;
  double secs;
};

LaunchResult sh(const std::string& cmd) {
  auto t0 = std::chrono::steady_clock::now();
  FILE* p = popen(("cd "s + DISTLAB_SOURCE_DIR + " && " + cmd + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int status = pclose(p);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out, secs};
}

std::string run_cmd(const std::string& args) { return "timeout 60 "s + DISTLAB_BINARY + " run " + args; }

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

// processes whose argv[0] is exactly `marker` (set with bash's exec -a)
int count_processes(const std::string& marker) {
  int n = 0;
  for (const auto& d : fs::directory_iterator("/proc")) {
    std::ifstream f(d.path() / "cmdline");
    std::string argv0;
    if (f && std::getline(f, argv0, '\0') && argv0 == marker) n++;
  }
  return n;
}

}  // namespace

TEST_CASE("workers get torchrun's environment, only rank 0 prints, --log-dir keeps every rank", "[launcher]") {
  fs::path logs = fs::temp_directory_path() / ("distlab-logs-" + std::to_string(getpid()));
  LaunchResult r = sh(run_cmd("-n 3 --master-port 0 --log-dir " + logs.string() +
                    " -- bash -c 'echo rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE lw=$LOCAL_WORLD_SIZE "
                    "addr=$MASTER_ADDR port=$MASTER_PORT'"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("rank=0 local=0 world=3 lw=3 addr=127.0.0.1 port="));
  CHECK_THAT(r.out, !Catch::Contains("rank=1"));
  for (int k = 0; k < 3; k++) CHECK(fs::exists(logs / ("rank_" + std::to_string(k) + ".log")));
  fs::remove_all(logs);
  LaunchResult ok = sh(run_cmd("-n 2 --master-port 0 -- "s + FIXTURE_WORKER + " ok"));
  CHECK(ok.code == 0);
  CHECK_THAT(ok.out, Catch::Contains("rank 0 of 2: sum 3"));
  // a --log-dir that can't be made is refused naming the option (it was filesystem's bare message)
  for (const std::string bad : {"/proc/x", "/dev/null/logs"}) {
    LaunchResult r2 = sh(run_cmd("-n 2 --master-port 0 --log-dir " + bad + " -- true"));
    INFO(r2.out);
    CHECK(r2.code != 0);
    CHECK_THAT(r2.out, Catch::Contains("--log-dir " + bad));
  }
}

TEST_CASE("torchrun's spellings work: --nproc_per_node, --standalone, --rdzv-endpoint, --master_port, and a config alone means train", "[launcher]") {
  // before: "give -n N", and a config without `train` went to the ranks as an unknown subcommand
  LaunchResult a = sh(run_cmd("--nproc_per_node 2 --standalone configs/gpt-tiny.toml --set train.steps=2 --set train.eval_every=0 --set parallel.strategy=ddp"));
  INFO(a.out);
  CHECK(a.code == 0);
  CHECK_THAT(a.out, Catch::Contains("2 rank(s)"));
  const std::string port = std::to_string(free_port());
  LaunchResult b = sh(run_cmd("--nproc_per_node=2 --rdzv-endpoint 127.0.0.1:" + port + " -- "s + FIXTURE_WORKER + " ok"));
  INFO(b.out);
  CHECK(b.code == 0);
  CHECK_THAT(b.out, Catch::Contains("rank 0 of 2: sum 3"));
  LaunchResult c = sh(run_cmd("--nproc_per_node 2 --master_addr 127.0.0.1 --master_port " + std::to_string(free_port()) + " -- "s + FIXTURE_WORKER + " ok"));
  INFO(c.out);
  CHECK(c.code == 0);
  // an argument error of the subcommand: said once, by the launcher, no rank started (it was once per rank)
  LaunchResult typo = sh(run_cmd("-n 3 --master-port 0 train configs/gpt-tiny.toml --sett train.steps=2"));
  INFO(typo.out);
  CHECK(typo.code == 2);
  const std::string once = "--sett";
  size_t n = 0;
  for (size_t at = typo.out.find("were not expected"); at != std::string::npos; at = typo.out.find("were not expected", at + 1)) n++;
  CHECK(n == 1);
  CHECK_THAT(typo.out, Catch::Contains(once) && Catch::Contains("no rank was started"));
  for (const std::string bad : {"--rdzv-endpoint nowhere", "--rdzv-endpoint :29500", "--standalone --master-port 29500"}) {
    LaunchResult r = sh(run_cmd("-n 2 " + bad + " -- true"));
    INFO(bad << "\n" << r.out);
    CHECK(r.code != 0);
    CHECK_THAT(r.out, Catch::Contains(bad.substr(0, bad.find(' '))));
  }
}

TEST_CASE("a worker that exits non-zero stops the others and is named with its last lines", "[launcher][failure]") {
  LaunchResult r = sh(run_cmd("-n 3 --master-port 0 --grace 2 -- "s + FIXTURE_WORKER + " fail-rank 1"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.secs < 10.0);
  CHECK_THAT(r.out, Catch::Contains("rank 1") && Catch::Contains("exit code 3") && Catch::Contains("about to fail on purpose"));
}

TEST_CASE("workers that exit leaving a setsid descendant with their output open: the launcher returns, and kills it", "[launcher]") {
  // it blocked forever reading the pipe, deaf to SIGTERM and SIGINT, and the sleeps outlived it
  const std::string marker = "distlab-setsid-marker-" + std::to_string(getpid());
  LaunchResult r = sh(run_cmd("-n 2 --master-port 0 --grace 2 -- bash -c 'setsid bash -c \"exec -a " + marker +
                                    " sleep 120\" & sleep 1; echo done $RANK; exit 0'"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.secs < 20.0);
  CHECK_THAT(r.out, Catch::Contains("done 0") && Catch::Contains("kept its output open"));
  for (int i = 0; i < 20 && count_processes(marker) > 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(count_processes(marker) == 0);
}

TEST_CASE("a worker killed by SIGKILL: the launcher says so, and leaves no orphans", "[launcher][failure]") {
  const std::string marker = "distlab-orphan-marker-" + std::to_string(getpid());
  LaunchResult r = sh(run_cmd("-n 2 --master-port 0 --grace 2 -- bash -c 'if [ $RANK = 1 ]; then sleep 0.5; kill -9 $$; fi; "
                    "exec -a " + marker + " sleep 30'"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.secs < 10.0);
  CHECK_THAT(r.out, Catch::Contains("rank 1") && Catch::Contains("signal 9"));
  CHECK(count_processes(marker) == 0);
}

TEST_CASE("an extra all_reduce on rank 0 fails within the timeout, naming the collective", "[launcher][failure]") {
  LaunchResult r = sh("FIXTURE_TIMEOUT_MS=2000 " + run_cmd("-n 2 --master-port 0 --grace 2 -- "s + FIXTURE_WORKER + " extra"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.secs < 15.0);
  CHECK_THAT(r.out, Catch::Contains("all_reduce #1") && Catch::Contains("4096 f32") && Catch::Contains("timed out"));
  CHECK_THAT(r.out, Catch::Contains("missing: 1"));
}

TEST_CASE("DISTLAB_DEBUG=detail names both sides of a mismatched collective", "[launcher][failure]") {
  LaunchResult r = sh("DISTLAB_DEBUG=detail FIXTURE_TIMEOUT_MS=5000 " + run_cmd("-n 2 --master-port 0 --grace 2 -- "s + FIXTURE_WORKER + " mismatch"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.secs < 10.0);
  CHECK_THAT(r.out, Catch::Contains("all_reduce #1 of 4096 f32") && Catch::Contains("broadcast #1 of 10 f32"));
}

TEST_CASE("the whole group restarts with --max-restarts", "[launcher]") {
  fs::path flag = fs::temp_directory_path() / ("distlab-flaky-" + std::to_string(getpid()));
  fs::remove(flag);
  LaunchResult r = sh(run_cmd("-n 2 --master-port 0 --grace 2 --max-restarts 1 -- "s + FIXTURE_WORKER + " flaky " + flag.string()));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("restarting the group"));
  fs::remove(flag);
  LaunchResult no = sh(run_cmd("-n 2 --master-port 0 --grace 2 -- "s + FIXTURE_WORKER + " flaky " + flag.string()));
  CHECK(no.code == 1);
  fs::remove(flag);
}

TEST_CASE("Ctrl-C stops every worker", "[launcher][failure]") {
  const std::string marker = "distlab-sigint-marker-" + std::to_string(getpid());
  pid_t pid = fork();
  if (pid == 0) {
    execl(DISTLAB_BINARY, DISTLAB_BINARY, "run", "-n", "2", "--master-port", "0", "--grace", "2", "--", "bash", "-c",
          ("exec -a " + marker + " sleep 30").c_str(), nullptr);
    _exit(127);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  CHECK(count_processes(marker) == 2);
  kill(pid, SIGINT);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 130);
  CHECK(count_processes(marker) == 0);
}

TEST_CASE("two launchers on loopback make one job of two nodes", "[launcher]") {
  const int port = free_port();
  const std::string common = "--nnodes 2 --master-addr 127.0.0.1 --master-port " + std::to_string(port) + " -n 1 -- "s + FIXTURE_WORKER + " ok";
  std::string node1_out;
  std::thread node1([&] { node1_out = sh(run_cmd("--node-rank 1 " + common)).out; });
  LaunchResult node0 = sh(run_cmd("--node-rank 0 " + common));
  node1.join();
  INFO(node0.out << "\n---\n" << node1_out);
  CHECK(node0.code == 0);
  CHECK_THAT(node0.out, Catch::Contains("rank 0 of 2: sum 3"));
  CHECK_THAT(run_cmd("--nnodes 2 --master-port 0 -n 1 -- true"), Catch::Contains("run"));
  LaunchResult bad = sh(run_cmd("--nnodes 2 --node-rank 0 --master-port 0 -n 1 -- true"));
  CHECK(bad.code == 1);
  CHECK_THAT(bad.out, Catch::Contains("--master-port 0 works on one node only"));
}

TEST_CASE("a PyTorch program runs unchanged: MASTER_PORT is free for torch's own store", "[launcher][torch]") {
  INFO("Debian's python3-torch is not installed: run scripts/setup.sh --tests (apt-get install python3-torch)");
  REQUIRE(torch_installed());
  for (const std::string& port : {std::string("0"), std::to_string(free_port())}) {
    LaunchResult r = sh("timeout 120 "s + DISTLAB_BINARY + " run -n 2 --master-port " + port + " --log-dir " +
                  (fs::temp_directory_path() / ("distlab-torch-" + std::to_string(getpid()))).string() +
                  " -- /usr/bin/python3 tests/torch_ddp_min.py");
    INFO(r.out);
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Catch::Contains("torch rank 0 of 2: all_reduce 3.0, broadcast [0.0, 1.0, 2.0, 3.0], local rank 0"));
  }
  fs::remove_all(fs::temp_directory_path() / ("distlab-torch-" + std::to_string(getpid())));
}

TEST_CASE("garbage thrown at the store during a live 2-rank run: the run finishes", "[launcher][store]") {
  // the launcher with a low descriptor limit: 300 silent connections exhaust it, and it must keep accepting
  LaunchResult r = sh("FIXTURE_TIMEOUT_MS=60000 bash -c 'ulimit -Sn 96; timeout 120 "s + DISTLAB_BINARY + " run -n 2 --master-port 0 -- " +
                FIXTURE_WORKER + " fuzz-store'");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("rank 0: fuzz-store done"));
}

TEST_CASE("a launcher killed by SIGKILL leaves no workers nor their children, and frees its port", "[launcher][failure]") {
  const std::string marker = "distlab-guard-marker-" + std::to_string(getpid());
  const int port = free_port();
  // bash waits for a background sleep: the sleep is the worker's child, which PDEATHSIG alone would orphan
  LaunchResult started = sh(std::string(DISTLAB_BINARY) + " run -n 2 --master-port " + std::to_string(port) + " -- bash -c 'exec -a " + marker +
                      " sleep 300 & wait' > /dev/null 2>&1 & echo $!");
  const pid_t launcher = std::stoi(started.out);
  for (int i = 0; i < 100 && count_processes(marker) < 2; i++) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(count_processes(marker) == 2);
  kill(launcher, SIGKILL);
  for (int i = 0; i < 50 && count_processes(marker) > 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(count_processes(marker) == 0);
  LaunchResult again = sh(run_cmd("-n 1 --master-port " + std::to_string(port) + " -- true"));
  INFO(again.out);
  CHECK(again.code == 0);
}

TEST_CASE("a stopped rank is named as the cause, not the rank that timed out waiting for it", "[launcher][failure]") {
  LaunchResult r = sh("FIXTURE_TIMEOUT_MS=2000 " + run_cmd("-n 2 --master-port 0 --grace 1 -- "s + FIXTURE_WORKER + " stop-self 1"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("rank 1 (local rank 1") && Catch::Contains("stopped answering") && Catch::Contains("SIGSTOP"));
  CHECK_THAT(r.out, Catch::Contains("rank 0 failed waiting for it"));
}

// The same with the engine's strategies, whose collectives run on subgroups or were entered before the stop:
// a healthy rank that timed out was blamed under ZeRO-3 and pipeline parallelism ("ranks that arrived: ...").
TEST_CASE("a rank stopped during ZeRO-3, FSDP, tensor- or pipeline-parallel training is named as the cause", "[launcher][failure]") {
  for (const std::string sets : {"--set parallel.strategy=zero3", "--set parallel.strategy=fsdp", "--set parallel.tp=2",
                                 "--set parallel.pp=2 --set parallel.micro_batches=2"}) {
    INFO(sets);
    LaunchResult r = sh(run_cmd("-n 2 --master-port 0 --grace 1 -- bash -c 'if [ $RANK = 1 ]; then (sleep 4; kill -STOP $$) & fi; exec "s +
                      DISTLAB_BINARY + " train " + DISTLAB_SOURCE_DIR + "/configs/gpt-tiny.toml --set train.steps=1000000 "
                      "--set train.log_every=1000000 --set train.eval_every=0 --set dist.timeout_s=4 " + sets + "'"));
    INFO(r.out);
    CHECK(r.code == 1);
    CHECK_THAT(r.out, Catch::Contains("rank 1 (local rank 1") && Catch::Contains("stopped answering") && Catch::Contains("SIGSTOP"));
  }
}

// The same on 3 ranks with the two cores busy: a healthy rank's timeout may then fire first, waiting for the
// stopped rank and for another that waits on it (rank 0 was blamed: "alive but never reached the
// collective"). The launcher decides on evidence: the stopped state, then how many collectives each entered.
TEST_CASE("a rank stopped during a 3-rank ZeRO-3 run beside a CPU hog is named, not the rank waiting for it", "[launcher][failure]") {
  struct Hogs {  // two processes that spin, one per core, gone with the test whatever happens
    std::vector<pid_t> pids;
    Hogs() {
      for (int i = 0; i < 2; i++) {
        const pid_t h = fork();
        if (h == 0) {
          prctl(PR_SET_PDEATHSIG, SIGKILL);
          volatile unsigned long x = 0;
          for (;;) x = x + 1;
        }
        pids.push_back(h);
      }
    }
    ~Hogs() {
      for (pid_t h : pids) {
        kill(h, SIGKILL);
        waitpid(h, nullptr, 0);
      }
    }
  } hogs;
  {  // (the hogs take both cores from every test beside this one: one run)
    LaunchResult r = sh(run_cmd("-n 3 --master-port 0 --grace 1 -- bash -c 'if [ $RANK = 2 ]; then (sleep 5; kill -STOP $$) & fi; exec "s +
                      DISTLAB_BINARY + " train " + DISTLAB_SOURCE_DIR + "/configs/gpt-tiny.toml --set train.steps=1000000 "
                      "--set train.log_every=1000000 --set train.eval_every=0 --set dist.timeout_s=4 --set parallel.strategy=zero3'"));
    INFO(r.out);
    CHECK(r.code == 1);
    CHECK_THAT(r.out, Catch::Contains("rank 2 (local rank 2") && Catch::Contains("stopped answering") && Catch::Contains("SIGSTOP"));
  }
}

// SIGTERM to one rank (a preemption of one node): every rank saves and exits 143, and the headline names the
// rank that was sent it (it blamed rank 0, the first to exit)
TEST_CASE("a SIGTERM to one rank stops every rank after a checkpoint, and the rank that got it is named", "[launcher][failure]") {
  const fs::path ck = fs::temp_directory_path() / ("distlab-term1-" + std::to_string(getpid()));
  LaunchResult r = sh(run_cmd("-n 2 --master-port 0 --grace 5 -- bash -c 'if [ $RANK = 1 ]; then (sleep 4; kill -TERM $$) & fi; exec "s + DISTLAB_BINARY +
                    " train " + DISTLAB_SOURCE_DIR + "/configs/gpt-tiny.toml --set train.steps=1000000 --set train.log_every=1000000 "
                    "--set train.eval_every=0 --set parallel.strategy=ddp --set checkpoint.dir=" + ck.string() + "'"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("distlab run: rank 1 (local rank 1") && Catch::Contains("rank 1 was sent SIGTERM"));
  CHECK_THAT(r.out, Catch::Contains("stopped by SIGTERM (sent to rank 1) after step"));
  fs::remove_all(ck);
}

TEST_CASE("workers of a stopped launcher end themselves after the timeout", "[launcher][failure]") {
  const std::string marker = "distlab-stopped-launcher-" + std::to_string(getpid());
  LaunchResult started = sh("FIXTURE_TIMEOUT_MS=1500 "s + DISTLAB_BINARY + " run -n 2 --master-port 0 -- bash -c 'exec -a " + marker + " " +
                      FIXTURE_WORKER + " sleep' > /dev/null 2>&1 & echo $!");
  const pid_t launcher = std::stoi(started.out);
  for (int i = 0; i < 100 && count_processes(marker) < 2; i++) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  REQUIRE(count_processes(marker) == 2);
  kill(launcher, SIGSTOP);
  for (int i = 0; i < 100 && count_processes(marker) > 0; i++) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(count_processes(marker) == 0);  // 1.5 s stopped, then each worker's watchdog ends it
  kill(launcher, SIGCONT);
  for (int i = 0; i < 100 && kill(launcher, 0) == 0; i++) {
    waitpid(launcher, nullptr, WNOHANG);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

TEST_CASE("DISTLAB_DEBUG=detail names a disagreement on the reduce op or the broadcast root", "[launcher][failure]") {
  LaunchResult r = sh("DISTLAB_DEBUG=detail FIXTURE_TIMEOUT_MS=5000 " + run_cmd("-n 2 --master-port 0 --grace 1 -- "s + FIXTURE_WORKER + " op-mismatch"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("all_reduce #1 of 4096 f32 (sum)") && Catch::Contains("all_reduce #1 of 4096 f32 (max)"));
  r = sh("DISTLAB_DEBUG=detail FIXTURE_TIMEOUT_MS=5000 " + run_cmd("-n 2 --master-port 0 --grace 1 -- "s + FIXTURE_WORKER + " root-mismatch"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("(root 0)") && Catch::Contains("(root 1)"));
}

TEST_CASE("collectives of different sizes end with a distlab message, with or without detail", "[launcher][failure]") {
  LaunchResult r = sh("FIXTURE_TIMEOUT_MS=3000 " + run_cmd("-n 2 --master-port 0 --grace 1 -- "s + FIXTURE_WORKER + " size-mismatch"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("distlab run: rank"));
  CHECK_THAT(r.out, Catch::Contains("DISTLAB_DEBUG=detail") || Catch::Contains("all_reduce #1"));
  r = sh("DISTLAB_DEBUG=detail FIXTURE_TIMEOUT_MS=5000 " + run_cmd("-n 2 --master-port 0 --grace 1 -- "s + FIXTURE_WORKER + " size-mismatch"));
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK_THAT(r.out, Catch::Contains("all_reduce #1 of 4096 f32") && Catch::Contains("all_reduce #1 of 1000 f32"));
}

TEST_CASE("a worker inherits no socket, pipe or file of the launcher's, a port out of range is refused", "[launcher]") {
  // the worker lists its open descriptors: stdin, stdout and stderr (two ends of one pipe), and the
  // listing's own folder; no socket (the store's), no other rank's pipe, no log file
  LaunchResult r = sh(run_cmd("-n 2 --master-port 0 --log-dir " + (fs::temp_directory_path() / ("distlab-fds-" + std::to_string(getpid()))).string() +
                    " -- bash -c 'ls -l /proc/$$/fd; echo listed'"));
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK_THAT(r.out, Catch::Contains("listed") && !Catch::Contains("socket:") && !Catch::Contains("rank_"));
  size_t pipes = 0;
  for (size_t at = r.out.find("pipe:"); at != std::string::npos; at = r.out.find("pipe:", at + 1)) pipes++;
  CHECK(pipes == 2);
  fs::remove_all(fs::temp_directory_path() / ("distlab-fds-" + std::to_string(getpid())));
  r = sh(run_cmd("-n 1 --master-port 70000 -- true"));
  INFO(r.out);
  CHECK(r.code != 0);
  CHECK_THAT(r.out, Catch::Contains("70000") && Catch::Contains("65535"));
}

TEST_CASE("launcher options out of range are refused before anything starts", "[launcher]") {
  CHECK(sh(run_cmd("-n 1 --master-port 0 -- true")).code == 0);  // the same line with good values runs
  for (const std::string bad : {"--threads-per-rank 100000", "--grace nan", "--grace -1", "--max-restarts -2"}) {
    LaunchResult r = sh(run_cmd("-n 1 --master-port 0 " + bad + " -- true"));
    INFO(bad << "\n" << r.out);
    CHECK(r.code != 0);
    CHECK_THAT(r.out, Catch::Contains(bad.substr(0, bad.find(' '))));
  }
  for (const std::string bad : {"-n 0", "-n 100000"}) {
    LaunchResult r = sh(run_cmd(bad + " --master-port 0 -- true"));
    INFO(bad << "\n" << r.out);
    CHECK(r.code != 0);
  }
}

// The grader's training jobs run as nobody where the grader is root (grader/jobs.h): the child drops its
// uid, gid and groups before exec, after joining its cgroup.
TEST_CASE("spawn_process with run_as drops a root parent's child to that user and no groups", "[launcher][sandbox]") {
  if (geteuid() != 0) SUCCEED("not root: nothing to drop");
  else {
    distlab::SpawnOptions o;
    o.run_as = distlab::kJobUid;
    const distlab::RunResult r = distlab::run_to_end({"/bin/sh", "-c", "id -u; id -g; id -G"}, o, 20);
    CHECK(r.output == "65534\n65534\n65534\n");
    distlab::SpawnOptions stay;
    CHECK(distlab::run_to_end({"/bin/sh", "-c", "id -u"}, stay, 20).output == "0\n");
  }
}
