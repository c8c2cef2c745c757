#include "core/parallel/mesh.h"

#include <fmt/format.h>

#include "core/util/error.h"

namespace distlab {

const char* axis_name(MeshAxis a) {
  switch (a) {
    case MeshAxis::dp: return "dp";
    case MeshAxis::tp: return "tp";
    case MeshAxis::pp: return "pp";
    case MeshAxis::cp: return "cp";
    case MeshAxis::dp_cp: return "dp x cp";
  }
  return "?";
}

MeshCoord coord_of(int rank, const MeshShape& s) {
  MeshCoord c;
  c.tp = rank % s.tp;
  c.cp = (rank / s.tp) % s.cp;
  c.dp = (rank / (s.tp * s.cp)) % s.dp;
  c.pp = rank / (s.tp * s.cp * s.dp);
  return c;
}

int rank_of(const MeshCoord& c, const MeshShape& s) { return c.tp + s.tp * (c.cp + s.cp * (c.dp + s.dp * c.pp)); }

std::vector<int> group_ranks(int rank, const MeshShape& s, MeshAxis axis) {
  const MeshCoord me = coord_of(rank, s);
  std::vector<int> v;
  if (axis == MeshAxis::dp_cp) {  // dp-major, cp-minor: the order of the ranks' numbers
    for (int d = 0; d < s.dp; d++)
      for (int k = 0; k < s.cp; k++) {
        MeshCoord c = me;
        c.dp = d;
        c.cp = k;
        v.push_back(rank_of(c, s));
      }
    return v;
  }
  const int n = axis == MeshAxis::dp ? s.dp : axis == MeshAxis::tp ? s.tp : axis == MeshAxis::cp ? s.cp : s.pp;
  for (int i = 0; i < n; i++) {
    MeshCoord c = me;
    (axis == MeshAxis::dp ? c.dp : axis == MeshAxis::tp ? c.tp : axis == MeshAxis::cp ? c.cp : c.pp) = i;
    v.push_back(rank_of(c, s));
  }
  return v;
}

MeshShape resolve_mesh(int world, int64_t dp, int64_t tp, int64_t pp, int64_t cp) {
  if (cp < 1) throw ConfigError(fmt::format("parallel.cp {}: the context-parallel size is a positive number of ranks", cp), "parallel.cp = 1 splits nothing");
  if (world % cp != 0)
    throw ConfigError(fmt::format("parallel.cp {} does not divide the {} ranks", cp, world), "launch a multiple of parallel.cp ranks (distlab run -n N)");
  world /= int(cp);  // dp × tp × pp cover what cp leaves
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
      throw ConfigError(fmt::format("{} ranks do not split into parallel.dp {} x parallel.tp {} x parallel.pp {}{}: {} does not divide {}", world * cp,
                                    dp ? std::to_string(dp) : "?", tp ? std::to_string(tp) : "?", pp ? std::to_string(pp) : "?",
                                    cp > 1 ? fmt::format(" x parallel.cp {}", cp) : "", known * cp, world * cp),
                        "launch a multiple of the stated sizes (distlab run -n N)");
    (dp == 0 ? dp : tp == 0 ? tp : pp) = world / known;
  }
  if (dp * tp * pp != world)
    throw ConfigError(fmt::format("parallel.dp {} x parallel.tp {} x parallel.pp {}{} = {} ranks, but the job has {}", dp, tp, pp,
                                  cp > 1 ? fmt::format(" x parallel.cp {}", cp) : "", dp * tp * pp * cp, world * cp),
                      "the mesh must hold every rank exactly once: change the sizes or distlab run -n");
  return MeshShape{int(dp), int(tp), int(pp), int(cp)};
}

Mesh::Mesh(ProcessGroup& world, const MeshShape& shape) : shape_(shape), coord_(coord_of(world.rank(), shape)) {
  if (shape.world() != world.size())
    throw ConfigError(fmt::format("a mesh of {} ranks on a world of {}", shape.world(), world.size()));
  // every rank creates its own three groups, in the same order (new_group's rule)
  tp_ = world.new_group(group_ranks(world.rank(), shape, MeshAxis::tp));
  dp_ = world.new_group(group_ranks(world.rank(), shape, MeshAxis::dp));
  pp_ = world.new_group(group_ranks(world.rank(), shape, MeshAxis::pp));
  if (shape.cp > 1) {
    cp_ = world.new_group(group_ranks(world.rank(), shape, MeshAxis::cp));
    dp_cp_ = world.new_group(group_ranks(world.rank(), shape, MeshAxis::dp_cp));
  }
}

ProcessGroup& Mesh::group(MeshAxis a) {
  switch (a) {
    case MeshAxis::tp: return *tp_;
    case MeshAxis::pp: return *pp_;
    case MeshAxis::dp: return *dp_;
    case MeshAxis::cp: DL_ASSERT(cp_, "Mesh::group(cp) without context parallelism"); return *cp_;
    case MeshAxis::dp_cp: return cp_ ? *dp_cp_ : *dp_;
  }
  return *dp_;
}

std::string Mesh::describe() const {
  if (shape_.cp > 1)
    return fmt::format("dp {} x cp {} x tp {} x pp {}; this rank: dp {}, cp {}, tp {}, pp {}", shape_.dp, shape_.cp, shape_.tp, shape_.pp,
                       coord_.dp, coord_.cp, coord_.tp, coord_.pp);
  return fmt::format("dp {} x tp {} x pp {}; this rank: dp {}, tp {}, pp {}", shape_.dp, shape_.tp, shape_.pp, coord_.dp, coord_.tp, coord_.pp);
}

}  // namespace distlab
