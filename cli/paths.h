// Where this distlab's own tree is (labs/, solutions/, chapters/, configs/) and where it builds plugins and
// keeps its caches (build/): the folders it was built from, or, for a build carried to another machine
// (bench/gpu_bundle.sh to a lent GPU), DISTLAB_SOURCE_DIR and DISTLAB_BUILD_DIR from the environment.
#pragma once
#include <string>

namespace distlab {
// ConfigError naming the variable when it is set but names no folder (the build one is made if missing).
std::string tree_source_dir();
std::string tree_build_dir();
}  // namespace distlab
