// DistributedDataParallel: every rank holds the whole model and sees a different slice of the data;
// after backward the gradients are averaged across ranks, so every rank takes the same optimizer step a
// single device would take on the whole global batch.
//
// Two implementations, side by side (picotron's DataParallelNaive / DataParallelBucket):
//  - NaiveDDP: after the whole backward, one blocking all_reduce per parameter.
//  - BucketedDDP: parameters are packed, in reverse order (the order backward produces their gradients),
//    into buckets of about bucket_mb MiB. The model calls after_layer_backward(unit, params) right after a
//    unit's gradients are final; as soon as every gradient of the next bucket is ready, the bucket is
//    copied into its flat buffer and an async all_reduce starts — while backward goes on with the earlier
//    layers. finish_backward() waits for them (in bucket order, the same on every rank) and copies back.
// Both broadcast rank 0's parameters and buffers at construction, so every replica starts equal. With
// set_sync(false) (PyTorch's no_sync) the hooks do nothing: gradients accumulate locally over micro-steps,
// and only the last micro-step communicates.
// Read next: flat_param.h (the flat layout the ZeRO stages share), then zero1.h (the optimizer state split).
#pragma once
#include <memory>
#include <vector>

#include "core/comm/process_group.h"
#include "core/models/model.h"
#include "core/parallel/strategy.h"

namespace distlab {

// parallel.ddp_mode: one all-reduce per gradient after the backward (naive), or buckets that overlap it
enum class DdpMode { bucketed, naive };
template <>
struct ChoiceTable<DdpMode> {
  static constexpr std::array names = {choice(DdpMode::bucketed, "bucketed"), choice(DdpMode::naive, "naive")};
};

// DDP's part of the Strategy interface (strategy.h): begin_backward(false) is no_sync; finish_backward
// leaves every gradient averaged; the optimizer steps every parameter, the same on every rank.
class DataParallel : public Strategy {
 public:
  ~DataParallel() override = default;
  void begin_backward(bool sync) override { sync_ = sync; }
  void finish_backward(Runtime& rt) override = 0;  // all gradients averaged when it returns (if syncing)
  void set_sync(bool on) { sync_ = on; }           // the same as begin_backward: PyTorch's no_sync()
  bool sync() const { return sync_; }
  virtual int64_t all_reduces_per_step() const = 0;  // -1: not known in advance (a lab's code)
  nlohmann::json report() const override {
    return {{"name", describe()}, {"all_reduces_per_step", all_reduces_per_step()}, {"averages", "gradients, after backward"}};
  }

 protected:
  bool sync_ = true;
};

// Copies rank 0's parameters and buffers to every rank.
void broadcast_model(ProcessGroup& pg, Model& model);

class NaiveDDP : public DataParallel {
 public:
  NaiveDDP(ProcessGroup& pg, Model& model);
  std::string describe() const override { return "ddp (naive)"; }
  void finish_backward(Runtime& rt) override;
  int64_t all_reduces_per_step() const override { return int64_t(params_.size()); }

 private:
  ProcessGroup& pg_;
  std::vector<Parameter*> params_;
};

class BucketedDDP : public DataParallel {
 public:
  // A cuda rank's buckets are all-reduced by pg's device backend where they are (dist.backend = "nccl"),
  // or cross to the host for Gloo and back (core/parallel/comm_buffers.h).
  BucketedDDP(ProcessGroup& pg, Model& model, Runtime& rt, double bucket_mb);
  std::string describe() const override { return "ddp (bucketed)"; }
  void after_layer_backward(int unit, const std::vector<Parameter*>& params) override;
  void finish_backward(Runtime& rt) override;
  int64_t all_reduces_per_step() const override { return int64_t(buckets_.size()); }
  int64_t num_buckets() const { return int64_t(buckets_.size()); }
  // the parameter names of bucket b, in the order they sit in the flat buffer
  std::vector<std::string> bucket_names(int64_t b) const;
  nlohmann::json report() const override;

 private:
  struct Bucket {
    std::vector<Parameter*> params;  // reverse model order
    Tensor flat;                     // (Σ numel), category comm_buffers
    std::shared_ptr<Work> work;
    int64_t ready = 0;
  };
  void launch_ready_buckets();
  ProcessGroup& pg_;
  Runtime& rt_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<int64_t, int64_t>> where_;  // parameter index -> (bucket, offset)
  std::vector<Parameter*> params_;
  std::vector<bool> marked_;
  int64_t next_to_launch_ = 0;
};

std::unique_ptr<DataParallel> make_ddp(DdpMode mode, ProcessGroup& pg, Model& model, Runtime& rt,
                                       double bucket_mb);

}  // namespace distlab
