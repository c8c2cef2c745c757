#include "core/perf/trace_io.h"

namespace distlab {

nlohmann::json events_to_json(const std::vector<TraceEvent>& events) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& e : events)
    a.push_back({e.name, int(e.kind), int(e.stream), e.flops, e.bytes, e.t_begin_us, e.t_end_us, e.scales_with_batch, e.op,
                 e.payload_bytes, e.group_size, e.seq, e.group, e.low_precision, e.on_host, e.link_bytes, e.recompute,
                 {e.shape.gemm[0].m, e.shape.gemm[0].n, e.shape.gemm[0].k, e.shape.gemm[1].m, e.shape.gemm[1].n, e.shape.gemm[1].k,
                  e.shape.heads, e.shape.seq, e.shape.head_dim}});
  return a;
}

std::vector<TraceEvent> events_from_json(const nlohmann::json& j) {
  std::vector<TraceEvent> out;
  for (const auto& x : j) {
    TraceEvent e;
    e.name = x[0].get<std::string>();
    e.kind = EventKind(x[1].get<int>());
    e.stream = Stream(x[2].get<int>());
    e.flops = x[3].get<double>();
    e.bytes = x[4].get<double>();
    e.t_begin_us = x[5].get<double>();
    e.t_end_us = x[6].get<double>();
    e.scales_with_batch = x[7].get<bool>();
    e.op = x[8].get<std::string>();
    e.payload_bytes = x[9].get<int64_t>();
    e.group_size = x[10].get<int>();
    e.seq = x[11].get<int64_t>();
    e.group = x[12].get<std::string>();
    e.low_precision = x.size() > 13 && x[13].get<bool>();
    e.on_host = x.size() > 14 && x[14].get<bool>();
    e.link_bytes = x.size() > 15 ? x[15].get<double>() : 0.0;
    e.recompute = x.size() > 16 && x[16].get<bool>();
    if (x.size() > 17) {
      const auto& d = x[17];
      e.shape.gemm[0] = {d[0].get<int64_t>(), d[1].get<int64_t>(), d[2].get<int64_t>()};
      e.shape.gemm[1] = {d[3].get<int64_t>(), d[4].get<int64_t>(), d[5].get<int64_t>()};
      e.shape.heads = d[6].get<int64_t>(), e.shape.seq = d[7].get<int64_t>(), e.shape.head_dim = d[8].get<int64_t>();
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace distlab
