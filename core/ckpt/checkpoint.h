// The checkpoint format: one folder per saved step, every rank's part of the training state in it.
//
//   DIR/step-000100/
//     rank-00000.safetensors   rank 0's PIECES of the logical tensors, f32, and its own state as JSON
//     rank-00001.safetensors   (the safetensors __metadata__ key "distlab.state": step, sampler epoch and
//     ...                      position, RNG streams, loss scaler, optimizer step counts)
//     manifest.json            rank 0 writes it once every rank's file is in place: the step, the config,
//                              the world (strategy, ranks), each file's size and CRC-32, and for every logical
//                              tensor its full shape and where its pieces are
//     COMPLETE                 written last (the manifest's CRC-32): a folder without it did not finish saving
//
// A LOGICAL tensor is named as PyTorch names it — "conv1.weight" (the f32 weights: the master copy under
// mixed precision), "optim.exp_avg.conv1.weight", "optim.exp_avg_sq.conv1.weight",
// "optim.momentum_buffer.fc1.weight", and BatchNorm's buffers ("bn1.running_mean"). A PIECE is elements
// [offset, offset + numel) of the flattened logical tensor, as one rank held them: the whole tensor under
// DDP (rank 0 writes it), a rank's slice of a flat vector under ZeRO/FSDP. Because pieces are addressed by
// logical name and element range, not by rank, N ranks' checkpoint loads on M ranks and under another
// strategy (PyTorch's distributed checkpoint does the same): each rank reads the ranges it now owns.
// Buffers are written by every rank (DDP does not average them): a rank reads its own, or rank 0's when
// the world changed.
//
// Every file is written to "<name>.partial", fsync'd and renamed (core/util/atomic_file.h); COMPLETE comes
// last, so a save killed at any point leaves either a complete checkpoint or a folder that loading skips.
// Read next: core/train/extension.h (what a caller may put in place of the engine's parts).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/ckpt/safetensors.h"
#include "core/util/error.h"

namespace distlab {

// A checkpoint that must not be used: incomplete, corrupt, or from another run. The message names the
// folder or file and the reason.
struct CheckpointError : Error { using Error::Error; };
struct IncompleteCheckpoint : CheckpointError { using CheckpointError::CheckpointError; };  // a save that did not finish

// CRC-32 (IEEE, as zlib and gzip compute it), to detect a file changed after it was written.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);
std::string crc32_hex(uint32_t c);

std::string step_dir_name(int64_t step);  // "step-000100"

// One rank's file, built up and written.
class CheckpointWriter {
 public:
  // A piece: elements [offset, offset + numel) of `logical`, whose whole shape is `shape`. `category`:
  // weights, optim_state or buffers (inspect's bytes per category).
  void add(const std::string& logical, const Shape& shape, int64_t offset, const float* data, int64_t numel, const std::string& category);
  void set_state(const nlohmann::json& state) { state_ = state; }
  int64_t bytes() const;
  // Writes <step_dir>/rank-NNNNN.safetensors (atomically); `before_commit` runs when the bytes are written
  // but not yet renamed (the fault injection of the tests kills the rank there). Returns the file's record
  // for the manifest: {"file", "rank", "bytes", "crc32", "pieces": [...]}.
  nlohmann::json write(const std::string& step_dir, int rank, const std::function<void()>& before_commit = {});

 private:
  struct Piece {
    std::string logical, tensor, category;
    Shape shape;
    int64_t offset, numel;
    std::vector<float> values;
  };
  std::vector<Piece> pieces_;
  nlohmann::json state_ = nlohmann::json::object();
};

// Rank 0, once every rank's file is written: manifest.json from `manifest` plus every rank's record, then
// COMPLETE. Throws IoError when a write fails (the folder then stays incomplete).
void write_manifest(const std::string& step_dir, nlohmann::json manifest, const std::vector<nlohmann::json>& rank_records);

// An opened checkpoint folder. Opening checks COMPLETE, the manifest (against COMPLETE's checksum) and that
// every file exists with its recorded size; verify_files() also reads every file and checks its CRC-32.
// A file is checked again whenever a rank first reads from it.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& step_dir);  // CheckpointError naming the folder and the fault
  const std::string& dir() const { return dir_; }
  const nlohmann::json& manifest() const { return manifest_; }
  int64_t step() const { return manifest_.at("step").get<int64_t>(); }
  int world_size() const { return manifest_.at("world_size").get<int>(); }
  void verify_files();
  bool has(const std::string& logical) const { return manifest_.at("tensors").contains(logical); }
  Shape shape(const std::string& logical) const;
  // Elements [offset, offset + numel) of `logical` into out. Where pieces overlap (buffers: one per rank),
  // `prefer_rank`'s wins. Throws CheckpointError if the pieces do not cover the range.
  void read(const std::string& logical, int64_t offset, int64_t numel, float* out, int prefer_rank = 0);
  // Rank r's own state ("distlab.state" of its file).
  nlohmann::json rank_state(int rank);

 private:
  const StFile& file_of_rank(int rank);
  std::string dir_;
  nlohmann::json manifest_;
  std::map<int, std::string> file_name_;
  std::map<int, std::unique_ptr<StFile>> files_;
};

// The step folders in `dir` (named step-NNNNNN), newest first.
std::vector<std::string> list_checkpoints(const std::string& dir);
// Deletes the complete checkpoints in `dir` beyond the newest `keep` (0: none), and incomplete folders
// older than the newest complete one (a save that died). Returns what it removed.
std::vector<std::string> prune_checkpoints(const std::string& dir, int64_t keep);
// The newest complete, intact checkpoint in dir; "" when there is none. `skipped` gets one entry per
// folder passed over and why; `accept` may throw CheckpointError to refuse one (an incompatible config).
struct Skipped {
  std::string reason;
  bool incomplete = false;  // a save that did not finish: expected after a crash, not a fault
};
std::string find_checkpoint(const std::string& dir, std::vector<Skipped>& skipped, const std::function<void(Checkpoint&)>& accept = {});

// The fields of a rank's saved state (step, epoch, position, optimizer and scheduler steps, loss scale, ...)
// that hold what no run saves (a negative epoch, an optimizer step of -1): each as "data/epoch is -7 (not in
// 0..N)". Checkpoint::verify_files throws on any, so resume = auto falls back to the checkpoint before.
std::vector<std::string> rank_state_problems(const nlohmann::json& state, int64_t step);

// distlab ckpt inspect: what is inside, as text (and the same as JSON into `json`).
std::string inspect_checkpoint(const std::string& path, nlohmann::json* json = nullptr);
// distlab ckpt export: the full model weights (not the optimizer state) as one safetensors file PyTorch
// loads (model.load_state_dict(safetensors.torch.load_file(out))), in `dtype`. merge: a LoRA run's adapters
// folded into their base weights (W + scaling · B A, the scaling from the run's [lora]), the file then the
// plain model's under its Hugging Face names (PEFT's merge_and_unload); a checkpoint without adapters is an
// error then.
void export_checkpoint(const std::string& path, const std::string& out, DType dtype, bool merge = false);
// A folder that is a step folder, or a checkpoint.dir whose newest complete checkpoint is meant.
std::string resolve_checkpoint_path(const std::string& path);

}  // namespace distlab
