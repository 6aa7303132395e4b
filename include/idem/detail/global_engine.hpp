// idem/detail/global_engine.hpp: the protocols behind idem::global_guard (scope::global): claim,
// completion and compensation. The queues their batcher threads take requests from are
// detail/request_queue.hpp; the public options and counters are idem/global_options.hpp.
//
// Design
// ------
// The shared PostgreSQL's primary key on idempotent_record decides every claim; this process's
// in-memory table (an idem::guard without a sink, the "local table") is a cache in front of it:
//
//   * begin(k) first asks the local table (lock-free). A terminal record there is final (SUCCESS and
//     FAILED rows are never changed again by anyone), so a duplicate of a key this process already
//     knows is answered without a round trip. A live local claim means another thread of this
//     process is executing k, or is asking the store about k right now: in_progress.
//   * Otherwise the local claim just taken is this process's single in-flight question about k
//     (so one batch never holds a key twice from one process), and the claim goes to the store:
//     queued for the claim batcher, the caller blocks until its batch commits (group commit).
//   * Claim batch = one autocommit statement (its own READ COMMITTED transaction, one round trip
//     including the commit): the batch id row, INSERT ... ON CONFLICT DO NOTHING RETURNING for new
//     keys plus UPDATE ... WHERE status = 'RELEASED' RETURNING (fence + 1) for released ones, and
//     the winners' audit rows (detail/global_sql.hpp); then, only when some key lost, one SELECT of
//     the losers' rows (a fresh snapshot, which sees the winners that made ours conflict). A winner
//     gets a global ticket holding the store's fence and the local claim (so local duplicates keep
//     seeing in_progress without a round trip). A loser's local claim becomes the cached answer:
//     SUCCESS / FAILED are recorded locally (replayed from then on), anything else is released
//     locally (the next begin asks the store again).
//   * Completion batch (completion batcher threads, each with its own connection): one autocommit
//     UPDATE ... FROM unnest(...) WHERE key AND fencing_token AND status = 'PROCESSING' RETURNING
//     key, audit rows in the same statement. A key returned won; any other is stale (unless this
//     node's own earlier attempt of the same completion committed, which the audit trail shows).
//     The local record follows the store's answer, and only once the store committed it: durable
//     before visible. Until then the local claim stays live, so this process's duplicates see
//     in_progress (also after the owner was told store_unavailable: the completion stays queued);
//     a completion the store refused or never received leaves the claim released locally (the
//     next begin asks the store), never SUCCEEDED or FAILED. Compensation never writes the local
//     table: a duplicate learns its result from the store, after it committed.
//   * Response payloads: a success's bytes go in the completion's fenced UPDATE (hex text[] ->
//     BYTEA, as postgres_store writes them) and come back in the loser read; the local table
//     caches a terminal record with its payload, or, when it cannot keep the payload (its payload
//     budget spent), not at all (released locally: the next begin asks the store). A claim resets
//     the payload, so bytes never outlive the claim that recorded them.
//   * Compensation (the maintenance thread, own connection; only with a resolver): SELECT expired
//     PROCESSING rows (a partial index), skip those this process holds a live local claim on, ask
//     the resolver, then one fenced UPDATE batch that also re-checks the lease under the row lock.
//     Two nodes compensating the same claim: the second one's UPDATE waits for the first's row lock,
//     then finds status != PROCESSING and returns no row. Exactly one resolution, one audit row.
//   * Ordered versions (options.ordered_versions): the claim batch is gsql::claim_ordered, which
//     checks and raises each pair's row of idempotent_version under its row lock in the claim's own
//     statement (global_sql.hpp has the argument). run_claims sends one key per pair, the batch's
//     highest version; the others and the refused keys are losers, and the loser read (with each
//     pair's version, one snapshot) answers superseded for a loser without a live or decided record
//     whose pair is higher. The local table does not order versions: the store decides each claim.
//
// Unknown commits. Every batch statement inserts a random 64-bit batch id. When its commit goes
// unanswered the batcher asks the store whether that id committed (a speculative insert that waits
// for the old session if it is still running). Not committed: the batch runs again. Committed: the
// claims it won are the keys whose claim audit row names the batch id (their RETURNING rows died
// with the connection); a completion it won left this node's audit row with the same fence, status
// and detail, which is also how a completion retried after store_unavailable recognises its own
// earlier success (a claim is held by one process, so (key, fence) names it). Nothing is ever
// retried blindly.
//
// Callers give up after global_options::wait_timeout. A claim whose caller gave up is withdrawn: if
// its batch later turns out to have won it, the batcher releases it in the store (audited
// "not_durable"), so nobody executes it and nobody waits for its lease. A completion whose caller gave
// up stays queued and owns the local claim until the store takes it (the effect happened: its
// success must be recorded), like sync mode of the durable guard.
//
// Thread-safety: every public member of global_engine may be called from any thread. Progress:
// answers from the local table are lock-free; anything that reaches the store blocks (a mutex and a
// condition variable per batcher, and the round trip), bounded by wait_timeout.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <unistd.h>

#include "idem/detail/global_session.hpp"
#include "idem/detail/request_queue.hpp"
#include "idem/detail/global_sql.hpp"
#include "idem/global_options.hpp"
#include "idem/guard.hpp"
#include "idem/postgres_store.hpp"

