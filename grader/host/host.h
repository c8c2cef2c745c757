// The plugin's host: `distlab-labhost LAB PLUGIN` loads a student's plugin and serves requests on fd 3
// (grader/bridge/protocol.h). It links nothing of the engine but the lab's own API header, so the plugin can
// resolve no engine symbol; it runs inside the sandbox (grader/bridge/sandbox.h), so it can touch no file of
// the grader's. Each lab's functions are served by its own file, grader/labs/NN-name/host.cpp (serve_labNN
// below), picked by main.cpp from the LAB argument.
#pragma once
#include <dlfcn.h>
#include <unistd.h>

#include <cstring>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "grader/bridge/protocol.h"
#include "grader/bridge/wire.h"

namespace labhost {

constexpr int kFd = 3;

inline distlab::wire::Clock::time_point forever() { return distlab::wire::after_seconds(24 * 3600.0); }

// Writes a frame to the engine; if the engine is gone there is nothing left to do but exit.
void put(distlab::labproto::Op op, const void* payload, uint64_t bytes, std::initializer_list<int64_t> args = {});
// Reads the engine's next frame; exits when the engine is gone or sent kAbort.
void get(distlab::wire::Frame& f, std::vector<char>& payload);

// Tells the engine what the student's code threw (kRaised); returns the host's exit code.
int report_raised(std::exception_ptr e);

// The engine's answer to a request: a kData frame of exactly `bytes` (any size when bytes < 0). Anything
// else means the engine broke the protocol: the host exits.
std::vector<char> expect_data(int64_t bytes);

// A payload read front to back; a short one means the engine broke the protocol (the host exits).
struct Reader {
  const std::vector<char>& in;
  size_t at = 0;
  template <class T>
  T take() {
    T v{};
    if (at + sizeof(T) > in.size()) _exit(3);
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
};

// The loop of a host whose engine only calls functions: each kCall runs `call` (its outputs into `out`) and
// is answered by kReturn, or by kRaised when the student's code threw. `call` returns false for a function
// it doesn't know (the engine broke the protocol). Returns the host's exit code.
int serve_calls(const std::function<bool(const distlab::wire::Frame& f, const std::vector<char>& in, std::vector<char>& out)>& call);

// An entry the student left empty in the lab's table: thrown as "the plugin's table has no NAME".
template <class F>
void need(F* fn, const char* name) {
  if (!fn) throw std::logic_error(std::string("the plugin's table has no ") + name);
}

// The lab's table in the plugin (`symbol`, defined at the bottom of the student's `source_file`), checked —
// present, of this ABI version — and announced to the engine with kHello. nullptr after kLoadFailed has
// said why.
template <class Table>
Table* load_table(void* plugin, const char* symbol, int abi, const char* source_file, const char* api_header) {
  auto* t = static_cast<Table*>(dlsym(plugin, symbol));
  if (!t || t->abi != abi) {
    const std::string why = !t ? std::string("the plugin has no ") + symbol + " table (keep the table at the bottom of " + source_file + ")"
                               : std::string("the plugin's ") + symbol + " table is of another version: rebuild it against " + api_header;
    put(distlab::labproto::kLoadFailed, why.data(), why.size());
    return nullptr;
  }
  put(distlab::labproto::kHello, nullptr, 0, {abi});
  return t;
}

int serve_lab01(void* plugin);
int serve_lab02(void* plugin);
int serve_lab03(void* plugin);
int serve_lab04(void* plugin);
int serve_lab05(void* plugin);
int serve_lab06(void* plugin);
int serve_lab07(void* plugin);
int serve_lab10(void* plugin);

}  // namespace labhost
