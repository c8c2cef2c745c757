// One error policy for the engine: every failure a user can cause is an `Error` with a message that names
// the thing (key, file, rank, collective) and a hint that says what to try next. Internal invariants use
// DL_ASSERT, which adds the source location.
#pragma once
#include <stdexcept>
#include <string>

namespace distlab {

class Error : public std::runtime_error {
 public:
  Error(const std::string& what, std::string hint = "") : std::runtime_error(what), hint_(std::move(hint)) {}
  const std::string& hint() const { return hint_; }
  // "what" followed by "hint: ..." on its own line when there is one.
  std::string full() const { return hint_.empty() ? std::string(what()) : std::string(what()) + "\n  hint: " + hint_; }

 private:
  std::string hint_;
};

struct ConfigError : Error { using Error::Error; };  // a key, a type, a value, file:line
struct DataError : Error { using Error::Error; };    // a data set missing, truncated or corrupt
struct IoError : Error { using Error::Error; };      // a file that can't be read or written
struct ShapeError : Error { using Error::Error; };   // tensors that don't fit together
struct OutOfMemoryError : Error { using Error::Error; };  // simulated device memory exhausted

[[noreturn]] void assert_fail(const char* cond, const char* file, int line, const std::string& msg);

}  // namespace distlab

#define DL_ASSERT(cond, msg)                                                    \
  do {                                                                          \
    if (!(cond)) ::distlab::assert_fail(#cond, __FILE__, __LINE__, (msg));      \
  } while (0)
