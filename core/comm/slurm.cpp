#include "core/comm/slurm.h"

#include <fmt/format.h>

#include <algorithm>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "core/comm/errors.h"

namespace distlab {

namespace {

const char* var(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

long number(const std::string& text, const std::string& what, long max = 1L << 40) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end || x < 0 || x > max || errno == ERANGE)
    throw CommError(fmt::format("{}='{}' is not a number in 0..{}", what, text, max),
                    "distlab reads what srun sets for its tasks; run it under srun, or unset the variable");
  return x;
}

long int_var(const char* name, long fallback) {
  const char* v = var(name);
  return v ? number(v, std::string("environment variable ") + name) : fallback;
}

// "01-03,07" -> 01 02 03 07, each number as wide as the range's first
std::vector<std::string> expand_ranges(const std::string& ranges, const std::string& what) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= ranges.size()) {
    size_t comma = ranges.find(',', start);
    if (comma == std::string::npos) comma = ranges.size();
    const std::string r = ranges.substr(start, comma - start);
    const size_t dash = r.find('-');
    const std::string lo = r.substr(0, dash), hi = dash == std::string::npos ? lo : r.substr(dash + 1);
    const long a = number(lo, what + " (a range's start)", 1L << 31), b = number(hi, what + " (a range's end)", 1L << 31);
    if (b < a || b - a > 100000) throw CommError(fmt::format("{}: the range '{}' is empty or too long", what, r));
    for (long x = a; x <= b; x++) {
      std::string digits = std::to_string(x);
      out.push_back(std::string(lo.size() > digits.size() ? lo.size() - digits.size() : 0, '0') + digits);
    }
    start = comma + 1;
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& list, const std::string& what) {
  std::vector<std::string> hosts;
  size_t i = 0;
  while (i < list.size()) {
    // one term: text and [ranges] groups up to a comma outside brackets; each group multiplies the names
    std::vector<std::string> names{""};
    while (i < list.size() && list[i] != ',') {
      if (list[i] == '[') {
        const size_t close = list.find(']', i);
        if (close == std::string::npos) throw CommError(fmt::format("{}: '[' without ']' in '{}'", what, list));
        const std::vector<std::string> parts = expand_ranges(list.substr(i + 1, close - i - 1), what);
        std::vector<std::string> next;
        for (const auto& n : names)
          for (const auto& p : parts) next.push_back(n + p);
        names = std::move(next);
        i = close + 1;
      } else if (list[i] == ']' || list[i] == ' ') {
        throw CommError(fmt::format("{}: unexpected '{}' in '{}'", what, list[i], list));
      } else {
        for (auto& n : names) n += list[i];
        i++;
      }
    }
    if (names.front().empty()) throw CommError(fmt::format("{}: an empty host name in '{}'", what, list));
    hosts.insert(hosts.end(), names.begin(), names.end());
    i++;  // the comma
  }
  if (hosts.empty()) throw CommError(what + ": no host in an empty list");
  return hosts;
}

std::vector<int> expand_tasks_per_node(const std::string& text, const std::string& what) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    const std::string t = text.substr(start, comma - start);  // "2" or "2(x3)"
    const size_t paren = t.find("(x");
    const int n = int(number(t.substr(0, paren), what, 1 << 20));
    long repeat = 1;
    if (paren != std::string::npos) {
      if (t.back() != ')') throw CommError(fmt::format("{}: '{}' is not N or N(xK)", what, t));
      repeat = number(t.substr(paren + 2, t.size() - paren - 3), what, 1 << 20);
    }
    out.insert(out.end(), size_t(repeat), n);
    start = comma + 1;
  }
  return out;
}

