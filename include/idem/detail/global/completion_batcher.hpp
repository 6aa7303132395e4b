// idem/detail/global/completion_batcher.hpp: the completion batcher of scope::global: completions,
// releases and lease renewals of claims this process won, written to PostgreSQL in batches by
// completion_connections threads, each with its own connection. Also the batch writer the
// compensator (compensator.hpp) writes its resolutions with.
//
// Invariant: durable before visible. A completion batch is one autocommit UPDATE ... FROM
// unnest(...) WHERE key AND fencing_token AND status = 'PROCESSING' RETURNING key, its audit rows in
// the same statement (sql::complete). A key returned won; any other is stale, unless this node's own
// earlier attempt of the same completion committed, which its audit row shows (sql::completed_before:
// a claim is held by one process, so (key, fence) names it). The local record follows the store's
// answer, and only once the store committed it. Until then the local claim stays live, so this
// process's duplicates see in_progress (also after the owner was told store_unavailable: the
// completion stays queued); a completion the store refused or never received leaves the claim
// released locally (the next begin asks the store), never SUCCEEDED or FAILED.
//
// Response payloads: a success's bytes go in the completion's fenced UPDATE (hex text[] -> BYTEA, as
// postgres_store writes them). The local table caches a terminal record with its payload, or, when
// it cannot keep the payload (its payload budget spent), not at all (released locally: the next
// begin asks the store).
//
// Callers give up after global_options::wait_timeout. A completion whose caller gave up stays queued
// and owns the local claim until the store takes it (the effect happened: its success must be
// recorded), like sync mode of the durable guard. When the guard closes, the queue drains for up to
// wait_timeout; what is left then is dropped (released locally): those claims expire in the store
// and go to compensation. An unanswered commit is resolved by its batch id (batch_context.hpp).
//
// Thread-safety: complete(), extend() and queue_withdrawal() may be called from any thread; write()
// from one thread per session. Progress: blocking (the queue's mutex and condition variables, and
// the round trips), callers bounded by wait_timeout.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "idem/detail/assert.hpp"
#include "idem/detail/global/batch_context.hpp"
#include "idem/detail/global/request_queue.hpp"
#include "idem/detail/global/arbiter.hpp"
#include "idem/detail/global/open_session.hpp"
#include "idem/guard.hpp"
#include "idem/store_rows.hpp"

namespace idem::detail::global {

/// One completion, release or lease renewal on its way through the completion batcher. The fields
/// the batcher answers (st, v) are read by the caller after it saw st == done under the queue's mutex.
struct completion_request {
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

/// One row of a completion or compensation batch.
struct completion_row {
    key k;
    std::uint64_t fence;
    record_state to;
    std::uint64_t outcome;
    transition_cause cause;
    std::string_view payload{};  ///< a completion's (completion_request::payload, alive for the batch)
};

/// True when the rows' keys are strictly increasing: the batch statements take them sorted, each
/// once (their rows are locked in key order; one UPDATE cannot change a row twice).
template <class Range, class Key>
[[nodiscard]] bool strictly_increasing(const Range& rows, Key key_of) {
    return std::adjacent_find(rows.begin(), rows.end(),
                              [&](const auto& a, const auto& b) { return !(key_of(a) < key_of(b)); }) == rows.end();
}

class completion_batcher {
public:
    /// Opens nothing yet (each session connects on its first call); starts one batcher thread per
    /// session.
    completion_batcher(batch_context& ctx, const std::string& uri) : ctx_(ctx) {
        completions_.beside = ctx_.go.batch_beside;  // before any thread reads it
        for (std::size_t i = 0; i < ctx_.go.completion_connections; ++i)
            dbs_.push_back(open_session(uri, ctx_.name, ctx_.go.call_deadline, "idem-global-completions",
                                        ctx_.go.require_synchronous_standby));
        for (auto& db : dbs_) threads_.emplace_back([this, d = db.get()] { completion_loop(*d); });
    }
    /// Completions drain (a success whose caller gave up still belongs in the store) for up to
    /// wait_timeout; what is left then is dropped: those claims expire and go to compensation.
    ~completion_batcher() {
        completions_.stop(std::chrono::steady_clock::now() + ctx_.go.wait_timeout);
        for (auto& t : threads_) t.join();
    }
    completion_batcher(const completion_batcher&) = delete;
    completion_batcher& operator=(const completion_batcher&) = delete;

