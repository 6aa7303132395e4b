// idem/store.hpp: the durable store interface (its row types are in store_rows.hpp).
//
// A store does four things: apply a batch of transitions atomically (records and audit rows in one
// transaction), load records for recovery, read one key, and read audit trails. Implementations:
// memory_store (below; for tests and users who want the pipeline without a disk), sqlite_store
// (sqlite_store.hpp, target idem::sqlite) and postgres_store (postgres_store.hpp, target
// idem::postgres). Stores are used by one thread at a time (the flusher, or recovery before it
// starts); they need not be thread-safe.
#pragma once

#include <algorithm>
#include <climits>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "idem/detail/rows/batch_fold.hpp"
#include "idem/detail/node_identity.hpp"
#include "idem/error.hpp"
#include "idem/store_rows.hpp"
#include "idem/transition.hpp"

namespace idem {

/// Thrown by store::apply when the commit's result is unknown (the connection broke during COMMIT).
/// The flusher then asks store::committed(batch_id) instead of retrying blindly.
class commit_unknown : public error {
public:
    explicit commit_unknown(const std::string& what) : error(errc::store_unavailable, what) {}
};

/// Thrown by store::apply when the store refuses the batch because of what a row holds (a value
/// its types or constraints can never take: PostgreSQL SQLSTATE classes 22 and 23), as opposed to
/// an outage. Retrying the same rows cannot help: the flusher splits the batch to find the row,
/// commits the others and sets that row aside (counted, named in last_store_error()).
class rejected_row : public error {
public:
    explicit rejected_row(const std::string& what) : error(errc::store_error, what) {}
};

/// A window that never ends (store_options::window, audit_window; global_options likewise).
inline constexpr std::chrono::milliseconds forever = std::chrono::milliseconds::max();

/// What store::prune removes in one call. A bound of `keep_all` removes nothing of that kind.
struct prune_limits {
    static constexpr std::int64_t keep_all = INT64_MIN;
    /// Records (never PROCESSING ones) whose updated_time is older than this (Unix ms): the
    /// idempotency window, store_options::window.
    std::int64_t records_before_ms = keep_all;
    /// Audit rows whose at_time is older than this (Unix ms): store_options::audit_window.
    std::int64_t audit_before_ms = keep_all;
    /// At most this many records and this many audit rows per call, so one call is a short
    /// transaction that never holds the writer for long.
    std::size_t max_rows = 10'000;
};

/// What one store::prune call removed; `more`: a bound still has rows past it (call again).
struct prune_result {
    std::size_t records = 0;
    std::size_t audit_rows = 0;
    bool more = false;
};

/// How far a store has been pruned (persisted in the store): every record last updated before
/// `records_ms`, and every audit row older than `audit_ms`, may be gone. `idem verify` uses it to
/// tell a pruned history (legal) from a lost one. keep_all: never pruned.
struct prune_horizon {
    std::int64_t records_ms = prune_limits::keep_all;
    std::int64_t audit_ms = prune_limits::keep_all;
    friend bool operator==(const prune_horizon&, const prune_horizon&) = default;
};

class store {
public:
    virtual ~store() = default;
    /// Writes `rows` (sorted by key, then seq) in one transaction: one audit row per row, and each
    /// key's record set to the state of its last row, unless the stored fence is higher. Records
    /// batch_id in the same transaction. Throws commit_unknown when COMMIT's outcome is unknown,
    /// idem::error(store_unavailable) when the store cannot be reached, idem::error(store_error)
    /// for anything else (disk full, I/O error), each naming the store and the failing step.
    virtual void apply(std::span<const store_row> rows, std::uint64_t batch_id) = 0;
    /// Whether the batch with this id committed (used after commit_unknown).
    [[nodiscard]] virtual bool committed(std::uint64_t batch_id) = 0;
    /// Calls fn for every record (recovery). Throws idem::error(corrupt_record) for a row that
    /// breaks the schema's rules, naming the key and the rule.
    virtual void load(const std::function<void(const stored_record&)>& fn) = 0;
    [[nodiscard]] virtual std::optional<stored_record> get(std::string_view key) = 0;
    /// Recovery that serves first (recovery_start::claims_first) reads the store in two parts.
    /// load_claims: calls fn for every PROCESSING record. Default: load(), filtered; a store that
    /// can find them without reading every record overrides it (sqlite_store: a partial index).
    virtual void load_claims(const std::function<void(const stored_record&)>& fn) {
        load([&](const stored_record& r) {
            if (r.state == record_state::processing) fn(r);
        });
    }
    /// load_window_keys: calls fn(key, updated_ms) for every record updated at or after since_ms
    /// (Unix ms; prune_limits::keep_all: every record), in any order; PROCESSING records may be
    /// among them. Only the key and its last update, so a store can answer from an index
    /// without reading the rows (sqlite_store: the updated_time index, which holds the key).
    /// The keys are not checked as load() checks them: they only feed the cold window's filter,
    /// and a key that is looked up is read again, whole and checked, with get(). Default: load().
    virtual void load_window_keys(std::int64_t since_ms, const std::function<void(std::string_view, std::int64_t)>& fn) {
        load([&](const stored_record& r) {
            if (r.updated_ms >= since_ms) fn(r.key, r.updated_ms);
        });
    }
    /// The key's audit trail in sequence order.
    [[nodiscard]] virtual std::vector<audit_entry> audit(std::string_view key) = 0;
    /// Every audit row, ordered by key then sequence (for `idem verify`).
    virtual void scan_audit(const std::function<void(const audit_entry&)>& fn) = 0;
    /// Runs fn so that every read it makes of this store (load, scan_audit, get, audit) sees one
    /// snapshot: what another writer commits meanwhile is invisible to all of them, so the audit
    /// trail and the records read in fn agree with each other (`idem verify` on a live store).
    /// fn must not write. Exceptions of fn (and of the store) reach the caller. A store read by
    /// one thread with no other writer needs nothing, which is this default: it runs fn.
    virtual void snapshot_read(const std::function<void()>& fn) { fn(); }
    /// Sync mode calls this at start; throws idem::error(invalid_argument) with the reason when the
    /// store cannot make a commit durable (PostgreSQL with fsync=off or synchronous_commit=off).
    virtual void check_sync_durability() {}
    /// Whether the store can hold `k` at all. The guard asks before it grants a claim and answers
    /// begin_status::invalid_key when it cannot, so a key the store would refuse never reaches the
    /// flush queue. On refusal fills *why (if given) with the key and the rule. Must not block,
    /// allocate (unless why is given) or throw: it runs on the hot path. Default: every valid key.
    [[nodiscard]] virtual bool accepts(const key& k, std::string* why = nullptr) const noexcept {
        (void)k;
        (void)why;
        return true;
    }
    /// Removes records past the idempotency window and audit rows past the audit window, at most
    /// limits.max_rows of each, in one short transaction, and moves the stored horizon. PROCESSING
    /// records are never removed. Which expired rows a bounded call takes first is the store's
    /// (memory_store and the SQL stores: records oldest updated_time first, audit rows oldest
    /// sequence first; RocksDB: key order). Audit rows may stop at the first row, in sequence order,
    /// that is not older than the bound (rows are appended in time order, give or take a batch):
    /// nothing is removed early, a row written out of order a batch late. The horizon moves forward
    /// only, to the bounds applied, persisted with the deletions; max_fence() keeps counting the
    /// fences of removed records. Called by the flusher between batches (one thread at a time, as
    /// every store call). Default: removes nothing (a store that cannot prune).
    virtual prune_result prune(const prune_limits& limits) {
        (void)limits;
        return {};
    }
    /// What prune has removed so far (see prune_horizon); read from the store, so it survives a
    /// restart. Default: never pruned.
    [[nodiscard]] virtual prune_horizon horizon() { return {}; }
    /// A second connection to the same data that reads (get) while this one writes, so a read
    /// never waits for a batch in flight (the durable guard's recalls); nullptr when the store
    /// cannot be opened twice (memory, RocksDB: one opener), and reads then go between batches.
    [[nodiscard]] virtual std::unique_ptr<store> open_reader() { return nullptr; }
    /// Reconnects after store_unavailable (no-op for embedded stores).
    virtual void reconnect() {}
    [[nodiscard]] virtual std::string name() const = 0;
    /// The largest fencing_token in the store (0 when empty): new fences start above it.
    [[nodiscard]] virtual std::uint64_t max_fence() = 0;
    /// The node identity written into the audit trail's `node` column (default: HOST:PID:RRRRRR,
    /// detail/node_identity.hpp).
    void set_node(std::string node) { node_ = std::move(node); }
    [[nodiscard]] const std::string& node() const noexcept { return node_; }

protected:
    std::string node_ = detail::default_node();
};

}  // namespace idem

// memory_store, the reference store, lives in idem/stores/memory_store.hpp; included here so that
// code which found it in this header still does.
#include "idem/stores/memory_store.hpp"  // IWYU pragma: export