SlurmStep read_slurm_step() {
  SlurmStep s;
  if (!var("SLURM_STEP_NUM_TASKS") || !var("SLURM_PROCID")) return s;
  if (var("DISTLAB_SLURM") && std::string(var("DISTLAB_SLURM")) == "0") return s;
  s.inside = true;
  s.ntasks = int(int_var("SLURM_STEP_NUM_TASKS", 1));
  s.procid = int(int_var("SLURM_PROCID", 0));
  s.localid = int(int_var("SLURM_LOCALID", 0));
  s.nnodes = int(int_var("SLURM_STEP_NUM_NODES", 1));
  s.job_id = int_var("SLURM_JOB_ID", 0);
  s.step_id = int_var("SLURM_STEP_ID", 0);
  if (s.ntasks < 1 || s.procid >= s.ntasks)
    throw CommError(fmt::format("SLURM_PROCID={} is not below SLURM_STEP_NUM_TASKS={}", s.procid, s.ntasks));
  const char* list = var("SLURM_STEP_NODELIST") ? var("SLURM_STEP_NODELIST") : var("SLURM_JOB_NODELIST");
  if (!list) throw CommError("srun's task has no SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST", "run distlab as srun starts it, with Slurm's environment");
  s.nodes = expand_hostlist(list, "SLURM_STEP_NODELIST");
  if (int(s.nodes.size()) != s.nnodes)
    throw CommError(fmt::format("SLURM_STEP_NODELIST names {} nodes, SLURM_STEP_NUM_NODES says {}", s.nodes.size(), s.nnodes));
  s.node_index = int(int_var("SLURM_NODEID", 0));
  if (const char* me = var("SLURMD_NODENAME"))
    for (size_t i = 0; i < s.nodes.size(); i++)
      if (s.nodes[i] == me) s.node_index = int(i);
  if (s.node_index >= s.nnodes) throw CommError(fmt::format("this node's index {} is not below the step's {} nodes", s.node_index, s.nnodes));
  const char* per_node = var("SLURM_STEP_TASKS_PER_NODE");
  const std::vector<int> counts = per_node ? expand_tasks_per_node(per_node, "SLURM_STEP_TASKS_PER_NODE") : std::vector<int>(size_t(s.nnodes), s.ntasks / s.nnodes);
  if (int(counts.size()) != s.nnodes)
    throw CommError(fmt::format("SLURM_STEP_TASKS_PER_NODE='{}' covers {} nodes, the step has {}", per_node ? per_node : "", counts.size(), s.nnodes));
  s.local_tasks = counts[size_t(s.node_index)];
  if (s.local_tasks < 1 || s.localid >= s.local_tasks)
    throw CommError(fmt::format("SLURM_LOCALID={} is not below this node's {} tasks", s.localid, s.local_tasks));
  return s;
}

std::string slurm_master_addr(const SlurmStep& s) {
  if (const char* a = var("MASTER_ADDR")) return a;
  return s.nodes.size() <= 1 ? "127.0.0.1" : s.nodes.front();  // one node: loopback, whatever its name resolves to
}

bool slurm_port_given() { return var("MASTER_PORT") != nullptr; }

std::vector<int> slurm_master_ports(const SlurmStep& s) {
  if (slurm_port_given()) return {int(number(var("MASTER_PORT"), "environment variable MASTER_PORT", 65534))};
  // even ports in 15000..30998 (below Linux's ephemeral ports, 32768 on) and the odd one after each, mixed
  // from the job and step ids (Knuth's multiplicative hash), so that neighbouring jobs and steps differ; the
  // k-th candidate moves by another multiplier, so two jobs that share their first rarely share the next
  std::vector<int> ports;
  for (uint64_t k = 0; int(ports.size()) < kSlurmPortCandidates; k++) {
    const uint64_t h = (uint64_t(s.job_id) * 2654435761ULL + uint64_t(s.step_id) * 40503ULL + k * (k + uint64_t(s.job_id % 7919) + 1) * 104729ULL) % 8000;
    const int p = 15000 + 2 * int(h);
    if (std::find(ports.begin(), ports.end(), p) == ports.end()) ports.push_back(p);
  }
  return ports;
}

