// idem/detail/global/claim_batcher.hpp: the claim batcher of scope::global: the claims the local
// table could not answer, sent to PostgreSQL in batches (group commit) by claim_connections threads,
// each with its own connection, and the answer each caller waits for.
//
// Invariant: the store's primary key decides every claim, and a claim is granted only by a batch
// that committed. A claim batch is one autocommit statement (its own READ COMMITTED transaction, one
// round trip including the commit): the batch id row, INSERT ... ON CONFLICT DO NOTHING RETURNING
// for new keys plus UPDATE ... WHERE status = 'RELEASED' RETURNING (fence + 1) for released ones,
// and the winners' audit rows (sql.hpp); then, only when some key lost, one SELECT of the losers'
// rows (a fresh snapshot, which sees the winners that made ours conflict). A batch holds a key at
// most once (the caller's local claim is this process's one question about it; request_queue::take).
//
//   * A winner gets a global ticket holding the store's fence and the local claim (so local
//     duplicates keep seeing in_progress without a round trip).
//   * A loser's local claim becomes the cached answer: SUCCESS / FAILED are recorded locally
//     (replayed from then on, with their payload when the local table can keep it), anything else
//     is released locally (the next begin asks the store again).
//   * Unknown commit (batch_context.hpp): when the batch committed, the claims it won are the keys
//     whose claim audit row names the batch id (their RETURNING rows died with the connection).
//   * A caller gives up after global_options::wait_timeout. Its claim is withdrawn: if its batch
//     later turns out to have won it, it is released in the store at once (audited "not_durable",
//     completion_batcher::withdrawal), so nobody executes it and nobody waits for its lease.
//   * Ordered versions (options.ordered_versions): the batch is sql::claim_ordered, which checks and
//     raises each pair's row of idempotent_version under its row lock in the claim's own statement
//     (sql.hpp has the argument). One key per pair goes to the store, the batch's highest version;
//     the others and the refused keys are losers, and the loser read (with each pair's version, one
//     snapshot) answers superseded for a loser without a live or decided record whose pair is
//     higher. The local table does not order versions: the store decides each claim.
//
// Thread-safety: claim() may be called from any thread. Progress: blocking (the queue's mutex and
// condition variables, and the round trips), callers bounded by wait_timeout.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "idem/detail/assert.hpp"
#include "idem/detail/global/batch_context.hpp"
#include "idem/detail/global/completion_batcher.hpp"
#include "idem/detail/global/request_queue.hpp"
#include "idem/detail/global/arbiter.hpp"
#include "idem/detail/global/open_session.hpp"
#include "idem/guard.hpp"
#include "idem/store_rows.hpp"