namespace idem {

namespace detail {

/// One claim on its way through the claim batcher. Fields below `st` are written by the batcher and
/// read by the caller after it saw st == done under the batcher's mutex.
struct global_claim {
    enum class phase : std::uint8_t { queued, sent, done, abandoned };
    enum class verdict : std::uint8_t { won, lost, superseded, error };
    key k;
    std::uint64_t fp = 0;
    phase st = phase::queued;
    verdict v = verdict::error;
    int retries = 0;
    std::uint64_t fence = 0;  ///< won: the claim's fence; lost: the row's fence
    record_state row_state = record_state::absent;
    std::uint64_t outcome = 0;  ///< lost: the row's outcome; superseded: the pair's newest version
    std::uint64_t row_fp = 0;
    bool expired = false;
    std::string payload;  ///< lost: the row's response payload (bytes; empty for none)
};

/// One completion, release or lease renewal on its way through the completion batcher.
struct global_completion {
    enum class phase : std::uint8_t { queued, sent, done };
    enum class verdict : std::uint8_t { won, stale, error };
    key k;
    std::uint64_t fence = 0;
    record_state to = record_state::succeeded;
    std::uint64_t outcome = 0;
    std::string payload;  ///< a success's response payload (bytes), written with the state
    transition_cause cause = transition_cause::succeed;
    std::chrono::milliseconds extend_by{0};  ///< > 0: a lease renewal, not a transition
    ticket local;                            ///< the local claim, finalised by the batcher (empty for renewals)
    phase st = phase::queued;
    verdict v = verdict::error;
};

class global_engine {
public:
    global_engine(std::string uri, options opts, global_options go)
        : opts_(std::move(opts)),
          go_(std::move(go)),
          local_(local_options(opts_)),
          store_(uri, go_.call_deadline),  // creates or checks the schema
          name_(pg::redact(uri)),
          compensation_db_(uri, name_, go_.call_deadline, "idem-global-compensation") {
        if (go_.call_deadline <= std::chrono::milliseconds::zero() || go_.wait_timeout <= std::chrono::milliseconds::zero())
            throw error(errc::invalid_argument, "global_options: call_deadline and wait_timeout must be positive");
        if (go_.max_batch == 0) throw error(errc::invalid_argument, "global_options: max_batch must be at least 1");
        if (go_.window.count() <= 0 || go_.audit_window.count() <= 0)
            throw error(errc::invalid_argument, "global_options: window and audit_window must be positive (idem::forever: never pruned)");
        if (go_.window != forever && opts_.retention > go_.window)
            throw error(errc::invalid_argument,
                        "options.retention (" +
                            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(opts_.retention).count()) +
                            " ms) is longer than global_options.window (" + std::to_string(go_.window.count()) +
                            " ms): the local table would remember keys the store forgets");
        if (opts_.lease < std::chrono::milliseconds(1))
            throw error(errc::invalid_argument, "options.lease must be at least 1 ms in scope::global (store leases are in ms)");
        // Every answer of scope::global rests on a commit: refuse a server that may lose one
        // (fsync=off, synchronous_commit=off). Sessions pin synchronous_commit and re-check fsync on
        // every reconnect (global_session.hpp).
        store_.require_durability("");
        node_ = go_.node.empty() ? detail::default_node() : go_.node;
        node_ = std::string(pg::utf8_truncate(node_, 64));
        store_.set_node(node_);
        create_index();
        rng_.seed(std::random_device{}() ^ static_cast<std::uint64_t>(::getpid()) << 32);
        if (go_.claim_connections == 0 || go_.completion_connections == 0)
            throw error(errc::invalid_argument, "global_options: claim_connections and completion_connections must be at least 1");
        for (std::size_t i = 0; i < go_.claim_connections; ++i)
            claim_dbs_.push_back(std::make_unique<global_session>(uri, name_, go_.call_deadline, "idem-global-claims",
                                                                  opts_.ordered_versions));
        for (std::size_t i = 0; i < go_.completion_connections; ++i)
            completion_dbs_.push_back(std::make_unique<global_session>(uri, name_, go_.call_deadline, "idem-global-completions"));
        for (auto& db : claim_dbs_) claim_threads_.emplace_back([this, d = db.get()] { claim_loop(*d); });
        for (auto& db : completion_dbs_) completion_threads_.emplace_back([this, d = db.get()] { completion_loop(*d); });
        if (opts_.maintenance_interval > std::chrono::nanoseconds::zero())
            maintenance_thread_ = std::thread([this] { maintenance_loop(); });
    }

    ~global_engine() {
        {
            std::lock_guard lk(comp_m_);
            comp_stop_ = true;
        }
        comp_cv_.notify_all();
        if (maintenance_thread_.joinable()) maintenance_thread_.join();
        claims_.stop();
        for (auto& t : claim_threads_) t.join();
        // Completions drain (a success whose caller gave up still belongs in the store) for up to
        // wait_timeout; what is left then is dropped: those claims expire and go to compensation.
        completions_.stop(std::chrono::steady_clock::now() + go_.wait_timeout);
        for (auto& t : completion_threads_) t.join();
    }
    global_engine(const global_engine&) = delete;
    global_engine& operator=(const global_engine&) = delete;

    // ---- claims ---------------------------------------------------------------------------------

    struct claim_answer {
        begin_status status;
        std::optional<ticket> local;  ///< acquired only (optional: an empty ticket zeroes a whole key)
        std::uint64_t fence = 0;
        std::uint64_t outcome = 0;
        std::string payload{};  ///< succeeded or failed: the record's response payload
    };

    /// Whether scope::global can hold `k` at all: not the placeholder key{}, and valid UTF-8 (the
    /// store's rule, postgres_store::accepts_key: keys are PostgreSQL text). global_guard::begin()
    /// answers any other key invalid_key before it touches the local table, a batch or the store: the
    /// key can never be claimed, so an answer a caller would retry (store_unavailable) would be a lie,
    /// and a key the statement cannot bind would fail every other claim of its batch. Wait-free.
    [[nodiscard]] static bool accepts(const key& k) noexcept {
        return !k.empty() && postgres_store::accepts_key(k.view());
    }
    /// Why accepts(k) is false: the rule the key breaks (for messages).
    [[nodiscard]] static std::string refusal(const key& k) {
        return k.empty() ? "is the empty placeholder key{} (a key has 1 to 128 bytes)"
                         : "is not valid UTF-8; scope::global keeps keys in PostgreSQL text, which cannot hold it";
    }

