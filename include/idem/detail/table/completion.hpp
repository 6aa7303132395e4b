// idem/detail/table/completion.hpp: a claim's completion (record_table::complete's steps), its lease
// renewal (extend) and its doubt mark (hold_in_doubt). The hot path of succeed() and fail().
//
// Included by record_table.hpp, whose class declares these members: each definition is `inline`, as
// a definition in the class is, except those the class declares [[gnu::noinline]] (never inlined).
//
// Invariant: a completion linearizes at its CAS processing(fence) -> completing (4) (enter); only
// the thread holding completing writes the record's fields, and (5) publishes them. A claim_ref
// whose fence or incarnation is not the slot's is stale: it changes nothing.
#pragma once

#include <string_view>
#include <system_error>

#include "idem/detail/table/record_table.hpp"

namespace idem::detail::table {

/// complete() with a payload to attach. Out of line, and complete_as<false> has no payload
/// code at all: a completion without one costs what it cost before payloads existed.
template <template <class> class Atomic, class Clock>
std::error_code record_table<Atomic, Clock>::complete_with_payload(const key& k, claim_ref<Atomic>& c, slot_state to,
                                                                   std::uint64_t outcome, transition_cause cause,
                                                                   bool check_lease, bool await,
                                                                   std::string_view payload) noexcept {
    if (payload.size() > opts_.max_payload) return errc::invalid_argument;
    return complete_as<true>(k, c, to, outcome, cause, check_lease, await, payload);
}

/// complete()'s steps, WithPayload when a payload is attached (complete_with_payload).
///
/// Sync mode, durable before visible: a terminal result is published with the unconfirmed mark
/// (the doubt bit on a terminal word, its row's sequence number in lease_until) before the wait
/// for the commit; readers answer in_progress (in_doubt once the owner gave up waiting) until
/// the sink says the row is durable, then the recorded outcome. The owner clears the mark after
/// its commit; a reader that finds the row durable answers from the record either way.
///
/// Response payload (a terminal `to` only; ignored otherwise): errc::invalid_argument when it is
/// over options.max_payload, errc::capacity_exhausted when the payload budget of the claim's
/// generation is spent; either changes nothing (the claim stays held: retry or complete
/// without it). The bytes are copied into the arena while the record is completing, and the
/// transition offered carries a view of them there.
template <template <class> class Atomic, class Clock>
template <bool WithPayload>
inline std::error_code record_table<Atomic, Clock>::complete_as(const key& k, claim_ref<Atomic>& c, slot_state to,
                                                                std::uint64_t outcome, transition_cause cause,
                                                                bool check_lease, bool await,
                                                                std::string_view payload) noexcept {
    slot_type& s = *c.s;
    admission room(sink_);
    if (!room.take()) {  // before anything changes: a refusal leaves the claim as it was
        count(c_backpressure);
        return errc::backpressure;
    }
    std::uint64_t replaced = 0;
    if (std::error_code ec = enter(c, replaced, !check_lease)) return ec;
    IDEM_DEBUG_ASSERT(holds(s, c.word, slot_state::completing), "a completion writes only while it holds completing");
    const auto now = clock_.now();
    if (check_lease && s.lease_until.load(std::memory_order_relaxed) > now.count()) {  // relaxed: we hold completing
        s.word.store(replaced, std::memory_order_release);                             // (5) the owner renewed: not expired
        return errc::busy;
    }
    std::string_view stored{};  // the payload's bytes in the arena, for the sink
    if constexpr (WithPayload) {
        // Only now, holding completing: the generation cannot be recycled (its arenas reset)
        // while one of its records is not terminal, so the units are ours alone.
        if (!attach_payload(s, payload, stored)) {
            s.word.store(replaced, std::memory_order_release);  // (5) undo: nothing changed
            return errc::capacity_exhausted;
        }
    }
    // The transition (a copy of the key among its fields) is built only for a sink to take.
    const std::uint64_t seq =
        sink_ == nullptr
            ? 0
            : room.offer(transition{k, record_state::processing, durable_state(to), cause, state_word::fence(c.word),
                                    outcome,
                                    s.fingerprint.load(std::memory_order_relaxed),  // relaxed: we hold completing
                                    std::chrono::nanoseconds(0), now, stored});
    const bool unconfirmed = seq != 0 && is_terminal(to) && sink_->synchronous();
    if (leases_ != nullptr && (cause == transition_cause::succeed || cause == transition_cause::fail)) [[unlikely]]
        observe(k, now - std::chrono::nanoseconds(
                             s.updated.load(std::memory_order_relaxed)));  // relaxed: we hold completing; the claim time
    s.outcome.store(outcome, seqlock::field_store);                        // field_store: published by (5)
    s.updated.store(now.count(), seqlock::field_store);
    if (unconfirmed) s.lease_until.store(static_cast<std::int64_t>(seq), seqlock::field_store);
    const std::uint64_t done = state_word::with_state(c.word, to) | (unconfirmed ? state_word::doubt_bit : 0);
    s.word.store(done, std::memory_order_release);  // (5)
    count_here(to == slot_state::succeeded ? c_succeeded : to == slot_state::failed ? c_failed : c_released);
    if (!await || seq == 0 || !sink_->synchronous()) return {};
    const durability_wait w = sink_->await(seq);
    if (unconfirmed) confirm(s, done, seq, w == durability_wait::committed);
    if (w == durability_wait::committed) return {};
    return w == durability_wait::rejected ? errc::store_error : errc::store_unavailable;
}

/// Renews a claim's lease (and clears a doubt mark: the owner is alive). Progress: lock-free.
template <template <class> class Atomic, class Clock>
inline std::error_code record_table<Atomic, Clock>::extend(claim_ref<Atomic>& c, std::chrono::nanoseconds by) noexcept {
    IDEM_DEBUG_ASSERT(holds_claim(c), "extend() takes an acquired claim's claim_ref");
    slot_type& s = *c.s;
    std::uint64_t replaced = 0;
    if (std::error_code ec = enter(c, replaced)) return ec;
    s.lease_until.store((clock_.now() + by).count(), seqlock::field_store);  // field_store: published by (5)
    s.word.store(c.word, std::memory_order_release);                         // (5)
    return {};
}

/// The owner says its operation ran (or may have run) and its completion could not be
/// recorded: the claim stays PROCESSING, marked in doubt now (duplicates answer in_doubt, the
/// doubt is audited), and compensation asks the resolver once the lease expires. Never
/// releases the key. When the mark cannot be written (the queue is full, or compensation
/// holds the record), the claim is left as it is: the lease and the resolver decide the same
/// way, only the duplicates see in_progress until then. Progress: lock-free.
template <template <class> class Atomic, class Clock>
inline void record_table<Atomic, Clock>::hold_in_doubt(const key& k, claim_ref<Atomic>& c) noexcept {
    IDEM_DEBUG_ASSERT(holds_claim(c), "hold_in_doubt() takes an acquired claim's claim_ref");
    slot_type& s = *c.s;
    admission room(sink_);
    if (!room.take()) return;
    std::uint64_t replaced = 0;
    if (enter(c, replaced)) return;  // stale (counted, like a drop's) or busy: someone else decides
    IDEM_DEBUG_ASSERT(holds(s, c.word, slot_state::completing), "a doubt mark is written only while holding completing");
    const auto now = clock_.now();
    if (sink_ != nullptr)
        (void)room.offer(transition{k, record_state::processing, record_state::processing, transition_cause::doubt,
                                    state_word::fence(c.word), 0,
                                    s.fingerprint.load(std::memory_order_relaxed),  // relaxed: we hold completing
                                    std::chrono::nanoseconds(0), now});
    s.word.store(c.word | state_word::doubt_bit, std::memory_order_release);  // (5)
    if (!state_word::in_doubt(replaced)) count(c_in_doubt);                   // a claim is counted in doubt once
}

/// Moves the claim's slot from processing(fence) (with or without the doubt mark) into
/// completing. `replaced` receives the exact word replaced, for an undo.
template <template <class> class Atomic, class Clock>
inline std::error_code record_table<Atomic, Clock>::enter(claim_ref<Atomic>& c, std::uint64_t& replaced,
                                                          bool by_owner) noexcept {
    slot_type& s = *c.s;
    const std::uint64_t busy = state_word::with_state(c.word, slot_state::completing);
    for (std::uint64_t expected : {c.word, c.word | state_word::doubt_bit}) {
        const std::uint64_t want = expected;
        if (s.word.compare_exchange_strong(expected, busy, std::memory_order_seq_cst)) {  // (4)
            seqlock::writer_fence();                                                      // (9)
            replaced = want;
            return {};
        }
        // Someone holds the record for a moment (compensation, a reclaim that may withdraw, or
        // a doubt mark being written): the claim may still be ours.
        const bool same_life = state_word::incarnation(expected) == state_word::incarnation(c.word);
        const slot_state st = state_word::state(expected);
        if (same_life && ((st == slot_state::completing && state_word::fence(expected) == state_word::fence(c.word)) ||
                          (st == slot_state::claiming && state_word::fence(expected) == state_word::fence(c.word) + 1)))
            return errc::busy;
        if (expected != (c.word | state_word::doubt_bit)) break;
    }
    if (by_owner) count(c_stale);
    return errc::stale_ticket;
}

/// After the owner's wait for its terminal row: a commit clears the unconfirmed mark; a wait
/// that ended without one records that the owner gave up (through the transient completing, so
/// readers see the flag and the word together). Either CAS fails only if the record moved on.
template <template <class> class Atomic, class Clock>
inline void record_table<Atomic, Clock>::confirm(slot_type& s, std::uint64_t marked, std::uint64_t seq,
                                                 bool committed) noexcept {
    std::uint64_t expected = marked;
    if (committed) {
        s.word.compare_exchange_strong(expected, marked & ~state_word::doubt_bit, std::memory_order_seq_cst);  // (4)
        return;
    }
    if (!s.word.compare_exchange_strong(expected, state_word::with_state(marked, slot_state::completing),
                                        std::memory_order_seq_cst))  // (4)
        return;
    seqlock::writer_fence();  // (9)
    s.lease_until.store(static_cast<std::int64_t>(seq | gave_up_flag),
                        seqlock::field_store);        // field_store: published by (5)
    s.word.store(marked, std::memory_order_release);  // (5)
}

}  // namespace idem::detail::table
