// idem/detail/global/arbiter.hpp: what scope::global asks of the database that decides its claims
// (the arbiter), one connection at a time: the statements of a claim batch, a completion batch, a
// lease renewal, a compensation scan, and the question whether an unanswered batch committed.
//
// Two arbiters implement it: PostgreSQL (pg_session.hpp, the SQL of sql.hpp) and MySQL / MariaDB
// (my_session.hpp, the SQL of my_sql.hpp). The batchers (claim_batcher.hpp, completion_batcher.hpp,
// compensator.hpp) are written once against this interface; open_session() picks the arbiter by
// the URI's scheme. docs/scaling.md gives each arbiter's argument that a claim is decided once.
//
// Every call returns what happened instead of throwing, because its callers loop on it:
//
//   ok           the call ran to its end (a write committed)
//   transient    nothing committed, try again: connection refused or lost, deadline, server
//                shutting down or starting, serialization failure, deadlock victim, lock wait
//   in_doubt     the connection broke while a commit was in flight: the batch may have committed;
//                the caller resolves it with batch_committed(batch id), never by a blind retry
//   fatal        the server refused the statement for another reason (a bug, a schema problem)
//
// What every arbiter guarantees (the batchers rely on it):
//   * A claim batch, a completion batch and a compensation batch each commit atomically with a row
//     of its batch id in idempotent_batch, and batch_committed(id) answers exactly whether that
//     happened, including for a batch whose session is still running on the server when it is asked
//     (the arbiter waits for that session or ends it first).
//   * A claim is granted to one batch only: a new row by the primary key, a RELEASED row under its
//     row lock. A won claim has its fence (1 above the largest fence a prune removed for a new row,
//     the row's fence + 1 for a RELEASED one) and one audit row "claim outcome=0 batch=<id>".
//   * A completion, compensation or renewal changes a row only while it is PROCESSING with the
//     caller's fence (compensation: and its lease has expired, on the server's clock), under the
//     row's lock, taken in key order; each changed row gets one audit row (not for renewals).
//   * Times (leases, created, updated, audit) are the server's clock, in Unix milliseconds.
//
// Thread-safety: one thread at a time per session. Progress: blocking; each call bounded by the
// session's call deadline (plus the connect timeout while connecting) on PostgreSQL, where a
// watchdog cancels the call. On MariaDB the deadline bounds each statement and each wait for the
// server (lock waits, max_statement_time, the connector's read timeout), not the call: a batch
// whose statements meet several lock waits can take a few deadlines. Callers
// are bounded by global_options::wait_timeout either way.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "idem/status.hpp"

namespace idem::detail::global {

/// Whether `uri` names a MySQL or MariaDB server (mysql:// or mariadb://); anything else is
/// PostgreSQL's (a URI or a libpq key=value string).
[[nodiscard]] inline bool is_mysql_uri(std::string_view uri) noexcept {
    return uri.starts_with("mysql://") || uri.starts_with("mariadb://");
}

class global_session {
public:
    enum class result { ok, transient, in_doubt, fatal };

    /// One key of a claim batch (its biz_type is derived from it: biz_type_of). `pair` and `version`:
    /// the ordered-versions pair ("" and 0 for a key that does not split, and when ordered versions
    /// are off).
    struct claim_item {
        std::string_view k;
        std::uint64_t fp = 0;
        std::string_view pair{};
        std::uint64_t version = 0;
    };
    /// The claims a batch won: key -> (fence, the state it was claimed from: absent or released).
    using won_map = std::unordered_map<std::string, std::pair<std::uint64_t, record_state>>;
    /// A key's row as a claim batch's loser read it.
    struct row_read {
        record_state state;
        std::uint64_t fence, outcome, fp;
        bool expired;  ///< the lease has passed (server clock)
        std::string payload;
    };
    using row_map = std::unordered_map<std::string, row_read>;
    /// One fenced write of a completion or compensation batch (status: status_text of the target;
    /// PROCESSING for a doubt mark, an audited no-op).
    struct write_item {
        std::string_view k;
        std::uint64_t fence;
        std::string_view status;
        std::uint64_t outcome;
        std::string detail;  ///< the audit row's detail
        std::string_view payload;
    };
    struct extend_item {
        std::string_view k;
        std::uint64_t fence;
        std::int64_t ms;  ///< the new lease, from the server's now
    };
    struct expired_row {
        std::string k;
        std::uint64_t fence, fp;
    };
    using key_set = std::unordered_set<std::string>;

    global_session() = default;
    global_session(const global_session&) = delete;
    global_session& operator=(const global_session&) = delete;
    virtual ~global_session() = default;

    /// Claim batch (keys sorted, each once): `won` gets the claims it won. ordered: items carry their
    /// pairs, and a claim is granted only when its version is not below its pair's newest.
    virtual result claim(std::int64_t batch_id, std::span<const claim_item> items, std::int64_t lease_ms,
                         const std::string& node, bool ordered, won_map& won) = 0;
    /// After an unanswered claim batch committed: which of `keys` it won (their claim audit rows
    /// carry `detail`, written by `node`).
    virtual result claimed_by_us(std::span<const std::string_view> keys, const std::string& detail, const std::string& node,
                                 won_map& won) = 0;
    /// The rows of `keys` as committed now (a fresh snapshot); a key without a row is absent from
    /// `rows`. ordered (pairs.size() == keys.size()): `newest` gets each key's pair's newest version
    /// (0: none), read in the same snapshot.
    virtual result read_rows(std::span<const std::string_view> keys, std::span<const std::string_view> pairs, row_map& rows,
                             std::unordered_map<std::string, std::uint64_t>* newest) = 0;
    /// Completion or compensation batch (keys sorted, each once): `won` gets the keys whose fenced
    /// write won.
    virtual result complete(std::int64_t batch_id, std::span<const write_item> items, const std::string& node,
                            bool compensation, key_set& won) = 0;
    /// Which of `items` this node won before (their audit row exists: an attempt whose answer was lost).
    virtual result completed_before(std::span<const write_item> items, const std::string& node, key_set& before) = 0;
    /// Lease renewals (keys sorted, each once); `renewed` gets the keys renewed. No audit row.
    virtual result extend(std::span<const extend_item> items, key_set& renewed) = 0;
    /// Expired claims, oldest lease first, at most `limit`.
    virtual result expired(std::size_t limit, std::vector<expired_row>& rows) = 0;
    /// Whether the batch `batch_id` committed (exact: see the header).
    virtual result batch_committed(std::int64_t batch_id, bool& committed) = 0;
    /// What scope::global adds to the store's schema (the index of expired claims; the version
    /// table with ordered versions). Idempotent; safe when several openers race.
    virtual result prepare(bool ordered) = 0;

    [[nodiscard]] const std::string& last_error() const noexcept { return last_error_; }
    /// The session reconnects at its next call.
    virtual void drop() = 0;

protected:
    std::string last_error_;
};

}  // namespace idem::detail::global
