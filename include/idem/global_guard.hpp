// idem/global_guard.hpp: scope::global, exactly-once claims shared by processes and machines through
// one PostgreSQL (target idem::postgres) or one MariaDB (target idem::mysql; mysql:// URIs).
//
//   idem::options o;                       // o.lease: the claim's lease in the store; o.resolve: compensation
//   idem::global_guard g("postgresql://idem@db.internal/payments", o);
//   auto r = g.begin(idem::key("TX1_TRANSFER_v1"), idem::fingerprint_of("alice->bob 100"));
//   switch (r.status) {
//     case idem::begin_status::acquired: (void)r.ticket.succeed(42); break;  // one caller, all nodes
//     case idem::begin_status::succeeded: break;     // the winner's outcome is r.outcome
//     default: break;                                // in_progress / in_doubt elsewhere, store_unavailable, ...
//   }
//
// The result shape, begin_wait(), run() and the ticket's completion are those of guard.hpp
// (guard_contract.hpp): code written against one scope runs against the other.
//
// The store's primary key decides every claim (detail/global/coordinator.hpp has the design; the
// arbiter's statements are detail/global/pg_sql.hpp or my_sql.hpp, behind arbiter.hpp); this
// process's in-memory table answers the keys it already knows (completed outcomes, its own live
// claims) without a round trip. Every other begin() waits for one batched transaction, shared with
// the claims of other threads (group commit). Completion and compensation are fenced UPDATEs whose
// row count decides; every transition is one audit row carrying this process's node identity.
// docs/scaling.md says what each scope guarantees and costs, and how to outgrow one PostgreSQL.
// On MariaDB options.ordered_versions is refused (invalid_argument): only PostgreSQL orders versions.
// options.ordered_versions orders the versions of composed keys across every process sharing the
// store (superseded; docs/api.md, "Ordered versions in global scope"): the store's version table
// decides, so it holds across restarts; every process sharing a store must use the same setting.
//
// Thread-safety: every member of global_guard may be called from any thread concurrently; a ticket is
// used by one thread at a time and must not outlive its guard. Progress: begin() of a key this
// process knows is lock-free; anything that reaches the store blocks, bounded by
// global_options::wait_timeout (a store that does not answer gives store_unavailable, never a hang).
//
// Not guaranteed: what the local table caches outlives nothing: a restarted process asks the store
// again (a round trip per key it meets). Keys must be valid UTF-8 (PostgreSQL text; the same rule on
// MariaDB, so a key space can move between arbiters): any other key,
// and the placeholder key{}, is answered invalid_key at once (nothing is touched; retrying cannot
// help). Fences of answers from the local table are 0 (the store's fence is
// reported only when the store answered). A claim's lease is measured on the SERVER's clock.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "idem/detail/assert.hpp"
#include "idem/detail/global/coordinator.hpp"
#include "idem/global_options.hpp"

namespace idem {

class global_guard;
class regional_guard;

/// The claim in scope::global: move-only, rolled back (per options.on_failure, audited) when dropped
/// without completion. Completion waits for the completion batch holding it. succeed(), fail() and
/// the drop are the ones of every scope (guard_contract.hpp).
class [[nodiscard]] global_ticket : public detail::ticket_contract<global_ticket> {
public:
    /// succeed(outcome, payload) stores the response payload with the record, in the store, and
    /// every node replays it (ticket_contract; typed run() results stored as payloads work here).
    static constexpr bool carries_payloads = true;

    global_ticket() noexcept = default;
    global_ticket(global_ticket&& o) noexcept
        : coordinator_(std::exchange(o.coordinator_, nullptr)),
          claim_(std::move(o.claim_)),
          ran_(std::exchange(o.ran_, false)) {}
    global_ticket& operator=(global_ticket&& o) noexcept {
        if (this != &o) {
            drop();
            coordinator_ = std::exchange(o.coordinator_, nullptr);
            claim_ = std::move(o.claim_);
            ran_ = std::exchange(o.ran_, false);
        }
        return *this;
    }
    global_ticket(const global_ticket&) = delete;
    global_ticket& operator=(const global_ticket&) = delete;
    ~global_ticket() { drop(); }

    [[nodiscard]] bool valid() const noexcept { return coordinator_ != nullptr; }
    /// The store's fencing token of this claim (0 for an empty ticket).
    [[nodiscard]] std::uint64_t fence() const noexcept { return coordinator_ ? claim_->fence : 0; }
    /// The key (an empty placeholder key for a ticket that never held a claim).
    [[nodiscard]] const key& get_key() const noexcept {
        static const key none{};
        return claim_ ? claim_->k : none;
    }

