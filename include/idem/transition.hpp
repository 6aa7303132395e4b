// idem/transition.hpp: what the guard tells a durable pipeline about each state change.
//
// The guard hands every transition (claim, completion, release, compensation, doubt) to an optional
// transition_sink: it reserves room first, then makes the in-memory CAS, then offers the transition.
// A sink must not allocate or block in reserve() or offer(); in sync mode await() blocks until the
// transition is durable.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>

#include "idem/detail/enum_print.hpp"
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

namespace detail {
/// The enumerator's name, or nullptr for a value record_state does not name.
[[nodiscard]] constexpr const char* name_of(record_state v) noexcept {
    switch (v) {
        case record_state::absent: return "absent";
        case record_state::processing: return "processing";
        case record_state::succeeded: return "succeeded";
        case record_state::failed: return "failed";
        case record_state::released: return "released";
    }
    return nullptr;
}
}  // namespace detail

/// Prints the enumerator's name (`succeeded`; to_string gives the store's `SUCCESS`), or
/// `record_state(n)` for a value it does not name.
template <class CharT, class Traits>
std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os, record_state v) {
    return detail::print_enum(os, detail::name_of(v), "record_state", v);
}

/// Why a transition happened; stored in the audit trail's `detail` column.
enum class transition_cause : std::uint8_t {
    claim,        ///< begin() granted a claim
    reclaim,      ///< an expired claim was taken over (reclaim_expired)
    succeed,      ///< ticket.succeed()
    fail,         ///< ticket.fail() with the terminal policy
    release,      ///< ticket.fail() retryable, or the ticket was dropped
    compensate,   ///< the resolver decided an expired claim
    doubt,        ///< the resolver could not decide: the claim stays PROCESSING in doubt
    not_durable,  ///< sync mode: the claim could not be made durable and was withdrawn
    imported,     ///< `idem import` wrote it from another system's table (tools/import.hpp): the
                  ///< old system's decision, or its claim in doubt
};

namespace detail {
/// The enumerator's name, or nullptr for a value transition_cause does not name.
[[nodiscard]] constexpr const char* name_of(transition_cause v) noexcept {
    switch (v) {
        case transition_cause::claim: return "claim";
        case transition_cause::reclaim: return "reclaim";
        case transition_cause::succeed: return "succeed";
        case transition_cause::fail: return "fail";
        case transition_cause::release: return "release";
        case transition_cause::compensate: return "compensate";
        case transition_cause::doubt: return "doubt";
        case transition_cause::not_durable: return "not_durable";
        case transition_cause::imported: return "imported";
    }
    return nullptr;
}
}  // namespace detail

[[nodiscard]] constexpr const char* to_string(transition_cause c) noexcept {
    const char* name = detail::name_of(c);
    return name != nullptr ? name : "?";
}

/// Prints the enumerator's name, or `transition_cause(n)` for a value it does not name.
template <class CharT, class Traits>
std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os, transition_cause v) {
    return detail::print_enum(os, detail::name_of(v), "transition_cause", v);
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
    /// The response bytes a completion recorded with its outcome (empty: none; claims carry none).
    /// The bytes live in the guard's payload arena of the record's generation, which is not
    /// recycled before the sink has flushed everything offered: a sink reads them until then.
    std::string_view payload{};
};

/// How a sync wait for one transition ended.
enum class durability_wait : std::uint8_t {
    committed,  ///< the batch holding it committed
    timed_out,  ///< not committed before the deadline (the row stays queued): errc::store_unavailable
    rejected,   ///< the store can never take the row; it was set aside (stats::rejected_rows)
};

namespace detail {
/// The enumerator's name, or nullptr for a value durability_wait does not name.
[[nodiscard]] constexpr const char* name_of(durability_wait v) noexcept {
    switch (v) {
        case durability_wait::committed: return "committed";
        case durability_wait::timed_out: return "timed_out";
        case durability_wait::rejected: return "rejected";
    }
    return nullptr;
}
}  // namespace detail

/// Prints the enumerator's name, or `durability_wait(n)` for a value it does not name.
template <class CharT, class Traits>
std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os, durability_wait v) {
    return detail::print_enum(os, detail::name_of(v), "durability_wait", v);
}

/// What the store says about a key memory does not hold (transition_sink::recall), with its
/// times on the guard's clock.
struct recalled {
    enum class kind : std::uint8_t {
        absent,       ///< no record, or one past the idempotency window: the key is new
        record,       ///< the record below
        unavailable,  ///< the store could not be read in time: nothing may be decided
    };
    kind found = kind::absent;
    record_state state = record_state::absent;
    std::uint64_t fence = 0;
    std::uint64_t outcome = 0;
    std::uint64_t fingerprint = 0;
    std::chrono::nanoseconds lease_until{0};
    std::chrono::nanoseconds updated{0};
    std::string payload;  ///< the response bytes recorded with the outcome (empty: none)
};

namespace detail {
/// The enumerator's name, or nullptr for a value recalled::kind does not name.
[[nodiscard]] constexpr const char* name_of(recalled::kind v) noexcept {
    switch (v) {
        case recalled::kind::absent: return "absent";
        case recalled::kind::record: return "record";
        case recalled::kind::unavailable: return "unavailable";
    }
    return nullptr;
}
}  // namespace detail

/// Prints the enumerator's name, or `recalled::kind(n)` for a value it does not name.
template <class CharT, class Traits>
std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os, recalled::kind v) {
    return detail::print_enum(os, detail::name_of(v), "recalled::kind", v);
}

/// Receives transitions from the hot path. Implementation: detail::flush_pipeline.
///
/// Admission is by reservation: the guard reserves room before it changes anything in memory, so a
/// refusal (backpressure) leaves no trace: no sequence number, no index position, no allocation.
/// Every transition offered under a reservation is taken.
class transition_sink {
public:
    virtual ~transition_sink() = default;
    /// Room for one transition. False when the queue is full (after the sink's bounded wait, if
    /// any): the guard answers backpressure and has changed nothing. Lock-free, no allocation.
    [[nodiscard]] virtual bool reserve() noexcept = 0;
    /// Gives back a reservation that will not be used (the claim was lost to another caller).
    virtual void unreserve() noexcept = 0;
    /// Enqueues t under a reservation taken before; returns its sequence number (> 0). Never fails,
    /// never allocates; blocks only for an instant while the flusher hands a node back.
    [[nodiscard]] virtual std::uint64_t offer(const transition& t) noexcept = 0;
    /// Sync mode: blocks until the transition with `seq` is decided or the sink's deadline passes.
    [[nodiscard]] virtual durability_wait await(std::uint64_t seq) noexcept = 0;
    /// Whether the transition with `seq` is committed now. Never blocks.
    [[nodiscard]] virtual bool durable(std::uint64_t seq) const noexcept = 0;
    /// True when begin()/succeed() must wait for await() before they return (group commit).
    [[nodiscard]] virtual bool synchronous() const noexcept = 0;
    /// Whether the store can hold key k at all (store::accepts); on refusal fills *why (if given)
    /// with the rule. The guard answers invalid_key before a claim of a key it cannot.
    [[nodiscard]] virtual bool accepts(const key& k, std::string* why = nullptr) const noexcept {
        (void)k;
        (void)why;
        return true;
    }
    /// Reads key k's record from the store, for a key the guard's cold window says the store may
    /// remember. Blocks (deadline-bounded); the rare path of a duplicate after eviction. Default:
    /// a sink without a store to ask knows nothing.
    [[nodiscard]] virtual recalled recall(const key& k) noexcept {
        (void)k;
        return {};
    }
};

}  // namespace idem
