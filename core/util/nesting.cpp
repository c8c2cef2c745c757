#include "core/util/nesting.h"

#include <fmt/format.h>

#include "core/util/error.h"

namespace distlab {

void check_nesting(const std::string& text, const std::string& source) {
  int depth = 0, dots = 0, line = 1;
  bool in_key = true;  // at a line's start, until its '=': dots there are parts of a dotted key or header
  auto refuse = [&](const char* what, int n) {
    throw ConfigError(fmt::format("{}:{}: {} {} levels deep (at most {})", source, line, what, n, kMaxNesting),
                      "a config or an answers file is a few flat tables: nothing here needs that nesting");
  };
  for (size_t i = 0; i < text.size(); i++) {
    const char c = text[i];
    if (c == '\n') {
      line++;
      in_key = true;
      dots = 0;
    } else if (c == '#' && in_key) {  // a comment: to the end of the line
      while (i + 1 < text.size() && text[i + 1] != '\n') i++;
    } else if (c == '"' || c == '\'') {  // a string: to its closing quote (triple quotes end at the first match too)
      for (i++; i < text.size() && text[i] != c; i++) {
        if (c == '"' && text[i] == '\\') i++;
        if (i < text.size() && text[i] == '\n') line++;
      }
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxNesting) refuse("brackets nested", depth);
    } else if (c == ']' || c == '}') {
      depth = depth > 0 ? depth - 1 : 0;
    } else if (c == '=' || c == ':' || c == ',') {
      in_key = false;
    } else if (c == '.' && in_key) {
      if (++dots > kMaxNesting) refuse("a dotted key or table header", dots);
    }
  }
}

}  // namespace distlab