    /// The store's half of global_guard::begin(), which refused keys accepts() refuses and asked the
    /// local table first (a known key costs what it costs in process scope; answered_locally is
    /// derived from the table's own striped counters, no shared counter on that path): `lr` holds
    /// the local claim on k (this process's one question about k in flight).
    claim_answer claim(const key& k, std::uint64_t fp, begin_result&& lr) noexcept {
        std::shared_ptr<global_claim> c;
        try {
            c = std::make_shared<global_claim>();
        } catch (...) {
            (void)lr.ticket.fail(0, failure_policy::retryable);
            return {begin_status::store_unavailable, {}, 0, 0};
        }
        c->k = k;
        c->fp = fp;
        if (!claims_.submit(c)) {
            (void)lr.ticket.fail(0, failure_policy::retryable);
            return {begin_status::store_unavailable, {}, 0, 0};
        }
        {
            std::unique_lock lk(claims_.m);
            const auto until = std::chrono::steady_clock::now() + go_.wait_timeout;
            claims_.done.wait_until(lk, until, [&] { return c->st == global_claim::phase::done; });
            if (c->st != global_claim::phase::done) {
                c->st = global_claim::phase::abandoned;  // the batcher withdraws it if it wins
                lk.unlock();
                count(n_timeouts_);
                (void)lr.ticket.fail(0, failure_policy::retryable);
                return {begin_status::store_unavailable, {}, 0, 0};
            }
        }
        switch (c->v) {
            case global_claim::verdict::won: return {begin_status::acquired, std::move(lr.ticket), c->fence, 0};
            case global_claim::verdict::superseded:  // nothing claimed; the next begin asks the store again
                count(n_superseded_);
                (void)lr.ticket.fail(0, failure_policy::retryable);
                return {begin_status::superseded, {}, c->fence, c->outcome};
            case global_claim::verdict::error:
                (void)lr.ticket.fail(0, failure_policy::retryable);
                return {begin_status::store_unavailable, {}, 0, 0};
            case global_claim::verdict::lost: break;
        }
        if (fp != 0 && c->row_fp != 0 && fp != c->row_fp) {
            (void)lr.ticket.fail(0, failure_policy::retryable);
            return {begin_status::payload_mismatch, {}, c->fence, 0};
        }
        switch (c->row_state) {
            case record_state::succeeded:  // final: cache it, later duplicates never leave the process
                // With its payload; one the local table cannot keep (over max_payload, or its
                // payload budget spent) is not cached: the next begin asks the store again.
                (void)lr.ticket.succeed(c->outcome, c->payload);
                if (lr.ticket) (void)lr.ticket.fail(0, failure_policy::retryable);
                return {begin_status::succeeded, {}, c->fence, c->outcome, std::move(c->payload)};
            case record_state::failed:  // final too, with the error response it may carry
                (void)lr.ticket.fail(c->outcome, failure_policy::terminal, c->payload);
                if (lr.ticket) (void)lr.ticket.fail(0, failure_policy::retryable);
                return {begin_status::failed, {}, c->fence, c->outcome, std::move(c->payload)};
            default:  // PROCESSING elsewhere (or RELEASED again after our retries): ask again next time
                (void)lr.ticket.fail(0, failure_policy::retryable);
                return {c->expired ? begin_status::in_doubt : begin_status::in_progress, {}, c->fence, 0};
        }
    }

    // ---- completions ----------------------------------------------------------------------------

    /// Records `to` for the claim (k, fence), finalising `local` the same way once the store
    /// committed it (never before: a duplicate must not be told an outcome the store may not keep).
    /// Returns {} when the store took it, stale_ticket when the claim is no longer the record's,
    /// store_unavailable when the store did not answer within wait_timeout (the completion stays
    /// queued and owns the local claim until the store takes it) or when it could not be queued
    /// (no memory, or the guard is closing: `local` is released, the next begin asks the store).
    /// `payload` (a success's or a terminal failure's response; the caller checked it against
    /// options.max_payload) is
    /// copied before this returns and written by the same fenced UPDATE as the state.
    std::error_code complete(const key& k, std::uint64_t fence, record_state to, std::uint64_t outcome,
                             transition_cause cause, ticket&& local, std::string_view payload = {}) noexcept {
        std::string bytes;
        try {
            bytes.assign(payload);
        } catch (...) {  // out of memory: nothing is queued, nothing written
            (void)local.fail(0, failure_policy::retryable);
            return errc::store_unavailable;
        }
        const std::error_code ec = submit_completion(k, fence, [&](global_completion& r) {
            r.to = to;
            r.outcome = outcome;
            r.payload = std::move(bytes);
            r.cause = cause;
            r.local = std::move(local);
        });
        if (local) (void)local.fail(0, failure_policy::retryable);  // never queued: the store was told nothing
        return ec;
    }

    /// Renews the lease of (k, fence) to now + by (server clock).
    std::error_code extend(const key& k, std::uint64_t fence, std::chrono::nanoseconds by) noexcept {
        return submit_completion(k, fence, [&](global_completion& r) {
            r.extend_by = std::max(std::chrono::milliseconds(1), std::chrono::ceil<std::chrono::milliseconds>(by));
        });
    }

    // ---- compensation ---------------------------------------------------------------------------

    /// One compensation pass: expired claims (at most compensation_limit) go to the resolver, and its
    /// answers are written with fenced UPDATEs. Returns how many claims this node resolved (doubt
    /// marks not included). Without a resolver, does nothing.
    std::size_t compensate() {
        if (!opts_.resolve) return 0;
        std::lock_guard lk(comp_run_m_);
        struct expired_row {
            std::string k;
            std::uint64_t fence;
            std::uint64_t fp;
        };
        std::vector<expired_row> rows;
        auto r = compensation_db_.run("compensation scan", [&](pqxx::connection& c) {
            rows.clear();
            pqxx::nontransaction n(c);
            const auto res = n.exec_prepared(std::string(gsql::expired_name),
                                             static_cast<std::int64_t>(go_.compensation_limit));
            for (const auto& row : res)
                rows.push_back({row[0].c_str(), static_cast<std::uint64_t>(row[1].as<std::int64_t>()),
                                static_cast<std::uint64_t>(row[2].as<std::int64_t>())});
        });
        if (r != global_session::result::ok) {
            note_error(compensation_db_.last_error());
            return 0;
        }
        std::vector<item> items;
        std::vector<resolver_answer> answers;  // their payloads, viewed by items until written
        answers.reserve(rows.size());          // never reallocated: the views stay valid
        std::set<std::pair<std::string, std::uint64_t>> still_expired;
        for (const expired_row& e : rows) {
            const auto k = key::parse(e.k);
            if (!k) continue;
            // A live local claim: a thread of this process is executing it (or asking about it).
            if (local_.query(*k).state == record_state::processing) continue;
            resolver_answer& a = answers.emplace_back();
            try {
                a = opts_.resolve(expired_claim{e.k, e.fence, e.fp});
            } catch (...) {
                a = {};  // a throwing resolver decides nothing
            }
            // A response over options.max_payload is not recorded without it: in doubt, asked again.
            if ((a.verdict == resolution::succeeded || a.verdict == resolution::failed) &&
                a.payload.size() > opts_.max_payload)
                a = {};
            item it{*k, e.fence, record_state::processing, a.outcome, transition_cause::compensate, a.payload};
            switch (a.verdict) {
                case resolution::succeeded: it.to = record_state::succeeded; break;
                case resolution::failed: it.to = record_state::failed; break;
                case resolution::not_executed:
                    it.to = record_state::released;
                    it.outcome = 0;
                    it.payload = {};
                    break;
                case resolution::unknown:
                    still_expired.insert({e.k, e.fence});
                    if (doubted_.contains({e.k, e.fence})) continue;  // marked and audited already
                    it.cause = transition_cause::doubt;
                    it.outcome = 0;
                    it.payload = {};
                    break;
            }
            items.push_back(std::move(it));
        }
        std::erase_if(doubted_, [&](const auto& p) { return !still_expired.contains(p); });
        if (items.empty()) return 0;
        std::sort(items.begin(), items.end(), [](const item& a, const item& b) { return a.k.view() < b.k.view(); });
        std::unordered_set<std::string> won;
        if (!write_completions(compensation_db_, items, /*compensation=*/true, won, /*give_up=*/true)) return 0;
        std::size_t resolved = 0;
        for (const item& it : items) {
            if (!won.contains(std::string(it.k.view()))) continue;
            if (it.cause == transition_cause::doubt) {
                doubted_.insert({std::string(it.k.view()), it.fence});
                count(n_doubt_);
            } else {
                ++resolved;
                count(n_compensated_);
            }
        }
        return resolved;
    }

