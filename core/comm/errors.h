// Errors of the distributed runtime: they name the rank, the collective and its sequence number.
#pragma once
#include <vector>

#include "core/util/error.h"

namespace distlab {

struct StoreError : Error { using Error::Error; };      // rendezvous: timeouts, lost connections
// a collective that failed or timed out; waiting_for: the ranks it waited for in vain (the launcher
// blames them, not this rank, when they were still alive: stopped or stuck)
struct CommError : Error {
  using Error::Error;
  std::vector<int> waiting_for;
};
struct MismatchError : CommError { using CommError::CommError; };  // ranks called different collectives
struct PeerLostError : CommError { using CommError::CommError; };  // another rank closed its connection (it failed first)

}  // namespace distlab
