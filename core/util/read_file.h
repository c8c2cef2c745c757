// Reading a file a user (or anyone) may have replaced: a symbolic link to /dev/zero, a FIFO that never
// ends, a file larger than what its reader can hold. read_regular_file opens without blocking (O_NONBLOCK),
// refuses anything that is not, once opened, a regular file (fstat: a link to a regular file is fine, as a
// Hugging Face cache's are) and any file over `max_bytes`, then reads what fstat said. Read next:
// core/ckpt/checkpoint.cpp, core/ckpt/safetensors.cpp.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace distlab {

// Throws IoError naming the path (and `what`: "the checkpoint's manifest") when the file can't be read,
// is not a regular file, or is larger than `max_bytes`. follow_links = false: a symbolic link at `path`
// is refused too (a cache's entry is a file the program wrote itself, never a link).
std::vector<uint8_t> read_regular_file(const std::string& path, uint64_t max_bytes, const std::string& what, bool follow_links = true);

}  // namespace distlab
