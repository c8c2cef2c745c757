// `distlab bench published`: the cost model's validation table (bench/published.toml). See published_cmd.cpp.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace distlab {

struct PublishedArgs {
  std::string table = "bench/published.toml";
  std::string root;  // the runs' config paths are relative to it ("" = the current folder)
  std::string json;
};

// Prints the table; 1 when a run disagrees with it (outside the band without an `outside`, or inside with one).
int run_published(const PublishedArgs& a);
void add_published_command(CLI::App* bench, int& exit_code);

}  // namespace distlab