namespace idem::detail::global {

/// One claim on its way through the claim batcher. Fields below `st` are written by the batcher and
/// read by the caller after it saw st == done under the queue's mutex.
struct claim_request {
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

/// The store's answer to one claim, as global_guard::begin() returns it.
struct claim_answer {
    begin_status status;
    std::optional<ticket> local;  ///< acquired only (optional: an empty ticket zeroes a whole key)
    std::uint64_t fence = 0;
    std::uint64_t outcome = 0;
    std::string payload{};  ///< succeeded or failed: the record's response payload
};

/// A key's row in the store, as a claim that did not win it (or a replica) read it.
struct found_row {
    record_state state = record_state::absent;
    std::uint64_t fence = 0;
    std::uint64_t outcome = 0;
    std::uint64_t fp = 0;  ///< the request fingerprint the row holds (0: none)
    bool expired = false;  ///< PROCESSING with its lease past (in doubt)
    std::string payload;   ///< the response payload (bytes; empty for none)
};

/// The answer to a claim of k whose row the store holds in `row` (another node holds or decided
/// it): `local` is this process's local claim on k. A SUCCESS or FAILED row is final, so it is
/// cached in the local table (its later duplicates never leave the process); anything else gives
/// the local claim back, so the next begin asks again. A fingerprint that differs from the row's
/// is payload_mismatch.
inline claim_answer answer_from_row(std::uint64_t fp, ticket& local, found_row&& row) noexcept {
    if (fp != 0 && row.fp != 0 && fp != row.fp) {
        (void)local.fail(0, failure_policy::retryable);
        return {begin_status::payload_mismatch, {}, row.fence, 0};
    }
    switch (row.state) {
        case record_state::succeeded:  // final: cache it, later duplicates never leave the process
            // With its payload; one the local table cannot keep (over max_payload, or its payload
            // budget spent) is not cached: the next begin asks the store again.
            (void)local.succeed(row.outcome, row.payload);
            if (local) (void)local.fail(0, failure_policy::retryable);
            return {begin_status::succeeded, {}, row.fence, row.outcome, std::move(row.payload)};
        case record_state::failed:  // final too, with the error response it may carry
            (void)local.fail(row.outcome, failure_policy::terminal, row.payload);
            if (local) (void)local.fail(0, failure_policy::retryable);
            return {begin_status::failed, {}, row.fence, row.outcome, std::move(row.payload)};
        default:  // PROCESSING elsewhere (or RELEASED again after our retries): ask again next time
            (void)local.fail(0, failure_policy::retryable);
            return {row.expired ? begin_status::in_doubt : begin_status::in_progress, {}, row.fence, 0};
    }
}

class claim_batcher {
public:
    /// Opens nothing yet (each session connects on its first call); starts one batcher thread per
    /// session. Won claims whose callers gave up are released through `completions`, which must
    /// outlive this batcher.
    claim_batcher(batch_context& ctx, completion_batcher& completions, const std::string& uri)
        : ctx_(ctx), completions_(completions) {
        claims_.beside = ctx_.go.batch_beside;  // before any thread reads it
        for (std::size_t i = 0; i < ctx_.go.claim_connections; ++i)
            dbs_.push_back(open_session(uri, ctx_.name, ctx_.go.call_deadline, "idem-global-claims",
                                        ctx_.go.require_synchronous_standby, ctx_.opts.ordered_versions));
        for (auto& db : dbs_) threads_.emplace_back([this, d = db.get()] { claim_loop(*d); });
    }
    /// Claims still queued are answered store_unavailable (verdict error); the batch in flight ends.
    ~claim_batcher() {
        claims_.stop();
        for (auto& t : threads_) t.join();
    }
    claim_batcher(const claim_batcher&) = delete;
    claim_batcher& operator=(const claim_batcher&) = delete;

    /// The store's half of global_guard::begin(), which refused keys coordinator::accepts refuses and
    /// asked the local table first: `lr` holds the local claim on k (this process's one question
    /// about k in flight). Waits for the claim's batch, at most wait_timeout.
    claim_answer claim(const key& k, std::uint64_t fp, begin_result&& lr) noexcept {
        IDEM_ASSERT(lr.status == begin_status::acquired && lr.ticket,
                    "a claim goes to the store only while this process holds the local claim on its key");
        std::shared_ptr<claim_request> c;
        try {
            c = std::make_shared<claim_request>();
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
            const auto until = std::chrono::steady_clock::now() + ctx_.go.wait_timeout;
            claims_.done.wait_until(lk, until, [&] { return c->st == claim_request::phase::done; });
            if (c->st != claim_request::phase::done) {
                c->st = claim_request::phase::abandoned;  // the batcher withdraws it if it wins
                lk.unlock();
                batch_context::count(ctx_.n.timeouts);
                (void)lr.ticket.fail(0, failure_policy::retryable);
                return {begin_status::store_unavailable, {}, 0, 0};
            }
        }
        switch (c->v) {
            case claim_request::verdict::won: return {begin_status::acquired, std::move(lr.ticket), c->fence, 0};
            case claim_request::verdict::superseded:  // nothing claimed; the next begin asks the store again
                batch_context::count(ctx_.n.superseded);
                (void)lr.ticket.fail(0, failure_policy::retryable);
                return {begin_status::superseded, {}, c->fence, c->outcome};
            case claim_request::verdict::error:
                (void)lr.ticket.fail(0, failure_policy::retryable);
                return {begin_status::store_unavailable, {}, 0, 0};
            case claim_request::verdict::lost: break;
        }
        return answer_from_row(fp, lr.ticket,
                               {c->row_state, c->fence, c->outcome, c->row_fp, c->expired, std::move(c->payload)});
    }

private:
    using won_map = global_session::won_map;  // key -> fence, from
    using row_read = global_session::row_read;

