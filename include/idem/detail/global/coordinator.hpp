// idem/detail/global/coordinator.hpp: what idem::global_guard (scope::global) calls: the local
// table (an idem::guard without a sink) used as a cache in front of PostgreSQL, and the batcher
// threads that ask PostgreSQL: the claim batcher (claim_batcher.hpp), the completion batcher
// (completion_batcher.hpp), and the maintenance thread that runs the compensator (compensator.hpp),
// the local table's recycling and the prune. The public options and counters are
// idem/global_options.hpp; the SQL is sql.hpp; one bounded connection is session.hpp.
//
// The name: a coordinator does not decide anything itself. The shared PostgreSQL's primary key on
// idempotent_record decides every claim; the coordinator routes each call to the part that answers
// it (the local table when it knows, a batcher otherwise), owns those parts and their connections,
// and starts and stops them in an order that keeps each one's hand-offs valid.
//
// Invariant: the local table only caches what the store committed, or what this process is asking
// it right now.
//   * begin(k) first asks the local table (lock-free). A terminal record there is final (SUCCESS and
//     FAILED rows are never changed again by anyone), so a duplicate of a key this process already
//     knows is answered without a round trip. A live local claim means another thread of this
//     process is executing k, or is asking the store about k right now: in_progress.
//   * Otherwise the local claim just taken is this process's single in-flight question about k, and
//     the claim goes to the claim batcher; the caller blocks until its batch commits (group commit).
//   * The local record becomes SUCCEEDED or FAILED only after the store committed that (a won
//     completion, or a claim that lost to such a row); anything else releases it locally, so the
//     next begin asks the store (local_options() says how the table is configured for that).
//
// Order of the parts (the members' declaration order): the options are checked first (batch_context),
// before anything connects; the local table outlives the batchers (queued completions hold its
// tickets); the completion batcher outlives the claim batcher (which queues withdrawals into it) and
// the compensator (which writes through it). Closing stops the maintenance thread, then the claim
// batcher (claims still queued answer store_unavailable), then the completion batcher (which drains
// for up to wait_timeout).
//
// Thread-safety: every public member may be called from any thread. Progress: answers from the
// local table are lock-free; anything that reaches the store blocks (a mutex and a condition
// variable per batcher, and the round trip), bounded by wait_timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "idem/detail/global/batch_context.hpp"
#include "idem/detail/global/claim_batcher.hpp"
#include "idem/detail/global/compensator.hpp"
#include "idem/detail/global/completion_batcher.hpp"
#include "idem/detail/global/open_session.hpp"
#include "idem/detail/pg/sql.hpp"
#include "idem/global_options.hpp"
#include "idem/guard.hpp"

namespace idem::detail::global {

class coordinator {
public:
    /// Checks the options (invalid_argument, before any connection), builds the local table, opens
    /// the store (creates or checks the schema), refuses a server that may lose a commit, creates the
    /// partial index, then starts the batchers and the maintenance thread.
    coordinator(std::string uri, options opts, global_options go)
        : ctx_(uri, std::move(opts), std::move(go)),
          local_(local_options(ctx_.opts)),
          store_(open_store(uri, ctx_.name, ctx_.go.call_deadline)),  // creates or checks the schema
          compensation_db_(open_session(uri, ctx_.name, ctx_.go.call_deadline, "idem-global-compensation",
                                        ctx_.go.require_synchronous_standby)) {
        // Every answer of scope::global rests on a commit: refuse a server that may lose one
        // (PostgreSQL: fsync=off, synchronous_commit=off; MySQL: innodb_flush_log_at_trx_commit or
        // sync_binlog other than 1). Sessions re-check on every reconnect (pg_session.hpp,
        // my_session.hpp).
        store_.require_durability();
        // And, when asked, one on which a failover can lose one (no synchronous standby).
        if (ctx_.go.require_synchronous_standby) {
            IDEM_ASSERT(store_.require_standby != nullptr, "batch_context refuses the option for arbiters without it");
            store_.require_standby();
        }
        store_.st->set_node(ctx_.node);
        create_index();
        completions_.emplace(ctx_, uri);
        claims_.emplace(ctx_, *completions_, uri);
        compensator_.emplace(ctx_, *completions_, *compensation_db_, local_);
        if (ctx_.opts.maintenance_interval > std::chrono::nanoseconds::zero())
            maintenance_thread_ = std::thread([this] { maintenance_loop(); });
    }

    /// Stops the maintenance thread here; the batchers stop as members, claims before completions
    /// (the header says why).
    ~coordinator() {
        {
            std::lock_guard lk(maintenance_m_);
            maintenance_stop_ = true;
        }
        maintenance_cv_.notify_all();
        if (maintenance_thread_.joinable()) maintenance_thread_.join();
    }
    coordinator(const coordinator&) = delete;
    coordinator& operator=(const coordinator&) = delete;

