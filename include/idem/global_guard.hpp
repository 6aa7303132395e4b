// idem/global_guard.hpp: scope::global, exactly-once claims shared by processes and machines through
// one PostgreSQL (target idem::postgres).
//
//   idem::options o;                       // o.lease: the claim's lease in the store; o.resolve: compensation
//   idem::global_guard g("postgresql://idem@db.internal/payments", o);
//   auto r = g.begin(idem::key("TX1_TRANSFER_v1"), fingerprint);
//   switch (r.status) {
//     case idem::begin_status::acquired:  execute(); r.ticket.succeed(42); break;   // one caller, all nodes
//     case idem::begin_status::succeeded: reply(r.outcome); break;                  // the winner's outcome
//     default: reply_busy(r.status);     // in_progress / in_doubt elsewhere, store_unavailable, ...
//   }
//
// The store's primary key decides every claim (detail/global_engine.hpp has the design); this
// process's in-memory table answers the keys it already knows (completed outcomes, its own live
// claims) without a round trip. Every other begin() waits for one batched transaction, shared with
// the claims of other threads (group commit). Completion and compensation are fenced UPDATEs whose
// row count decides; every transition is one audit row carrying this process's node identity.
// docs/scaling.md says what each scope guarantees and costs, and how to outgrow one PostgreSQL.
//
// Thread-safety: every member of global_guard may be called from any thread concurrently; a ticket is
// used by one thread at a time and must not outlive its guard. Progress: begin() of a key this
// process knows is lock-free; anything that reaches the store blocks, bounded by
// global_options::wait_timeout (a store that does not answer gives store_unavailable, never a hang).
//
// Not guaranteed: what the local table caches outlives nothing: a restarted process asks the store
// again (a round trip per key it meets). Keys must be valid UTF-8 (PostgreSQL text): any other key,
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

#include "idem/detail/global_engine.hpp"

namespace idem {

class global_guard;

/// The claim in scope::global: move-only, rolled back (per options.on_failure, audited) when dropped
/// without completion. Completion waits for the completion batch holding it.
class [[nodiscard]] global_ticket {
public:
    global_ticket() noexcept = default;
    global_ticket(global_ticket&& o) noexcept : engine_(std::exchange(o.engine_, nullptr)), claim_(std::move(o.claim_)) {}
    global_ticket& operator=(global_ticket&& o) noexcept {
        if (this != &o) {
            drop();
            engine_ = std::exchange(o.engine_, nullptr);
            claim_ = std::move(o.claim_);
        }
        return *this;
    }
    global_ticket(const global_ticket&) = delete;
    global_ticket& operator=(const global_ticket&) = delete;
    ~global_ticket() { drop(); }

    [[nodiscard]] bool valid() const noexcept { return engine_ != nullptr; }
    explicit operator bool() const noexcept { return valid(); }
    /// The store's fencing token of this claim (0 for an empty ticket).
    [[nodiscard]] std::uint64_t fence() const noexcept { return engine_ ? claim_->fence : 0; }
    /// The key (an empty placeholder key for a ticket that never held a claim).
    [[nodiscard]] const key& get_key() const noexcept {
        static const key none{};
        return claim_ ? claim_->k : none;
    }

