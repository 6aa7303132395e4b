// idem/detail/table/claim_steps.hpp: a claim's steps once record_table::claim() found where the key
// stands: try_claim (a known key: CAS (4)), claim_fresh (a new key, in the position its CAS (2)
// took), grant (the claim's fields, its offer to the sink, processing (5)). A fresh claim's hot path.
//
// Included by record_table.hpp, whose class declares these members: each definition is `inline`, as
// a definition in the class is, except those the class declares [[gnu::noinline]] (never inlined).
//
// Invariant: a claim is granted only in the epoch it started in: each step re-reads the epoch (6)
// after its first step (the CAS (2) or (4)) and withdraws when a rotation (7) overtook it. Only the
// claimer holding claiming writes the claim's fields (asserted in debug builds).
#pragma once

#include <optional>
#include <string>

#include "idem/detail/table/record_table.hpp"

namespace idem::detail::table {

/// CAS `seen` -> claiming(fence). nullopt: the CAS lost or the claim was withdrawn (retry).
template <template <class> class Atomic, class Clock>
inline auto record_table<Atomic, Clock>::try_claim(slot_type& s, generation<Atomic>& gen, std::uint64_t seen,
                                                   std::uint64_t fence, record_state from, const key& k,
                                                   std::uint64_t fingerprint, std::uint64_t epoch, transition_cause cause,
                                                   admission& room, std::string* payload) noexcept
    -> std::optional<begin_answer> {
    if (fence > state_word::max_fence) {
        count(c_capacity);
        return begin_answer{begin_status::capacity_exhausted, {}, 0, 0};
    }
    const std::uint64_t inc = state_word::incarnation(seen);
    std::uint64_t expected = seen;
    if (!s.word.compare_exchange_strong(expected, state_word::make(slot_state::claiming, inc, fence),
                                        std::memory_order_seq_cst))  // (4) pairs with (6)(7)
        return std::nullopt;
    seqlock::writer_fence();  // (9)
    const auto now = clock_.now();
    if (epoch_.load(std::memory_order_seq_cst) != epoch ||  // (6) a rotation overtook us: withdraw
        (cause == transition_cause::reclaim &&
         s.lease_until.load(std::memory_order_relaxed) > now.count())) {  // relaxed: we hold claiming; renewed
        s.word.store(seen, std::memory_order_release);                    // (5)
        return std::nullopt;
    }
    return grant(s, gen, seen, fence, from, k, fingerprint, cause, now, room, payload);
}

/// A first claim of the key in this generation: the position `e` of its probe sequence is ours
/// (its CAS (2) is the claim's first step); checks the epoch, takes a slot from this thread's
/// chunk, moves it vacant -> claiming, writes its identity and publishes it in the position
/// (2'). nullopt: withdrawn (a rotation overtook us; the position stays withdrawn), retry.
template <template <class> class Atomic, class Clock>
inline auto record_table<Atomic, Clock>::claim_fresh(index_entry<Atomic>& e, generation<Atomic>& gen, hash128 h,
                                                     std::uint64_t fence, record_state from, const key& k,
                                                     std::uint64_t fingerprint, std::uint64_t epoch,
                                                     std::chrono::nanoseconds now, admission& room,
                                                     std::string* payload) noexcept -> std::optional<begin_answer> {
    if (epoch_.load(std::memory_order_seq_cst) != epoch) {  // (6) a rotation overtook us: withdraw
        position::withdraw(e, h);
        return std::nullopt;
    }
    // The epoch is current, so this generation cannot be recycled (its arenas reset) while the
    // position is pending: a pending position blocks recycling like a claim in progress.
    const std::uint64_t n = fence > state_word::max_fence ? slot_arena<Atomic>::npos : gen.slots().alloc(my_stripe_here());
    if (n == slot_arena<Atomic>::npos) {
        position::withdraw(e, h);
        count(c_capacity);
        return begin_answer{begin_status::capacity_exhausted, {}, 0, 0};
    }
    slot_type& s = gen.slots().at(n);
    // A slot handed out is vacant, without identity (zero page, or reset by a recycle that left
    // its incarnation counting), and nobody else can change its word now: a CAS needs a
    // snapshot with the caller's identity (this slot has none yet), and a stale thread holding
    // the slot from an earlier life has a word of an earlier incarnation. So a plain store
    // (4') moves it to claiming, before the identity is written: afterwards a stale thread acts
    // only on a matching identity and a claiming word, which it leaves alone.
    const std::uint64_t seen = s.word.load(std::memory_order_acquire);  // (3)
    const std::uint64_t inc = state_word::incarnation(seen);
    IDEM_DEBUG_ASSERT(state_word::state(seen) == slot_state::vacant,
                      "a slot the arena hands out is vacant (a zero page, or reset by a recycle)");
    if (state_word::state(seen) != slot_state::vacant) {
        position::withdraw(e, h);  // never expected (asserted above); a release build leaves the slot unused
        return std::nullopt;
    }
    // release: a reader that acquires this word also sees the recycle's reset of the identity
    // (which this thread saw through (6)), so it cannot validate the identity of an earlier life.
    s.word.store(state_word::make(slot_state::claiming, inc, fence), std::memory_order_release);  // (4')
    seqlock::writer_fence();                                                                      // (9)
    s.lo.store(h.lo, seqlock::field_store);  // field_store: published by (2')
    s.hi.store(h.hi, seqlock::field_store);
    s.key_ref.store(0, seqlock::field_store);
    position::publish(e, h, n);  // (2') the slot, claiming, with its identity
    return grant(s, gen, seen, fence, from, k, fingerprint, transition_cause::claim, now, room, payload);
}

/// Another caller is placing the key's first slot in this generation right now.
template <template <class> class Atomic, class Clock>
inline auto record_table<Atomic, Clock>::pending_claim() noexcept -> begin_answer {
    count(c_in_progress);
    return {begin_status::in_progress, {}, 0, 0};
}

/// The claim is ours (the slot holds claiming(fence), replacing `seen`): writes its fields,
/// offers it to the sink under the reservation `room` (taken before the claim, so the offer
/// cannot be refused) and publishes it as processing, or undoes it (full key arena).
template <template <class> class Atomic, class Clock>
inline auto record_table<Atomic, Clock>::grant(slot_type& s, generation<Atomic>& gen, std::uint64_t seen,
                                               std::uint64_t fence, record_state from, const key& k,
                                               std::uint64_t fingerprint, transition_cause cause,
                                               std::chrono::nanoseconds now, admission& room, std::string* payload) noexcept
    -> std::optional<begin_answer> {
    const std::uint64_t inc = state_word::incarnation(seen);
    IDEM_DEBUG_ASSERT(s.word.load(std::memory_order_relaxed) == state_word::make(slot_state::claiming, inc, fence),
                      "a claim's fields are written only by its claimer, holding claiming(fence)");
    const unsigned granted = cause == transition_cause::reclaim ? c_reclaimed : c_acquired;
    // Ordered versions: the recheck (version_map.hpp, "Linearization"). The claim is visible
    // now (racing callers see in_progress); a newer version whose step came meanwhile refuses it.
    if (versions_[0] != nullptr) [[unlikely]] {
        if (const auto newer = newer_version(k, gen)) {
            s.word.store(seen, std::memory_order_release);  // (5) undo: nothing changed
            count(c_superseded);
            return begin_answer{begin_status::superseded, {}, *newer, 0};
        }
    }
    // A key memory does not know may still be in the store's window: ask it before granting.
    // The slot holds claiming meanwhile, so racing callers are answered in_progress.
    if (from == record_state::absent && cause == transition_cause::claim && cold_ != nullptr &&
        cold_->may_contain(s.lo.load(std::memory_order_relaxed),
                           s.hi.load(std::memory_order_relaxed))) {  // relaxed: we hold claiming
        if (auto answered = recall(s, gen, seen, k, fingerprint, from, payload)) return answered;
    }
    if (s.key_ref.load(std::memory_order_relaxed) == 0) {  // relaxed: we hold claiming
        // First claim of the key in this generation: its text goes to the arena (a released or
        // reclaimed record keeps the text of its first claim: same identity, same key).
        const std::uint64_t ref = gen.keys().append(k, my_stripe_here());
        if (ref == 0) {
            s.word.store(seen, std::memory_order_release);  // (5) undo: nothing changed
            count(c_capacity);
            return begin_answer{begin_status::capacity_exhausted, {}, 0, 0};
        }
        s.key_ref.store(ref, seqlock::field_store);  // field_store: published by (5)
    }
    // Counted before the field writes below: on a shared stripe count() is a locked RMW, a full
    // barrier on x86 that waits for the thread's pending stores, and the fields' cache misses
    // would be among them (on an owned stripe it is a plain store). The stores before this
    // point (the key text just appended; on a fresh slot its claiming word (4') and identity)
    // are in lines this thread wrote a moment ago. Counting before publishing only makes
    // outstanding() err on scanning.
    count_here(granted);
    const auto lease_until = now + lease_for(k);
    s.fingerprint.store(fingerprint, seqlock::field_store);  // field_store: published by (5)
    s.lease_until.store(lease_until.count(), seqlock::field_store);
    s.updated.store(now.count(), seqlock::field_store);
    const std::uint64_t seq =  // the transition is built only for a sink to take
        sink_ == nullptr
            ? 0
            : room.offer(transition{k, from, record_state::processing, cause, fence, 0, fingerprint, lease_until, now});
    const std::uint64_t processing = state_word::make(slot_state::processing, inc, fence);
    s.word.store(processing, std::memory_order_release);  // (5)
    claim_ref<Atomic> ref{&s, processing};
    if (seq != 0 && sink_->synchronous()) {
        const durability_wait w = sink_->await(seq);
        if (w != durability_wait::committed) {
            // Not durable: do not grant. Withdraw if the queue takes the withdrawal; otherwise
            // the lease runs out and compensation asks the resolver (which will answer
            // not_executed). The caller is told now: the withdrawal is queued, not awaited.
            (void)complete(k, ref, slot_state::released, 0, transition_cause::not_durable, false, /*await=*/false);
            return begin_answer{
                w == durability_wait::rejected ? begin_status::invalid_key : begin_status::store_unavailable, {}, 0, fence};
        }
    }
    return begin_answer{begin_status::acquired, ref, 0, fence};
}

}  // namespace idem::detail::table
