// Lab 01: everything your ring.cpp can use, and the functions you implement. (Don't edit this file: the
// grader builds your ring.cpp against it, and nothing else of distlab is visible to it.)
//
// Your code runs in a process of its own, one per rank. The only way to reach another rank is a Comm:
//   comm.send(data, count, dst)  hands `count` floats to rank dst and returns at once (the message waits
//                                for its receiver, as a Gloo or NCCL send of this size does);
//   comm.recv(data, count, src)  blocks until the next message from rank src arrives; it must have exactly
//                                `count` floats.
// Messages between two ranks arrive in the order they were sent. If every rank waits in recv and no
// message is on its way, nothing can move: the grader reports that as a deadlock.
#pragma once
#include <cstdint>

namespace lab01 {

class Comm {
 public:
  // (how the host wires a Comm up; your code only calls the four functions below)
  struct Ops {
    void (*send)(void* ctx, const float* data, int64_t count, int dst);
    void (*recv)(void* ctx, float* data, int64_t count, int src);
  };
  Comm(int rank, int size, const Ops* ops, void* ctx) : rank_(rank), size_(size), ops_(ops), ctx_(ctx) {}

  int rank() const { return rank_; }  // 0 .. size()-1
  int size() const { return size_; }  // N, the number of ranks
  void send(const float* data, int64_t count, int dst) { ops_->send(ctx_, data, count, dst); }
  void recv(float* data, int64_t count, int src) { ops_->recv(ctx_, data, count, src); }

 private:
  int rank_, size_;
  const Ops* ops_;
  void* ctx_;
};

// Each rank holds in (N·n floats: N slots of n) and ends with out (n) = the sum over ranks of slot `rank`.
void ring_reduce_scatter(Comm& comm, float* out, const float* in, int64_t n);
// Each rank holds in (n); every rank ends with out (N·n), where slot r = rank r's input.
void ring_all_gather(Comm& comm, float* out, const float* in, int64_t n);
// Every rank holds data (count floats, any count, not only multiples of N); every rank ends with the sum.
void ring_all_reduce(Comm& comm, float* data, int64_t count);

}  // namespace lab01

// The table the grader looks up in your plugin (defined at the bottom of ring.cpp).
constexpr int kLab01Abi = 2;
struct Lab01Plugin {
  int abi;  // kLab01Abi
  void (*reduce_scatter)(lab01::Comm&, float*, const float*, int64_t);
  void (*all_gather)(lab01::Comm&, float*, const float*, int64_t);
  void (*all_reduce)(lab01::Comm&, float*, int64_t);
};
