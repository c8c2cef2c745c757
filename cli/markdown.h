#pragma once
// The chapters' Markdown for a terminal (cli/markdown.cpp): headings underlined, **bold**, *emphasis* and
// `code` shown as such (ANSI on a terminal, the plain text elsewhere), links as "text (url)", fenced code
// indented and kept byte for byte, tables aligned in columns with a rule under their header, lists with
// bullets, quotes with a bar. What `distlab chapter show` prints; `--raw` prints the file as it is.
#include <string>

namespace distlab {

std::string render_markdown(const std::string& markdown, bool ansi);

}  // namespace distlab
