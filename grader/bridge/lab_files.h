// Lab 07's two seams between the student's save_state/load_state (in the plugin's process) and the trainer:
//
//   LabFileServer      the checkpoint folder as the student's code reaches it (labs/07-checkpoint/api.h's
//                      Files): one request per call, plain names in one folder, a quota, and every step that
//                      would tear a file on a kill recorded as a violation
//   parse_load_answer  load_state's answer (the refusal, then what it set), read without trusting a length
//
// Both take whatever the plugin sends; the trainer (grader/labs/07-checkpoint/bridge.cpp) decides what to do
// with the result. tests/test_lab_fuzz.cpp throws random and adversarial requests at both.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <ostream>
#include <string>
#include <vector>

#include "grader/bridge/wire.h"

namespace distlab {

class LabPlugin;

std::string lab07_state_file(int rank);  // "rank-<r>.state": the name a complete checkpoint holds for rank r

// A quota bounds what one save_state (or load_state) may put on the trainer's disk: at most kMaxFiles files
// opened and `byte_quota` bytes written (a few times the snapshot it was given: the State holds everything
// worth saving). The trainer's own files in the folder (model.safetensors and its .partial, .reference/) are
// not the student's to touch.
class LabFileServer {
 public:
  static constexpr int kMaxFiles = 16;
  // kill_on_write: DISTLAB_TEST_FAULT's kill halfway through the first write
  LabFileServer(LabPlugin& plugin, std::string dir, int rank, bool kill_on_write, std::ostream& log, uint64_t byte_quota);
  ~LabFileServer();
  LabFileServer(const LabFileServer&) = delete;
  LabFileServer& operator=(const LabFileServer&) = delete;

  // Answers one request of the plugin (labproto::kFileOpen .. kFileRead), or throws an Error naming it.
  void serve(const wire::Frame& f, std::vector<char>& payload);
  void finish();  // after save_state returned: a file left open is a violation, and is closed

  std::vector<std::string> violations;

 private:
  struct Open {
    int fd;
    std::string name;
    bool dirty;  // written since its last fsync
  };
  std::string checked(const std::string& name, const char* call) const;
  std::string path(const std::string& name) const;
  Open& handle(int64_t h, const char* call);
  void write_all(Open& o, const char* p, size_t n);
  void answer(const void* data, size_t bytes);

  LabPlugin& plugin_;
  std::string dir_;
  int rank_;
  bool kill_on_write_;
  std::ostream& log_;
  std::map<int32_t, Open> open_;
  std::map<std::string, bool> closed_dirty_;
  // files written through any handle since an fsync through any handle (fsync flushes the file, not the handle):
  // a second, clean handle closed last does not make a written file safe to rename
  std::set<std::string> unsynced_;
  int32_t next_ = 1;
  uint64_t quota_, written_ = 0;
  int opened_ = 0;
};

// What load_state set, as its answer says (grader/labs/07-checkpoint/host.cpp writes it):
//   int32 length, the refusal (length bytes; empty: accepted)
//   int64 steps_set, int64 steps
//   per parameter, per optimizer state: int64 count (-1: not set, else the parameter's numel), count floats
//   int64 rng_set, int64 streams (must be the model's), streams × uint64
//   int64 sampler_set, int64 epoch, int64 position
struct LabLoadAnswer {
  std::string refusal;
  bool steps_set = false;
  int64_t steps = 0;
  std::vector<std::vector<float>> states;  // [param · names + name]; empty where not set
  std::vector<bool> state_set;
  bool rng_set = false;
  std::vector<uint64_t> rng;
  bool sampler_set = false;
  int64_t epoch = 0, position = 0;
};

// The refusal only (what every rank agrees on before anything is applied); throws Error on a broken answer.
std::string parse_load_refusal(const std::vector<char>& answer);
// The whole answer, checked against the model: `numels` per parameter, `names` optimizer states each, `streams`
// dropout streams. A count that is not the parameter's, a short or long answer, a negative step, epoch or
// position: an Error naming it, never a read past the answer.
LabLoadAnswer parse_load_answer(const std::vector<char>& answer, const std::vector<int64_t>& numels, size_t names, size_t streams);

}  // namespace distlab
