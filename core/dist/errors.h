// Errors of the distributed runtime: they name the rank, the collective and its sequence number.
#pragma once
#include "core/util/error.h"

namespace distlab {

struct StoreError : Error { using Error::Error; };      // rendezvous: timeouts, lost connections
struct CommError : Error { using Error::Error; };       // a collective that failed or timed out
struct MismatchError : CommError { using CommError::CommError; };  // ranks called different collectives
struct PeerLostError : CommError { using CommError::CommError; };  // another rank closed its connection (it failed first)

}  // namespace distlab