std::string slurm_job_token(const SlurmStep& s) { return fmt::format("slurm-{}.{}", s.job_id, s.step_id); }

std::string shell_quote(const std::string& s) {
  bool plain = !s.empty();
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || std::string("@%+=:,./_-").find(c) != std::string::npos)) plain = false;
  if (plain) return s;
  std::string o = "'";
  for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return o + "'";
}

void check_slurm_time(const std::string& t, const std::string& what) {
  // D-H, D-H:M, D-H:M:S, M, M:S, H:M:S: digits and at most one '-' before at most two ':'
  const size_t dash = t.find('-');
  const std::string clock = dash == std::string::npos ? t : t.substr(dash + 1);
  int colons = 0;
  bool ok = !t.empty() && !clock.empty() && (dash == std::string::npos || dash > 0);
  for (size_t i = 0; ok && i < t.size(); i++) {
    if (t[i] == ':') colons++;
    else if (t[i] == '-') ok = i == dash && colons == 0;
    else ok = std::isdigit(static_cast<unsigned char>(t[i]));
  }
  if (!ok || colons > 2 || clock.front() == ':' || clock.back() == ':' || clock.find("::") != std::string::npos)
    throw ConfigError(fmt::format("{} '{}' is not a Slurm time limit", what, t), "use minutes (90), H:M:S (01:30:00) or days-hours (1-12)");
}

std::string sbatch_script(const SbatchJob& j) {
  check_slurm_time(j.time, "--time");
  auto name_ok = [](const std::string& n) {
    for (char c : n)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
    return !n.empty();
  };
  if (!name_ok(j.job_name)) throw ConfigError(fmt::format("--job-name '{}': use letters, digits, '-', '_' and '.'", j.job_name));
  if (!j.partition.empty() && !name_ok(j.partition)) throw ConfigError(fmt::format("--partition '{}': use letters, digits, '-', '_' and '.'", j.partition));
  if (j.command.empty()) throw ConfigError("--slurm-script: nothing to run", "give the subcommand after the options: ... --slurm-script train CONFIG");
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# distlab: {} node(s) x {} rank(s). Submit it with `sbatch FILE`; the output goes to {}.\n", j.nodes, j.ranks_per_node, j.output);
  s += fmt::format("#SBATCH --job-name={}\n#SBATCH --nodes={}\n#SBATCH --ntasks-per-node=1\n", j.job_name, j.nodes);
  // the launcher's task holds the node's CPUs for its ranks: those asked for, else the whole node
  s += j.cpus_per_node > 0 ? fmt::format("#SBATCH --cpus-per-task={}\n", j.cpus_per_node) : std::string("#SBATCH --exclusive\n");
  if (j.gpus_per_node > 0) s += fmt::format("#SBATCH --gpus-per-node={}\n", j.gpus_per_node);
  if (!j.partition.empty()) s += fmt::format("#SBATCH --partition={}\n", j.partition);
  s += fmt::format("#SBATCH --time={}\n#SBATCH --output={}\n", j.time, j.output);
  s += "set -euo pipefail\n";
  s += "# this job's token: distlab's rendezvous store refuses any client without it; srun passes the environment on\n";
  s += "export DISTLAB_STORE_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\n";
  s += "# one launcher per node: each takes its node rank and the master (the first node) from Slurm;\n";
  s += "# --kill-on-bad-exit stops every node when one fails; srun (22.05 on) is told the CPUs again\n";
  s += "srun --kill-on-bad-exit=1 --cpus-per-task=${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE}";
  for (size_t i = 0; i < j.command.size(); i++) {
    s += ' ';
    s += shell_quote(j.command[i]);
    if (i == 0) {
      s += fmt::format(" run -n {}", j.ranks_per_node);
      for (const auto& a : j.launcher_args) s += " " + shell_quote(a);
    }
  }
  return s + "\n";
}

}  // namespace distlab
