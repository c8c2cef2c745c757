// A save from the master weights, for ZeRO-1 and ZeRO-2, whose parts ARE the f32 masters: every rank's part
// of each flat vector (flat_param.h) all-gathered in f32 and lent to the parameters as whole f32 tensors, so
// that the checkpoint writes the unrounded values; the parameters' own (16-bit) data waits in `set_aside`
// until restore_params puts it back. (ZeRO-3 gathers from the optimizer's masters in its own all-gather.)
// Read next: flat_slices.h (what of each flat vector a rank's checkpoint holds).
#pragma once
#include <vector>

#include "core/parallel/flat_param.h"

namespace distlab {

void lend_masters(Runtime& rt, FlatParams& flats, std::vector<Tensor>& set_aside);
void restore_params(FlatParams& flats, std::vector<Tensor>& set_aside);

}  // namespace distlab
