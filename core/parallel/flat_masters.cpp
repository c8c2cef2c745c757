#include "core/parallel/flat_masters.h"

#include "core/parallel/comm_buffers.h"

namespace distlab {

void lend_masters(Runtime& rt, FlatParams& flats, std::vector<Tensor>& set_aside) {
  set_aside.clear();
  for (FlatParam& f : flats.all()) {
    Tensor flat = rt.empty({f.padded}, Category::comm_buffers, "gathered f32 masters"), up;
    const float* mine = flats.part_to_send(f, up, &f.local.data);
    staged_all_gather(rt, flats.group(), flat.f32(), mine, f.shard, DType::f32);  // in f32: the masters, unrounded
    for (size_t i = 0; i < f.params.size(); i++) {
      Parameter& p = *f.params[i];
      set_aside.push_back(p.data);
      p.data = rt.empty(p.data.shape(), Category::params, p.name + " (gathered f32 master)");
      copy_values(rt, flat.f32_at(f.offset[i]), DType::f32, p.data.data(), DType::f32, p.data.numel());
    }
  }
}

void restore_params(FlatParams& flats, std::vector<Tensor>& set_aside) {
  size_t k = 0;
  for (FlatParam& f : flats.all())
    for (Parameter* p : f.params)
      if (k < set_aside.size()) p->data = set_aside[k++];
  set_aside.clear();
}

}  // namespace distlab