    void claim_loop(global_session& db) {
        std::vector<std::shared_ptr<claim_request>> batch;
        for (;;) {
            batch.clear();
            {
                std::unique_lock lk(claims_.m);
                claims_.await_work(lk);
                if (claims_.stopping) {
                    for (auto& c : claims_.q) c->st = claim_request::phase::done;  // verdict error
                    claims_.q.clear();
                    lk.unlock();
                    claims_.done.notify_all();
                    return;
                }
                claims_.take(
                    batch, ctx_.go.max_batch, [](const auto& c) { return c->st == claim_request::phase::abandoned; },
                    [](auto& c) { c->st = claim_request::phase::sent; });
            }
            const request_queue<claim_request>::in_flight_batch over(claims_, !batch.empty());
            if (!batch.empty()) run_claims(batch, db);
        }
    }

    /// "TXID_OPERATION" of a key that splits (the ordered-versions pair), with its version.
    static std::optional<std::pair<std::string, std::uint32_t>> pair_of(const key& k) {
        const auto s = k.split();
        if (!s) return std::nullopt;
        std::string p;
        p.reserve(s->txid.size() + 1 + s->operation.size());
        p.append(s->txid).append(1, key::separator).append(s->operation);
        return std::pair{std::move(p), s->version};
    }

    void run_claims(std::vector<std::shared_ptr<claim_request>>& batch, global_session& db) {
        std::chrono::milliseconds pause{1};
        won_map won;
        std::unordered_map<std::string, row_read> rows;
        std::unordered_map<std::string, std::uint64_t> newest;  // ordered: each loser's pair's version
        const bool ordered = ctx_.opts.ordered_versions;
        // Step 1: the claim statement, autocommit (one round trip; the batch id makes an unanswered
        // commit resolvable).
        for (;;) {
            {  // withdraw what callers gave up on before it is sent
                std::lock_guard lk(claims_.m);
                std::erase_if(batch, [](const auto& c) { return c->st == claim_request::phase::abandoned; });
            }
            if (batch.empty()) return;
            IDEM_ASSERT(strictly_increasing(batch, [](const auto& c) { return c->k.view(); }),
                        "a claim batch holds its keys sorted, each once (request_queue::take)");
            // Ordered: one key per pair goes to the store, the batch's highest version (claim_ordered
            // says why); the lower ones are losers, answered after it by the read of step 2.
            std::unordered_map<std::string, std::pair<std::uint32_t, const claim_request*>> top;
            std::vector<std::string> pair_text;  // the items' pairs (reserved: items view them)
            std::vector<global_session::claim_item> items;
            items.reserve(batch.size());
            if (ordered) {
                pair_text.reserve(batch.size());
                for (const auto& c : batch)
                    if (auto pv = pair_of(c->k)) {
                        auto [it, fresh] = top.try_emplace(std::move(pv->first), pv->second, c.get());
                        if (!fresh && pv->second > it->second.first) it->second = {pv->second, c.get()};
                    }
            }
            for (const auto& c : batch) {
                global_session::claim_item item{c->k.view(), c->fp};
                if (ordered) {
                    auto pv = pair_of(c->k);
                    if (pv && top.at(pv->first).second != c.get()) continue;
                    if (pv) {
                        IDEM_ASSERT(pair_text.size() < pair_text.capacity(), "the items' pairs never reallocate");
                        item.pair = pair_text.emplace_back(std::move(pv->first));
                        item.version = pv->second;
                    }
                }
                items.push_back(item);
            }
            const std::int64_t batch_id = ctx_.next_batch_id();
            const std::int64_t lease_ms = std::max<std::int64_t>(
                1, std::chrono::duration_cast<std::chrono::milliseconds>(ctx_.opts.lease).count());
            batch_context::count(ctx_.n.claims_sent, batch.size());
            auto r = db.claim(batch_id, items, lease_ms, ctx_.node, ordered, won);
            if (r == global_session::result::in_doubt) {
                batch_context::count(ctx_.n.commits_in_doubt);
                ctx_.note_error(db.last_error());
                const auto committed = ctx_.resolve_batch(db, batch_id, &claims_);
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
                ctx_.note_error(db.last_error());
            }
            if (r == global_session::result::ok) break;
            if (r == global_session::result::fatal || !claims_.backoff(pause, ctx_.go.max_backoff)) {
                finish_claims(batch, nullptr, nullptr, nullptr);
                return;
            }
        }
        batch_context::count(ctx_.n.claim_batches);
        // Step 2: the losers' rows (a fresh snapshot: the winner that made our insert conflict has
        // committed). A read: retried alone on a transient failure, never the claims again.
        if (won.size() < batch.size() && !read_rows(batch, won, rows, ordered ? &newest : nullptr, db)) {
            rows.clear();
            newest.clear();
        }
        finish_claims(batch, &won, &rows, ordered ? &newest : nullptr);
    }

