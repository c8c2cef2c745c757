#include "core/tensor/device.h"

#include "core/util/error.h"

namespace distlab {

const char* device_name(DeviceKind d) {
  switch (d) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::meta: return "meta";
    case DeviceKind::cuda: return "cuda";
  }
  return "?";
}

DeviceKind parse_device(const std::string& s) {
  if (s == "cpu") return DeviceKind::cpu;
  if (s == "meta") return DeviceKind::meta;
  if (s == "cuda")
    throw ConfigError("device 'cuda' is not available in this build",
                      "this version runs on cpu and meta; use --device cpu (real numbers) or --device meta (shapes, memory, FLOPs)");
  throw ConfigError("unknown device '" + s + "'", "use cpu or meta");
}

}  // namespace distlab
