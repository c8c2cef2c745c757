#include "cli/paths.h"

#include <cstdlib>
#include <filesystem>

#include "core/util/error.h"

namespace distlab {

namespace fs = std::filesystem;

std::string tree_source_dir() {
  const char* env = std::getenv("DISTLAB_SOURCE_DIR");
  if (!env || !*env) return DISTLAB_SOURCE_DIR;
  std::error_code ec;
  if (!fs::is_directory(fs::path(env) / "labs", ec))
    throw ConfigError(std::string("DISTLAB_SOURCE_DIR='") + env + "' is not a distlab tree (it has no labs/ folder)",
                      "point it at the repository's root, or unset it to use the one this distlab was built from");
  return fs::absolute(env).string();
}

std::string tree_build_dir() {
  const char* env = std::getenv("DISTLAB_BUILD_DIR");
  if (!env || !*env) return DISTLAB_BUILD_DIR;
  std::error_code ec;
  fs::create_directories(env, ec);
  if (!fs::is_directory(env, ec))
    throw ConfigError(std::string("DISTLAB_BUILD_DIR='") + env + "' is not a folder this user can make",
                      "point it at a writable folder (plugins and the grader's caches go there), or unset it");
  return fs::absolute(env).string();
}

}  // namespace distlab
