// What the engine (a trainer, or the grader) and a plugin's host process say to each other. The host
// (grader/host/) loads the student's plugin and runs its functions on request; the plugin's only ways out
// are the requests below, which the engine answers and counts. Numbers here are the wire format.
#pragma once
#include <cstdint>

namespace distlab::labproto {

constexpr uint64_t kMaxPayload = uint64_t(256) << 20;  // no single message is larger (lab 01's biggest is 16 MiB)

enum Op : uint32_t {
  // host -> engine, once: the plugin loaded and has the lab's table (arg0 = the table's ABI version)
  kHello = 1,
  kLoadFailed = 2,  // payload: why (dlopen's message, a missing table, a wrong ABI)
  // engine -> host: run a function of the plugin (arg0 = Fn, more args per function, inputs in the payload)
  kCall = 3,
  kReturn = 4,  // host -> engine: the function returned; outputs in the payload
  kRaised = 5,  // host -> engine: the function threw; payload: what()
  kAbort = 6,   // engine -> host: give up the current call (payload: why); the host exits
  // host -> engine, once, before the plugin is loaded: the engine measures what the host holds alone (its
  // baseline: PluginMemory) and answers kLoad; only then does the host load the student's code
  kBeforeLoad = 7,
  kLoad = 8,
  // lab 01: point-to-point messages through the engine's relay
  kSend = 10,  // arg0 = dst; payload: the floats
  kRecv = 11,  // arg0 = src, arg1 = count; answered by kData (count floats) or kAbort
  kData = 12,
  // lab 02: collectives the engine runs for the plugin on its real process group
  kAllReduce = 20,       // arg0 = ReduceOp; payload: floats; answered by kData
  kAllReduceAsync = 21,  // arg0 = ReduceOp; payload: floats; answered by kHandle (arg0)
  kWait = 22,            // arg0 = handle; answered by kData
  kHandle = 23,
  // lab 03: what the student's train_step asks of the trainer (grader/bridge/lab_plugin.cpp)
  kStepForwardBackward = 30,  // arg0 = micro; payload: the f32 loss factor; answered by kData (the f64 loss)
  kStepGrads = 31,            // answered by kData: every gradient as f32, in the model's order
  kStepOptimizer = 32,        // payload: every gradient as f32; answered by kData (empty)
  kStepSkip = 33,             // answered by kData (empty)
  kStepScheduler = 34,        // answered by kData (empty)
  // lab 04: two more collectives, and what the student's ZeRO asks of the trainer (grader/labs/04-zero/bridge.cpp)
  kReduceScatter = 24,  // arg0 = ReduceOp, arg1 = n; payload: size·n floats; answered by kData (n floats)
  kAllGather = 25,      // payload: n floats; answered by kData (size·n floats)
  kReduceScatterAsync = 26,  // as kReduceScatter, answered by kHandle (arg0); its kWait answers the n floats
  kZeroState = 39,         // arg0 = flat, arg1 = n; payload: the name; answered by kData (empty): n floats counted
  kZeroGrad = 40,          // arg0 = flat; answered by kData: its whole gradient on this rank (numel floats)
  kZeroKeep = 41,          // arg0 = flat, arg1 = begin; payload: this rank's averaged part; answered by kData (empty)
  kZeroKeptGrad = 42,      // arg0 = flat; answered by kData: the part kept this step (as the trainer holds it)
  kZeroWeights = 43,       // arg0 = flat; answered by kData: the flat's weights now (numel floats)
  kZeroSetWeights = 44,    // arg0 = flat, arg1 = begin; payload: weights; answered by kData (empty)
  kZeroRelease = 45,       // arg0 = flat; answered by kData (empty): its whole gradient freed
  // lab 07: the checkpoint folder's files, through the trainer (grader/labs/07-checkpoint/bridge.cpp)
  kFileOpen = 50,    // payload: the name; answered by kData (an int32 handle)
  kFileWrite = 51,   // arg0 = handle; payload: the bytes; answered by kData (empty)
  kFileSync = 52,    // arg0 = handle; answered by kData (empty)
  kFileClose = 53,   // arg0 = handle; answered by kData (empty)
  kFileRename = 54,  // payload: from\0to; answered by kData (empty)
  kFileExists = 55,  // payload: the name; answered by kData (an int32)
  kFileRead = 56,    // payload: the name; answered by kData (the bytes)
  // lab 05: what the student's FSDP asks of the trainer (grader/labs/05-fsdp-1b/bridge.cpp), each answered by
  // kData (an int32 handle where it makes one, else empty)
  kFsdpAlloc = 70,          // arg0 = n, arg1 = kind (0 weights, 1 grads, 2 host); a buffer handle
  kFsdpRelease = 71,        // arg0 = buffer
  kFsdpPart = 72,           // arg0 = flat; a buffer handle (the trainer's part)
  kFsdpCopy = 73,           // arg0 = dst, arg1 = dst_at, arg2 = src, arg3 = src_at, arg4 = n
  kFsdpFill = 74,           // arg0 = buffer, arg1 = at, arg2 = n; payload: the f32 value
  kFsdpAllGather = 75,      // arg0 = in, arg1 = out, arg2 = n; a work handle
  kFsdpReduceScatter = 76,  // arg0 = in, arg1 = out, arg2 = n; a work handle
  kFsdpWait = 77,           // arg0 = work
  kFsdpView = 78,           // arg0 = flat, arg1 = k, arg2 = buffer, arg3 = at
  kFsdpTakeGrad = 79,       // arg0 = flat, arg1 = k, arg2 = buffer, arg3 = at
  kFsdpKeepGrad = 80,       // arg0 = flat, arg1 = buffer
  // lab 06: what the student's pipeline executor asks of its stage (grader/labs/06-tp-pp/bridge.cpp); arg0 =
  // micro, arg1 = the second micro-batch (the paired calls) or dp_sync (kPipeBackward); each answered by kData
  // (empty)
  kPipeForward = 81,
  kPipeBackward = 82,
  kPipeRecvForward = 83,
  kPipeSendForward = 84,
  kPipeRecvBackward = 85,
  kPipeSendBackward = 86,
  kPipeSendForwardRecvBackward = 87,
  kPipeSendBackwardRecvForward = 88,
};

enum Fn : int64_t {
  // lab 01 (args: rank, size, n)
  kRingReduceScatter = 1,
  kRingAllGather = 2,
  kRingAllReduce = 3,
  // lab 02
  kSamplerIndices = 10,  // args: n, replicas, rank, seed, epoch, shuffle | drop_last << 1; returns int64s
  kDdpInit = 11,         // args: rank, size, mode (0 naive, 1 bucketed), bucket_mb·1e6, #params; payload: numel + name\0 each
  kDdpAfterBackward = 12,  // args: unit, #ready; payload: int32 indices, then their gradients
  kDdpFinish = 13,         // payload: (naive) every gradient; returns every gradient
  kDdpBeginBackward = 14,  // arg1 = sync (bucketed only)
  // lab 03 (a ScalerConfig is 4 x 4 bytes: init_scale, growth_factor, backoff_factor f32, growth_interval i32;
  // a ScalerState 8: scale f32, growth_tracker i32)
  kScalerInit = 20,    // payload: config; returns a state
  kScalerUpdate = 21,  // arg1 = found_inf; payload: config, state; returns the state
  kUnscale = 22,       // args: rank, size, #grads; payload: state, then per grad an int64 numel, then the floats;
                       // returns int32 found_inf, then the floats
  kClipGradNorm = 23,  // arg1 = #grads; payload: f64 max_norm, numels, floats; returns f64 norm, then the floats
  kTrainStep = 24,     // args: rank, size, accum_steps, #params; payload: f64 max_norm, config, then numel + name\0
                       // each (the first call of a run: the state starts from scaler_init); returns f32 scale used,
                       // the state after
  // lab 04 (the flat table: per flat an int64 numel, an int64 decay flag, an int64 unit and its name\0; an AdamW: f32 lr, beta1,
  // beta2, eps, weight_decay, max_norm, int64 t)
  kShardOf = 30,        // args: numel, rank, world; returns int64 padded, begin, end
  kZero1Reduce = 31,    // args: rank, size, #flats; payload: the flat table
  kZero2Reduce = 32,    // args: rank, size, #flats, flat; payload: the flat table
  kZeroStep = 33,       // args: rank, size, #flats; payload: an AdamW, the flat table
  kAdamWStep = 34,      // args: n, decay; payload: an AdamW, f32 grad_scale, then w, m, v, g (n floats each); returns w, m, v
  kZeroStateDump = 35,  // returns every buffer state() made: int64 flat, int64 n, name\0, n floats each
  kZero2Finish = 36,    // args: rank, size, #flats; payload: the flat table
  // lab 05
  kFsdpHook = 40,  // args: rank, size, hook (0 before_forward, 1 after_forward, 2 before_backward, 3 after_backward,
                   // 4 finish_backward), unit, flags (1 reshard_after_forward, 2 prefetch, 4 sync, 8 offload), #flats;
                   // payload: per flat an int32 unit, int32 #params, then per parameter an int64 numel and its name\0.
                   // Units go by the numbers the trainer drew for this run (lab.unit_seed), not the model's order
  kFlatLayout = 41,  // args: world, #sizes; payload: int64 sizes; returns int64 numel, padded, shard, then the offsets
  // lab 07 (a snapshot: int64 rank, world, micro_batch, step, #params, #state names; the names\0; per param
  // an int64 numel and its name\0; int64 optimizer steps; per param per state name an int64 count and the
  // floats; int64 #streams and the uint64 draws; int64 epoch, position)
  kSaveState = 50,  // payload: the snapshot
  kLoadState = 51,  // payload: the snapshot (a fresh run's values); returns int32 length + the refusal ("" =
                    // loaded), then what was set: int64 flag + steps; per param per name an int64 count (-1:
                    // not set) + floats; int64 flag + #streams + draws; int64 flag + epoch + position
  // lab 06 (grader/labs/06-tp-pp/bridge.cpp). The layers: args rank, size, rows, in, out, has_bias; payload
  // x (rows, in), w (out, in), then b (out, when has_bias; forward) or dy (rows, out; backward); return y
  // (rows, out), or dx (rows, in), dw (out, in), db (out, when has_bias). Their all-reduces are kAllReduce
  // requests (op sum).
  kTpColumnForward = 60,
  kTpColumnBackward = 61,
  kTpRowForward = 62,
  kTpRowBackward = 63,
  kPipeRun = 64,  // args: stages, stage, m; the student's executor's requests are kPipe* ops below; returns nothing
  // Sequence parallel: the same args and order, `rows` counting every rank's token rows; the stream's side —
  // x and dx of a column layer, y and dy of a row layer — holds this rank's rows/t of them. Their collectives
  // are kAllGather and kReduceScatter (op sum) requests.
  kTpSpColumnForward = 65,
  kTpSpColumnBackward = 66,
  kTpSpRowForward = 67,
  kTpSpRowBackward = 68,
  kTpSpNormGrads = 69,  // args: rank, size, n; payload: a norm parameter's gradient (n floats); returns it summed
  // lab 10 (grader/labs/10-lora-qlora/host.cpp). An Nf4 on the wire: int64 #packed, #absmax_q, #absmax2, f32
  // offset, then the packed bytes, the absmax_q bytes, the absmax2 floats. A base is an Nf4 the host keeps by
  // id for the layer calls (in the plugin's process: its bytes are the plugin's).
  kNf4Code = 90,      // returns the floats
  kQuantize = 91,     // args: n, base id (-1: do not keep); payload: n floats; returns an Nf4
  kDequantize = 92,   // args: n; payload: an Nf4; returns n floats
  kKeepBase = 93,     // args: base id; payload: an Nf4, kept as that base
  kLoraForward = 94,  // args: base id, N, in, out, r, has_bias; payload: f32 scaling, x, A, B, bias; returns y (N, out)
  kLoraBackward = 95, // args: base id, N, in, out, r, has_bias, want_dx; payload: f32 scaling, x, dy, A, B, bias, dA, dB;
                      // returns dx (N, in; when want_dx), dA, dB
  kBaseBytes = 96,    // args: base id; returns the base's Nf4 as the host holds it now
};

}  // namespace distlab::labproto
