#include "core/util/units.h"

#include <fmt/format.h>

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "core/util/error.h"

namespace distlab {

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  if (u == 0) return fmt::format("{:.0f} B", v);
  return fmt::format("{:.2f} {}", v, units[u]);
}

int64_t parse_bytes(const std::string& text, const std::string& what) {
  const char* s = text.c_str();
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || !(v >= 0)) {
    throw ConfigError(fmt::format("{}: '{}' is not a size", what, text), "write a number with a unit, e.g. 16GiB, 512MiB, 80GB");
  }
  std::string unit;
  for (const char* p = end; *p; ++p)
    if (!std::isspace(static_cast<unsigned char>(*p))) unit += char(std::tolower(static_cast<unsigned char>(*p)));
  double mul = 0;
  if (unit.empty() || unit == "b") mul = 1;
  else if (unit == "k" || unit == "kib") mul = 1024.0;
  else if (unit == "m" || unit == "mib") mul = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") mul = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") mul = 1e3;
  else if (unit == "mb") mul = 1e6;
  else if (unit == "gb") mul = 1e9;
  else if (unit == "tb") mul = 1e12;
  else
    throw ConfigError(fmt::format("{}: unknown unit '{}' in '{}'", what, unit, text),
                      "units: B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)");
  // an int64 holds 8 EiB; no device or host comes near it, and past it the count would wrap negative
  if (!(v * mul < 9.2e18))
    throw ConfigError(fmt::format("{}: '{}' is more bytes than a size can hold here (8 EiB)", what, text), "write a size such as 80GB or 16GiB");
  return int64_t(std::llround(v * mul));
}

}  // namespace distlab
