// idem/detail/pg/lanes.hpp: the lanes of the PostgreSQL store (pipelined commits): the connections a
// durable_guard's flush pipeline commits on at once.
//
// postgres_store is a pipelined_store with `lanes` connections (default 1): lane 0 is the store's
// own connection, lane i > 0 a second postgres_store on the same URI, opened at its first use and
// carrying the first store's settings (node, sync durability, remote_apply, test hook). A lane runs
// no schema step: the first store created or checked the schema already, and CREATE INDEX IF NOT
// EXISTS takes a SHARE lock on its table even when the index exists, which would deadlock with
// another lane's batch (schema.hpp). The flush pipeline then keeps up to `lanes` batches in flight,
// one per connection, never two sharing a key (docs/pg_pipeline.md); PostgreSQL's group commit
// flushes their WAL together. lanes = 1 gives the single-connection flusher. Every call other than
// apply_on, committed_on and reconnect_on uses lane 0. The default is 1 because on the 2-core machine
// of docs/pg_pipeline.md more lanes cut batches into more, smaller transactions and lost throughput
// (CPU, not commit latency, was the limit there); more lanes pay when the commit's latency (a remote
// server, a synchronous standby) is the limit.
//
// Invariants
//   * The number of lanes never changes after open (pipelined_store's contract): the slots of lanes
//     1.. are made once, and a slot's store, once opened, stays until the store is destroyed.
//   * Only lane i's flusher thread opens or uses lane i > 0 (pipelined_store: calls naming one lane
//     never overlap), so opening on first use needs no lock.
//   * A setting the first store changes later (sync durability required, the test hook) reaches the
//     lanes opened already through each_open(); a lane opened later copies it at its opening.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "idem/detail/assert.hpp"

namespace idem::detail::pg {

/// The stores of lanes 1.. of a first store of type Store (lane 0 is the first store itself).
template <class Store>
class lane_set {
public:
    /// Makes the slots of `lanes` lanes (the store validated lanes >= 1 first).
    void reserve_lanes(std::size_t lanes) {
        IDEM_ASSERT(lanes >= 1 && more_.empty(), "a store has at least one lane, and its lanes are set once");
        more_.resize(lanes - 1);
    }
    [[nodiscard]] std::size_t count() const noexcept { return more_.size() + 1; }

    /// The store of `lane` (< count()): `first` for lane 0, else the lane's store, made by open()
    /// (a std::unique_ptr<Store>) at the first use.
    template <class Open>
    Store& at(std::size_t lane, Store& first, Open&& open) {
        IDEM_ASSERT(lane < count(), "a lane is below lanes() (pipelined_store's contract)");
        if (lane == 0) return first;
        std::unique_ptr<Store>& l = more_[lane - 1];
        if (!l) l = open();
        return *l;
    }
    /// Whether `lane` (< count()) has a store: lane 0 always, lane i > 0 once it was used.
    [[nodiscard]] bool opened(std::size_t lane) const {
        IDEM_ASSERT(lane < count(), "a lane is below lanes() (pipelined_store's contract)");
        return lane == 0 || more_[lane - 1] != nullptr;
    }
    /// fn(store) for each lane i > 0 opened so far.
    template <class F>
    void each_open(F&& fn) {
        for (auto& l : more_)
            if (l) fn(*l);
    }

private:
    std::vector<std::unique_ptr<Store>> more_;  // lanes 1..; null until first used
};

}  // namespace idem::detail::pg