    // succeed(outcome) and fail(code[, policy]) answer, in this scope: {} once committed;
    // stale_ticket when the claim was compensated meanwhile (nothing changed); store_unavailable
    // when the store did not confirm within wait_timeout (the completion stays queued and is written
    // when the store answers) or when it could not even be queued (out of memory: nothing is
    // written; the claim stays PROCESSING in the store until its lease expires and compensation
    // resolves it). Until the store committed a success, this process's duplicates see in_progress
    // (other processes: in_progress, in_doubt once the lease expired), never succeeded. The ticket is
    // empty afterwards in every case: this scope never answers backpressure or busy. A terminal
    // failure is FAILED (replayed); a retryable one RELEASED (claimable again, fence + 1).
    // succeed(outcome, payload) also answers invalid_argument when payload.size() >
    // options.max_payload (nothing changed, the ticket stays valid: succeed again, or fail); the
    // payload is written by the same fenced UPDATE as SUCCESS, so a duplicate on any node gets both
    // or neither. It never answers capacity_exhausted: options.payload_budget bounds only this
    // process's cache of terminal records, and a payload it cannot cache is asked of the store.

    /// Renews the lease in the store to now + by (server clock). stale_ticket empties the ticket.
    std::error_code extend(std::chrono::nanoseconds by) noexcept {
        if (!coordinator_) return errc::empty_ticket;
        const std::error_code ec = coordinator_->extend(claim_->k, claim_->fence, by);
        if (ec == errc::stale_ticket) {
            coordinator_ = nullptr;
            (void)claim_->local.fail(0, failure_policy::retryable);
        }
        return ec;
    }

private:
    friend class global_guard;
    friend class detail::ticket_contract<global_ticket>;
    // The claim lives on the heap: an empty ticket (every answer but `acquired`) is two pointers, so
    // a duplicate answered from the local table costs no more than in process scope. (A key is 129
    // bytes; zeroing two of them per answer, and reading back across the zeroing, measurably did.)
    struct claim {
        key k;
        std::uint64_t fence;
        ticket local;
    };
    global_ticket(detail::global::coordinator* e, std::unique_ptr<claim> c) noexcept
        : coordinator_(e), claim_(std::move(c)) {}

    [[nodiscard]] failure_policy on_failure() const noexcept { return coordinator_->opts().on_failure; }
    void forget() noexcept { coordinator_ = nullptr; }
    /// leave_in_doubt(): the store's record stays PROCESSING until its lease expires and
    /// compensation asks the resolver; this process's duplicates answer in_doubt meanwhile.
    void hold() noexcept {
        IDEM_DEBUG_ASSERT(coordinator_ != nullptr && claim_, "ticket_contract holds only a valid ticket");
        coordinator_ = nullptr;
        claim_->local.leave_in_doubt();
    }

    std::error_code finish(transition_cause cause, std::uint64_t outcome, std::string_view payload = {}) noexcept {
        IDEM_DEBUG_ASSERT(coordinator_ != nullptr && claim_, "ticket_contract finishes only a valid ticket");
        // Refused before anything is queued: the ticket stays valid (ticket_contract's rule).
        if (payload.size() > coordinator_->opts().max_payload) return errc::invalid_argument;
        const record_state to = cause == transition_cause::succeed ? record_state::succeeded
                                : cause == transition_cause::fail  ? record_state::failed
                                                                   : record_state::released;
        detail::global::coordinator* e = std::exchange(coordinator_, nullptr);
        return e->complete(claim_->k, claim_->fence, to, outcome, cause, std::move(claim_->local), payload);
    }

    detail::global::coordinator* coordinator_ = nullptr;
    std::unique_ptr<claim> claim_;
    bool ran_ = false;  ///< a success or terminal failure was refused: a drop leaves the claim in doubt
};

/// The answer of global_guard::begin(): the result shape of every scope. fence is the store's when
/// the store answered, 0 when the local table did.
using global_begin_result = begin_result_of<global_ticket>;

class global_guard : public detail::guard_contract<global_guard> {
public:
    using ticket_type = global_ticket;
    using result_type = global_begin_result;

    /// Opens go.claim_connections + go.completion_connections + 2 connections to `uri` (claim and
    /// completion batchers, compensation, schema and reads); creates or checks the schema and the
    /// partial index on expired claims. Starts a batcher thread per connection, and a maintenance
    /// thread (every options.maintenance_interval): a compensation pass when options.resolve is set,
    /// then the local table's recycling of records older than options.retention. Throws idem::error:
    /// invalid_argument (options; checked before any connection is attempted), store_unavailable
    /// (cannot connect), store_error (schema).
    explicit global_guard(std::string uri, options opts = {}, global_options go = {})
        : coordinator_(std::make_unique<detail::global::coordinator>(std::move(uri), std::move(opts), std::move(go))) {}

    /// Removes records past global_options::window and audit rows past audit_window now (the
    /// maintenance thread also does it every prune_interval). A key whose record is gone is new
    /// again on every node. Throws idem::error (store_unavailable, store_error).
    prune_result prune() { return coordinator_->prune(); }
    global_guard(const global_guard&) = delete;
    global_guard& operator=(const global_guard&) = delete;

