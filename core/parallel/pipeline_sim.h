// The pipeline's bubble without a model: p stages of equal, synthetic work (a forward of `flops`, a
// backward of twice that, activations of `act_bytes` between stages) run through the real executor
// (pipeline.h) on the meta device over a fake world, and the ranks' traces replayed on a hardware profile
// (core/perf/cost_model.h). What `distlab bench pipeline` prints, for any p and m — m < p included, which
// training refuses. The course's numbers: bubble (p - 1)/(m + p - 1); 1F1B holds min(p - s, m) micro-batches
// on stage s, GPipe m.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/models/model.h"
#include "core/perf/hardware.h"

namespace distlab {

struct PipelineSimResult {
  int stages = 0, micro_batches = 0;
  std::string schedule;
  double bubble = 0;             // the stages' mean idle share of the pipeline's span, modeled
  double formula = 0;            // (p - 1)/(m + p - 1)
  double span_s = 0, ideal_s = 0;  // the modeled span; m slots of one stage's work (no bubble)
  std::vector<int> peak_in_flight;  // per stage
};

// One stage of equal, synthetic work: no parameters, a forward of `flops` and a backward of 2 × flops
// (FLOPs and trace events only, for the meta device), activations (B, T, width) in and out.
std::unique_ptr<Model> synthetic_stage(double flops, int64_t width);

PipelineSimResult simulate_pipeline(int stages, int micro_batches, const std::string& schedule, const HardwareProfile& hw,
                                    double flops = 1e12, int64_t act_bytes = 8 << 20);

}  // namespace distlab