    // ---- reading --------------------------------------------------------------------------------

    [[nodiscard]] record_view query(const key& k) const noexcept { return local_.query(k); }

    /// The key's row in the store (a round trip; serialised with other reads of this guard).
    std::optional<stored_record> lookup(std::string_view k) {
        std::lock_guard lk(store_m_);
        return store_.get(k);
    }
    std::vector<audit_entry> audit(std::string_view k) {
        std::lock_guard lk(store_m_);
        return store_.audit(k);
    }

    /// Removes records past go.window and audit rows past go.audit_window, in calls of at most
    /// `max_rows` rows each, until none is left (each call one short transaction; reads of other
    /// threads wait at most one call). Returns what was removed. The bounds are taken on the
    /// server's clock, the one every row's times are stamped with: a node whose clock runs ahead
    /// must not prune a record still inside the window (its key would run again).
    prune_result prune(std::size_t max_rows = 10'000) {
        prune_result total;
        if (go_.window == forever && go_.audit_window == forever) return total;
        std::int64_t now = 0;
        {
            std::lock_guard lk(store_m_);
            now = store_.server_now_ms();
        }
        prune_limits limits;
        if (go_.window != forever) limits.records_before_ms = now - go_.window.count();
        if (go_.audit_window != forever) limits.audit_before_ms = now - go_.audit_window.count();
        limits.max_rows = max_rows;
        for (;;) {
            prune_result r;
            {
                std::lock_guard lk(store_m_);
                r = store_.prune(limits);
            }
            total.records += r.records;
            total.audit_rows += r.audit_rows;
            n_pruned_records_.fetch_add(r.records, std::memory_order_relaxed);  // relaxed: statistics
            n_pruned_audit_.fetch_add(r.audit_rows, std::memory_order_relaxed);
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
        s.claims_sent = ld(n_sent_);
        s.claims_won = ld(n_won_);
        s.claims_lost = ld(n_lost_);
        s.claim_batches = ld(n_claim_batches_);
        s.completions = ld(n_completions_);
        s.stale_completions = ld(n_stale_);
        s.completion_batches = ld(n_completion_batches_);
        s.compensated = ld(n_compensated_);
        s.doubt_marks = ld(n_doubt_);
        s.withdrawn = ld(n_withdrawn_);
        s.commits_in_doubt = ld(n_in_doubt_);
        s.store_errors = ld(n_errors_);
        s.timeouts = ld(n_timeouts_);
        s.pruned_records = ld(n_pruned_records_);
        s.pruned_audit_rows = ld(n_pruned_audit_);
        s.superseded = ld(n_superseded_);
        return s;
    }
    [[nodiscard]] std::string last_error() const {
        std::lock_guard lk(err_m_);
        return last_error_;
    }

    [[nodiscard]] const std::string& node() const noexcept { return node_; }
    [[nodiscard]] const options& opts() const noexcept { return opts_; }
    [[nodiscard]] const global_options& global_opts() const noexcept { return go_; }
    [[nodiscard]] const std::string& name() const noexcept { return name_; }
    guard& local() noexcept { return local_; }

private:
    struct item {  // one row of a completion / compensation batch
        key k;
        std::uint64_t fence;
        record_state to;
        std::uint64_t outcome;
        transition_cause cause;
        std::string_view payload{};  ///< a completion's (global_completion::payload, alive for the batch)
    };

    /// The audit detail of a completion, as postgres_store writes it (store_rows.hpp): the cause, the
    /// outcome, and the payload's size and hash when it has one. Also what completed_before matches.
    static std::string detail_of(const item& it) {
        return std::string(to_string(it.cause)) + " outcome=" + std::to_string(it.outcome) + payload_detail(it.payload);
    }

    static options local_options(options o) {
        // The local table never decides a lease: the store does. Its claims live until the caller
        // completes them (or the ticket is dropped), so the local table never compensates.
        // Nor does it decide an outcome: a local claim becomes SUCCEEDED or FAILED only after the
        // store committed that (run_completions, or a claim that lost to such a row). A local ticket
        // dropped without that (a completion that could not be queued, a guard closing with
        // completions left) is released, never failed per on_failure: a FAILED the store does not
        // hold would be replayed to every duplicate. (global_ticket applies on_failure through the
        // store.)
        o.on_failure = failure_policy::retryable;
        o.lease = std::chrono::hours(24 * 365 * 50);
        o.adaptive.enabled = false;  // nor an adaptive one (options.adaptive is process scope only)
        o.resolve = nullptr;
        o.reclaim_expired = false;
        // Nor does it order versions: a local claim is only a question to the store, which may refuse
        // it (a higher version claimed on another node) or never answer; the store's version table
        // decides (run_claims).
        o.ordered_versions = false;
        // Its own maintenance would scan the whole table for expired claims every interval (there
        // are none, by the line above): the engine's maintenance thread runs only its recycling.
        o.maintenance_interval = std::chrono::nanoseconds::zero();
        return o;
    }

    void create_index() {
        for (int attempt = 0;; ++attempt) {
            auto r = compensation_db_.run("create index", [&](pqxx::connection& c) {
                pqxx::nontransaction n(c);
                n.exec(std::string(gsql::processing_index));
                if (opts_.ordered_versions) n.exec(std::string(gsql::version_table));
            });
            if (r == global_session::result::ok) return;
            if (attempt == 3)
                throw error(errc::store_unavailable, "global guard: " + compensation_db_.last_error());
            std::this_thread::sleep_for(std::chrono::milliseconds(50 << attempt));  // a racing opener
        }
    }

    static void count(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
        c.fetch_add(n, std::memory_order_relaxed);  // relaxed: a statistic
    }
    void note_error(const std::string& what) {
        count(n_errors_);
        std::lock_guard lk(err_m_);
        last_error_ = what;
    }

    /// A completion or renewal of (k, fence), filled in by `fill`, queued and awaited. A failed
    /// allocation answers store_unavailable without calling `fill`.
    template <class Fill>
    std::error_code submit_completion(const key& k, std::uint64_t fence, Fill fill) noexcept {
        std::shared_ptr<global_completion> r;
        try {
            r = std::make_shared<global_completion>();
        } catch (...) {
            return errc::store_unavailable;
        }
        r->k = k;
        r->fence = fence;
        fill(*r);
        if (!completions_.submit(r)) return errc::store_unavailable;
        std::unique_lock lk(completions_.m);
        const auto until = std::chrono::steady_clock::now() + go_.wait_timeout;
        completions_.done.wait_until(lk, until, [&] { return r->st == global_completion::phase::done; });
        if (r->st != global_completion::phase::done) {
            count(n_timeouts_);
            return errc::store_unavailable;  // still queued: the batcher keeps trying
        }
        switch (r->v) {
            case global_completion::verdict::won: return {};
            case global_completion::verdict::stale: return errc::stale_ticket;
            case global_completion::verdict::error: break;
        }
        return errc::store_unavailable;
    }

    /// The batch with this id committed? Asked until the store answers (or the batcher stops).
    template <class Req>
    std::optional<bool> resolve_batch(global_session& db, std::int64_t batch_id, request_queue<Req>* q) {
        std::chrono::milliseconds pause{1};
        for (;;) {
            bool committed = false;
            auto r = db.run("resolve unknown commit", [&](pqxx::connection& c) {
                pqxx::work w(c);
                const auto res = w.exec_prepared(std::string(gsql::batch_committed_name), batch_id);
                committed = res.empty();
                w.abort();  // the speculative insert must not stay
            });
            if (r == global_session::result::ok) return committed;
            note_error(db.last_error());
            if (r == global_session::result::fatal) return std::nullopt;
            if (q == nullptr) {
                if (pause >= go_.max_backoff) return std::nullopt;  // compensation: next pass
                std::this_thread::sleep_for(pause);
                pause = std::min(go_.max_backoff, pause * 2);
            } else if (!q->backoff(pause, go_.max_backoff)) {
                return std::nullopt;
            }
        }
    }

    std::int64_t next_batch_id() {
        std::lock_guard lk(rng_m_);
        return static_cast<std::int64_t>(rng_() >> 1) | 1;  // positive, never 0
    }

    // ---- the claim batcher ----------------------------------------------------------------------

    void claim_loop(global_session& db) {
        std::vector<std::shared_ptr<global_claim>> batch;
        for (;;) {
            batch.clear();
            {
                std::unique_lock lk(claims_.m);
                claims_.work.wait(lk, [&] { return claims_.stopping || !claims_.q.empty(); });
                if (claims_.stopping) {
                    for (auto& c : claims_.q) c->st = global_claim::phase::done;  // verdict error
                    claims_.q.clear();
                    lk.unlock();
                    claims_.done.notify_all();
                    return;
                }
                claims_.take(batch, go_.max_batch, [](const auto& c) { return c->st == global_claim::phase::abandoned; },
                             [](auto& c) { c->st = global_claim::phase::sent; });
            }
            if (!batch.empty()) run_claims(batch, db);
        }
    }

    struct row_read {
        record_state state;
        std::uint64_t fence, outcome, fp;
        bool expired;
        std::string payload;
    };

    /// "TXID_OPERATION" of a key that splits (the ordered-versions pair), with its version.
    static std::optional<std::pair<std::string, std::uint32_t>> pair_of(const key& k) {
        const auto s = k.split();
        if (!s) return std::nullopt;
        std::string p;
        p.reserve(s->txid.size() + 1 + s->operation.size());
        p.append(s->txid).append(1, key::separator).append(s->operation);
        return std::pair{std::move(p), s->version};
    }

    void run_claims(std::vector<std::shared_ptr<global_claim>>& batch, global_session& db) {
        std::chrono::milliseconds pause{1};
        std::unordered_map<std::string, std::pair<std::uint64_t, record_state>> won;
        std::unordered_map<std::string, row_read> rows;
        std::unordered_map<std::string, std::uint64_t> newest;  // ordered: each loser's pair's version
        const bool ordered = opts_.ordered_versions;
        // Step 1: the claim statement, autocommit (one round trip; the batch id makes an unanswered
        // commit resolvable).
        for (;;) {
            {  // withdraw what callers gave up on before it is sent
                std::lock_guard lk(claims_.m);
                std::erase_if(batch, [](const auto& c) { return c->st == global_claim::phase::abandoned; });
            }
            if (batch.empty()) return;
            pg::array_literal keys, biz, fps, pairs, versions;
            // Ordered: one key per pair goes to the store, the batch's highest version (claim_ordered
            // says why); the lower ones are losers, answered after it by the read of step 2.
            std::unordered_map<std::string, std::pair<std::uint32_t, const global_claim*>> top;
            if (ordered)
                for (const auto& c : batch)
                    if (auto pv = pair_of(c->k)) {
                        auto [it, fresh] = top.try_emplace(std::move(pv->first), pv->second, c.get());
                        if (!fresh && pv->second > it->second.first) it->second = {pv->second, c.get()};
                    }
            for (const auto& c : batch) {
                if (ordered) {
                    auto pv = pair_of(c->k);
                    if (pv && top.at(pv->first).second != c.get()) continue;
                    pairs.add_text(pv ? std::string_view(pv->first) : std::string_view());
                    versions.add_uint(pv ? pv->second : 0);
                }
                keys.add_text(c->k.view());
                biz.add_text(pg::utf8_prefix(biz_type_of(c->k.view())));
                fps.add_uint(c->fp);
            }
            const std::int64_t batch_id = next_batch_id();
            const std::int64_t lease_ms =
                std::max<std::int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(opts_.lease).count());
            count(n_sent_, batch.size());
            auto r = db.run("claim batch", [&](pqxx::connection& conn) {
                won.clear();
                pqxx::nontransaction n(conn);
                db.committing(true);  // autocommit: the statement is its own COMMIT
                const auto res =
                    ordered ? n.exec_prepared(std::string(gsql::claim_ordered_name), batch_id, keys.str(), biz.str(),
                                              fps.str(), lease_ms, node_, pairs.str(), versions.str())
                            : n.exec_prepared(std::string(gsql::claim_name), batch_id, keys.str(), biz.str(), fps.str(),
                                              lease_ms, node_);
                db.committing(false);
                for (const auto& row : res)
                    won[row[0].c_str()] = {static_cast<std::uint64_t>(row[1].as<std::int64_t>()),
                                           std::string_view(row[2].c_str()) == "RELEASED" ? record_state::released
                                                                                          : record_state::absent};
            });
            if (r == global_session::result::in_doubt) {
                count(n_in_doubt_);
                note_error(db.last_error());
                const auto committed = resolve_batch(db, batch_id, &claims_);
                if (!committed) {  // stopping, or the store refuses: nobody learns; the leases decide
                    finish_claims(batch, nullptr, nullptr, nullptr);
                    return;
                }
                if (*committed) {
                    // The results were lost with the connection; the batch id proves the claims are
                    // ours, the rows (their fences) are read below.
                    if (!claimed_by_us(batch, batch_id, won, db)) {
                        finish_claims(batch, nullptr, nullptr, nullptr);
                        return;
                    }
                    r = global_session::result::ok;
                } else {
                    r = global_session::result::transient;
                }
            } else if (r != global_session::result::ok) {
                note_error(db.last_error());
            }
            if (r == global_session::result::ok) break;
            if (r == global_session::result::fatal || !claims_.backoff(pause, go_.max_backoff)) {
                finish_claims(batch, nullptr, nullptr, nullptr);
                return;
            }
        }
        count(n_claim_batches_);
        // Step 2: the losers' rows (a fresh snapshot: the winner that made our insert conflict has
        // committed). A read: retried alone on a transient failure, never the claims again.
        if (won.size() < batch.size() && !read_rows(batch, won, rows, ordered ? &newest : nullptr, db)) {
            rows.clear();
            newest.clear();
        }
        finish_claims(batch, &won, &rows, ordered ? &newest : nullptr);
    }

