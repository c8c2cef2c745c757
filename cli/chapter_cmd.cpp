#include "cli/chapter_cmd.h"
#include "cli/paths.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iterator>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <vector>

#include "cli/markdown.h"
#include "core/util/error.h"

namespace fs = std::filesystem;

namespace distlab {

namespace {

struct Chapter {
  int number;
  std::string name;  // "08-tp-pp"
  std::string title;
  fs::path file;
};

// chapters/NN-topic.md, in order; the title is the file's first "# " line
std::vector<Chapter> all_chapters() {
  const fs::path dir = fs::path(tree_source_dir()) / "chapters";
  std::vector<Chapter> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().stem().string();
    if (e.path().extension() != ".md" || name.size() < 4 || !std::isdigit(name[0]) || !std::isdigit(name[1]) || name[2] != '-') continue;
    Chapter c{std::stoi(name.substr(0, 2)), name, name, e.path()};
    std::ifstream in(e.path());
    for (std::string line; std::getline(in, line);)
      if (line.rfind("# ", 0) == 0) {
        c.title = line.substr(2);
        break;
      }
    v.push_back(c);
  }
  std::sort(v.begin(), v.end(), [](const Chapter& a, const Chapter& b) { return a.number < b.number; });
  return v;
}

}  // namespace

void add_chapter_commands(CLI::App& app) {
  CLI::App* ch = app.add_subcommand("chapter", "the course's chapters: list, show N");
  ch->require_subcommand(1);
  ch->add_subcommand("list", "every chapter with its title")->callback([] {
    for (const Chapter& c : all_chapters()) std::cout << fmt::format("{:>2}  {}\n", c.number, c.title);
  });
  auto which = std::make_shared<std::string>();
  auto raw = std::make_shared<bool>(false);
  auto no_pager = std::make_shared<bool>(false);
  auto* show = ch->add_subcommand("show", "print a chapter (rendered for the terminal; through a pager on one)");
  show->add_option("chapter", *which, "its number (8) or name (08-tp-pp)")->required();
  show->add_flag("--raw", *raw, "the Markdown file as it is");
  show->add_flag("--no-pager", *no_pager, "print it, even on a terminal");
  show->callback([which, raw, no_pager] {
    const auto all = all_chapters();
    for (const Chapter& c : all) {
      bool number = !which->empty() && which->find_first_not_of("0123456789") == std::string::npos;
      if ((number && which->size() < 4 && std::stoi(*which) == c.number) || *which == c.name) {
        std::ifstream in(c.file);
        const std::string md((std::istreambuf_iterator<char>(in)), {});
        const bool tty = isatty(1);
        const std::string text = *raw ? md : render_markdown(md, tty);
        // on a terminal, through the user's pager ($PAGER, else less -R: it keeps the colours), as git does
        if (tty && !*no_pager) {
          const char* pager = std::getenv("PAGER");
          const std::string cmd = pager && *pager ? pager : "less -R";
          if (FILE* p = popen(cmd.c_str(), "w")) {
            std::fwrite(text.data(), 1, text.size(), p);
            if (pclose(p) == 0) return;
          }
        }
        std::cout << text;
        return;
      }
    }
    std::string names;
    for (const Chapter& c : all) names += fmt::format("{}{}", names.empty() ? "" : ", ", c.number);
    throw Error(fmt::format("no chapter '{}'", *which), names.empty() ? "no chapters/ folder beside this build"
                                                                       : "the chapters are " + names + " (distlab chapter list)");
  });
}

}  // namespace distlab