    /// Records success: {} once committed; stale_ticket when the claim was compensated meanwhile
    /// (nothing changed); store_unavailable when the store did not confirm within wait_timeout (the
    /// success stays queued and is written when the store answers) or when it could not even be
    /// queued (out of memory: nothing is written; the claim stays PROCESSING in the store until its
    /// lease expires and compensation resolves it). Until the store committed the success, this
    /// process's duplicates see in_progress (other processes: in_progress, in_doubt once the lease
    /// expired), never succeeded. The ticket is empty afterwards in every case.
    std::error_code succeed(std::uint64_t outcome = 0) noexcept {
        return finish(record_state::succeeded, outcome, transition_cause::succeed);
    }
    /// Records failure with options.on_failure.
    std::error_code fail(std::uint64_t code = 0) noexcept {
        return engine_ ? fail(code, engine_->opts().on_failure) : make_error_code(errc::empty_ticket);
    }
    /// Records failure: terminal (FAILED, replayed) or retryable (RELEASED: claimable again, fence + 1).
    std::error_code fail(std::uint64_t code, failure_policy policy) noexcept {
        return policy == failure_policy::terminal ? finish(record_state::failed, code, transition_cause::fail)
                                                  : finish(record_state::released, code, transition_cause::release);
    }
    /// Renews the lease in the store to now + by (server clock). stale_ticket empties the ticket.
    std::error_code extend(std::chrono::nanoseconds by) noexcept {
        if (!engine_) return errc::empty_ticket;
        const std::error_code ec = engine_->extend(claim_->k, claim_->fence, by);
        if (ec == errc::stale_ticket) {
            engine_ = nullptr;
            (void)claim_->local.fail(0, failure_policy::retryable);
        }
        return ec;
    }

private:
    friend class global_guard;
    // The claim lives on the heap: an empty ticket (every answer but `acquired`) is two pointers, so
    // a duplicate answered from the local table costs no more than in process scope. (A key is 129
    // bytes; zeroing two of them per answer, and reading back across the zeroing, measurably did.)
    struct claim {
        key k;
        std::uint64_t fence;
        ticket local;
    };
    global_ticket(detail::global_engine* e, std::unique_ptr<claim> c) noexcept : engine_(e), claim_(std::move(c)) {}

    std::error_code finish(record_state to, std::uint64_t outcome, transition_cause cause) noexcept {
        if (!engine_) return errc::empty_ticket;
        detail::global_engine* e = std::exchange(engine_, nullptr);
        return e->complete(claim_->k, claim_->fence, to, outcome, cause, std::move(claim_->local));
    }
    void drop() noexcept {
        if (engine_) (void)fail(0, engine_->opts().on_failure);
    }

    detail::global_engine* engine_ = nullptr;
    std::unique_ptr<claim> claim_;
};

struct [[nodiscard]] global_begin_result {
    begin_status status;
    global_ticket ticket;     ///< valid only when status == acquired
    std::uint64_t outcome = 0;  ///< succeeded: the winner's outcome; failed: its code
    std::uint64_t fence = 0;    ///< the store's fence when the store answered; 0 when the local table did
    explicit operator bool() const noexcept { return status == begin_status::acquired; }
};

class global_guard {
public:
    /// Opens go.claim_connections + go.completion_connections + 2 connections to `uri` (claim and
    /// completion batchers, compensation, schema and reads); creates or checks the schema and the
    /// partial index on expired claims. Starts a batcher thread per connection, and a maintenance
    /// thread (every options.maintenance_interval): a compensation pass when options.resolve is set,
    /// then the local table's recycling of records older than options.retention. Throws idem::error: invalid_argument (options),
    /// store_unavailable (cannot connect), store_error (schema).
    explicit global_guard(std::string uri, options opts = {}, global_options go = {})
        : engine_(std::make_unique<detail::global_engine>(std::move(uri), std::move(opts), std::move(go))) {}

    /// Removes records past global_options::window and audit rows past audit_window now (the
    /// maintenance thread also does it every prune_interval). A key whose record is gone is new
    /// again on every node. Throws idem::error (store_unavailable, store_error).
    prune_result prune() { return engine_->prune(); }
    global_guard(const global_guard&) = delete;
    global_guard& operator=(const global_guard&) = delete;

    /// Claims `k` across every process sharing the store, or says what its record is. invalid_key
    /// for key{} and for a key that is not valid UTF-8, at once, touching nothing.
    global_begin_result begin(const key& k, std::uint64_t fingerprint = 0) noexcept {
        // A key the store can never hold is refused before anything is touched (global_engine::accepts).
        if (!detail::global_engine::accepts(k)) [[unlikely]]
            return {begin_status::invalid_key, global_ticket(), 0, 0};
        // The local table answers what this process knows (inline: no call, no intermediate answer).
        auto lr = engine_->local().begin(k, fingerprint);
        if (lr.status != begin_status::acquired) return {lr.status, global_ticket(), lr.outcome, 0};
        auto a = engine_->claim(k, fingerprint, std::move(lr));
        if (a.status == begin_status::acquired) {
            std::unique_ptr<global_ticket::claim> c;
            try {
                c.reset(new global_ticket::claim{k, a.fence, std::move(*a.local)});
            } catch (...) {  // out of memory: give the claim back (the local ticket in `a` releases it locally)
                if (a.local) (void)engine_->complete(k, a.fence, record_state::released, 0, transition_cause::release,
                                                     std::move(*a.local));
                return {begin_status::store_unavailable, global_ticket(), 0, a.fence};
            }
            return {a.status, global_ticket(engine_.get(), std::move(c)), 0, a.fence};
        }
        return {a.status, global_ticket(), a.outcome, a.fence};
    }

