// idem/detail/table/record_image.hpp: a record as a store holds it, on its way into a slot.
//
// Two paths put a stored record into the table: recovery (record_table::restore, before the guard
// is shared) and the cold window (record_table::recall, a record read back for a key memory no
// longer holds). Both describe the record as one record_image and hand it to one install step
// (record_table::install, restore.hpp), so the mapping record_state -> slot_state, the fence's
// range and the payload's place are written once.
//
// Invariant: a record image is installed only when representable(): a state other than absent and
// a fence in 1 .. state_word::max_fence (the slot word's 52 bits). The limits a stored row is
// checked against (detail/rows/record_rules.hpp) are the table's limits, static_asserted below, so
// a row every store accepts is an image the table can hold.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "idem/detail/rows/record_rules.hpp"
#include "idem/detail/table/slot.hpp"
#include "idem/detail/table/snapshot.hpp"
#include "idem/options.hpp"
#include "idem/transition.hpp"

namespace idem::detail::table {

static_assert(state_word::max_fence + 1 == rows::fence_limit,
              "a store accepts exactly the fences a slot word can hold (52 bits)");
static_assert(options::max_payload_limit == rows::payload_hard_max,
              "a store accepts exactly the payloads an option can admit (1 MiB)");

/// The record state a slot's state shows: transient states are the claim (processing); vacant and
/// recycling hold no record.
[[nodiscard]] constexpr record_state durable_state(slot_state s) noexcept {
    switch (s) {
        case slot_state::claiming:
        case slot_state::processing:
        case slot_state::completing: return record_state::processing;
        case slot_state::succeeded: return record_state::succeeded;
        case slot_state::failed: return record_state::failed;
        case slot_state::released: return record_state::released;
        default: return record_state::absent;
    }
}

/// The slot state a stored record is installed in: durable_state's inverse on the states a record
/// has (absent has no slot: vacant).
[[nodiscard]] constexpr slot_state slot_state_of(record_state s) noexcept {
    switch (s) {
        case record_state::processing: return slot_state::processing;
        case record_state::succeeded: return slot_state::succeeded;
        case record_state::failed: return slot_state::failed;
        case record_state::released: return slot_state::released;
        default: return slot_state::vacant;
    }
}

/// One stored record as the table takes it (the key travels beside it). Members in the order
/// recovery reads them from a row: {state, fence, outcome, fingerprint, lease_until, updated,
/// payload}. `payload` views bytes the caller keeps alive until the install returns; it is kept
/// only with a succeeded or failed record.
struct record_image {
    record_state state = record_state::absent;
    std::uint64_t fence = 0;
    std::uint64_t outcome = 0;
    std::uint64_t fingerprint = 0;
    std::chrono::nanoseconds lease_until{0};  ///< on the guard's clock
    std::chrono::nanoseconds updated{0};      ///< on the guard's clock
    std::string_view payload{};

    /// The record a store recalled (r.found == record); views r's payload.
    [[nodiscard]] static record_image of(const recalled& r) noexcept {
        return {r.state, r.fence, r.outcome, r.fingerprint, r.lease_until, r.updated, r.payload};
    }

    /// A state with a record and a fence the slot word can hold.
    [[nodiscard]] constexpr bool representable() const noexcept {
        return state != record_state::absent && fence != 0 && fence <= state_word::max_fence;
    }
    [[nodiscard]] constexpr bool terminal() const noexcept {
        return state == record_state::succeeded || state == record_state::failed;
    }
    /// The payload goes into the payload arena with the record (a terminal record's only).
    [[nodiscard]] constexpr bool carries_payload() const noexcept { return terminal() && !payload.empty(); }

    /// The slot's fields once installed with `incarnation` (identity and key_ref are the slot's
    /// own, not the image's): what install() publishes and what a reader of the slot would see.
    [[nodiscard]] snapshot as_snapshot(std::uint64_t incarnation) const noexcept {
        snapshot s;
        s.word = state_word::make(slot_state_of(state), incarnation, fence);
        s.outcome = outcome;
        s.fingerprint = fingerprint;
        s.lease_until = lease_until.count();
        s.updated = updated.count();
        s.valid = true;
        return s;
    }
};

}  // namespace idem::detail::table
