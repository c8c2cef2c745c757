// A lab's student code in a training run. The plugin is never loaded into the trainer: it runs in its own
// sandboxed process (core/lab/plugin_process.h), and the classes here stand in for it behind the engine's
// interfaces — a Sampler whose indices come from the student's sampler_indices, and a DataParallel whose
// hooks send the gradients over, run the collectives the student asks for on this rank's real process
// group (counted and traced like the engine's own), and take the averaged gradients back.
// An entry the student left empty fails with a message naming it: the engine's own code never stands in.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "core/data/sampler.h"
#include "core/lab/plugin_process.h"
#include "core/parallel/ddp.h"

namespace distlab {

struct LabPluginOptions {
  std::string host_exe;  // distlab-labhost
  std::string plugin;    // the .so
  std::string lab_name;  // "02-ddp-cifar"
  std::string sandbox = "auto";  // auto | require | off
  double timeout_s = 300;        // for one answer of the plugin
};

class LabPlugin {
 public:
  explicit LabPlugin(const LabPluginOptions& o);  // starts the host and waits for the plugin to load

  std::shared_ptr<Sampler> make_sampler(int64_t n, int world, int rank, uint64_t seed, bool shuffle);
  // naive ("naive") or bucketed DDP by the student; broadcasts rank 0's weights first, as the engine's does
  std::unique_ptr<DataParallel> make_ddp(const std::string& mode, ProcessGroup& pg, Model& model, Runtime& rt, double bucket_mb);

  // Runs one function of the plugin; collectives it asks for on the way run on *pg (may be null).
  std::vector<char> call(labproto::Fn fn, std::initializer_list<int64_t> args, const void* in, size_t in_bytes, ProcessGroup* pg,
                         Runtime* rt, const char* during);

 private:
  struct Pending {
    Tensor buffer;  // comm_buffers
    std::shared_ptr<Work> work;
  };
  void serve_collective(const wire::Frame& f, std::vector<char>& payload, ProcessGroup* pg, Runtime* rt, const char* during);

  LabPluginOptions opt_;
  std::unique_ptr<PluginProcess> proc_;
  std::map<int64_t, Pending> pending_;
  int64_t next_handle_ = 1;
};

}  // namespace distlab
