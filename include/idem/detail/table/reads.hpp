// idem/detail/table/reads.hpp: reads of the table off the claim path: query (one key), for_each (every
// record), the counters (sum over stripes) and stats, and diagnostics (key_refusal, slot_memory).
//
// Included by record_table.hpp, whose class declares these members: each definition is `inline`, as
// a definition in the class is, except those the class declares [[gnu::noinline]] (never inlined).
//
// Invariant: a reader writes nothing and shows only what a valid seqlock snapshot saw (snapshot.hpp):
// a record whose word changed while it was read is read again or skipped. Counters are statistics:
// relaxed, and a sum over stripes is not a snapshot.
#pragma once

#include <string>
#include <utility>

#include "idem/detail/table/record_table.hpp"

namespace idem::detail::table {

/// A consistent view of the key's record (absent when unknown). Progress: lock-free.
template <template <class> class Atomic, class Clock>
inline record_view record_table<Atomic, Clock>::query(const key& k) const noexcept {
    const hash128 h = hash(k);
    for (;;) {
        const std::uint64_t epoch = epoch_.load(std::memory_order_seq_cst);  // (6)
        bool retry = false;
        for (std::uint64_t g : {epoch & 1, (epoch + 1) & 1}) {
            const auto f = gens_[g]->find(h, opts_.max_probe);
            if (f.pending) {  // a first claim being made: processing, its fence not yet known
                record_view v;
                v.state = record_state::processing;
                return v;
            }
            slot_type* s = f.s;
            if (s == nullptr) continue;
            const snapshot snap = read_slot(*s);
            if (!snap.is(h)) {
                retry = true;
                break;
            }
            const slot_state st = state_word::state(snap.word);
            if (st == slot_state::vacant || st == slot_state::recycling) continue;
            record_view v = view_of(snap);
            if (st == slot_state::released) v.state = record_state::absent;
            if (const auto hidden = unconfirmed(snap)) {  // sync mode: not durable yet, so not visible
                v.state = record_state::processing;
                v.outcome = 0;
                v.in_doubt = *hidden == begin_status::in_doubt;
            } else if (is_terminal(st) && !copy_payload(*s, *gens_[g], snap, v.payload)) {
                retry = true;  // the record changed while its payload was copied
                break;
            }
            return v;
        }
        if (!retry) return {};
    }
}

/// Calls fn(key text, view) for every record in memory (terminal, processing and released).
template <template <class> class Atomic, class Clock>
template <class Fn>
inline void record_table<Atomic, Clock>::for_each(Fn&& fn) const {
    for (auto& g : gens_) {
        for (std::size_t i = 0; i < g->size(); ++i) {
            slot_type* sp = published_slot(*g, i);
            if (sp == nullptr) continue;
            slot_type& s = *sp;
            const snapshot snap = read_slot(s);
            const slot_state st = state_word::state(snap.word);
            if (!snap.valid || st == slot_state::vacant || st == slot_state::recycling) continue;
            std::string text = g->keys().read(s.key_ref.load(seqlock::field_load));  // field_load: validated below
            record_view v = view_of(snap);
            // copy_payload validates the word too (after both reads); without a payload, (8) below
            if (is_terminal(st) && !copy_payload(s, *g, snap, v.payload)) continue;  // changed meanwhile: skip
            seqlock::reader_fence();                                                 // (8)
            if (s.word.load(std::memory_order_relaxed) != snap.word) continue;       // changed meanwhile: skip
            fn(std::move(text), std::move(v));
        }
    }
}

template <template <class> class Atomic, class Clock>
inline stats record_table<Atomic, Clock>::snapshot_stats() const noexcept {
    stats s;
    s.acquired = sum(c_acquired);
    s.duplicates = sum(c_duplicates);
    s.in_progress_hits = sum(c_in_progress);
    s.payload_mismatches = sum(c_mismatch);
    s.superseded = sum(c_superseded);
    s.succeeded = sum(c_succeeded);
    s.failed = sum(c_failed);
    s.released = sum(c_released);
    s.stale_tickets = sum(c_stale);
    s.in_doubt = sum(c_in_doubt);
    s.compensated = sum(c_compensated);
    s.reclaimed = sum(c_reclaimed);
    s.capacity_exhausted = sum(c_capacity);
    s.backpressure = sum(c_backpressure);
    s.evicted = sum(c_evicted);
    s.recalls = sum(c_recalls);
    s.recalled = sum(c_recalled);
    s.recall_failures = sum(c_recall_failed);
    if (cold_ != nullptr) {
        const auto u = cold_->use();
        s.cold_keys = u.keys;
        s.cold_bytes = u.bytes;
    }
    s.rotations_blocked = sum(c_rotation_blocked);
    s.rotations = rotations_.load(std::memory_order_relaxed);  // relaxed: a statistic
    s.max_probe = max_probe_.load(std::memory_order_relaxed);  // relaxed: a statistic
    return s;
}

/// Why begin() answered invalid_key for k, for error messages (not on the hot path).
template <template <class> class Atomic, class Clock>
inline std::string record_table<Atomic, Clock>::key_refusal(const key& k) const {
    if (k.empty()) return "the empty key{} is not a key; a key needs 1 to 128 bytes";
    std::string why;
    if (sink_ != nullptr && !sink_->accepts(k, &why)) return why;
    return "the store set aside its claim as a row it can never take (see last_store_error())";
}

/// Where generation g's slot arena is mapped and how large it is (tests and diagnostics read
/// its backing in /proc/self/smaps).
template <template <class> class Atomic, class Clock>
inline std::pair<const void*, std::size_t> record_table<Atomic, Clock>::slot_memory(unsigned g) noexcept {
    const auto sp = gens_[g & 1]->slots().span();
    return {sp.base, sp.bytes};
}

template <template <class> class Atomic, class Clock>
inline std::uint64_t record_table<Atomic, Clock>::sum(unsigned c) const noexcept {
    std::uint64_t v = 0;
    for (auto& st : stripes_) v += st.v[c].load(std::memory_order_relaxed);  // relaxed: a statistic
    return v;
}

/// The slot published at index position i, or nullptr (free, pending or withdrawn position).
template <template <class> class Atomic, class Clock>
inline auto record_table<Atomic, Clock>::published_slot(generation<Atomic>& g, std::size_t i) noexcept -> slot_type* {
    const std::uint64_t ref = position::ref_of(g.entry(i).load(std::memory_order_acquire));  // (1') pairs with (2')
    return ref < 2 ? nullptr : &g.slot_at(ref);
}

template <template <class> class Atomic, class Clock>
inline record_view record_table<Atomic, Clock>::view_of(const snapshot& snap) noexcept {
    record_view v;
    v.state = durable_state(state_word::state(snap.word));
    v.fence = state_word::fence(snap.word);
    v.outcome = snap.outcome;
    v.fingerprint = snap.fingerprint;
    v.in_doubt = state_word::state(snap.word) == slot_state::processing && state_word::in_doubt(snap.word);
    v.lease_until = std::chrono::nanoseconds(snap.lease_until);
    return v;
}

}  // namespace idem::detail::table
