// Lab 05: everything your fsdp.cpp can use, and what you implement. (Don't edit this file: the grader
// builds your fsdp.cpp against it, and nothing else of distlab is visible to it.)
//
// Your code runs in a process of its own beside the trainer and is PyTorch FSDP's FlatParameter and its
// hooks: it lays each unit's parameters out in one flat vector, makes a unit whole by all-gathering every
// rank's part into a buffer it allocates, points the layers' weights into that buffer (views), frees it
// when the unit is not needed, turns the layers' gradients into a flat vector, reduce-scatters it and hands
// this rank's part to the optimizer. The trainer owns the model, the data, the optimizer and this rank's
// part of every flat vector; every buffer lives in the trainer, behind a handle, so that the memory a rank
// holds and the bytes it sends are counted where your code can't reach them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lab05 {

struct Options {
  bool reshard_after_forward = true;  // FULL_SHARD (true) or SHARD_GRAD_OP (false): free a unit after its forward?
  bool prefetch = true;               // gather the next unit while this one computes (forward and backward prefetch)
  bool sync = true;                   // false on accumulation micro-steps (no_sync): gradients add up, unreduced
  bool offload = false;               // CPU offload: this rank's parts live in host memory, the optimizer steps there
  // Task 6: the memory gathering may use, in elements: the Kind::weights buffers you hold at once — the units
  // whole now (the one computing, the root), those on their way, parts staged under offload; their sizes as
  // allocated — must never add up to more (the trainer measures at every alloc). Gather as far ahead along
  // the recorded order as it allows. 0: no budget (gather the next unit, as FSDP does).
  int64_t gather_budget = 0;
};

// Task 1 — a flat vector's layout. The parameters of sizes numel[0], numel[1], ... one after the other,
// padded with zeros so that `world` ranks own equal parts; rank r owns elements [r·shard, (r+1)·shard).
struct FlatLayout {
  std::vector<int64_t> offset;  // where each parameter starts in the flat vector
  int64_t numel = 0;            // the parameters' elements
  int64_t padded = 0;           // the flat vector's length, padding included
  int64_t shard = 0;            // each rank's part
};
FlatLayout flat_layout(const std::vector<int64_t>& numel, int world);

using Buffer = int;  // a buffer in the trainer, by handle
using Work = int;    // a collective in flight, by handle

enum class Kind {
  weights,  // device memory in the parameters' dtype (bf16 in a bf16 run), counted as parameters
  grads,    // device memory, f32: a flat gradient and its reduced part, counted as communication buffers
  host,     // host memory in the parameters' dtype, counted as host memory (CPU offload's side of the bus):
            // bf16 in a bf16 run, so an f32 value copied into it is rounded to bf16
};

// One rank's sharded model. A unit is a transformer block (or the embeddings with the tied lm_head, or the
// final LayerNorm). A unit's parameters form one or two flat vectors ("flats"): one per weight-decay group
// (AdamW decays a flat whole or not at all). Parameter k of flat f is (f, k), in the model's order.
class Fsdp {
 public:
  virtual ~Fsdp() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual int num_units() const = 0;
  virtual std::vector<int> flats(int unit) const = 0;            // the unit's flats
  virtual std::vector<int64_t> numels(int flat) const = 0;       // its parameters' sizes, in order
  virtual std::string name(int flat, int k) const = 0;           // "transformer.h.7.attn.c_attn.weight": 7 is the unit's number
  // What is not here: the order the units run in. The unit and flat numbers (and so a block's number in
  // its names) say nothing of when a unit runs: the trainer draws them, afresh for every grading. PyTorch
  // FSDP learns the order on the first iteration (its execution order data); so does your code, from the
  // hooks' calls.

  // -- memory (every buffer's elements are numbered from 0) --
  // A new buffer of n elements, uninitialized: the trainer fills it with NaN, so a value you forgot to write
  // shows. Counted on this rank until release().
  virtual Buffer alloc(int64_t n, Kind kind) = 0;
  // Frees the buffer. A parameter whose weights view it has no weights from then on.
  virtual void release(Buffer b) = 0;
  // This rank's part of the flat's weights: the trainer's (the optimizer updates it after each step; never
  // release it), `shard` elements in the parameters' dtype — device memory, host memory under offload.
  virtual Buffer part(int flat) = 0;
  // dst[dst_at, dst_at + n) = src[src_at, src_at + n), converting dtypes. Between device and host memory
  // this crosses the bus (PCIe): counted, and charged by the cost model at the host link's bandwidth.
  virtual void copy(Buffer dst, int64_t dst_at, Buffer src, int64_t src_at, int64_t n) = 0;
  virtual void fill(Buffer b, int64_t at, int64_t n, float value) = 0;

