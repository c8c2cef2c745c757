// distlab: the command-line front of the engine. Each subcommand lives in its own file.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>

#include "cli/train_cmd.h"
#include "core/util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"distlab — a workbench for learning distributed training"};
  app.require_subcommand(1);
  int exit_code = 0;
  distlab::add_train_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const distlab::Error& e) {
    std::cout.flush();
    std::cerr << "distlab: error: " << e.full() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::cerr << "distlab: error: " << e.what() << "\n";
    return 1;
  }
  return exit_code;
}