    /// Claims `k` across every process sharing the store, or says what its record is. invalid_key
    /// for key{} and for a key that is not valid UTF-8, at once, touching nothing. With
    /// options.ordered_versions, superseded (outcome: the newest version) when a higher version of
    /// k's (txid, operation) was claimed on any node and k has no record (or a RELEASED one).
    global_begin_result begin(const key& k, std::uint64_t fingerprint = 0) noexcept {
        return begin_via(k, fingerprint, [](const key&) noexcept { return std::optional<detail::global::found_row>(); });
    }

    // begin_wait(key, fingerprint, timeout) and run(key, fn, run_options) come from
    // detail::guard_contract (guard_contract.hpp): the same in every scope. Here an attempt that
    // reaches the store costs a round trip, so wait_backoff spaces them by up to ten round trips.

    /// What this process's table knows about `k` (absent when it never asked). Lock-free.
    [[nodiscard]] record_view query(const key& k) const noexcept { return coordinator_->query(k); }
    /// The key's row in the store (a round trip).
    [[nodiscard]] std::optional<stored_record> lookup(std::string_view k) { return coordinator_->lookup(k); }
    /// The key's audit trail in the store (a round trip).
    [[nodiscard]] std::vector<audit_entry> audit(std::string_view k) { return coordinator_->audit(k); }

    /// One compensation pass now (the maintenance thread runs one every maintenance_interval).
    /// Returns how many expired claims this node resolved.
    std::size_t compensate() { return coordinator_->compensate(); }

    [[nodiscard]] global_stats snapshot() const noexcept { return coordinator_->snapshot(); }
    /// The last store error seen (for messages), empty when none.
    [[nodiscard]] std::string last_error() const { return coordinator_->last_error(); }
    /// This process's node identity, as written into the audit trail.
    [[nodiscard]] const std::string& node() const noexcept { return coordinator_->node(); }
    [[nodiscard]] const options& opts() const noexcept { return coordinator_->opts(); }

private:
    friend class detail::guard_contract<global_guard>;
    friend class regional_guard;

    /// begin(), asking `replica(k)` (a std::optional<found_row>, noexcept) after the local table
    /// and before the store: a SUCCESS or FAILED row it returns answers the claim, and is cached
    /// like the store's answer (regional_guard reads its region's replica of a foreign home this
    /// way); anything else, or nothing, goes to the store.
    template <class Replica>
    global_begin_result begin_via(const key& k, std::uint64_t fingerprint, Replica&& replica) noexcept {
        // A key the store can never hold is refused before anything is touched (coordinator::accepts).
        if (!detail::global::coordinator::accepts(k)) [[unlikely]]
            return {begin_status::invalid_key, global_ticket(), 0, 0};
        // The local table answers what this process knows (inline: no call, no intermediate answer).
        auto lr = coordinator_->local().begin(k, fingerprint);
        if (lr.status != begin_status::acquired) return {lr.status, global_ticket(), lr.outcome, 0, std::move(lr.payload)};
        if (auto row = replica(k); row && (row->state == record_state::succeeded || row->state == record_state::failed)) {
            auto a = detail::global::answer_from_row(fingerprint, lr.ticket, std::move(*row));
            return {a.status, global_ticket(), a.outcome, a.fence, std::move(a.payload)};
        }
        auto a = coordinator_->claim(k, fingerprint, std::move(lr));
        if (a.status == begin_status::acquired) {
            std::unique_ptr<global_ticket::claim> c;
            try {
                c.reset(new global_ticket::claim{k, a.fence, std::move(*a.local)});
            } catch (...) {  // out of memory: give the claim back (the local ticket in `a` releases it locally)
                if (a.local)
                    (void)coordinator_->complete(k, a.fence, record_state::released, 0, transition_cause::release,
                                                 std::move(*a.local));
                return {begin_status::store_unavailable, global_ticket(), 0, a.fence};
            }
            return {a.status, global_ticket(coordinator_.get(), std::move(c)), 0, a.fence};
        }
        return {a.status, global_ticket(), a.outcome, a.fence, std::move(a.payload)};
    }

    /// run()'s words for the answers only this scope gives its reasons for.
    [[nodiscard]] std::string refusal_message(begin_status st, const key& k) const {
        const std::string name = "key '" + key::printable(k.view()) + "'";
        switch (st) {
            case begin_status::capacity_exhausted: return name + ": local table full";
            case begin_status::backpressure: return name + ": queue full";
            case begin_status::store_unavailable:
                return name + ": the store did not confirm the claim; not executed (" + coordinator_->last_error() + ")";
            case begin_status::invalid_key: return name + " " + detail::global::coordinator::refusal(k) + "; not executed";
            default: return name + ": " + to_string(st);
        }
    }

    std::unique_ptr<detail::global::coordinator> coordinator_;
};

}  // namespace idem