    /// Whether scope::global can hold `k` at all: not the placeholder key{}, and valid UTF-8 (the
    /// store's rule, postgres_store::accepts_key: keys are PostgreSQL text). global_guard::begin()
    /// answers any other key invalid_key before it touches the local table, a batch or the store: the
    /// key can never be claimed, so an answer a caller would retry (store_unavailable) would be a lie,
    /// and a key the statement cannot bind would fail every other claim of its batch. Wait-free.
    [[nodiscard]] static bool accepts(const key& k) noexcept { return !k.empty() && pg::valid_utf8(k.view()); }
    /// Why accepts(k) is false: the rule the key breaks (for messages).
    [[nodiscard]] static std::string refusal(const key& k) {
        return k.empty() ? "is the empty placeholder key{} (a key has 1 to 128 bytes)"
                         : "is not valid UTF-8; scope::global keeps keys as text (PostgreSQL text cannot hold it, and every "
                           "arbiter keeps the same rule, so a key space can move between them)";
    }

    /// The store's half of global_guard::begin(), which refused keys accepts() refuses and asked the
    /// local table first (a known key costs what it costs in process scope; answered_locally is
    /// derived from the table's own striped counters, no shared counter on that path): `lr` holds
    /// the local claim on k (this process's one question about k in flight).
    claim_answer claim(const key& k, std::uint64_t fp, begin_result&& lr) noexcept {
        return claims_->claim(k, fp, std::move(lr));
    }

    /// Records `to` for the claim (k, fence) once the store committed it (completion_batcher::complete).
    std::error_code complete(const key& k, std::uint64_t fence, record_state to, std::uint64_t outcome,
                             transition_cause cause, ticket&& local, std::string_view payload = {}) noexcept {
        return completions_->complete(k, fence, to, outcome, cause, std::move(local), payload);
    }

    /// Renews the lease of (k, fence) to now + by (server clock).
    std::error_code extend(const key& k, std::uint64_t fence, std::chrono::nanoseconds by) noexcept {
        return completions_->extend(k, fence, by);
    }

    /// One compensation pass now (compensator::compensate).
    std::size_t compensate() { return compensator_->compensate(); }

    // ---- reading --------------------------------------------------------------------------------

    [[nodiscard]] record_view query(const key& k) const noexcept { return local_.query(k); }

    /// The key's row in the store (a round trip; serialised with other reads of this guard).
    std::optional<stored_record> lookup(std::string_view k) {
        std::lock_guard lk(store_m_);
        return store_.st->get(k);
    }
    std::vector<audit_entry> audit(std::string_view k) {
        std::lock_guard lk(store_m_);
        return store_.st->audit(k);
    }

    /// Removes records past go.window and audit rows past go.audit_window, in calls of at most
    /// `max_rows` rows each, until none is left (each call one short transaction; reads of other
    /// threads wait at most one call). Returns what was removed. The bounds are taken on the
    /// server's clock, the one every row's times are stamped with: a node whose clock runs ahead
    /// must not prune a record still inside the window (its key would run again).
    prune_result prune(std::size_t max_rows = 10'000) {
        const global_options& go = ctx_.go;
        prune_result total;
        if (go.window == forever && go.audit_window == forever) return total;
        std::int64_t now = 0;
        {
            std::lock_guard lk(store_m_);
            now = store_.server_now_ms();
        }
        prune_limits limits;
        if (go.window != forever) limits.records_before_ms = now - go.window.count();
        if (go.audit_window != forever) limits.audit_before_ms = now - go.audit_window.count();
        limits.max_rows = max_rows;
        for (;;) {
            prune_result r;
            {
                std::lock_guard lk(store_m_);
                r = store_.st->prune(limits);
            }
            total.records += r.records;
            total.audit_rows += r.audit_rows;
            batch_context::count(ctx_.n.pruned_records, r.records);
            batch_context::count(ctx_.n.pruned_audit_rows, r.audit_rows);
            if (!r.more) return total;
        }
    }

