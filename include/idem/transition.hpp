// idem/transition.hpp: what the guard tells a durable pipeline about each state change.
//
// The guard hands every transition (claim, completion, release, compensation, doubt) to an optional
// transition_sink right after the in-memory CAS that made it. A sink must not allocate or block in
// offer() unless it runs in sync mode, where await() blocks until the transition is durable.
#pragma once

#include <chrono>
#include <cstdint>

#include "idem/key.hpp"

namespace idem {

/// The durable states, named as in the store's `status` column. absent = no record; released =
/// a claim given back (retryable failure, not executed): claimable again, its fence kept.
enum class record_state : std::uint8_t { absent = 0, processing = 1, succeeded = 2, failed = 3, released = 4 };

[[nodiscard]] constexpr const char* to_string(record_state s) noexcept {
    switch (s) {
        case record_state::absent: return "ABSENT";
        case record_state::processing: return "PROCESSING";
        case record_state::succeeded: return "SUCCESS";
        case record_state::failed: return "FAILED";
        case record_state::released: return "RELEASED";
    }
    return "?";
}

/// Why a transition happened; stored in the audit trail's `detail` column.
enum class transition_cause : std::uint8_t {
    claim,            ///< begin() granted a claim
    reclaim,          ///< an expired claim was taken over (reclaim_expired)
    succeed,          ///< ticket.succeed()
    fail,             ///< ticket.fail() with the terminal policy
    release,          ///< ticket.fail() retryable, or the ticket was dropped
    compensate,       ///< the resolver decided an expired claim
    doubt,            ///< the resolver could not decide: the claim stays PROCESSING in doubt
    not_durable,      ///< sync mode: the claim could not be made durable and was withdrawn
};

[[nodiscard]] constexpr const char* to_string(transition_cause c) noexcept {
    switch (c) {
        case transition_cause::claim: return "claim";
        case transition_cause::reclaim: return "reclaim";
        case transition_cause::succeed: return "succeed";
        case transition_cause::fail: return "fail";
        case transition_cause::release: return "release";
        case transition_cause::compensate: return "compensate";
        case transition_cause::doubt: return "doubt";
        case transition_cause::not_durable: return "not_durable";
    }
    return "?";
}

struct transition {
    key k;
    record_state from = record_state::absent;
    record_state to = record_state::absent;
    transition_cause cause = transition_cause::claim;
    std::uint64_t fence = 0;
    std::uint64_t outcome = 0;
    std::uint64_t fingerprint = 0;
    std::chrono::nanoseconds lease_until{0};  ///< on the guard's clock
    std::chrono::nanoseconds at{0};           ///< on the guard's clock
};

/// Receives transitions from the hot path. Implementations: the flush pipeline of the stores.
class transition_sink {
public:
    virtual ~transition_sink() = default;
    /// Enqueue without blocking or allocating. Returns a sequence number > 0, or 0 when the queue is
    /// full (the guard then reports errc::backpressure and undoes nothing already acknowledged).
    [[nodiscard]] virtual std::uint64_t offer(const transition& t) noexcept = 0;
    /// Sync mode: block until the batch holding `seq` committed. False when the store could not be
    /// reached before the pipeline's deadline (the caller gets errc::store_unavailable).
    [[nodiscard]] virtual bool await(std::uint64_t seq) noexcept = 0;
    /// True when begin()/succeed() must wait for await() before they return (group commit).
    [[nodiscard]] virtual bool synchronous() const noexcept = 0;
};

}  // namespace idem
