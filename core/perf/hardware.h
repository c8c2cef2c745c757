// Hardware profiles. This version carries the simulated device memory of each (nominal capacity, as the
// vendor's data sheet states it); the cost model adds FLOP/s and link bandwidths to the same table.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace distlab {

struct HardwareProfile {
  std::string name;
  int64_t memory_bytes;
  std::string source;  // where the number comes from
};

const std::vector<HardwareProfile>& hardware_profiles();
std::optional<HardwareProfile> find_profile(const std::string& name);
// "16GiB" / "80GB" / a profile name ("t4", "a100-80g", ...) -> bytes. ConfigError naming `what` otherwise.
int64_t parse_device_memory(const std::string& text, const std::string& what);

}  // namespace distlab
