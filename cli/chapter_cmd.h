#pragma once
#include <CLI/CLI.hpp>

namespace distlab {
// `distlab chapter list | show N`: the course's chapters (chapters/NN-topic.md) in the terminal. Each ends
// with its lab; tests/test_cli.cpp runs every `distlab` command a chapter quotes.
void add_chapter_commands(CLI::App& app);
}  // namespace distlab
