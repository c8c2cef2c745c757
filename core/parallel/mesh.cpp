#include "core/parallel/mesh.h"

#include <fmt/format.h>

#include "core/util/error.h"

namespace distlab {

const char* axis_name(MeshAxis a) {
  switch (a) {
    case MeshAxis::dp: return "dp";
    case MeshAxis::tp: return "tp";
    case MeshAxis::pp: return "pp";
  }
  return "?";
}

MeshCoord coord_of(int rank, const MeshShape& s) {
  MeshCoord c;
  c.tp = rank % s.tp;
  c.dp = (rank / s.tp) % s.dp;
  c.pp = rank / (s.tp * s.dp);
  return c;
}

int rank_of(const MeshCoord& c, const MeshShape& s) { return c.tp + s.tp * (c.dp + s.dp * c.pp); }

std::vector<int> group_ranks(int rank, const MeshShape& s, MeshAxis axis) {
  const MeshCoord me = coord_of(rank, s);
  std::vector<int> v;
  const int n = axis == MeshAxis::dp ? s.dp : axis == MeshAxis::tp ? s.tp : s.pp;
  for (int i = 0; i < n; i++) {
    MeshCoord c = me;
    (axis == MeshAxis::dp ? c.dp : axis == MeshAxis::tp ? c.tp : c.pp) = i;
    v.push_back(rank_of(c, s));
  }
  return v;
}

MeshShape resolve_mesh(int world, int64_t dp, int64_t tp, int64_t pp) {
  if (dp < 0 || tp < 0 || pp < 0)
    throw ConfigError(fmt::format("parallel.dp {}, parallel.tp {}, parallel.pp {}: sizes are positive (0: what the others leave)", dp, tp, pp));
  const int zeros = (dp == 0) + (tp == 0) + (pp == 0);
  if (zeros == 3) dp = 0, tp = 1, pp = 1;
  else if (zeros > 1)
    throw ConfigError(fmt::format("parallel.dp {}, parallel.tp {}, parallel.pp {}: only one of them may be left to the world size", dp, tp, pp),
                      "state two of them; the third is world / (the two)");
  const int64_t known = (dp ? dp : 1) * (tp ? tp : 1) * (pp ? pp : 1);
  if (zeros) {
    if (known > world || world % known != 0)
      throw ConfigError(fmt::format("{} ranks do not split into parallel.dp {} x parallel.tp {} x parallel.pp {}: {} does not divide {}", world,
                                    dp ? std::to_string(dp) : "?", tp ? std::to_string(tp) : "?", pp ? std::to_string(pp) : "?", known, world),
                        "launch a multiple of the stated sizes (distlab run -n N)");
    (dp == 0 ? dp : tp == 0 ? tp : pp) = world / known;
  }
  if (dp * tp * pp != world)
    throw ConfigError(fmt::format("parallel.dp {} x parallel.tp {} x parallel.pp {} = {} ranks, but the job has {}", dp, tp, pp, dp * tp * pp, world),
                      "the mesh must hold every rank exactly once: change the sizes or distlab run -n");
  return MeshShape{int(dp), int(tp), int(pp)};
}

Mesh::Mesh(ProcessGroup& world, const MeshShape& shape) : shape_(shape), coord_(coord_of(world.rank(), shape)) {
  if (shape.world() != world.size())
    throw ConfigError(fmt::format("a mesh of {} ranks on a world of {}", shape.world(), world.size()));
  // every rank creates its own three groups, in the same order (new_group's rule)
  tp_ = world.new_group(group_ranks(world.rank(), shape, MeshAxis::tp));
  dp_ = world.new_group(group_ranks(world.rank(), shape, MeshAxis::dp));
  pp_ = world.new_group(group_ranks(world.rank(), shape, MeshAxis::pp));
}

ProcessGroup& Mesh::group(MeshAxis a) { return a == MeshAxis::tp ? *tp_ : a == MeshAxis::dp ? *dp_ : *pp_; }

std::string Mesh::describe() const {
  return fmt::format("dp {} x tp {} x pp {}; this rank: dp {}, tp {}, pp {}", shape_.dp, shape_.tp, shape_.pp, coord_.dp, coord_.tp, coord_.pp);
}

}  // namespace distlab
