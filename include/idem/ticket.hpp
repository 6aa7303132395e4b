// idem/ticket.hpp: the claim, a move-only RAII handle.
//
// A ticket is the right to execute one key's operation, held by exactly one caller. Complete it with
// succeed() or fail(); a ticket dropped without completion is released per options.on_failure
// (retryable: the key can be claimed again; terminal: the key becomes FAILED), and audited.
// Thread-safety: a ticket is used by one thread at a time; it may move between threads.
// Progress: every member is lock-free (wait-free when the claim is still current).
#pragma once

#include <chrono>
#include <cstdint>
#include <system_error>
#include <thread>
#include <utility>

#include "idem/detail/engine.hpp"

namespace idem {

template <template <class> class Atomic, class Clock>
class basic_guard;

template <template <class> class Atomic = std::atomic, class Clock = steady_clock_source>
class [[nodiscard]] basic_ticket {
public:
    using engine_type = detail::engine<Atomic, Clock>;

    basic_ticket() noexcept = default;
    basic_ticket(basic_ticket&& o) noexcept
        : engine_(std::exchange(o.engine_, nullptr)), ref_(o.ref_), key_(o.key_) {}
    basic_ticket& operator=(basic_ticket&& o) noexcept {
        if (this != &o) {
            drop();
            engine_ = std::exchange(o.engine_, nullptr);
            ref_ = o.ref_;
            key_ = o.key_;
        }
        return *this;
    }
    basic_ticket(const basic_ticket&) = delete;
    basic_ticket& operator=(const basic_ticket&) = delete;
    ~basic_ticket() { drop(); }

    /// True while the ticket holds an uncompleted claim.
    [[nodiscard]] bool valid() const noexcept { return engine_ != nullptr; }
    explicit operator bool() const noexcept { return valid(); }

    /// The claim's fencing token (0 for an empty ticket).
    [[nodiscard]] std::uint64_t fence() const noexcept {
        return engine_ ? detail::state_word::fence(ref_.word) : 0;
    }
    [[nodiscard]] const key& get_key() const noexcept { return key_; }

    /// Records success with an outcome replayed to duplicates. errc::stale_ticket when the claim was
    /// compensated or reclaimed meanwhile (nothing changes), errc::empty_ticket when moved from or
    /// already completed, errc::backpressure when the flush queue is full or errc::busy when
    /// compensation holds the record for a moment (the ticket stays valid: retry),
    /// errc::store_unavailable in sync mode when the commit could not be confirmed (the success is
    /// recorded in memory and queued, not yet durable: duplicates see in_doubt until it commits),
    /// errc::store_error in sync mode when the store set the row aside as one it can never take.
    /// errc::backpressure changes nothing: room in the queue is reserved before the record moves.
    std::error_code succeed(std::uint64_t outcome = 0) noexcept {
        return finish(detail::slot_state::succeeded, outcome, transition_cause::succeed);
    }

    /// Records failure with the guard's failure policy.
    std::error_code fail(std::uint64_t code = 0) noexcept {
        return engine_ ? fail(code, engine_->opts().on_failure) : make_error_code(errc::empty_ticket);
    }

    /// Records failure: terminal (duplicates see FAILED) or retryable (the key may be claimed again).
    std::error_code fail(std::uint64_t code, failure_policy policy) noexcept {
        return policy == failure_policy::terminal
                   ? finish(detail::slot_state::failed, code, transition_cause::fail)
                   : finish(detail::slot_state::released, code, transition_cause::release);
    }

    /// Renews the lease to now + `by`. errc::stale_ticket if the claim is no longer this ticket's
    /// (the ticket becomes empty), errc::busy if compensation holds the record for a moment.
    std::error_code extend(std::chrono::nanoseconds by) noexcept {
        if (!engine_) return errc::empty_ticket;
        std::error_code ec = engine_->extend(ref_, by);
        if (ec == errc::stale_ticket) engine_ = nullptr;  // the claim is gone; dropping must not release it
        return ec;
    }

private:
    friend class basic_guard<Atomic, Clock>;
    basic_ticket(engine_type* e, detail::claim_ref<Atomic> ref, const key& k) noexcept
        : engine_(e), ref_(ref), key_(k) {}

    std::error_code finish(detail::slot_state to, std::uint64_t outcome, transition_cause cause) noexcept {
        if (!engine_) return errc::empty_ticket;
        std::error_code ec = engine_->complete(key_, ref_, to, outcome, cause);
        if (ec != errc::backpressure && ec != errc::busy) engine_ = nullptr;  // done or stale: the claim is gone
        return ec;
    }

    void drop() noexcept {
        if (!engine_) return;
        // A dropped claim must not stay PROCESSING until its lease runs out. Retry briefly while
        // compensation holds the record; under backpressure the lease and compensation take over.
        for (int i = 0; i < 64 && engine_; ++i) {
            if (fail(0, engine_->opts().on_failure) != errc::busy) break;
            std::this_thread::yield();
        }
        engine_ = nullptr;
    }

    engine_type* engine_ = nullptr;
    detail::claim_ref<Atomic> ref_{};
    key key_{};
};

using ticket = basic_ticket<>;

}  // namespace idem
