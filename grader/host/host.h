// The plugin's host: `distlab-labhost LAB PLUGIN` loads a student's plugin and serves requests on fd 3
// (core/lab/protocol.h). It links nothing of the engine but the lab's own API header, so the plugin can
// resolve no engine symbol; it runs inside the sandbox (core/lab/sandbox.h), so it can touch no file of
// the grader's. One file per lab serves that lab's functions.
#pragma once
#include <exception>
#include <string>
#include <vector>

#include "core/lab/protocol.h"
#include "core/lab/wire.h"

namespace labhost {

constexpr int kFd = 3;

inline distlab::wire::Clock::time_point forever() { return distlab::wire::after_seconds(24 * 3600.0); }

// Writes a frame to the engine; if the engine is gone there is nothing left to do but exit.
void put(distlab::labproto::Op op, const void* payload, uint64_t bytes, std::initializer_list<int64_t> args = {});
// Reads the engine's next frame; exits when the engine is gone or sent kAbort.
void get(distlab::wire::Frame& f, std::vector<char>& payload);

// Tells the engine what the student's code threw (kRaised); returns the host's exit code.
int report_raised(std::exception_ptr e);

int serve_lab01(void* plugin);
int serve_lab02(void* plugin);
int serve_lab03(void* plugin);
int serve_lab04(void* plugin);
int serve_lab05(void* plugin);

}  // namespace labhost
