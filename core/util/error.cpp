#include "core/util/error.h"

#include <fmt/format.h>

namespace distlab {

void assert_fail(const char* cond, const char* file, int line, const std::string& msg) {
  throw Error(fmt::format("internal error at {}:{}: {} ({})", file, line, msg, cond),
              "this is a bug in distlab, not in your config: please report it with the command you ran");
}

}  // namespace distlab