    /// Which keys of the batch this node holds now (the claim batch committed, its answer was lost).
    bool claimed_by_us(const std::vector<std::shared_ptr<claim_request>>& batch, std::int64_t batch_id, won_map& won,
                       global_session& db) {
        std::vector<std::string_view> keys;
        keys.reserve(batch.size());
        for (const auto& c : batch) keys.push_back(c->k.view());
        const std::string detail = rows::claim_batch_detail(batch_id);  // as the claim's SQL wrote it
        std::chrono::milliseconds pause{1};
        for (;;) {
            const auto r = db.claimed_by_us(keys, detail, ctx_.node, won);
            if (r == global_session::result::ok) return true;
            ctx_.note_error(db.last_error());
            if (r == global_session::result::fatal || !claims_.backoff(pause, ctx_.go.max_backoff)) return false;
        }
    }

    /// Reads the rows of the batch's keys not in `skip`. False when the store stayed unreachable
    /// until the batcher stopped.
    /// `newest` (ordered versions): also the newest version of each loser's pair, 0 for none (one
    /// statement, one snapshot with the rows).
    bool read_rows(const std::vector<std::shared_ptr<claim_request>>& batch, const won_map& skip,
                   global_session::row_map& rows, std::unordered_map<std::string, std::uint64_t>* newest,
                   global_session& db) {
        std::vector<std::string_view> losers, pairs;
        std::vector<std::string> pair_text;  // reserved: `pairs` views them
        pair_text.reserve(batch.size());
        for (const auto& c : batch)
            if (!skip.contains(std::string(c->k.view()))) {
                losers.push_back(c->k.view());
                if (newest) {
                    auto pv = pair_of(c->k);
                    pairs.push_back(pv ? std::string_view(pair_text.emplace_back(std::move(pv->first)))
                                       : std::string_view());
                }
            }
        std::chrono::milliseconds pause{1};
        for (;;) {
            const auto r = db.read_rows(losers, pairs, rows, newest);
            if (r == global_session::result::ok) return true;
            ctx_.note_error(db.last_error());
            if (r == global_session::result::fatal || !claims_.backoff(pause, ctx_.go.max_backoff)) return false;
        }
    }

