// Human-readable byte sizes, both ways: "16GiB" <-> 17179869184.
#pragma once
#include <cstdint>
#include <string>

namespace distlab {

std::string format_bytes(double bytes);              // "1.50 GiB", "12.0 MiB", "512 B"
// Parses "16GiB", "16 GB", "512MiB", "1e9", "4096". Throws ConfigError naming `what` when it can't.
int64_t parse_bytes(const std::string& text, const std::string& what);

}  // namespace distlab
