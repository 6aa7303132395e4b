// idem/detail/recovery/clock_map.hpp: a stored record on the guard's clock. The mapping between the
// guard's clock and the Unix milliseconds every stored time is written in (at_ms, updated_time,
// lease_until), the idempotency window judged on it, and a stored record turned into the answer a
// recall gives the table. Plain values and functions, no thread: the durable guard (durable.hpp),
// its flush pipeline and the simulation (verify/sim_test.cpp) all use these, so they convert alike.
//
// Invariant: one clock judges the window. The mapping is taken once, when a durable guard is built
// (clock_map::at_start), and every stored time is written with it; recovery, recalls and the
// flusher's prune all take "now" from it (clock_map::now_ms), so each compares a record's time with
// a now on the clock that time was written on. system_clock is not read again: after a suspend
// (the guard's steady clock stops, the wall clock does not) or a wall-clock step it differs from the
// mapping by the step, and a bound taken from it would prune records still inside the window after a
// step forward (keys the cold window still answers for would run again) and keep records past it
// after a step back.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "idem/detail/rows/record_rules.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/store.hpp"
#include "idem/store_rows.hpp"
#include "idem/transition.hpp"

namespace idem::detail::recovery {

/// The idempotency window (store_options::window): how long a decision is remembered at all.
struct window {
    std::chrono::milliseconds length = forever;

    /// Whether a record last updated at `updated_ms` (Unix ms) is past the window at `now_ms`.
    [[nodiscard]] bool past(std::int64_t updated_ms, std::int64_t now_ms) const noexcept {
        return length != forever && updated_ms < now_ms - length.count();
    }
    /// The window in the guard clock's nanoseconds, as the table's cold window takes it (max(): forever).
    [[nodiscard]] std::chrono::nanoseconds on_clock() const noexcept {
        constexpr auto limit = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::nanoseconds::max());
        if (length == forever || length >= limit) return std::chrono::nanoseconds::max();
        return length;
    }
};

/// The guard's clock mapped to Unix ms: `clock_base` on the guard's clock is `wall_base_ms`.
class clock_map {
public:
    constexpr clock_map(std::chrono::nanoseconds clock_base, std::int64_t wall_base_ms) noexcept
        : clock_base_(clock_base), wall_base_ms_(wall_base_ms) {}

    /// The mapping a durable guard takes when it is built: the guard clock's now is system_clock's now.
    [[nodiscard]] static clock_map at_start(std::chrono::nanoseconds clock_now) noexcept {
        return {clock_now,
                std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                    .count()};
    }

    /// A guard-clock time in Unix ms.
    [[nodiscard]] std::int64_t to_wall_ms(std::chrono::nanoseconds t) const noexcept {
        return wall_base_ms_ + std::chrono::duration_cast<std::chrono::milliseconds>(t - clock_base_).count();
    }

    /// A stored Unix time (ms) on the guard's clock. The store's times are data read from disk: one
    /// more than 100 years from the mapping (either way) is a damaged row, and would overflow the
    /// nanosecond arithmetic, so it is refused as corrupt_record naming the store, the key and the column.
    [[nodiscard]] std::chrono::nanoseconds from_wall_ms(std::int64_t ms, std::string_view k, const char* column,
                                                        const store& st) const {
        if (std::string why = rows::wall_time_fault(ms, wall_base_ms_, column); !why.empty())
            throw error(errc::corrupt_record, st.name() + ": record '" + key::printable(k) + "' has " + why);
        return clock_base_ + std::chrono::milliseconds(ms - wall_base_ms_);
    }

private:
    std::chrono::nanoseconds clock_base_;
    std::int64_t wall_base_ms_;
};

/// A record the store returned for a key of the cold window (`rec`, none when it has no record), as
/// the table takes it (transition_sink::recall): a terminal or released record past the window is
/// no record (the key is new again); a claim is kept whatever its age (compensation decides it).
/// The payload comes along: it is the response a duplicate of an evicted key is answered with.
/// Throws corrupt_record for a stored time the mapping cannot hold (from_wall_ms).
[[nodiscard]] inline recalled to_recalled(const stored_record* rec, const clock_map& clock, const window& w,
                                          std::int64_t now_ms, const store& st) {
    recalled out;
    if (rec == nullptr || rec->state == record_state::absent ||
        (rec->state != record_state::processing && w.past(rec->updated_ms, now_ms)))
        return out;
    out.found = recalled::kind::record;
    out.state = rec->state;
    out.fence = rec->fence;
    out.outcome = rec->outcome;
    out.fingerprint = rec->fingerprint;
    out.payload = rec->payload;
    out.lease_until = rec->state == record_state::processing
                          ? clock.from_wall_ms(rec->lease_until_ms, rec->key, "lease_until", st)
                          : std::chrono::nanoseconds(0);
    out.updated = clock.from_wall_ms(rec->updated_ms, rec->key, "updated_time", st);
    return out;
}

}  // namespace idem::detail::recovery
