// idem/store_options.hpp: how a durable guard writes to its store (durable.hpp): durability mode,
// the flush queue's bounds, the flusher's timing, the idempotency window and pruning.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

#include "idem/store.hpp"

namespace idem {

enum class durability : std::uint8_t {
    async,  ///< acknowledge at once; a crash loses at most the rows still queued
    sync,   ///< acknowledge when the batch holding the transition has committed (group commit)
};

/// Prints the enumerator's name ("async", "sync"); a value outside the enum as "durability(N)".
inline std::ostream& operator<<(std::ostream& os, durability d) {
    switch (d) {
        case durability::async: return os << "async";
        case durability::sync: return os << "sync";
    }
    return os << "durability(" << static_cast<unsigned>(d) << ')';
}

/// What a durable guard reads from its store before its constructor returns (durable.hpp).
enum class recovery_start : std::uint8_t {
    /// Every record of the idempotency window: claims in flight, released records and the hot
    /// window into memory, the rest into the cold window's filter. The guard then serves with the
    /// hot window in memory; start-up time grows with the window (10M records on SQLite: about
    /// 6 s).
    load_window,
    /// Claims in flight only (every PROCESSING record) and the largest fence; the constructor then
    /// returns, and a thread streams the keys of the whole window (one key and one time per record,
    /// on a second connection: store::open_reader) into the cold window's filter. Until that stream
    /// is complete, every key memory does not hold is read from the store before it is granted
    /// (a duplicate is answered from the store and comes back into memory; a fresh key pays one
    /// store read). Start-up time follows the claims in flight, not the window. Needs a store that
    /// opens a reader (SQLite, PostgreSQL, MySQL) and options.ordered_versions off; otherwise
    /// the guard starts as load_window does (recovery_report::claims_first says which ran).
    claims_first,
};

/// Prints the enumerator's name; a value outside the enum as "recovery_start(N)".
inline std::ostream& operator<<(std::ostream& os, recovery_start r) {
    switch (r) {
        case recovery_start::load_window: return os << "load_window";
        case recovery_start::claims_first: return os << "claims_first";
    }
    return os << "recovery_start(" << static_cast<unsigned>(r) << ')';
}

struct store_options {
    durability mode = durability::async;
    std::size_t queue_capacity = 1u << 16;  ///< transitions the queue holds
    /// Rows per store transaction. The default takes everything queued: with keys in random order
    /// each batch dirties about one page per key in the stores' key-ordered tables, and a batch of
    /// 65,536 rows shares those pages among ~16 times more rows than one of 4,096 (SQLite, 1M
    /// random keys: 2.5-3x the rate; docs/internals/durable-benchmarks.md, "Batch size").
    std::size_t max_batch = 1u << 16;
    std::chrono::nanoseconds offer_wait{0};                            ///< bounded wait on a full queue; 0: fail at once
    std::chrono::nanoseconds sync_timeout = std::chrono::seconds(10);  ///< longest wait for a commit in sync mode
    /// Flusher pause between two looks at an empty queue, while it found work less than 10 ms ago
    /// (under load: rows gather for the next batch meanwhile). Then it sleeps: idle_sleep.
    std::chrono::nanoseconds idle_poll = std::chrono::microseconds(200);
    /// Longest sleep of an idle flusher (at least idle_poll). It sleeps until a transition, a
    /// recall or the guard's destruction wakes it, or its next prune is due; this bound is a safety
    /// net only (a lost wake-up would cost at most this much latency), and what an idle guard costs:
    /// about one wake-up per idle_sleep (docs/operations.md, "An idle guard").
    std::chrono::nanoseconds idle_sleep = std::chrono::milliseconds(100);
    std::chrono::nanoseconds max_backoff = std::chrono::seconds(1);  ///< longest pause between retries
    /// Audit node identity; empty: HOST:PID:RRRRRR (detail/node_identity.hpp). (Brace-initialized so that a designated
    /// initializer leaving it out compiles under -Wextra -Werror: -Wmissing-field-initializers.)
    std::string node{};
    /// The idempotency window: how long a key's decision is remembered at all. Inside it a
    /// duplicate gets the recorded outcome even after memory evicted the key (options.retention,
    /// the hot window); past it the key may run again, and the store prunes its record.
    /// forever: never forgotten, never pruned. Default 7 days (docs/stores.md, "Two windows").
    std::chrono::milliseconds window = std::chrono::hours(24 * 7);
    /// How long audit rows are kept; auditors often need years. forever: never pruned.
    std::chrono::milliseconds audit_window = forever;
    /// How often the flusher prunes (one bounded call of store::prune between batches, repeated
    /// while it reports more). Zero: never in the background (`idem prune` does it).
    std::chrono::nanoseconds prune_interval = std::chrono::minutes(1);
    /// Longest wait for the store's answer about a key the cold window may hold (a duplicate after
    /// eviction); past it begin() answers store_unavailable and nothing is decided.
    std::chrono::nanoseconds recall_timeout = std::chrono::seconds(2);
    /// What is read before the guard serves (recovery_start above).
    recovery_start start = recovery_start::load_window;
    static constexpr std::chrono::milliseconds forever = idem::forever;
};

}  // namespace idem
