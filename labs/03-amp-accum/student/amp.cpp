// Lab 03 — mixed precision and accumulation: the loss scaler that keeps fp16's small gradients alive,
// clipping, and one optimizer step over k micro-batches.
#include <cmath>

#include <stdexcept>

#include "labs/03-amp-accum/api.h"

namespace lab03 {

ScalerState scaler_init(const ScalerConfig& c) {
  // TODO(03-amp-accum): implement scaler_init. Read labs/03-amp-accum/README.md.
  throw std::logic_error("03-amp-accum: scaler_init is not implemented yet: "
                         "fill in the TODO in labs/03-amp-accum/student/amp.cpp");
}

bool unscale_(Comm& comm, const ScalerState& s, std::vector<Grad>& grads) {
  // TODO(03-amp-accum): implement unscale_. Read labs/03-amp-accum/README.md.
  throw std::logic_error("03-amp-accum: unscale_ is not implemented yet: "
                         "fill in the TODO in labs/03-amp-accum/student/amp.cpp");
}

void scaler_update(const ScalerConfig& c, ScalerState& s, bool found_inf) {
  // TODO(03-amp-accum): implement scaler_update. Read labs/03-amp-accum/README.md.
  throw std::logic_error("03-amp-accum: scaler_update is not implemented yet: "
                         "fill in the TODO in labs/03-amp-accum/student/amp.cpp");
}

double clip_grad_norm(std::vector<Grad>& grads, double max_norm) {
  // TODO(03-amp-accum): implement clip_grad_norm. Read labs/03-amp-accum/README.md.
  throw std::logic_error("03-amp-accum: clip_grad_norm is not implemented yet: "
                         "fill in the TODO in labs/03-amp-accum/student/amp.cpp");
}

void train_step(Step& step, const ScalerConfig& c, ScalerState& s) {
  // TODO(03-amp-accum): implement train_step. Read labs/03-amp-accum/README.md.
  throw std::logic_error("03-amp-accum: train_step is not implemented yet: "
                         "fill in the TODO in labs/03-amp-accum/student/amp.cpp");
}

}  // namespace lab03

extern "C" Lab03Plugin distlab_lab03 = {kLab03Abi, lab03::scaler_init, lab03::unscale_, lab03::scaler_update,
                                        lab03::clip_grad_norm, lab03::train_step};