    [[nodiscard]] global_stats snapshot() const noexcept {
        global_stats s;
        s.local = local_.snapshot();
        auto ld = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };  // statistics
        // Every local begin() that did not take a claim was answered by the table, and is counted
        // by exactly one of these.
        s.answered_locally = s.local.duplicates + s.local.in_progress_hits + s.local.payload_mismatches +
                             s.local.capacity_exhausted;
        const traffic_counters& n = ctx_.n;
        s.claims_sent = ld(n.claims_sent);
        s.claims_won = ld(n.claims_won);
        s.claims_lost = ld(n.claims_lost);
        s.claim_batches = ld(n.claim_batches);
        s.completions = ld(n.completions);
        s.stale_completions = ld(n.stale_completions);
        s.completion_batches = ld(n.completion_batches);
        s.compensated = ld(n.compensated);
        s.doubt_marks = ld(n.doubt_marks);
        s.withdrawn = ld(n.withdrawn);
        s.commits_in_doubt = ld(n.commits_in_doubt);
        s.store_errors = ld(n.store_errors);
        s.timeouts = ld(n.timeouts);
        s.pruned_records = ld(n.pruned_records);
        s.pruned_audit_rows = ld(n.pruned_audit_rows);
        s.superseded = ld(n.superseded);
        return s;
    }
    [[nodiscard]] std::string last_error() const { return ctx_.last_error(); }

    [[nodiscard]] const std::string& node() const noexcept { return ctx_.node; }
    [[nodiscard]] const options& opts() const noexcept { return ctx_.opts; }
    [[nodiscard]] const global_options& global_opts() const noexcept { return ctx_.go; }
    [[nodiscard]] const std::string& name() const noexcept { return ctx_.name; }
    guard& local() noexcept { return local_; }

private:
    static options local_options(options o) {
        // The local table never decides a lease: the store does. Its claims live until the caller
        // completes them (or the ticket is dropped), so the local table never compensates.
        // Nor does it decide an outcome: a local claim becomes SUCCEEDED or FAILED only after the
        // store committed that (completion_batcher::run_completions, or a claim that lost to such a
        // row). A local ticket dropped without that (a completion that could not be queued, a guard
        // closing with completions left) is released, never failed per on_failure: a FAILED the
        // store does not hold would be replayed to every duplicate. (global_ticket applies
        // on_failure through the store.)
        o.on_failure = failure_policy::retryable;
        o.lease = std::chrono::hours(24 * 365 * 50);
        o.adaptive.enabled = false;  // nor an adaptive one (options.adaptive is process scope only)
        o.resolve = nullptr;
        o.reclaim_expired = false;
        // Nor does it order versions: a local claim is only a question to the store, which may refuse
        // it (a higher version claimed on another node) or never answer; the store's version table
        // decides (claim_batcher::run_claims).
        o.ordered_versions = false;
        // Its own maintenance would scan the whole table for expired claims every interval (there
        // are none, by the line above): the coordinator's maintenance thread runs only its recycling.
        o.maintenance_interval = std::chrono::nanoseconds::zero();
        return o;
    }

    void create_index() {
        for (int attempt = 0;; ++attempt) {
            const auto r = compensation_db_->prepare(ctx_.opts.ordered_versions);
            if (r == global_session::result::ok) return;
            if (attempt == 3) throw error(errc::store_unavailable, "global guard: " + compensation_db_->last_error());
            std::this_thread::sleep_for(std::chrono::milliseconds(50 << attempt));  // a racing opener
        }
    }

    /// Every maintenance_interval: a compensation pass (with a resolver), then the local table's
    /// generation recycling (retention), then a prune when prune_interval has passed.
    void maintenance_loop() {
        std::unique_lock lk(maintenance_m_);
        while (!maintenance_stop_) {
            maintenance_cv_.wait_for(lk, ctx_.opts.maintenance_interval, [this] { return maintenance_stop_; });
            if (maintenance_stop_) break;
            lk.unlock();
            try {
                compensate();
                local_.collect();
                if (ctx_.go.prune_interval > std::chrono::milliseconds::zero() &&
                    std::chrono::steady_clock::now() >= next_prune_) {
                    next_prune_ = std::chrono::steady_clock::now() + ctx_.go.prune_interval;
                    (void)prune();
                }
            } catch (...) {
                // a pass that fails is retried on the next one
            }
            lk.lock();
        }
    }

    batch_context ctx_;  // first: the options are checked before any member below connects
    guard local_;
    arbiter_store store_;  // schema, and reads (lookup, audit, prune) under store_m_
    std::mutex store_m_;
    std::unique_ptr<global_session> compensation_db_;  // the index at open, then the compensator's connection
    // Built in the constructor's body, after the store passed its checks; destroyed in reverse:
    // the compensator, then the claim batcher, then the completion batcher.
    std::optional<completion_batcher> completions_;
    std::optional<claim_batcher> claims_;
    std::optional<compensator> compensator_;
    std::mutex maintenance_m_;
    std::condition_variable maintenance_cv_;
    bool maintenance_stop_ = false;
    std::chrono::steady_clock::time_point next_prune_{};  // the maintenance thread only
    std::thread maintenance_thread_;
};

}  // namespace idem::detail::global