    /// Which keys of the batch this node holds now (the claim batch committed, its answer was lost).
    bool claimed_by_us(const std::vector<std::shared_ptr<global_claim>>& batch, std::int64_t batch_id,
                       std::unordered_map<std::string, std::pair<std::uint64_t, record_state>>& won,
                       global_session& db) {
        pg::array_literal keys;
        for (const auto& c : batch) keys.add_text(c->k.view());
        const std::string detail = "claim outcome=0 batch=" + std::to_string(batch_id);
        std::chrono::milliseconds pause{1};
        for (;;) {
            auto r = db.run("read own claims", [&](pqxx::connection& conn) {
                won.clear();
                pqxx::nontransaction n(conn);
                const auto res = n.exec_prepared(std::string(gsql::claimed_by_us_name), keys.str(), detail, node_);
                for (const auto& row : res)
                    won[row[0].c_str()] = {static_cast<std::uint64_t>(row[1].as<std::int64_t>()), record_state::absent};
            });
            if (r == global_session::result::ok) return true;
            note_error(db.last_error());
            if (r == global_session::result::fatal || !claims_.backoff(pause, go_.max_backoff)) return false;
        }
    }

    /// Reads the rows of the batch's keys not in `skip`. False when the store stayed unreachable
    /// until the batcher stopped.
    /// `newest` (ordered versions): also the newest version of each loser's pair, 0 for none (one
    /// statement, one snapshot with the rows).
    bool read_rows(const std::vector<std::shared_ptr<global_claim>>& batch,
                   const std::unordered_map<std::string, std::pair<std::uint64_t, record_state>>& skip,
                   std::unordered_map<std::string, row_read>& rows, std::unordered_map<std::string, std::uint64_t>* newest,
                   global_session& db) {
        pg::array_literal losers, pairs;
        for (const auto& c : batch)
            if (!skip.contains(std::string(c->k.view()))) {
                losers.add_text(c->k.view());
                if (newest) {
                    const auto pv = pair_of(c->k);
                    pairs.add_text(pv ? std::string_view(pv->first) : std::string_view());
                }
            }
        std::chrono::milliseconds pause{1};
        for (;;) {
            auto r = db.run("read claimed rows", [&](pqxx::connection& conn) {
                rows.clear();
                pqxx::nontransaction n(conn);
                const auto lr = newest ? n.exec_prepared(std::string(gsql::read_rows_ordered_name), losers.str(), pairs.str())
                                       : n.exec_prepared(std::string(gsql::read_rows_name), losers.str());
                if (newest) newest->clear();
                for (const auto& row : lr) {
                    if (newest) {
                        (*newest)[row[0].c_str()] = static_cast<std::uint64_t>(row[6].as<std::int64_t>());
                        if (row[1].is_null()) continue;  // no record
                    }
                    const auto st = parse_status(row[1].c_str());
                    row_read rr{st.value_or(record_state::processing),
                                static_cast<std::uint64_t>(row[2].as<std::int64_t>()),
                                static_cast<std::uint64_t>(row[3].as<std::int64_t>()),
                                static_cast<std::uint64_t>(row[4].as<std::int64_t>()), row[5].as<bool>(), {}};
                    const pqxx::field hex = row[newest ? 7 : 6];  // encode(payload, 'hex')
                    if (!pg::from_hex(std::string_view(hex.c_str(), hex.size()), rr.payload))
                        throw error(errc::store_error, "global guard " + name_ + ": the payload of key '" +
                                                           key::printable(row[0].c_str()) + "' came back as text that is not hex");
                    rows[row[0].c_str()] = std::move(rr);
                }
            });
            if (r == global_session::result::ok) return true;
            note_error(db.last_error());
            if (r == global_session::result::fatal || !claims_.backoff(pause, go_.max_backoff)) return false;
        }
    }

