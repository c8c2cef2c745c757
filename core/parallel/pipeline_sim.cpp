#include "core/parallel/pipeline_sim.h"

#include "core/ops/op_scope.h"
#include "core/parallel/none.h"
#include "core/parallel/pipeline.h"
#include "core/perf/cost_model.h"
#include "core/util/error.h"

namespace distlab {

namespace {

// One stage of equal work: no parameters, a forward of `flops` and a backward of 2 × flops (FLOPs and
// trace events only, on the meta device).
class SyntheticStage : public Model {
 public:
  SyntheticStage(double flops, int64_t width) : flops_(flops), width_(width) {}
  std::string describe() const override { return "synthetic stage"; }
  std::vector<Parameter*> parameters() override { return {}; }
  std::vector<std::vector<Parameter*>> units() override { return {}; }
  Tensor forward(Runtime& rt, const Batch& b, ForwardHook*) override { return forward_stage(rt, b, Tensor(), nullptr); }
  void backward(Runtime& rt, const Tensor& d, BackwardHook*) override { backward_stage(rt, d, nullptr); }
  Tensor forward_stage(Runtime& rt, const Batch& b, const Tensor&, ForwardHook*) override {
    OpScope op(rt, "stage_forward", flops_, 0);
    return rt.empty({b.B, b.T, width_}, Category::activations, "stage output");
  }
  Tensor backward_stage(Runtime& rt, const Tensor& d, BackwardHook*) override {
    OpScope op(rt, "stage_backward", 2 * flops_, 0);
    return rt.empty(d.shape(), Category::activations, "stage input gradient");
  }
  void swap_saved(SavedState&) override {}
  Shape stage_input_shape(const Batch& b) override { return {b.B, b.T, width_}; }
  Shape stage_output_shape(const Batch& b) override { return {b.B, b.T, width_}; }
  void set_training(bool) override {}
  void init(uint64_t) override {}

 private:
  double flops_;
  int64_t width_;
};

}  // namespace

std::unique_ptr<Model> synthetic_stage(double flops, int64_t width) { return std::make_unique<SyntheticStage>(flops, width); }

PipelineSimResult simulate_pipeline(int p, int m, const std::string& schedule, const HardwareProfile& hw, double flops, int64_t act_bytes) {
  PipelineSimResult out;
  out.stages = p;
  out.micro_batches = m;
  out.schedule = schedule;
  const std::optional<PipeSchedule> order = parse_choice<PipeSchedule>(schedule);
  if (!order) throw ConfigError("pipeline schedule '" + schedule + "'", "use " + choice_list<PipeSchedule>());
  const int64_t width = std::max<int64_t>(1, act_bytes / 4);  // a batch of 1 x 1 x width floats
  std::vector<std::vector<TraceEvent>> traces;
  for (int s = 0; s < p; s++) {  // the stages one after another: a fake group never blocks, each records its part
    Runtime rt(DeviceKind::meta, s);
    ProcessGroup pg(ProcessGroup::Fake{}, s, p, &rt.trace, "pipeline");
    SyntheticStage stage(flops, width);
    NoParallel none;
    Pipeline pipe(pg, stage, *order, m, /*allow_idle=*/true);
    rt.trace.keep_events(true);
    Batch b;
    b.B = b.T = 1;
    const auto r = pipe.train_step(
        rt, [&] { return b; },
        [&](Runtime& rr, const Tensor& logits, const Batch&, float, Tensor& d) {
          d = rr.empty(logits.shape(), Category::activations, "dlogits");
          return 0.0;
        },
        1.0f, none);
    out.peak_in_flight.push_back(r.peak_in_flight);
    traces.push_back(rt.trace.events());
  }
  const ReplayResult replayed = replay(traces, hw);
  const PipelineTimeline t = pipeline_timeline(replayed);
  out.bubble = t.bubble_mean;
  out.formula = double(p - 1) / double(m + p - 1);
  out.span_s = t.end_s - t.start_s;
  out.ideal_s = m * 3 * flops / (hw.fp32_flops_per_s * hw.gemm_efficiency);  // the stages' GEMMs at the rate they reach
  return out;
}

}  // namespace distlab
