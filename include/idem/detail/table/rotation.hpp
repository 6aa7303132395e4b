// idem/detail/table/rotation.hpp: what maintenance runs on the table: compensation (the resolver's
// answer for each expired claim) and the rotation (the previous generation recycled, its terminal
// records evicted into the cold window, the epoch moved (7)).
//
// Included by record_table.hpp, whose class declares these members: each definition is `inline`, as
// a definition in the class is, except those the class declares [[gnu::noinline]] (never inlined).
//
// Invariants: a claim whose lease expired is never re-executed blindly: the resolver decides it,
// through the same CAS into completing as its owner's completion, and a lease renewed meanwhile
// wins. A generation is recycled only when nothing in it is in flight (a pending position or a
// claiming slot blocks), every record is terminal and past retention (or memory is under
// pressure and the cold window holds it), and the store has every row of it; only the holder of
// the rotation mutex recycles or moves the epoch.
#pragma once

#include <algorithm>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "idem/detail/table/record_table.hpp"

namespace idem::detail::table {

/// Asks the resolver about every processing claim whose lease expired. Not on the hot path;
/// scans both generations (skipped when no claim is outstanding). Returns the claims resolved.
template <template <class> class Atomic, class Clock>
inline std::size_t record_table<Atomic, Clock>::compensate() {
    std::size_t resolved = 0;
    if (outstanding() == 0) return 0;
    for (auto& g : gens_) {
        for (std::size_t i = 0; i < g->size(); ++i) {
            slot_type* sp = published_slot(*g, i);
            if (sp == nullptr) continue;
            slot_type& s = *sp;
            const snapshot snap = read_slot(s);
            if (!snap.valid || state_word::state(snap.word) != slot_state::processing) continue;
            if (snap.lease_until > clock_.now().count()) continue;
            const std::string text = g->keys().read(s.key_ref.load(seqlock::field_load));  // field_load: validated below
            seqlock::reader_fence();                                                       // (8)
            if (s.word.load(std::memory_order_relaxed) != snap.word) continue;             // the key bytes may be newer
            const auto k = key::parse(text);
            if (!k) continue;
            resolver_answer answer{};
            if (opts_.resolve) answer = opts_.resolve(expired_claim{text, state_word::fence(snap.word), snap.fingerprint});
            if (resolve_claim(s, snap.word, *k, answer)) ++resolved;
        }
    }
    return resolved;
}

/// Applies the resolver's answer to the claim seen as `seen` (processing, expired). A succeeded
/// or failed answer is completed with its payload; one whose payload the guard cannot hold
/// (over options.max_payload, budget spent) is marked in doubt, like unknown.
template <template <class> class Atomic, class Clock>
inline bool record_table<Atomic, Clock>::resolve_claim(slot_type& s, std::uint64_t seen, const key& k,
                                                       const resolver_answer& answer) {
    claim_ref<Atomic> ref{&s, seen & ~state_word::doubt_bit};
    if (answer.verdict != resolution::unknown) {
        const slot_state to = answer.verdict == resolution::succeeded ? slot_state::succeeded
                              : answer.verdict == resolution::failed  ? slot_state::failed
                                                                      : slot_state::released;
        const std::error_code ec = complete(k, ref, to, answer.outcome, transition_cause::compensate, /*check_lease=*/true,
                                            true, answer.payload);
        if (!ec) {
            count(c_compensated);
            return true;
        }
        // A response the guard cannot hold is not recorded without it: in doubt, asked again.
        if (ec != errc::invalid_argument && ec != errc::capacity_exhausted) return false;
    }
    if (state_word::in_doubt(seen)) return false;  // already marked and audited
    admission room(sink_);
    if (!room.take()) return false;  // the queue is full: asked again next pass
    std::uint64_t replaced = 0;
    if (enter(ref, replaced, /*by_owner=*/false)) return false;
    IDEM_ASSERT(holds(s, ref.word, slot_state::completing), "compensation marks a doubt only while it holds completing");
    if (s.lease_until.load(std::memory_order_relaxed) > clock_.now().count()) {  // relaxed: we hold completing
        s.word.store(replaced, std::memory_order_release);                       // (5) renewed meanwhile
        return false;
    }
    (void)room.offer(transition{k, record_state::processing, record_state::processing, transition_cause::doubt,
                                state_word::fence(seen), 0,
                                s.fingerprint.load(std::memory_order_relaxed),  // relaxed: we hold completing
                                std::chrono::nanoseconds(0), clock_.now()});
    s.word.store(ref.word | state_word::doubt_bit, std::memory_order_release);  // (5)
    count(c_in_doubt);
    return false;
}

/// Claims granted (or restored) minus claims completed: zero means nothing can have expired.
template <template <class> class Atomic, class Clock>
inline std::uint64_t record_table<Atomic, Clock>::outstanding() const noexcept {
    const std::uint64_t opened = sum(c_acquired) + sum(c_reclaimed) + sum(c_restored_processing);
    const std::uint64_t closed = sum(c_succeeded) + sum(c_failed) + sum(c_released) + sum(c_reclaimed);
    return opened > closed ? opened - closed : 1;  // counters are not a snapshot: err on scanning
}

/// Recycles the previous generation when every record in it is terminal and older than the
/// retention, the store has every row of it (marks, below), and the current one is at least
/// half full. Then the recycled generation becomes the current one. Returns true on rotation.
/// Not on the hot path; concurrent calls are serialised (a second caller returns false).
///
/// Memory is a cache of the idempotency window: with a cold window (a durable guard), once the
/// current generation holds options.capacity records, the previous one is recycled whatever
/// the age of its terminal records (they go to the filter and the store answers for them), so
/// a table full of decided records never refuses a new key; only claims in flight block a
/// rotation. The same when the current generation has used half its payload budget.
///
/// Durability of the leaving rows: `marks` (flush_marks) says which rows the store has. Only
/// the previous generation's rows must be durable, not every row offered so far (a steady load
/// never lets the queue drain): once a scan found every record of the previous generation
/// evictable, every row of them was offered before the scan read it (a row is offered before
/// its record is published), so `issued()` taken after the scan covers them. That set of
/// records cannot change while the epoch stays (claims are decided only in the current
/// generation), so the mark is kept, and a later call whose scan passes again rotates as soon as
/// the store decided every row up to it.
template <template <class> class Atomic, class Clock>
template <class Marks>
inline bool record_table<Atomic, Clock>::rotate_if_due(Marks&& marks) {
    std::unique_lock lock(rotate_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    if (cold_ != nullptr) cold_->expire(clock_.now());
    const std::uint64_t epoch = epoch_.load(std::memory_order_seq_cst);  // (6)
    if (fill(epoch & 1) < std::max<std::uint64_t>(1, opts_.capacity / 2)) return false;
    generation<Atomic>& prev = *gens_[(epoch + 1) & 1];
    const bool pressed = cold_ != nullptr && under_pressure(epoch);
    const auto horizon = pressed ? std::numeric_limits<std::int64_t>::max() : (clock_.now() - opts_.retention).count();
    auto evictable = [&](const snapshot& snap) {
        const slot_state st = state_word::state(snap.word);
        return snap.valid && (is_claimable(st) || (is_terminal(st) && snap.updated <= horizon));
    };
    // A position whose first claim is being placed (ref pending) blocks the rotation like a
    // claim in progress; withdrawn positions are free.
    auto entry_evictable = [&](index_entry<Atomic>& e) {
        const std::uint64_t w = e.load(std::memory_order_seq_cst);  // (1)
        if (w == position::free) return true;
        const std::uint64_t ref = position::ref_of(w);
        if (ref == position::pending) return false;
        return ref == position::withdrawn || evictable(read_slot(prev.slot_at(ref)));
    };
    for (std::size_t i = 0; i < prev.size(); ++i) {
        if (!entry_evictable(prev.entry(i))) {
            count(c_rotation_blocked);
            return false;
        }
    }
    // Every record read above was offered to the sink before it was published (see above).
    // A sink that has offered nothing yet has issued() == 0: that mark is decided at once (a
    // guard whose every request since a restart was a duplicate answered from the store must
    // still rotate; a mark of 1 would wait for a row that may never come).
    if (!mark_.taken || mark_.epoch != epoch) mark_ = {epoch, marks.issued(), true};
    if (!marks.decided(mark_.seq)) {
        count(c_rotation_blocked);
        return false;
    }
    // The cold window learns every terminal record before it leaves memory (a reader that then
    // misses the key in memory finds it in the filter: see window_filter.hpp). A recycle that
    // stops half-way below leaves extra keys in the filter, which only costs a store read.
    if (cold_ != nullptr) {
        std::vector<window_filter::entry> leaving;
        for (std::size_t i = 0; i < prev.size(); ++i) {
            slot_type* sp = published_slot(prev, i);
            if (sp == nullptr) continue;
            // A torn read (an owner's sync confirm clearing the unconfirmed mark, or recording
            // that it gave up, between the two word loads) is read again: skipping it would
            // let the record below leave memory without entering the filter.
            snapshot snap = read_slot(*sp);
            while (!snap.valid) snap = read_slot(*sp);
            if (is_terminal(state_word::state(snap.word))) leaving.push_back({snap.lo, snap.hi, snap.updated});
        }
        if (!cold_->add(leaving)) {  // no memory for the filter: keep the records in memory
            count(c_rotation_blocked);
            return false;
        }
    }
    std::uint64_t evicted = 0;
    for (std::size_t i = 0; i < prev.size(); ++i) {
        index_entry<Atomic>& e = prev.entry(i);
        const std::uint64_t w = e.load(std::memory_order_seq_cst);  // (1)
        if (w == position::free) continue;
        const std::uint64_t ref = position::ref_of(w);
        if (ref == position::pending) return false;  // a stale claimer is placing a slot: try again later
        if (ref != position::withdrawn) {
            slot_type& s = prev.slot_at(ref);
            const snapshot snap = read_slot(s);
            if (!evictable(snap)) return false;  // a late claim by a stale thread: try again later
            // The rule this pass keeps, whatever the interleaving: a terminal record leaves
            // memory only once the cold window holds its key. The filter has no false
            // negatives, so a key it cannot contain was not added above: add it now. (Stopping
            // here instead would not keep it findable: positions freed earlier in this pass end
            // the probe sequences that led to it.) Only when the filter has no memory for it
            // does the pass stop, the record kept.
            if (cold_ != nullptr && is_terminal(state_word::state(snap.word)) && !cold_->may_contain(snap.lo, snap.hi)) {
                const window_filter::entry late[] = {{snap.lo, snap.hi, snap.updated}};
                if (!cold_->add(late)) {
                    count(c_rotation_blocked);
                    return false;
                }
            }
            const std::uint64_t inc = state_word::incarnation(snap.word) + 1;
            std::uint64_t expected = snap.word;
            if (!s.word.compare_exchange_strong(expected, state_word::make(slot_state::recycling, inc, 0),
                                                std::memory_order_seq_cst))  // (4)
                return false;
            seqlock::writer_fence();  // (9)
            if (is_terminal(state_word::state(snap.word))) ++evicted;
            s.lo.store(0, seqlock::field_store);  // field_store: published by (5)
            s.hi.store(0, seqlock::field_store);
            s.outcome.store(0, seqlock::field_store);
            s.fingerprint.store(0, seqlock::field_store);
            s.key_ref.store(0, seqlock::field_store);
            // The word keeps its incarnation when the slot is handed out again, so a stale
            // thread's CAS with a word of this life fails.
            s.word.store(state_word::make(slot_state::vacant, inc, 0), std::memory_order_release);  // (5)
        }
        // Free the position. Only its pending claimer writes a position besides this mutex's
        // holder, and it is not pending, so a plain store cannot lose a write. A stale claimer
        // may take it again at once; its epoch check fails and it withdraws.
        e.store(position::free, std::memory_order_seq_cst);
    }
    // No slot of the recycled generation is held by a claimer now (each was reset above), and no
    // claimer can be taking slots or appending keys here: a claimer takes them only after its
    // epoch check, which fails for every thread that sees this generation as current until (7).
    prev.slots().reset();
    prev.keys().reset();
    if (versions_[0] != nullptr) versions_[(epoch + 1) & 1]->reset();  // its versions leave with its records
    prev.payloads().reset();
    // The recycled generation's fill restarts from here. Its counters are not reset: only their
    // owners write them. Nobody counts a fill there now (a claimer counts while it holds a
    // claiming slot or a pending position, and every one of them blocked the scan above).
    const unsigned recycled = static_cast<unsigned>((epoch + 1) & 1);
    fill_base_[recycled].store(sum(c_fill0 + recycled), std::memory_order_relaxed);  // relaxed: published by (7)
    count(c_evicted, evicted);
    std::uint64_t expected_epoch = epoch;
    const bool moved = epoch_.compare_exchange_strong(expected_epoch, epoch + 1,
                                                      std::memory_order_seq_cst);  // (7) pairs with (6)
    IDEM_ASSERT(moved, "only the holder of the rotation mutex moves the epoch");
    rotations_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
    return true;
}

/// The current generation (of `epoch`) holds options.capacity records, or has used half its
/// payload budget: memory is full of what the store can answer for (rotate_if_due).
template <template <class> class Atomic, class Clock>
inline bool record_table<Atomic, Clock>::under_pressure(std::uint64_t epoch) const noexcept {
    if (fill(epoch & 1) >= opts_.capacity) return true;
    const auto& p = gens_[epoch & 1]->payloads();
    return p.budget_bytes() != 0 && p.used_bytes() >= p.budget_bytes() / 2;
}

template <template <class> class Atomic, class Clock>
inline std::uint64_t record_table<Atomic, Clock>::fill(std::uint64_t g) const noexcept {
    return sum(c_fill0 + static_cast<unsigned>(g)) -
           fill_base_[g & 1].load(std::memory_order_relaxed);  // relaxed: a statistic
}

}  // namespace idem::detail::table
