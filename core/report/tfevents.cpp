// tfevents (core/report/tfevents.h): a protocol buffer encoder of the few fields an Event needs, and the
// TFRecord framing around each.
#include "core/report/tfevents.h"

#include <array>
#include <cstring>

namespace distlab {

namespace {

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? 0x82F63B78u ^ (c >> 1) : c >> 1;  // the reflected Castagnoli polynomial
    t[i] = c;
  }
  return t;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// protocol buffer wire format: a varint, a key (field << 3 | wire type), fixed-size little-endian numbers
void varint(std::string& o, uint64_t v) {
  while (v >= 0x80) {
    o += char(uint8_t(v) | 0x80);
    v >>= 7;
  }
  o += char(uint8_t(v));
}
void key(std::string& o, int field, int wire) { varint(o, uint64_t(field) << 3 | uint64_t(wire)); }
template <class T>
void fixed(std::string& o, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian on every machine distlab builds for
  o.append(b, sizeof(T));
}
void bytes(std::string& o, int field, const std::string& s) {
  key(o, field, 2);
  varint(o, s.size());
  o += s;
}

std::string event(double wall_time, int64_t step, const std::string& file_version, const Scalar* s) {
  std::string e;
  key(e, 1, 1);
  fixed(e, wall_time);
  key(e, 2, 0);
  varint(e, uint64_t(step));
  if (!file_version.empty()) bytes(e, 3, file_version);
  if (s) {
    std::string value;  // Summary.Value
    bytes(value, 1, s->tag);
    key(value, 2, 5);
    fixed(value, s->value);
    std::string summary;
    bytes(summary, 1, value);
    bytes(e, 5, summary);
  }
  return e;
}

void record(std::string& o, const std::string& data) {
  const uint64_t n = data.size();
  std::string len;
  fixed(len, n);
  o += len;
  fixed(o, masked(crc32c(len.data(), len.size())));
  o += data;
  fixed(o, masked(crc32c(data.data(), data.size())));
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  uint32_t c = 0xFFFFFFFFu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::string tfevents(const std::vector<Scalar>& scalars, double start_time) {
  std::string o;
  record(o, event(start_time, 0, "brain.Event:2", nullptr));
  for (const Scalar& s : scalars) record(o, event(s.wall_time, s.step, "", &s));
  return o;
}

}  // namespace distlab