    /// Records `to` for the claim (k, fence), finalising `local` the same way once the store
    /// committed it (never before: a duplicate must not be told an outcome the store may not keep).
    /// Returns {} when the store took it, stale_ticket when the claim is no longer the record's,
    /// store_unavailable when the store did not answer within wait_timeout (the completion stays
    /// queued and owns the local claim until the store takes it) or when it could not be queued
    /// (no memory, or the guard is closing: `local` is released, the next begin asks the store).
    /// `payload` (a success's or a terminal failure's response; the caller checked it against
    /// options.max_payload) is copied before this returns and written by the same fenced UPDATE as
    /// the state.
    std::error_code complete(const key& k, std::uint64_t fence, record_state to, std::uint64_t outcome,
                             transition_cause cause, ticket&& local, std::string_view payload = {}) noexcept {
        IDEM_ASSERT(fence != 0, "a completion carries the store's fence of its claim (at least 1)");
        std::string bytes;
        try {
            bytes.assign(payload);
        } catch (...) {  // out of memory: nothing is queued, nothing written
            (void)local.fail(0, failure_policy::retryable);
            return errc::store_unavailable;
        }
        const std::error_code ec = submit(k, fence, [&](completion_request& r) {
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
        IDEM_ASSERT(fence != 0, "a lease renewal carries the store's fence of its claim (at least 1)");
        return submit(k, fence, [&](completion_request& r) {
            r.extend_by = std::max(std::chrono::milliseconds(1), std::chrono::ceil<std::chrono::milliseconds>(by));
        });
    }

    /// The release of a claim the store granted after its caller gave up (claim_batcher.hpp), audited
    /// "not_durable": nobody executes it and nobody waits for its lease. Queued by queue_withdrawal().
    [[nodiscard]] static std::shared_ptr<completion_request> withdrawal(const key& k, std::uint64_t fence) {
        auto rel = std::make_shared<completion_request>();
        rel->k = k;
        rel->fence = fence;
        rel->to = record_state::released;
        rel->cause = transition_cause::not_durable;
        return rel;
    }
    /// Queues a withdrawal without waiting for it (nobody does).
    void queue_withdrawal(const std::shared_ptr<completion_request>& w) { (void)completions_.submit(w); }

    /// Writes completions (or compensations) with one batch id, resolving an unknown commit; `won`
    /// gets the keys the store took. give_up: return after the first transient failure
    /// (compensation tries again next pass).
    bool write(global_session& db, const std::vector<completion_row>& rows, bool compensation,
               std::unordered_set<std::string>& won, bool give_up) {
        std::chrono::milliseconds pause{1};
        for (;;) {
            const auto r = write_batch(db, rows, compensation, won, {});
            if (r == global_session::result::ok) return true;
            if (r == global_session::result::fatal || give_up) return false;
            std::this_thread::sleep_for(pause);
            pause = std::min(ctx_.go.max_backoff, pause * 2);
        }
    }

    /// The audit detail of a completion, as postgres_store writes it (store_rows.hpp): the cause, the
    /// outcome, and the payload's size and hash when it has one. Also what completed_before matches.
    static std::string detail_of(const completion_row& it) {
        return rows::format_audit_detail(it.cause, it.outcome, it.payload);
    }

private:
    /// A completion or renewal of (k, fence), filled in by `fill`, queued and awaited. A failed
    /// allocation answers store_unavailable without calling `fill`.
    template <class Fill>
    std::error_code submit(const key& k, std::uint64_t fence, Fill fill) noexcept {
        std::shared_ptr<completion_request> r;
        try {
            r = std::make_shared<completion_request>();
        } catch (...) {
            return errc::store_unavailable;
        }
        r->k = k;
        r->fence = fence;
        fill(*r);
        if (!completions_.submit(r)) return errc::store_unavailable;
        std::unique_lock lk(completions_.m);
        const auto until = std::chrono::steady_clock::now() + ctx_.go.wait_timeout;
        completions_.done.wait_until(lk, until, [&] { return r->st == completion_request::phase::done; });
        if (r->st != completion_request::phase::done) {
            batch_context::count(ctx_.n.timeouts);
            return errc::store_unavailable;  // still queued: the batcher keeps trying
        }
        switch (r->v) {
            case completion_request::verdict::won: return {};
            case completion_request::verdict::stale: return errc::stale_ticket;
            case completion_request::verdict::error: break;
        }
        return errc::store_unavailable;
    }

    void completion_loop(global_session& db) {
        std::vector<std::shared_ptr<completion_request>> batch;
        for (;;) {
            batch.clear();
            {
                std::unique_lock lk(completions_.m);
                completions_.await_work(lk);
                if (completions_.q.empty()) return;  // stopping and drained
                if (completions_.drain_over()) {
                    auto left = std::move(completions_.q);
                    completions_.q.clear();
                    for (auto& r : left) r->st = completion_request::phase::done;  // verdict error
                    lk.unlock();
                    completions_.done.notify_all();
                    return;  // `left` drops the local claims: released locally (local_options)
                }
                completions_.take(
                    batch, ctx_.go.max_batch, [](const auto&) { return false; },
                    [](auto& r) { r->st = completion_request::phase::sent; });
            }
            const request_queue<completion_request>::in_flight_batch over(completions_, !batch.empty());
            run_completions(batch, db);
        }
    }

    void run_completions(std::vector<std::shared_ptr<completion_request>>& batch, global_session& db) {
        std::vector<completion_row> rows;
        std::vector<global_session::extend_item> extends;
        for (const auto& r : batch) {
            if (r->extend_by.count() > 0) {
                extends.push_back({r->k.view(), r->fence, r->extend_by.count()});
            } else {
                rows.push_back({r->k, r->fence, r->to, r->outcome, r->cause, r->payload});
            }
        }
        std::unordered_set<std::string> won;
        std::chrono::milliseconds pause{1};
        bool ok = false;
        for (;;) {
            const global_session::result res = write_batch(db, rows, false, won, extends);
            if (res == global_session::result::ok) {
                ok = true;
                break;
            }
            if (res == global_session::result::fatal || !completions_.backoff(pause, ctx_.go.max_backoff)) break;
        }
        if (ok) batch_context::count(ctx_.n.completion_batches);
        for (auto& r : batch) {
            const bool w = ok && won.contains(std::string(r->k.view()));
            if (r->extend_by.count() == 0) {
                if (w) {
                    batch_context::count(ctx_.n.completions);
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
                    if (ok) batch_context::count(ctx_.n.stale_completions);
                    (void)r->local.fail(0, failure_policy::retryable);  // ask the store next time
                }
            }
            r->v = !ok ? completion_request::verdict::error
                   : w ? completion_request::verdict::won
                       : completion_request::verdict::stale;
        }
        {
            std::lock_guard lk(completions_.m);
            for (auto& r : batch) r->st = completion_request::phase::done;
        }
        completions_.done.notify_all();
    }

    /// One attempt: the completion statement, autocommit with its batch id (an unanswered commit is
    /// resolved here), then, outside it, the check for an earlier attempt of ours and the lease
    /// renewals. ok means `won` is the truth. Repeating a whole attempt is safe: a completion that
    /// committed before is found by the check, a renewal renews again.
    global_session::result write_batch(global_session& db, const std::vector<completion_row>& rows, bool compensation,
                                       std::unordered_set<std::string>& won,
                                       std::span<const global_session::extend_item> extends) {
        IDEM_ASSERT(!compensation || extends.empty(), "a compensation batch renews no lease");
        IDEM_ASSERT(strictly_increasing(rows, [](const completion_row& r) { return r.k.view(); }),
                    "a completion batch holds its keys sorted, each once (the arbiter locks them in key order)");
        won.clear();
        if (!rows.empty()) {
            std::vector<global_session::write_item> items;
            items.reserve(rows.size());
            for (const completion_row& it : rows)
                items.push_back({it.k.view(), it.fence, status_text(it.to), it.outcome, detail_of(it), it.payload});
            const std::int64_t batch_id = ctx_.next_batch_id();
            auto r = db.complete(batch_id, items, ctx_.node, compensation, won);
            bool results_lost = false;
            if (r == global_session::result::in_doubt) {
                batch_context::count(ctx_.n.commits_in_doubt);
                ctx_.note_error(db.last_error());
                const auto committed = compensation ? ctx_.resolve_batch<completion_request>(db, batch_id, nullptr)
                                                    : ctx_.resolve_batch(db, batch_id, &completions_);
                if (!committed) return global_session::result::fatal;
                if (!*committed) return global_session::result::transient;
                results_lost = true;  // committed, but which rows it won died with the connection
                won.clear();
            } else if (r != global_session::result::ok) {
                ctx_.note_error(db.last_error());
                return r;
            }
            if (won.size() < rows.size() && (!compensation || results_lost)) {
                // Rows not won now may have been won by this node before (an earlier attempt whose
                // answer was lost): its audit row says so.
                std::vector<global_session::write_item> lost;
                for (global_session::write_item& it : items)
                    if (!won.contains(std::string(it.k))) lost.push_back(std::move(it));
                std::unordered_set<std::string> before;
                const auto rb = db.completed_before(lost, ctx_.node, before);
                if (rb != global_session::result::ok) {
                    ctx_.note_error(db.last_error());
                    return rb == global_session::result::fatal ? rb : global_session::result::transient;
                }
                won.insert(before.begin(), before.end());
            }
        }
        if (!extends.empty()) {
            std::unordered_set<std::string> renewed;
            const auto re = db.extend(extends, renewed);
            if (re != global_session::result::ok) {
                ctx_.note_error(db.last_error());
                return re == global_session::result::fatal ? re : global_session::result::transient;
            }
            won.insert(renewed.begin(), renewed.end());
        }
        return global_session::result::ok;
    }

    batch_context& ctx_;
    std::vector<std::unique_ptr<global_session>> dbs_;  // one per batcher thread
    request_queue<completion_request> completions_{/*drains=*/true};
    std::vector<std::thread> threads_;
};

}  // namespace idem::detail::global
