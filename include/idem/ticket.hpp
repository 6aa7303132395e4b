// idem/ticket.hpp: the claim, a move-only RAII handle.
//
//   auto complete = [](auto& ticket, bool charged) {   // idem::ticket, or global_guard.hpp's global_ticket
//       std::error_code ec = charged ? ticket.succeed(42) : ticket.fail(7, idem::failure_policy::terminal);
//       while (ec == idem::errc::backpressure) ec = ticket.succeed(42);  // durable: the queue is full
//       return !ec;                                    // stale_ticket: compensation decided meanwhile
//   };
//   idem::ticket empty;                                // what begin() returns unless acquired
//   const bool done = complete(empty, true);           // false: errc::empty_ticket
//   (void)done;
//
// A ticket is the right to execute one key's operation, held by exactly one caller. Complete it with
// succeed() or fail(); a ticket dropped without completion is released per options.on_failure
// (retryable: the key can be claimed again; terminal: the key becomes FAILED), and audited, unless
// a succeed() or terminal fail() was refused first (the effect happened): then it is left in doubt
// for the resolver, like leave_in_doubt(), and never released.
// succeed() and fail() are the ones of every scope (guard_contract.hpp); global_ticket has the
// same surface.
// Thread-safety: a ticket is used by one thread at a time; it may move between threads.
// Progress: every member is lock-free (wait-free when the claim is still current).
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "idem/detail/table/record_table.hpp"
#include "idem/guard_contract.hpp"

namespace idem {

template <template <class> class Atomic, class Clock>
class basic_guard;

template <template <class> class Atomic = std::atomic, class Clock = steady_clock_source>
class [[nodiscard]] basic_ticket : public detail::ticket_contract<basic_ticket<Atomic, Clock>> {
public:
    using table_type = detail::table::record_table<Atomic, Clock>;

    basic_ticket() noexcept = default;
    basic_ticket(basic_ticket&& o) noexcept
        : table_(std::exchange(o.table_, nullptr)), ref_(o.ref_), key_(o.key_), ran_(std::exchange(o.ran_, false)) {}
    basic_ticket& operator=(basic_ticket&& o) noexcept {
        if (this != &o) {
            this->drop();
            table_ = std::exchange(o.table_, nullptr);
            ref_ = o.ref_;
            key_ = o.key_;
            ran_ = std::exchange(o.ran_, false);
        }
        return *this;
    }
    basic_ticket(const basic_ticket&) = delete;
    basic_ticket& operator=(const basic_ticket&) = delete;
    ~basic_ticket() { this->drop(); }

    /// True while the ticket holds an uncompleted claim.
    [[nodiscard]] bool valid() const noexcept { return table_ != nullptr; }

    /// The claim's fencing token (0 for an empty ticket).
    [[nodiscard]] std::uint64_t fence() const noexcept { return table_ ? detail::table::state_word::fence(ref_.word) : 0; }
    [[nodiscard]] const key& get_key() const noexcept { return key_; }

    /// succeed(outcome, payload) records response bytes with the outcome (ticket_contract).
    static constexpr bool carries_payloads = true;

    // succeed(outcome), succeed(outcome, payload), fail(code) and fail(code, policy) come from
    // detail::ticket_contract. In this scope they answer: errc::stale_ticket when the claim was compensated or reclaimed meanwhile
    // (nothing changes), errc::empty_ticket when moved from or already completed,
    // errc::backpressure when the flush queue is full or errc::busy when compensation holds the
    // record for a moment (the ticket stays valid: retry), errc::store_unavailable in sync mode when
    // the commit could not be confirmed (the success is recorded in memory and queued, not yet
    // durable: duplicates see in_doubt until it commits), errc::store_error in sync mode when the
    // store set the row aside as one it can never take. errc::backpressure changes nothing: room in
    // the queue is reserved before the record moves. With a payload also: errc::invalid_argument
    // when it is over options.max_payload, errc::capacity_exhausted when options.payload_budget of
    // the claim's generation is spent; neither changes anything and the ticket stays valid (retry
    // later, complete without the payload, or fail()).

    /// Renews the lease to now + `by`. errc::stale_ticket if the claim is no longer this ticket's
    /// (the ticket becomes empty), errc::busy if compensation holds the record for a moment.
    std::error_code extend(std::chrono::nanoseconds by) noexcept {
        if (!table_) return errc::empty_ticket;
        std::error_code ec = table_->extend(ref_, by);
        if (ec == errc::stale_ticket) table_ = nullptr;  // the claim is gone; dropping must not release it
        return ec;
    }

private:
    friend class basic_guard<Atomic, Clock>;
    friend class detail::ticket_contract<basic_ticket>;
    basic_ticket(table_type* e, detail::table::claim_ref<Atomic> ref, const key& k) noexcept
        : table_(e), ref_(ref), key_(k) {}
    /// Takes a claim into an empty ticket in place (the guard fills its result without a move).
    void adopt(table_type* e, detail::table::claim_ref<Atomic> ref, const key& k) noexcept {
        table_ = e;
        ref_ = ref;
        key_ = k;
        ran_ = false;
    }

    [[nodiscard]] failure_policy on_failure() const noexcept { return table_->opts().on_failure; }
    void forget() noexcept { table_ = nullptr; }
    /// leave_in_doubt(): the claim is marked in doubt for the resolver (record_table::hold_in_doubt).
    void hold() noexcept {
        table_->hold_in_doubt(key_, ref_);
        table_ = nullptr;
    }

    std::error_code finish(transition_cause cause, std::uint64_t outcome, std::string_view payload = {}) noexcept {
        const detail::table::slot_state to = cause == transition_cause::succeed ? detail::table::slot_state::succeeded
                                             : cause == transition_cause::fail  ? detail::table::slot_state::failed
                                                                                : detail::table::slot_state::released;
        std::error_code ec = table_->complete(key_, ref_, to, outcome, cause, false, true, payload);
        // done or stale: the claim is gone. Refusals that change nothing keep it (retry).
        if (ec != errc::backpressure && ec != errc::busy &&
            (payload.empty() || (ec != errc::invalid_argument && ec != errc::capacity_exhausted)))
            table_ = nullptr;
        return ec;
    }

    table_type* table_ = nullptr;
    detail::table::claim_ref<Atomic> ref_{};
    key key_{};
    bool ran_ = false;  ///< a success or terminal failure was refused: a drop leaves the claim in doubt
};

using ticket = basic_ticket<>;

}  // namespace idem
