// ProcessGroup, part two: what is built on Gloo's unbound buffers rather than its collectives -- point-to-point
// send/recv (the pipeline's activations and gradients) with their trace events, and our own ring
// reduce-scatter (Gloo has none; ZeRO-2/3 and FSDP reduce with it, in f32 or 16 bits on the wire). The queue,
// the timeouts and the collectives are in process_group.cpp.
#include <fmt/format.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>

#include "core/comm/errors.h"
#include "core/comm/process_group.h"
#include "core/util/error.h"

namespace distlab {

// Point-to-point slots: the k-th message from a to b with tag t uses slot (t, k) on both sides.
uint64_t ProcessGroup::p2p_slot(int peer, int tag, bool sending) {
  uint64_t k = p2p_count_[{sending ? peer : -1 - peer, tag}]++;
  return (uint64_t(1) << 62) | (uint64_t(uint32_t(tag)) << 32) | (k & 0xffffffffu);
}

void ProcessGroup::send(const float* data, int64_t n, int dst, int tag) { send_recv(data, n, dst, tag, nullptr, 0, -1, 0); }

void ProcessGroup::recv(float* data, int64_t n, int src, int tag) { send_recv(nullptr, 0, -1, 0, data, n, src, tag); }

void ProcessGroup::trace_p2p(const char* op, int64_t bytes, int sender, int receiver, int tag, uint64_t slot, bool wait) {
  if (!trace_) return;
  auto global = [&](int r) { return global_ranks_.empty() ? r : global_ranks_[size_t(r)]; };
  TraceEvent e;
  e.name = wait ? std::string("wait ") + op : std::string(op);
  e.kind = wait ? EventKind::wait : EventKind::collective;
  e.stream = wait ? Stream::compute : Stream::comm;
  e.op = op;
  e.payload_bytes = bytes;
  e.group_size = 2;
  e.seq = int64_t(slot & 0xffffffffu);
  e.group = fmt::format("p2p {}->{} tag {}", global(sender), global(receiver), tag);
  e.t_begin_us = e.t_end_us = trace_->now_us();
  trace_->record(e);
}

void ProcessGroup::send_recv(const float* out, int64_t n_out, int dst, int out_tag, float* in, int64_t n_in, int src, int in_tag) {
  send_recv_async(out, n_out, dst, out_tag, in, n_in, src, in_tag)->wait();
}

std::shared_ptr<Work> ProcessGroup::send_recv_async(const float* out, int64_t n_out, int dst, int out_tag, float* in, int64_t n_in, int src,
                                                    int in_tag) {
  const bool sending = dst >= 0, receiving = src >= 0;
  if (sending && (dst >= size_ || dst == rank_))
    throw CommError(fmt::format("rank {}: send to rank {} in group '{}' of {} ranks", rank_, dst, name_, size_), "send to another rank of the group");
  if (receiving && (src >= size_ || src == rank_))
    throw CommError(fmt::format("rank {}: recv from rank {} in group '{}' of {} ranks", rank_, src, name_, size_), "receive from another rank of the group");
  const uint64_t send_slot = sending ? p2p_slot(dst, out_tag, true) : 0, recv_slot = receiving ? p2p_slot(src, in_tag, false) : 0;
  // both halves are in flight at once; the trace's comm stream is a queue, so both peers list the pair in
  // the same order (the lower sender first), or the replay would see each waiting for the other
  const bool recv_first = sending && receiving && src < rank_;
  if (recv_first) trace_p2p("recv", n_in * 4, src, rank_, in_tag, recv_slot, false);
  if (sending) trace_p2p("send", n_out * 4, rank_, dst, out_tag, send_slot, false);
  if (receiving && !recv_first) trace_p2p("recv", n_in * 4, src, rank_, in_tag, recv_slot, false);
  std::string what = sending && receiving ? fmt::format("send to rank {} + recv from rank {}", dst, src)
                     : sending            ? fmt::format("send to rank {}", dst)
                                          : fmt::format("recv from rank {}", src);
  const char* op = sending && receiving ? "send_recv" : sending ? "send" : "recv";
  auto work = submit(op, sending ? n_out : n_in, (n_out + n_in) * 4, false, [=, this](int64_t) {
    if (!fake_) {
      std::unique_ptr<gloo::transport::UnboundBuffer> sb, rb;
      if (sending && n_out > 0) {
        sb = context_->createUnboundBuffer(const_cast<float*>(out), size_t(n_out) * 4);
        sb->send(dst, send_slot);
      }
      if (receiving && n_in > 0) {
        rb = context_->createUnboundBuffer(in, size_t(n_in) * 4);
        rb->recv(src, recv_slot);
      }
      if (sb) sb->waitSend(opts_.timeout);
      if (rb) rb->waitRecv(opts_.timeout);
    }
    if (sending) count("send", n_out * 4, 0);
    if (receiving) count("recv", 0, n_in * 4);
  }, what);
  work->then([=, this] {  // the waits, on the waiting thread, when it waits
    if (sending) trace_p2p("send", n_out * 4, rank_, dst, out_tag, send_slot, true);
    if (receiving) trace_p2p("recv", n_in * 4, src, rank_, in_tag, recv_slot, true);
  });
  return work;
}

// Ring reduce-scatter (Gloo has no options-style one), pipelined. Split the buffer into size() chunks of
// n; in step s (0..N-2) rank r sends its partial sum of chunk (r-s-1) mod N to the right neighbour and
// adds the left neighbour's partial sum of chunk (r-s-2) mod N to its own input's; after N-1 steps chunk
// r holds the full reduction. Each chunk travels in segments of opts_.segment_floats: as soon as segment
// j of step s is reduced it leaves for step s+1, while segment j+1 is still arriving — the network and
// the additions overlap, and no step waits for a whole chunk. Nothing copies the input: step 0 sends
// straight from it, later steps from one of two partial-sum buffers (A), and the last step adds into
// `out`. Receives land in one of two buffers (R); both pairs alternate by step.
void ProcessGroup::ring_reduce_scatter(float* out, const float* in, int64_t n, ReduceOp op, int64_t seq, DType wire) {
  const int N = size_;
  // 16 bits on the wire (NCCL's bf16 ring): what travels is rounded, every hop adds in f32 and rounds what
  // it passes on, and the result is a 16-bit value
  const bool narrow = wire != DType::f32;
  const int wb = narrow ? 2 : 4;
  if (N == 1 || n == 0) {
    const float scale = op == ReduceOp::avg ? 1.0f / float(N) : 1.0f;
    for (int64_t i = 0; i < n; i++) out[i] = narrow ? round_to(round_to(in[i], wire) * scale, wire) : in[i] * scale;
    return;
  }
  const int right = (rank_ + 1) % N, left = (rank_ + N - 1) % N;
  const int64_t g = std::max<int64_t>(1, opts_.segment_floats), segments = (n + g - 1) / g;
  auto chunk = [&](int64_t c) { return ((c % N) + N) % N; };
  // R[0] always; R[1] and A[0] from 3 ranks, A[1] from 4 (2 ranks: one step, straight into `out`)
  const int64_t buffers = 1 + (N > 2 ? 2 : 0) + (N > 3 ? 1 : 0);
  if (int64_t(rs_scratch_.size()) < buffers * n) rs_scratch_.resize(size_t(buffers * n));
  float* base = rs_scratch_.data();
  float* R[2] = {base, N > 2 ? base + n : nullptr};                        // received partial sums
  float* A[2] = {N > 2 ? base + 2 * n : nullptr, N > 3 ? base + 3 * n : nullptr};  // ours, to send on
  // narrow: what is sent is staged in 16 bits (S, by step parity) and received in 16 bits (Q)
  if (narrow && int64_t(rs_scratch16_.size()) < 4 * n) rs_scratch16_.resize(size_t(4 * n));
  uint16_t* S[2] = {narrow ? rs_scratch16_.data() : nullptr, narrow ? rs_scratch16_.data() + n : nullptr};
  uint16_t* Q[2] = {narrow ? rs_scratch16_.data() + 2 * n : nullptr, narrow ? rs_scratch16_.data() + 3 * n : nullptr};
  auto slot = [&](int s, int64_t j) {  // unique per collective, step and segment
    return (uint64_t(2) << 60) | (uint64_t(seq & 0xffffffff) << 26) | (uint64_t(s) << 14) | uint64_t(j & 0x3fff);
  };
  auto seg_len = [&](int64_t j) { return std::min(g, n - j * g); };
  using Buf = std::unique_ptr<gloo::transport::UnboundBuffer>;
  std::vector<Buf> sending[2];  // sends from A[b] (or from `in`, step 0): done before A[b] is written again
  auto send_segment = [&](int s, const float* src, int64_t j) {
    void* from = const_cast<float*>(src + j * g);
    if (narrow) {  // staged: S[s % 2] is free again once sending[s % 2] finished (see finish_sends below)
      convert(src + j * g, DType::f32, S[s % 2] + j * g, wire, seg_len(j));
      from = S[s % 2] + j * g;
    }
    Buf b = context_->createUnboundBuffer(from, size_t(seg_len(j)) * wb);
    b->send(right, slot(s, j));
    sending[s % 2].push_back(std::move(b));
  };
  auto finish_sends = [&](int b) {
    for (auto& x : sending[b]) x->waitSend(opts_.timeout);
    sending[b].clear();
  };
  for (int64_t j = 0; j < segments; j++) send_segment(0, in + chunk(rank_ - 1) * n, j);
  for (int s = 0; s < N - 1; s++) {
    const bool last = s == N - 2;
    float* recv_to = R[s % 2];
    float* sum_to = last ? out : A[s % 2];
    const float* mine = in + chunk(rank_ - s - 2) * n;
    if (!last) finish_sends((s + 1) % 2);  // A[s % 2] (and S[(s + 1) % 2]) last fed the sends of step s - 1
    std::vector<Buf> receiving;
    for (int64_t j = 0; j < segments; j++) {
      void* to = narrow ? static_cast<void*>(Q[s % 2] + j * g) : static_cast<void*>(recv_to + j * g);
      receiving.push_back(context_->createUnboundBuffer(to, size_t(seg_len(j)) * wb));
      receiving.back()->recv(left, slot(s, j));
    }
    for (int64_t j = 0; j < segments; j++) {
      receiving[size_t(j)]->waitRecv(opts_.timeout);
      const int64_t lo = j * g, hi = lo + seg_len(j);
      if (narrow) {
        convert(Q[s % 2] + lo, wire, recv_to + lo, DType::f32, hi - lo);
        for (int64_t i = lo; i < hi; i++) {
          const float m = round_to(mine[i], wire);  // our contribution, as it would travel
          sum_to[i] = op == ReduceOp::max ? std::max(m, recv_to[i]) : m + recv_to[i];
        }
      } else if (op == ReduceOp::max) {
        for (int64_t i = lo; i < hi; i++) sum_to[i] = std::max(mine[i], recv_to[i]);
      } else {
        for (int64_t i = lo; i < hi; i++) sum_to[i] = mine[i] + recv_to[i];
      }
      if (!last) send_segment(s + 1, sum_to, j);
    }
  }
  finish_sends(0);
  finish_sends(1);
  if (op == ReduceOp::avg)
    for (int64_t i = 0; i < n; i++) out[i] *= 1.0f / float(N);
  if (narrow) round_f32(out, out, n, wire);  // the result is a 16-bit value, as NCCL's output buffer is
}

}  // namespace distlab
