// idem/detail/table/slot.hpp: one record slot and its packed state word.
//
// A slot is one cache line in a generation's slot arena. Its identity is the key's keyed 128-bit
// hash (lo, hi), written once per incarnation by the claimer that took it, while it holds claiming,
// and published with the slot's number in the generation's index (record_table.hpp, (2')); its life is
// the packed state word below, changed only by compare-and-swap (or by a release store from a
// transient state that only one thread can hold).
//
// State word, 64 bits:
//
//   63                                        12 11          4    3    2     0
//  +--------------------------------------------+-------------+------+-------+
//  |                 fence (52)                 | incarnation |doubt | state |
//  +--------------------------------------------+-------------+------+-------+
//
//   state        slot_state below
//   doubt        a processing claim whose lease expired and whose resolver answered unknown
//   incarnation  bumped each time the slot's identity is reset (generation recycle), so a reader
//                that validated (word, identity, word) never mixes two keys' fields
//   fence        strictly increasing per key, (generation << 32) | count; a ticket presents it on completion
//
// Transitions (every arrow is one CAS on the word unless marked "store", which only the thread that
// moved the slot into the transient state may do):
//
//   vacant | released --CAS--> claiming --store--> processing
//   processing --CAS--> completing --store--> succeeded | failed | released | processing (extend)
//   processing --CAS--> processing+doubt                        (resolver answered unknown)
//   terminal --CAS--> recycling --store--> vacant(incarnation+1) (generation recycle, identity reset)
//
// The response payload of a terminal record lives in the generation's payload arena; its reference
// lives in the key arena's entry of the record, flagged in key_ref (no room is left in the line).
//
// Fields other than the word (lease, outcome, fingerprint, updated, key_ref) are written only while the
// writer holds a transient state (claiming / completing / recycling) and are published by the
// release store that leaves it; readers validate with a seqlock read (word, fields, fence, word).
#pragma once

#include <atomic>
#include <cstdint>
#include <type_traits>

namespace idem::detail::table {

enum class slot_state : std::uint64_t {
    vacant = 0,      ///< identity may be set; never claimed in this generation
    claiming = 1,    ///< transient: the winner of a claim is writing the fields
    processing = 2,  ///< claimed; the owner holds a ticket with this fence
    completing = 3,  ///< transient: the owner (or compensation) is writing the final fields
    succeeded = 4,   ///< terminal
    failed = 5,      ///< terminal
    released = 6,    ///< retryable failure or not executed: claimable again with fence + 1
    recycling = 7,   ///< transient: generation recycle is resetting the identity
};

struct state_word {
    static constexpr std::uint64_t state_mask = 0x7;
    static constexpr std::uint64_t doubt_bit = 1ull << 3;
    static constexpr unsigned incarnation_shift = 4;
    static constexpr std::uint64_t incarnation_mask = 0xffull << incarnation_shift;
    static constexpr unsigned fence_shift = 12;
    /// The largest fence: every bit above the incarnation (52). record_image.hpp ties it to the
    /// fences every store accepts (detail/rows/record_rules.hpp, fence_limit).
    static constexpr std::uint64_t max_fence = (1ull << (64 - fence_shift)) - 1;

    [[nodiscard]] static constexpr slot_state state(std::uint64_t w) noexcept {
        return static_cast<slot_state>(w & state_mask);
    }
    [[nodiscard]] static constexpr std::uint64_t fence(std::uint64_t w) noexcept { return w >> fence_shift; }
    [[nodiscard]] static constexpr std::uint64_t incarnation(std::uint64_t w) noexcept {
        return (w & incarnation_mask) >> incarnation_shift;
    }
    [[nodiscard]] static constexpr bool in_doubt(std::uint64_t w) noexcept { return (w & doubt_bit) != 0; }

    [[nodiscard]] static constexpr std::uint64_t make(slot_state s, std::uint64_t incarnation, std::uint64_t fence,
                                                      bool doubt = false) noexcept {
        return static_cast<std::uint64_t>(s) | (doubt ? doubt_bit : 0) |
               ((incarnation << incarnation_shift) & incarnation_mask) | (fence << fence_shift);
    }
    /// The same word with another state (and the doubt bit cleared).
    [[nodiscard]] static constexpr std::uint64_t with_state(std::uint64_t w, slot_state s) noexcept {
        return (w & ~(state_mask | doubt_bit)) | static_cast<std::uint64_t>(s);
    }
};

static_assert(state_word::fence(state_word::make(slot_state::processing, 255, state_word::max_fence)) ==
                  state_word::max_fence,
              "the fence must survive packing next to state, doubt bit and incarnation");

[[nodiscard]] constexpr bool is_terminal(slot_state s) noexcept {
    return s == slot_state::succeeded || s == slot_state::failed;
}
[[nodiscard]] constexpr bool is_claimable(slot_state s) noexcept {
    return s == slot_state::vacant || s == slot_state::released;
}
[[nodiscard]] constexpr bool is_transient(slot_state s) noexcept {
    return s == slot_state::claiming || s == slot_state::completing || s == slot_state::recycling;
}

/// One record. Every field is an atomic so that racing readers are well defined (and visible to
/// ThreadSanitizer and Relacy); the protocol in the header comment makes the values consistent.
template <template <class> class Atomic>
struct alignas(64) slot {
    Atomic<std::uint64_t> lo{0};           // identity, low half of the keyed hash; 0 = no identity
    Atomic<std::uint64_t> hi{0};           // identity, high half; 0 = not yet written
    Atomic<std::uint64_t> word{0};         // packed state word (bit map above)
    Atomic<std::int64_t> lease_until{0};   // nanoseconds on the guard's clock
    Atomic<std::uint64_t> outcome{0};      // recorded outcome code (success value or failure code)
    Atomic<std::uint64_t> fingerprint{0};  // request fingerprint of the claim; 0 = none given
    Atomic<std::int64_t> updated{0};       // nanoseconds on the guard's clock of the last transition
    Atomic<std::uint64_t> key_ref{0};      // where the key text lives in the generation's arena; 0 = none.
                                           // Bit 63: the record has a response payload, its reference in
                                           // the generation's payload table (arenas.hpp, key_arena::has_payload)
};

/// True when slot s holds `w` moved into the transient state `st`, by the caller: only the thread
/// whose CAS (or (4')) moved it there writes the fields, and it leaves with (5). For assertions: a
/// relaxed load, which orders nothing.
template <template <class> class Atomic>
[[nodiscard]] bool holds(const slot<Atomic>& s, std::uint64_t w, slot_state st) noexcept {
    return s.word.load(std::memory_order_relaxed) == state_word::with_state(w, st);
}

static_assert(sizeof(slot<std::atomic>) == 64, "a slot is exactly one cache line: one miss per lookup");
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "the state word must be a lock-free atomic, or the hot path is not lock-free");
static_assert(sizeof(std::atomic<std::uint64_t>) == sizeof(std::uint64_t) && std::is_standard_layout_v<slot<std::atomic>>,
              "slots are mapped from zero pages: an atomic must be just its integer");

}  // namespace idem::detail::table