    /// Like begin(), but while the key is in progress (here or on another node) asks again, with
    /// back-off (up to 10 ms between round trips), for up to `timeout`.
    global_begin_result begin_wait(const key& k, std::uint64_t fingerprint, std::chrono::nanoseconds timeout) noexcept {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        std::chrono::microseconds pause{50};
        for (;;) {
            auto r = begin(k, fingerprint);
            if (r.status != begin_status::in_progress || std::chrono::steady_clock::now() >= deadline) return r;
            std::this_thread::sleep_for(pause);
            pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(10));
        }
    }

    /// What this process's table knows about `k` (absent when it never asked). Lock-free.
    [[nodiscard]] record_view query(const key& k) const noexcept { return engine_->query(k); }
    /// The key's row in the store (a round trip).
    [[nodiscard]] std::optional<stored_record> lookup(std::string_view k) { return engine_->lookup(k); }
    /// The key's audit trail in the store (a round trip).
    [[nodiscard]] std::vector<audit_entry> audit(std::string_view k) { return engine_->audit(k); }

    /// Runs fn at most once per key across all processes sharing the store; as guard::run (in
    /// progress elsewhere: waits up to ro.wait, then throws errc::in_progress).
    template <class Fn>
    std::uint64_t run(const key& k, Fn&& fn, const run_options& ro = {}) {
        auto r = ro.wait > std::chrono::nanoseconds::zero() ? begin_wait(k, ro.fingerprint, ro.wait)
                                                            : begin(k, ro.fingerprint);
        auto name = [&k] { return "key '" + key::printable(k.view()) + "'"; };
        switch (r.status) {
            case begin_status::acquired: break;
            case begin_status::succeeded:
                if (ro.on_duplicate == duplicate_policy::replay) return r.outcome;
                throw error(errc::duplicate_request, name() + " already succeeded");
            case begin_status::failed:
                throw error(errc::duplicate_request, name() + " already failed terminally with code " + std::to_string(r.outcome));
            case begin_status::in_progress: throw error(errc::in_progress, name() + " is being executed by another caller");
            case begin_status::in_doubt:
                throw error(errc::in_doubt, name() + " has an expired claim whose outcome is unknown");
            case begin_status::payload_mismatch:
                throw error(errc::payload_mismatch, name() + " was used before with a different request payload");
            case begin_status::capacity_exhausted: throw error(errc::capacity_exhausted, name() + ": local table full");
            case begin_status::backpressure: throw error(errc::backpressure, name() + ": queue full");
            case begin_status::store_unavailable:
                throw error(errc::store_unavailable, name() + ": the store did not confirm the claim; not executed (" +
                                                         engine_->last_error() + ")");
            case begin_status::invalid_key:
                throw error(errc::invalid_key, name() + " " + detail::global_engine::refusal(k) + "; not executed");
        }
        std::uint64_t outcome = 0;
        if constexpr (std::is_void_v<std::invoke_result_t<Fn>>) {
            std::invoke(std::forward<Fn>(fn));
        } else {
            outcome = static_cast<std::uint64_t>(std::invoke(std::forward<Fn>(fn)));
        }
        if (const std::error_code ec = r.ticket.succeed(outcome))
            throw error(static_cast<errc>(ec.value()), name() + ": " + ec.message());
        return outcome;
    }

    /// One compensation pass now (the maintenance thread runs one every maintenance_interval).
    /// Returns how many expired claims this node resolved.
    std::size_t compensate() { return engine_->compensate(); }

    [[nodiscard]] global_stats snapshot() const noexcept { return engine_->snapshot(); }
    /// The last store error seen (for messages), empty when none.
    [[nodiscard]] std::string last_error() const { return engine_->last_error(); }
    /// This process's node identity, as written into the audit trail.
    [[nodiscard]] const std::string& node() const noexcept { return engine_->node(); }
    [[nodiscard]] const options& opts() const noexcept { return engine_->opts(); }

private:
    std::unique_ptr<detail::global_engine> engine_;
};

}  // namespace idem
