// idem/detail/global/batch_context.hpp: what the batchers of one global guard share: the options
// (checked here, before anything connects), this process's node identity, the store's name for
// messages, the counters and the last store error, batch ids, and the resolution of a batch whose
// commit went unanswered. The batchers
// are claim_batcher.hpp, completion_batcher.hpp and compensator.hpp; coordinator.hpp owns one
// batch_context and hands it to each.
//
// Unknown commits. Every batch statement inserts a random 64-bit batch id (next_batch_id, one per
// attempt). When its commit goes unanswered the batcher asks the store whether that id committed
// (resolve_batch: a speculative insert that waits for the old session if it is still running;
// sql.hpp has why that wait is exact). Not committed: the batch runs again. Committed: the claims
// it won are the keys whose claim audit row names the batch id (claim_batcher.hpp); a completion it
// won left this node's audit row with the same fence, status and detail (completion_batcher.hpp).
//
// Invariants: an option out of range is refused (invalid_argument naming the option and its rule)
// when the context is built, which is before the first connection to the store is attempted; a batch
// id is positive and never 0; an unanswered commit is resolved by its batch id, never by running the
// batch blindly again.
//
// Thread-safety: every member may be called from any thread (batch ids and the last error are under
// their own mutexes; the counters are relaxed atomics). Progress: blocking only in resolve_batch
// (round trips, bounded by call_deadline each, and the batcher's back-off).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include <unistd.h>

#include "idem/detail/assert.hpp"
#include "idem/detail/global/request_queue.hpp"
#include "idem/detail/global/arbiter.hpp"
#include "idem/detail/my/uri.hpp"
#include "idem/detail/pg/sql.hpp"
#include "idem/detail/node_identity.hpp"
#include "idem/error.hpp"
#include "idem/global_options.hpp"
#include "idem/options.hpp"

namespace idem::detail::global {

/// The store traffic of one global guard (global_stats without the local table's counters). Relaxed:
/// statistics, read by snapshot() from any thread.
struct traffic_counters {
    std::atomic<std::uint64_t> claims_sent{0}, claims_won{0}, claims_lost{0}, superseded{0}, claim_batches{0},
        completions{0}, stale_completions{0}, completion_batches{0}, compensated{0}, doubt_marks{0}, withdrawn{0},
        commits_in_doubt{0}, store_errors{0}, timeouts{0}, pruned_records{0}, pruned_audit_rows{0};
};

class batch_context {
public:
    /// Checks the options (throws idem::error, invalid_argument) before anything else of the guard
    /// exists: no connection is attempted for options that can never work.
    batch_context(const std::string& uri, options o, global_options g)
        : opts(std::move(o)),
          go(checked(opts, std::move(g))),
          node(node_of(go)),
          name(is_mysql_uri(uri) ? my::redact(uri) : pg::redact(uri)) {
        // Refused here, before any connection: ordered versions need PostgreSQL's single-statement claim.
        if (opts.ordered_versions && is_mysql_uri(uri))
            throw error(errc::invalid_argument,
                        "global guard " + name +
                            ": options.ordered_versions needs a PostgreSQL arbiter; on MySQL / MariaDB a claim "
                            "batch cannot check and raise a pair's version in its own statement (docs/scaling.md)");
        if (go.require_synchronous_standby && is_mysql_uri(uri))
            throw error(errc::invalid_argument, "global guard " + name +
                                                    ": global_options.require_synchronous_standby checks PostgreSQL's "
                                                    "synchronous_standby_names; it has no MySQL / MariaDB counterpart here");
        rng_.seed(std::random_device{}() ^ static_cast<std::uint64_t>(::getpid()) << 32);
    }
    batch_context(const batch_context&) = delete;
    batch_context& operator=(const batch_context&) = delete;