    /// Hands each claim its verdict (null maps: error), withdraws won claims nobody waits for, and
    /// sends losers that found a RELEASED (or no) row round once more (three times at most).
    /// `newest` (ordered versions only): the pair's newest version per loser, read with `rows`; a
    /// loser whose record is absent or RELEASED while its pair is at a higher version is superseded.
    void finish_claims(std::vector<std::shared_ptr<global_claim>>& batch,
                       const std::unordered_map<std::string, std::pair<std::uint64_t, record_state>>* won,
                       const std::unordered_map<std::string, row_read>* rows,
                       const std::unordered_map<std::string, std::uint64_t>* newest) {
        std::vector<std::shared_ptr<global_completion>> withdraw;
        std::vector<std::shared_ptr<global_claim>> again;
        {
            std::lock_guard lk(claims_.m);
            for (auto& c : batch) {
                const std::string k(c->k.view());
                if (won == nullptr) {
                    c->v = global_claim::verdict::error;
                } else if (auto w = won->find(k); w != won->end()) {
                    c->v = global_claim::verdict::won;
                    c->fence = w->second.first;
                    count(n_won_);
                } else if (auto rr = rows->find(k); rr != rows->end() && rr->second.state != record_state::released) {
                    c->v = global_claim::verdict::lost;
                    c->row_state = rr->second.state;
                    c->fence = rr->second.fence;
                    c->outcome = rr->second.outcome;
                    c->row_fp = rr->second.fp;
                    c->expired = rr->second.expired;
                    c->payload = rr->second.payload;  // copied: a retried batch may read the map again
                    count(n_lost_);
                } else if (const std::uint64_t n = superseding(c->k, newest); n != 0) {
                    c->v = global_claim::verdict::superseded;
                    c->outcome = n;
                    c->fence = rr != rows->end() ? rr->second.fence : 0;
                } else if (c->st != global_claim::phase::abandoned && c->retries < 3 && !claims_.stopping) {
                    // The row was released between our UPDATE and our read (or deleted by an operator):
                    // it is claimable again; try once more rather than report a state that is gone.
                    ++c->retries;
                    c->st = global_claim::phase::queued;
                    again.push_back(c);
                    continue;
                } else {
                    c->v = global_claim::verdict::lost;
                    c->row_state = record_state::processing;  // in_progress: the caller may ask again
                    count(n_lost_);
                }
                if (c->st == global_claim::phase::abandoned) {
                    if (c->v == global_claim::verdict::won) {  // nobody executes it: give it back at once
                        auto rel = std::make_shared<global_completion>();
                        rel->k = c->k;
                        rel->fence = c->fence;
                        rel->to = record_state::released;
                        rel->cause = transition_cause::not_durable;
                        withdraw.push_back(std::move(rel));
                        count(n_withdrawn_);
                    }
                    continue;
                }
                c->st = global_claim::phase::done;
            }
            for (auto it = again.rbegin(); it != again.rend(); ++it) claims_.q.push_front(*it);
        }
        claims_.done.notify_all();
        for (auto& w : withdraw) (void)completions_.submit(w);
    }

