// distlab: the command-line front of the engine. Each subcommand lives in its own file.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <malloc.h>
#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <iostream>

#include "cli/bench_cmd.h"
#include "cli/ckpt_cmd.h"
#include "cli/chapter_cmd.h"
#include "cli/doctor_cmd.h"
#include "cli/env_cmd.h"
#include "cli/export_cmd.h"
#include "cli/lab_cmd.h"
#include "cli/plan_cmd.h"
#include "cli/plot_cmd.h"
#include "cli/quiz_cmd.h"
#include "cli/run_cmd.h"
#include "cli/train_cmd.h"
#include "core/comm/error_file.h"
#include "core/util/error.h"

int main(int argc, char** argv) {
  // a write past a file size limit fails with EFBIG, which every writer reports, instead of killing us
  signal(SIGXFSZ, SIG_IGN);
  // A training step frees and allocates the same activations and gradients again: keep freed memory in the
  // heap (up to 512 MiB above the peak's top) instead of handing it back to the kernel and faulting it in
  // again, page by page, on the next step. GPT-tiny under ZeRO-2 on 2 ranks: 12,000 page faults -> 3,300.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  distlab::install_terminate_handler();
  CLI::App app{"distlab — a workbench for learning distributed training"};
  app.require_subcommand(1);
  int exit_code = 0;
  distlab::add_train_command(app, exit_code);
  distlab::add_plan_command(app, exit_code);
  distlab::add_ckpt_commands(app, exit_code);
  char self[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  // `distlab run ... -- PROGRAM ARGS`: the program's arguments are not ours to parse
  std::vector<std::string> program;
  std::vector<char*> ours(argv, argv + argc);
  for (int i = 1; i < argc; i++)
    if (std::string(argv[i]) == "--") {
      program.assign(argv + i + 1, argv + argc);
      ours.resize(size_t(i));
      break;
    }
  const std::string self_exe = n > 0 ? std::string(self, size_t(n)) : std::string(argv[0]);
  distlab::add_run_command(app, exit_code, self_exe, program);
  distlab::add_bench_command(app, exit_code, self_exe);
  distlab::add_lab_commands(app, exit_code, self_exe);
  distlab::add_chapter_commands(app);
  distlab::add_env_command(app);
  distlab::add_doctor_command(app);
  distlab::add_export_commands(app, exit_code);
  distlab::add_plot_commands(app);
  distlab::add_quiz_command(app, exit_code, self_exe);
  // `distlab run` asks this of its subcommand once before it starts the ranks (each would print the same
  // argument error): parse, check, and stop before any subcommand runs
  if (const char* only = std::getenv("DISTLAB_ARGS_ONLY"); only && std::string(only) == "1") app.parse_complete_callback([] { std::exit(0); });
  try {
    app.parse(int(ours.size()), ours.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const distlab::Error& e) {
    std::cout.flush();
    std::cerr << ("distlab: error: " + e.full() + "\n") << std::flush;  // one write: a stop signal can't cut it
    distlab::record_worker_error(e);
    return 1;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << ("distlab: error: " + std::string(e.what()) + "\n") << std::flush;
    distlab::record_worker_error(e);
    return 1;
  }
  return exit_code;
}
