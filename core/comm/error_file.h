// How a worker tells its launcher why it failed (torchrun's error file, in small): the launcher sets
// DISTLAB_ERROR_FILE; a failing worker writes {time_ns, message, secondary}. "secondary" marks an error
// caused by another rank's failure (its connection closed or reset), so the launcher blames the rank that
// failed first, not the ones that noticed it.
#pragma once
#include <exception>
#include <string>
#include <vector>

namespace distlab {

void record_worker_error(const std::exception& e);
// A worker that stops on purpose with a non-zero exit (143: a SIGTERM, the checkpoint saved): `secondary`
// when the signal went to another rank, so that the launcher names the rank that was sent it.
void record_worker_stop(const std::string& message, bool secondary);

// An exception thrown on a thread we don't own (Gloo's transport thread enforces that both sides of a
// message have the same size) ends the process through std::terminate: this handler says what it was
// and what usually causes it, records it for the launcher, and exits 1.
void install_terminate_handler();

// How far a worker got: the number of collectives it has entered, over every group, published in a page
// shared with its launcher (DISTLAB_ERROR_FILE + ".progress"). When a collective times out, the launcher
// reads every rank's count: the rank furthest behind the others is the one that held the job up, whatever
// the timing of the ranks' own timeouts (under load the first to time out may be any of the waiting ones).
// One mapping per process, made on the first call (a no-op where no launcher asked for it).
void note_collective_entered();
// The count a worker published (-1: none, or unreadable).
long long read_worker_progress(const std::string& error_file);

struct WorkerError {
  bool present = false;
  long long time_ns = 0;
  bool secondary = false;
  std::vector<int> waiting_for;  // ranks the failed collective waited for in vain
  std::string message;
};
WorkerError read_worker_error(const std::string& path);

}  // namespace distlab