    /// The newest version of k's pair when it is above k's own (k is superseded), else 0.
    static std::uint64_t superseding(const key& k, const std::unordered_map<std::string, std::uint64_t>* newest) {
        if (newest == nullptr) return 0;
        const auto it = newest->find(std::string(k.view()));
        if (it == newest->end()) return 0;
        const auto s = k.split();
        return s && it->second > s->version ? it->second : 0;
    }

    // ---- the completion batcher -----------------------------------------------------------------

    void completion_loop(global_session& db) {
        std::vector<std::shared_ptr<global_completion>> batch;
        for (;;) {
            batch.clear();
            {
                std::unique_lock lk(completions_.m);
                completions_.work.wait(lk, [&] { return completions_.stopping || !completions_.q.empty(); });
                if (completions_.q.empty()) return;  // stopping and drained
                if (completions_.drain_over()) {
                    auto left = std::move(completions_.q);
                    completions_.q.clear();
                    for (auto& r : left) r->st = global_completion::phase::done;  // verdict error
                    lk.unlock();
                    completions_.done.notify_all();
                    return;  // `left` drops the local claims: released locally (local_options)
                }
                completions_.take(batch, go_.max_batch, [](const auto&) { return false; },
                                  [](auto& r) { r->st = global_completion::phase::sent; });
            }
            run_completions(batch, db);
        }
    }

    void run_completions(std::vector<std::shared_ptr<global_completion>>& batch, global_session& db) {
        std::vector<item> items;
        pg::array_literal ext_keys, ext_fences, ext_ms;
        std::size_t extends = 0;
        for (const auto& r : batch) {
            if (r->extend_by.count() > 0) {
                ext_keys.add_text(r->k.view());
                ext_fences.add_uint(r->fence);
                ext_ms.add_int(r->extend_by.count());
                ++extends;
            } else {
                items.push_back({r->k, r->fence, r->to, r->outcome, r->cause, r->payload});
            }
        }
        std::unordered_set<std::string> won;
        std::chrono::milliseconds pause{1};
        bool ok = false;
        for (;;) {
            const global_session::result res = write_batch(db, items, false, won, ext_keys, ext_fences, ext_ms, extends);
            if (res == global_session::result::ok) {
                ok = true;
                break;
            }
            if (res == global_session::result::fatal || !completions_.backoff(pause, go_.max_backoff)) break;
        }
        if (ok) count(n_completion_batches_);
        for (auto& r : batch) {
            const bool w = ok && won.contains(std::string(r->k.view()));
            if (r->extend_by.count() == 0) {
                if (w) {
                    count(n_completions_);
                    if (r->to == record_state::succeeded) {
                        // Cached with its payload; one the local table cannot keep (its payload
                        // budget spent) is released locally instead: the next begin asks the store.
                        (void)r->local.succeed(r->outcome, r->payload);
                        if (r->local) (void)r->local.fail(0, failure_policy::retryable);
                    } else if (r->to == record_state::failed) {
                        (void)r->local.fail(r->outcome, failure_policy::terminal, r->payload);  // as above
                        if (r->local) (void)r->local.fail(0, failure_policy::retryable);
                    } else {
                        (void)r->local.fail(r->outcome, failure_policy::retryable);
                    }
                } else {
                    if (ok) count(n_stale_);
                    (void)r->local.fail(0, failure_policy::retryable);  // ask the store next time
                }
            }
            r->v = !ok ? global_completion::verdict::error
                       : w ? global_completion::verdict::won : global_completion::verdict::stale;
        }
        {
            std::lock_guard lk(completions_.m);
            for (auto& r : batch) r->st = global_completion::phase::done;
        }
        completions_.done.notify_all();
    }

    /// Writes completions (or compensations) with one batch id, resolving an unknown commit.
    /// give_up: return after the first transient failure (compensation tries again next pass).
    bool write_completions(global_session& db, const std::vector<item>& items, bool compensation,
                           std::unordered_set<std::string>& won, bool give_up) {
        pg::array_literal none1, none2, none3;
        std::chrono::milliseconds pause{1};
        for (;;) {
            const auto r = write_batch(db, items, compensation, won, none1, none2, none3, 0);
            if (r == global_session::result::ok) return true;
            if (r == global_session::result::fatal || give_up) return false;
            std::this_thread::sleep_for(pause);
            pause = std::min(go_.max_backoff, pause * 2);
        }
    }