  // -- collectives over the ranks, on device buffers, started and returned from at once --
  // out[r·n, (r+1)·n) = rank r's in[0, n), for every rank r. `out` is written by wait().
  virtual Work all_gather(Buffer in, Buffer out, int64_t n) = 0;
  // out[0, n) = the average over ranks of their in[rank()·n, (rank()+1)·n). Kind::grads buffers.
  virtual Work reduce_scatter(Buffer in, Buffer out, int64_t n) = 0;
  // Returns when the collective is done. Every Work is waited for once; neither of its buffers may be
  // released before.
  virtual void wait(Work w) = 0;

  // -- the layers --
  // Parameter (flat, k)'s weights are b[at, at + numel) from now on: a view, no copy (a Kind::weights buffer).
  // The trainer checks, when a unit's forward or backward starts, that every parameter of it has weights.
  virtual void view(int flat, int k, Buffer b, int64_t at) = 0;
  // Parameter (flat, k)'s gradient — this rank's, summed over the micro-steps so far — into
  // b[at, at + numel), converted to f32; the layer's gradient is released (b has it now).
  virtual void take_grad(int flat, int k, Buffer b, int64_t at) = 0;
  // b[0, shard): this rank's part of the flat's gradient, averaged over ranks — what the optimizer steps
  // part(flat) with. Copied, once per flat per optimizer step, into the trainer's gradient of part(flat),
  // held in the parameters' dtype; a grads buffer, or under offload a host buffer (the optimizer steps on
  // the host). A host buffer is in the parameters' dtype too: in a bf16 run, the f32 part a reduce_scatter
  // wrote is rounded to bf16 where you copy it into the host buffer, before keep_grad — the same rounding
  // keep_grad applies to a grads buffer, so the optimizer sees the same values either way. Every flat's
  // part must be kept by the time finish_backward returns.
  virtual void keep_grad(int flat, Buffer b) = 0;
};

// Task 2 — forward, around every unit's forward: the unit's parameters must have their weights when
// before_forward returns; after_forward decides whether they stay (FULL_SHARD frees them — except the
// root's, which backward needs first). The root is PyTorch FSDP's root instance: the unit whose forward
// encloses every other's, so the first one a forward reaches, and the last to finish it.
void before_forward(Fsdp& f, const Options& o, int unit);
void after_forward(Fsdp& f, const Options& o, int unit);
// Task 3 — backward, around every unit's backward: weights again before it; after it, the gradients
// reduce-scattered (when o.sync) and the weights freed. finish_backward: once the whole backward is over,
// every reduction done and kept.
void before_backward(Fsdp& f, const Options& o, int unit);
void after_backward(Fsdp& f, const Options& o, int unit);
void finish_backward(Fsdp& f, const Options& o);
// Task 4 — prefetch (o.prefetch): record the order the units run in during the first step (forward and
// backward), and from then on start the gather of the unit the trainer needs next, so that it arrives
// while this one computes. Task 5 — offload (o.offload): the parts and the optimizer live on the host;
// only device buffers take part in a collective. Task 6 — prefetch under a memory budget
// (o.gather_budget > 0): on a link too slow for one unit's gather to hide behind one unit's compute, the
// gathers further ahead start earlier, and each holds another unit whole: how far ahead is your decision,
// unit by unit, from the sizes and the budget (PyTorch FSDP2's modules to prefetch, DeepSpeed's
// stage3_prefetch_bucket_size and stage3_max_live_parameters).

}  // namespace lab05

// The table the grader looks up in your plugin (defined at the bottom of fsdp.cpp).
constexpr int kLab05Abi = 4;
struct Lab05Plugin {
  int abi;  // kLab05Abi
  lab05::FlatLayout (*flat_layout)(const std::vector<int64_t>&, int);
  void (*before_forward)(lab05::Fsdp&, const lab05::Options&, int);
  void (*after_forward)(lab05::Fsdp&, const lab05::Options&, int);
  void (*before_backward)(lab05::Fsdp&, const lab05::Options&, int);
  void (*after_backward)(lab05::Fsdp&, const lab05::Options&, int);
  void (*finish_backward)(lab05::Fsdp&, const lab05::Options&);
};
extern "C" Lab05Plugin distlab_lab05;
