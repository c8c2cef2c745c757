#include "core/perf/hardware.h"

#include <cctype>

#include "core/util/error.h"
#include "core/util/units.h"

namespace distlab {

const std::vector<HardwareProfile>& hardware_profiles() {
  static const std::vector<HardwareProfile> p = {
      {"t4", 16LL << 30, "NVIDIA T4 data sheet: 16 GB GDDR6"},
      {"a100-40g", 40LL << 30, "NVIDIA A100 data sheet: 40 GB HBM2"},
      {"a100-80g", 80LL << 30, "NVIDIA A100 data sheet: 80 GB HBM2e"},
      {"h100", 80LL << 30, "NVIDIA H100 SXM data sheet: 80 GB HBM3"},
      {"h200", 141000000000LL, "NVIDIA H200 data sheet: 141 GB HBM3e"},
  };
  return p;
}

std::optional<HardwareProfile> find_profile(const std::string& name) {
  for (const auto& p : hardware_profiles())
    if (p.name == name) return p;
  return std::nullopt;
}

int64_t parse_device_memory(const std::string& text, const std::string& what) {
  if (auto p = find_profile(text)) return p->memory_bytes;
  if (!text.empty() && !std::isdigit(static_cast<unsigned char>(text[0])) && text[0] != '.') {
    std::string names;
    for (const auto& p : hardware_profiles()) names += (names.empty() ? "" : ", ") + p.name;
    throw ConfigError(what + ": unknown device profile '" + text + "'", "use a size such as 16GiB or a profile: " + names);
  }
  return parse_bytes(text, what);
}

}  // namespace distlab
