// Lab 01: the functions you implement in student/ring.cpp, and how the grader finds them.
// (Don't edit this file: the grader builds your ring.cpp against it.)
#pragma once
#include <cstdint>

#include "core/dist/process_group.h"

namespace lab01 {

// Each rank holds in (N·n) and ends with out (n) = the sum over ranks of everyone's slot `rank`.
void ring_reduce_scatter(distlab::ProcessGroup& pg, float* out, const float* in, int64_t n);
// Each rank holds in (n); every rank ends with out (N·n), slot r = rank r's input.
void ring_all_gather(distlab::ProcessGroup& pg, float* out, const float* in, int64_t n);
// Every rank holds data (count), any count (not only multiples of N); every rank ends with the sum.
void ring_all_reduce(distlab::ProcessGroup& pg, float* data, int64_t count);

}  // namespace lab01

// The table the grader looks up in your plugin (defined at the bottom of ring.cpp).
struct Lab01Api {
  void (*reduce_scatter)(distlab::ProcessGroup&, float*, const float*, int64_t);
  void (*all_gather)(distlab::ProcessGroup&, float*, const float*, int64_t);
  void (*all_reduce)(distlab::ProcessGroup&, float*, int64_t);
};
