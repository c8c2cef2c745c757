// A guard in front of the TOML and JSON parsers for text a user (or a hostile submission) wrote: both
// parsers recurse once per level of nesting, so a header [a.a.a. ... ] of 300,000 parts, or 100,000 '['
// in a row, overflows the stack of the process that parses it. check_nesting refuses such text first, with
// a message naming the file and the line, before any parser sees it.
#pragma once
#include <string>

namespace distlab {

constexpr int kMaxNesting = 64;  // levels of [ ] and { }, and parts of one dotted key or table header

// Throws ConfigError ("<source>:<line>: ... nested N levels deep ...") when `text` nests deeper than
// kMaxNesting; strings and comments are skipped, so their brackets and dots don't count.
void check_nesting(const std::string& text, const std::string& source);

}  // namespace distlab