    /// The rules of scope::global's options, each refusal naming the option and its rule. Throws
    /// idem::error (invalid_argument). The local table checks the rest of `o` (options.capacity, ...)
    /// when it is built, which is also before the first connection (coordinator.hpp's member order).
    static void check_options(const options& o, const global_options& g) {
        using std::chrono::milliseconds;
        const auto ms = [](auto d) { return std::to_string(std::chrono::duration_cast<milliseconds>(d).count()) + " ms"; };
        const auto refuse = [](const std::string& why) { throw error(errc::invalid_argument, why); };
        const std::string never_pruned = "; it must be positive (idem::forever: never pruned)";
        if (g.call_deadline <= milliseconds::zero())
            refuse("global_options.call_deadline is " + ms(g.call_deadline) + "; it must be positive");
        if (g.wait_timeout <= milliseconds::zero())
            refuse("global_options.wait_timeout is " + ms(g.wait_timeout) + "; it must be positive");
        if (g.max_batch == 0) refuse("global_options.max_batch is 0; it must be at least 1");
        if (g.claim_connections == 0) refuse("global_options.claim_connections is 0; it must be at least 1");
        if (g.completion_connections == 0) refuse("global_options.completion_connections is 0; it must be at least 1");
        if (g.batch_beside == 0) refuse("global_options.batch_beside is 0; it must be at least 1");
        if (g.window.count() <= 0) refuse("global_options.window is " + ms(g.window) + never_pruned);
        if (g.audit_window.count() <= 0) refuse("global_options.audit_window is " + ms(g.audit_window) + never_pruned);
        if (g.window != forever && o.retention > g.window)
            refuse("options.retention (" + ms(o.retention) + ") is longer than global_options.window (" + ms(g.window) +
                   "): the local table would remember keys the store forgets");
        if (o.lease < milliseconds(1))
            refuse("options.lease is " +
                   std::to_string(std::chrono::duration_cast<std::chrono::nanoseconds>(o.lease).count()) +
                   " ns; it must be at least 1 ms in scope::global (store leases are in ms)");
    }

    /// `g`, once check_options(o, g) passed.
    static global_options checked(const options& o, global_options g) {
        check_options(o, g);
        return g;
    }
    /// go.node, or the default identity; cut to the 64 characters of the audit trail's node column.
    static std::string node_of(const global_options& g) {
        return std::string(pg::utf8_truncate(g.node.empty() ? detail::default_node() : g.node, 64));
    }

    static void count(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
        c.fetch_add(n, std::memory_order_relaxed);  // relaxed: a statistic
    }

    /// A failed store call: counted, and its text kept for messages (last_error()).
    void note_error(const std::string& what) {
        count(n.store_errors);
        std::lock_guard lk(err_m_);
        last_error_ = what;
    }
    [[nodiscard]] std::string last_error() const {
        std::lock_guard lk(err_m_);
        return last_error_;
    }

    /// A fresh batch id for one attempt of a batch statement: positive, never 0.
    std::int64_t next_batch_id() {
        std::lock_guard lk(rng_m_);
        return static_cast<std::int64_t>(rng_() >> 1) | 1;
    }

    /// The batch with this id committed? Asked until the store answers, or until `q`'s batcher stops
    /// (nullopt; also for a store that refuses the question). Without a queue (compensation) the
    /// question is given up once the back-off reached max_backoff: the next pass asks again.
    template <class Req>
    std::optional<bool> resolve_batch(global_session& db, std::int64_t batch_id, request_queue<Req>* q) {
        IDEM_ASSERT(batch_id > 0, "a batch id is positive (next_batch_id)");
        std::chrono::milliseconds pause{1};
        for (;;) {
            bool committed = false;
            const auto r = db.batch_committed(batch_id, committed);
            if (r == global_session::result::ok) return committed;
            note_error(db.last_error());
            if (r == global_session::result::fatal) return std::nullopt;
            if (q == nullptr) {
                if (pause >= go.max_backoff) return std::nullopt;  // compensation: next pass
                std::this_thread::sleep_for(pause);
                pause = std::min(go.max_backoff, pause * 2);
            } else if (!q->backoff(pause, go.max_backoff)) {
                return std::nullopt;
            }
        }
    }

    const options opts;
    const global_options go;
    const std::string node;  ///< this process in the audit trail (go.node, or the default), at most 64 characters
    const std::string name;  ///< the store in messages: its URI without the password (pg::redact, my::redact)
    traffic_counters n;

private:
    mutable std::mutex err_m_;
    std::string last_error_;
    std::mutex rng_m_;  // batch ids are drawn by every batcher thread
    std::mt19937_64 rng_;
};

}  // namespace idem::detail::global
