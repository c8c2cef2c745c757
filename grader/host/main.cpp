// distlab-labhost LAB PLUGIN — see host.h.
#include <dlfcn.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "grader/host/host.h"

namespace labhost {

using namespace distlab;

void put(labproto::Op op, const void* payload, uint64_t bytes, std::initializer_list<int64_t> args) {
  wire::Frame f;
  f.op = op;
  int k = 0;
  for (int64_t a : args) f.arg[k++] = a;
  if (wire::write_frame(kFd, f, payload, bytes, forever()) != wire::Io::ok) _exit(3);
}

void get(wire::Frame& f, std::vector<char>& payload) {
  if (wire::read_frame(kFd, f, payload, labproto::kMaxPayload, forever()) != wire::Io::ok) _exit(3);
  if (f.op == labproto::kAbort) {
    std::fprintf(stderr, "stopped by the grader: %.*s\n", int(payload.size()), payload.data());
    _exit(3);
  }
}

std::vector<char> expect_data(int64_t bytes) {
  wire::Frame f;
  std::vector<char> payload;
  get(f, payload);
  if (f.op != labproto::kData || (bytes >= 0 && payload.size() != uint64_t(bytes))) _exit(3);
  return payload;
}

int serve_calls(const std::function<bool(const wire::Frame&, const std::vector<char>&, std::vector<char>&)>& call) {
  for (;;) {
    wire::Frame f;
    std::vector<char> in, out;
    get(f, in);
    if (f.op != labproto::kCall) return 3;
    try {
      if (!call(f, in, out)) return 3;
    } catch (...) {
      return report_raised(std::current_exception());
    }
    put(labproto::kReturn, out.data(), out.size());
  }
}

int report_raised(std::exception_ptr e) {
  std::string what = "an exception that is not a std::exception";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    what = x.what();
  } catch (...) {
  }
  put(labproto::kRaised, what.data(), what.size());
  return 1;
}

}  // namespace labhost

int main(int argc, char** argv) {
  using namespace labhost;
  signal(SIGPIPE, SIG_IGN);
  // every request's payload (up to a ring's whole buffer) lands in a fresh vector: keep freed memory in the
  // heap instead of handing it back to the kernel and faulting it in again on the next request
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
  if (argc != 3) {
    std::fprintf(stderr, "usage: distlab-labhost LAB PLUGIN (started by the grader or a trainer, with a socket on fd 3)\n");
    return 2;
  }
  const std::string lab = argv[1];
  // nothing of the student's is loaded yet: the engine measures this process as it is (its baseline), and
  // everything the plugin holds from here on counts as the plugin's own
  put(distlab::labproto::kBeforeLoad, nullptr, 0, {});
  {
    wire::Frame f;
    std::vector<char> payload;
    get(f, payload);
    if (f.op != distlab::labproto::kLoad) return 3;
  }
  void* h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const std::string why = dlerror();
    put(distlab::labproto::kLoadFailed, why.data(), why.size());
    return 2;
  }
  if (lab == "01") return serve_lab01(h);
  if (lab == "02") return serve_lab02(h);
  if (lab == "03") return serve_lab03(h);
  if (lab == "04") return serve_lab04(h);
  if (lab == "05") return serve_lab05(h);
  if (lab == "06") return serve_lab06(h);
  if (lab == "07") return serve_lab07(h);
  if (lab == "10") return serve_lab10(h);
  const std::string why = "lab " + lab + " has no plugin host";
  put(distlab::labproto::kLoadFailed, why.data(), why.size());
  return 2;
}
