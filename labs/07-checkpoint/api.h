// Lab 07: everything your ckpt.cpp can use, and what you implement. (Don't edit this file: the grader
// builds your ckpt.cpp against it, and nothing else of distlab is visible to it.)
//
// Your code runs in a process of its own beside each rank's trainer. The trainer trains (DDP on 2 ranks),
// saves the model's weights itself at every checkpoint (model.safetensors), and calls your save_state on
// every rank: you save what else a resume needs. When a run starts and finds a checkpoint, the trainer
// loads the weights and calls your load_state: you put the rest back. A resumed run must then compute
// exactly — bit for bit — what the run that was never interrupted computes.
//
// Files: your code reaches the checkpoint's folder (DIR/step-000020/) only through Files, which the trainer
// serves. A name is a plain file name: letters, digits, '.', '_' and '-', not starting with '.'.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lab07 {

// The trainer's state a resume needs besides the weights, on this rank. Getters read it as it is now
// (in save_state: right after the step being saved); setters put values back (in load_state; a value you
// never set stays as a fresh run starts it).
class State {
 public:
  virtual ~State() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;             // ranks now (in load_state: maybe not those that saved)
  virtual int64_t micro_batch() const = 0;   // samples per rank per step, now
  virtual int64_t step() const = 0;          // steps done: the checkpoint's step

  // The optimizer (torch.optim.AdamW): per parameter i (0..num_params()-1, model order) its state tensors
  // by PyTorch's names — "exp_avg" and "exp_avg_sq", param_numel(i) floats each — and the steps taken
  // (AdamW's t, which its bias corrections 1 - beta^t read). Under DDP every rank holds the same.
  virtual int num_params() const = 0;
  virtual std::string param_name(int i) const = 0;
  virtual int64_t param_numel(int i) const = 0;
  virtual std::vector<std::string> optimizer_state_names() const = 0;
  virtual std::vector<float> optimizer_state(int i, const std::string& name) const = 0;
  virtual void set_optimizer_state(int i, const std::string& name, const std::vector<float>& values) = 0;
  virtual int64_t optimizer_steps() const = 0;
  virtual void set_optimizer_steps(int64_t t) = 0;

  // The RNG streams: one per Dropout layer, its draws so far (a mask is a function of the seed and this
  // count, so the count IS the stream's state).
  virtual std::vector<uint64_t> rng_streams() const = 0;
  virtual void set_rng_streams(const std::vector<uint64_t>& draws) = 0;

  // The sampler (DistributedSampler): its order is a function of the seed and the epoch; position is the
  // micro-batches this rank has taken of that epoch.
  virtual int64_t epoch() const = 0;
  virtual int64_t position() const = 0;
  virtual void set_sampler(int64_t epoch, int64_t position) = 0;
};

// The checkpoint's folder. Every call blocks until the trainer has done it. A misuse (a name that is not a
// plain file name, a handle that is not open, reading a file that is not there) fails the run with a
// message naming the call.
class Files {
 public:
  virtual ~Files() = default;
  virtual int open(const std::string& name) = 0;                // create (or truncate) for writing; a handle
  virtual void write(int handle, const void* data, size_t n) = 0;
  virtual void fsync(int handle) = 0;                           // what was written is on the disk
  virtual void close(int handle) = 0;
  virtual void rename(const std::string& from, const std::string& to) = 0;  // atomic: replaces `to`
  virtual bool exists(const std::string& name) = 0;
  virtual std::vector<uint8_t> read(const std::string& name) = 0;  // the whole file
};

// The file rank r's state must END UP in. The trainer takes a checkpoint for complete when model.safetensors
// and every saving rank's state_file are there: a file must never appear under this name before it is
// whole.
inline std::string state_file(int rank) { return "rank-" + std::to_string(rank) + ".state"; }

// Task 1 — save this rank's state (called on every rank after the step is done and the weights are saved).
void save_state(State& st, Files& files);
// Task 2 — restore it. Return "" when done, or why this checkpoint cannot be used (a file that is corrupt):
// the trainer then tries the checkpoint before it. A checkpoint saved by another number of ranks (2 -> 1)
// must load too: under DDP every rank holds the same optimizer state, and a rank's position counts batches
// of micro_batch() on world() ranks — the samples seen so far are what must carry over.
std::string load_state(State& st, Files& files);

}  // namespace lab07

// The table the grader looks up in your plugin (defined at the bottom of ckpt.cpp).
constexpr int kLab07Abi = 1;
struct Lab07Plugin {
  int abi;  // kLab07Abi
  void (*save_state)(lab07::State&, lab07::Files&);
  std::string (*load_state)(lab07::State&, lab07::Files&);
};
extern "C" Lab07Plugin distlab_lab07;