    /// Hands each claim its verdict (null maps: error), withdraws won claims nobody waits for, and
    /// sends losers that found a RELEASED (or no) row round once more (three times at most).
    /// `newest` (ordered versions only): the pair's newest version per loser, read with `rows`; a
    /// loser whose record is absent or RELEASED while its pair is at a higher version is superseded.
    void finish_claims(std::vector<std::shared_ptr<claim_request>>& batch, const won_map* won,
                       const std::unordered_map<std::string, row_read>* rows,
                       const std::unordered_map<std::string, std::uint64_t>* newest) {
        IDEM_ASSERT((won == nullptr) == (rows == nullptr), "the rows are read only for a batch that committed");
        std::vector<std::shared_ptr<completion_request>> withdraw;
        std::vector<std::shared_ptr<claim_request>> again;
        {
            std::lock_guard lk(claims_.m);
            for (auto& c : batch) {
                const std::string k(c->k.view());
                if (won == nullptr) {
                    c->v = claim_request::verdict::error;
                } else if (auto w = won->find(k); w != won->end()) {
                    c->v = claim_request::verdict::won;
                    c->fence = w->second.first;
                    IDEM_ASSERT(c->fence != 0, "a claim the store granted carries its fence (at least 1)");
                    batch_context::count(ctx_.n.claims_won);
                } else if (auto rr = rows->find(k); rr != rows->end() && rr->second.state != record_state::released) {
                    c->v = claim_request::verdict::lost;
                    c->row_state = rr->second.state;
                    c->fence = rr->second.fence;
                    c->outcome = rr->second.outcome;
                    c->row_fp = rr->second.fp;
                    c->expired = rr->second.expired;
                    c->payload = rr->second.payload;  // copied: a retried batch may read the map again
                    batch_context::count(ctx_.n.claims_lost);
                } else if (const std::uint64_t n = superseding(c->k, newest); n != 0) {
                    c->v = claim_request::verdict::superseded;
                    c->outcome = n;
                    c->fence = rr != rows->end() ? rr->second.fence : 0;
                } else if (c->st != claim_request::phase::abandoned && c->retries < 3 && !claims_.stopping) {
                    // The row was released between our UPDATE and our read (or deleted by an operator):
                    // it is claimable again; try once more rather than report a state that is gone.
                    ++c->retries;
                    c->st = claim_request::phase::queued;
                    again.push_back(c);
                    continue;
                } else {
                    c->v = claim_request::verdict::lost;
                    c->row_state = record_state::processing;  // in_progress: the caller may ask again
                    batch_context::count(ctx_.n.claims_lost);
                }
                if (c->st == claim_request::phase::abandoned) {
                    if (c->v == claim_request::verdict::won) {  // nobody executes it: give it back at once
                        withdraw.push_back(completion_batcher::withdrawal(c->k, c->fence));
                        batch_context::count(ctx_.n.withdrawn);
                    }
                    continue;
                }
                c->st = claim_request::phase::done;
            }
            for (auto it = again.rbegin(); it != again.rend(); ++it) claims_.q.push_front(*it);
        }
        claims_.done.notify_all();
        for (auto& w : withdraw) completions_.queue_withdrawal(w);
    }

    /// The newest version of k's pair when it is above k's own (k is superseded), else 0.
    static std::uint64_t superseding(const key& k, const std::unordered_map<std::string, std::uint64_t>* newest) {
        if (newest == nullptr) return 0;
        const auto it = newest->find(std::string(k.view()));
        if (it == newest->end()) return 0;
        const auto s = k.split();
        return s && it->second > s->version ? it->second : 0;
    }

    batch_context& ctx_;
    completion_batcher& completions_;
    std::vector<std::unique_ptr<global_session>> dbs_;  // one per batcher thread
    request_queue<claim_request> claims_{/*drains=*/false};
    std::vector<std::thread> threads_;
};

}  // namespace idem::detail::global