    /// One attempt: the completion statement, autocommit with its batch id (an unanswered commit is
    /// resolved here), then, outside it, the check for an earlier attempt of ours and the lease
    /// renewals. ok means `won` is the truth. Repeating a whole attempt is safe: a completion that
    /// committed before is found by the check, a renewal renews again.
    global_session::result write_batch(global_session& db, const std::vector<item>& items, bool compensation,
                                       std::unordered_set<std::string>& won, pg::array_literal& ext_keys,
                                       pg::array_literal& ext_fences, pg::array_literal& ext_ms, std::size_t extends) {
        won.clear();
        if (!items.empty()) {
            pg::array_literal keys, fences, states, outcomes, details, payloads;
            for (const item& it : items) {
                keys.add_text(it.k.view());
                fences.add_uint(it.fence);
                states.add_text(status_text(it.to));
                outcomes.add_uint(it.outcome);
                details.add_text(detail_of(it));
                payloads.add_hex(it.payload);
            }
            const std::int64_t batch_id = next_batch_id();
            auto r = db.run(compensation ? "compensation batch" : "completion batch", [&](pqxx::connection& conn) {
                won.clear();
                pqxx::nontransaction n(conn);
                db.committing(true);  // autocommit: the statement is its own COMMIT
                const auto res = n.exec_prepared(std::string(gsql::complete_name), batch_id, keys.str(), fences.str(),
                                                 states.str(), outcomes.str(), details.str(), node_, compensation,
                                                 payloads.str());
                db.committing(false);
                for (const auto& row : res) won.insert(row[0].c_str());
            });
            bool results_lost = false;
            if (r == global_session::result::in_doubt) {
                count(n_in_doubt_);
                note_error(db.last_error());
                const auto committed = compensation ? resolve_batch<global_claim>(db, batch_id, nullptr)
                                                    : resolve_batch(db, batch_id, &completions_);
                if (!committed) return global_session::result::fatal;
                if (!*committed) return global_session::result::transient;
                results_lost = true;  // committed, but which rows it won died with the connection
                won.clear();
            } else if (r != global_session::result::ok) {
                note_error(db.last_error());
                return r;
            }
            if (won.size() < items.size() && (!compensation || results_lost)) {
                // Rows not won now may have been won by this node before (an earlier attempt whose
                // answer was lost): its audit row says so.
                pg::array_literal lk, lf, ls, ld;
                for (const item& it : items) {
                    if (won.contains(std::string(it.k.view()))) continue;
                    lk.add_text(it.k.view());
                    lf.add_uint(it.fence);
                    ls.add_text(status_text(it.to));
                    ld.add_text(detail_of(it));
                }
                std::unordered_set<std::string> before;
                const auto rb = db.run("completion check", [&](pqxx::connection& conn) {
                    pqxx::nontransaction n(conn);
                    const auto res = n.exec_prepared(std::string(gsql::completed_before_name), lk.str(), lf.str(),
                                                     ls.str(), ld.str(), node_);
                    for (const auto& row : res) before.insert(row[0].c_str());
                });
                if (rb != global_session::result::ok) {
                    note_error(db.last_error());
                    return rb == global_session::result::fatal ? rb : global_session::result::transient;
                }
                won.insert(before.begin(), before.end());
            }
        }
        if (extends > 0) {
            std::unordered_set<std::string> renewed;
            const auto re = db.run("lease renewal", [&](pqxx::connection& conn) {
                pqxx::nontransaction n(conn);
                const auto res = n.exec_prepared(std::string(gsql::extend_name), ext_keys.str(), ext_fences.str(), ext_ms.str());
                for (const auto& row : res) renewed.insert(row[0].c_str());
            });
            if (re != global_session::result::ok) {
                note_error(db.last_error());
                return re == global_session::result::fatal ? re : global_session::result::transient;
            }
            won.insert(renewed.begin(), renewed.end());
        }
        return global_session::result::ok;
    }

    // ---- the maintenance thread ------------------------------------------------------------------

    /// Every maintenance_interval: a compensation pass (with a resolver), then the local table's
    /// generation recycling (retention).
    void maintenance_loop() {
        std::unique_lock lk(comp_m_);
        while (!comp_stop_) {
            comp_cv_.wait_for(lk, opts_.maintenance_interval, [this] { return comp_stop_; });
            if (comp_stop_) break;
            lk.unlock();
            try {
                compensate();
                local_.collect();
                if (go_.prune_interval > std::chrono::milliseconds::zero() &&
                    std::chrono::steady_clock::now() >= next_prune_) {
                    next_prune_ = std::chrono::steady_clock::now() + go_.prune_interval;
                    (void)prune();
                }
            } catch (...) {
                // a pass that fails is retried on the next one
            }
            lk.lock();
        }
    }

    options opts_;
    global_options go_;
    guard local_;
    postgres_store store_;  // schema, and reads (lookup, audit) under store_m_
    std::mutex store_m_;
    std::string name_;
    std::string node_;
    global_session compensation_db_;
    std::vector<std::unique_ptr<global_session>> claim_dbs_, completion_dbs_;  // one per batcher thread
    request_queue<global_claim> claims_{/*drains=*/false};
    request_queue<global_completion> completions_{/*drains=*/true};
    std::mt19937_64 rng_;  // batch ids, drawn by three threads: under rng_m_
    std::mutex rng_m_;
    std::mutex comp_run_m_;  // one compensation pass at a time
    std::set<std::pair<std::string, std::uint64_t>> doubted_;
    std::mutex comp_m_;
    std::condition_variable comp_cv_;
    bool comp_stop_ = false;
    mutable std::mutex err_m_;
    std::string last_error_;
    std::atomic<std::uint64_t> n_sent_{0}, n_won_{0}, n_lost_{0}, n_claim_batches_{0}, n_completions_{0},
        n_stale_{0}, n_completion_batches_{0}, n_compensated_{0}, n_doubt_{0}, n_withdrawn_{0}, n_in_doubt_{0},
        n_errors_{0}, n_timeouts_{0}, n_pruned_records_{0}, n_pruned_audit_{0}, n_superseded_{0};
    std::chrono::steady_clock::time_point next_prune_{};  // the maintenance thread only
    std::vector<std::thread> claim_threads_, completion_threads_;
    std::thread maintenance_thread_;
};

}  // namespace detail
}  // namespace idem
