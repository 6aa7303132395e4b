// idem/pipelined_store.hpp: the interface of a store that commits on several connections
// ("lanes") at once; the flush pipeline (detail/pipeline/) drives it. PostgreSQL implements it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "idem/store.hpp"

namespace idem {

/// A store that can commit on several independent connections ("lanes") at once. The flush
/// pipeline keeps up to lanes() batches in flight, one per lane, each on its own flusher thread; it
/// never has two batches sharing a key in flight, nor starts a batch sharing a key with a failed one
/// that is not yet decided (docs/pg_pipeline.md). A store that is not a pipelined_store, or answers
/// lanes() == 1, is flushed on one thread through store::apply exactly as before.
///
/// Thread-safety: calls naming different lanes may run at the same time, from different threads;
/// calls naming one lane never overlap. Lane 0 may be the store's own connection: nothing else
/// (load, get, audit) runs while the pipeline flushes. lanes() must not change.
class pipelined_store {
public:
    virtual ~pipelined_store() = default;
    /// How many connections the store can commit on at once (>= 1).
    [[nodiscard]] virtual std::size_t lanes() const noexcept = 0;
    /// store::apply on lane `lane` (< lanes()): same contract, same exceptions.
    virtual void apply_on(std::size_t lane, std::span<const store_row> rows, std::uint64_t batch_id) = 0;
    /// store::committed on lane `lane`. The answer must not depend on the lane that applied.
    [[nodiscard]] virtual bool committed_on(std::size_t lane, std::uint64_t batch_id) = 0;
    /// store::reconnect for lane `lane`.
    virtual void reconnect_on(std::size_t lane) = 0;
};

}  // namespace idem
