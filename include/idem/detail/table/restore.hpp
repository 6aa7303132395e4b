// idem/detail/table/restore.hpp: records that come back from the store. Recovery restores them into
// the table before the guard is shared (restore); a claim of a key the cold window may hold reads
// the store's record and installs it in the claimed slot (recall), or answers from it without a
// slot when the table is full (recall_without_slot). The cold window's set-up is here too.
//
// Included by record_table.hpp, whose class declares these members: each definition is `inline`, as
// a definition in the class is, except those the class declares [[gnu::noinline]] (never inlined).
//
// Invariant: a stored record enters a slot only through install(), as a record_image the slot can
// hold (record_image.hpp: state -> slot_state, fence in 1 .. max_fence), while the caller holds the
// slot; it is published by one release store (5) of its word, so a reader sees all of it or none.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include "idem/detail/table/record_table.hpp"

namespace idem::detail::table {

/// Turns on the cold window: terminal records that rotation evicts are remembered in a filter
/// (window_filter.hpp) for `window` after their last update, and a claim of a key the filter
/// may hold first asks the sink (transition_sink::recall) what the store knows. Call before the
/// guard is shared, with a sink that can recall.
template <template <class> class Atomic, class Clock>
inline void record_table<Atomic, Clock>::enable_cold_window(std::chrono::nanoseconds window) {
    cold_ = std::make_unique<window_filter>(window);
}

/// A partial cold window (recovery_start::claims_first): until remember_cold(..., true), every
/// claim of a key memory does not hold reads the store (window_filter::begin_partial).
template <template <class> class Atomic, class Clock>
inline void record_table<Atomic, Clock>::begin_partial_cold() noexcept {
    if (cold_ != nullptr) cold_->begin_partial();
}

/// A key of the cold window as the filter takes it: its table hash and last update.
template <template <class> class Atomic, class Clock>
inline window_filter::entry record_table<Atomic, Clock>::cold_entry(std::string_view key_text,
                                                                    std::chrono::nanoseconds updated) const noexcept {
    const hash128 h = hash_text(key_text);
    return {h.lo, h.hi, updated.count()};
}

/// Adds keys to the cold window (recovery: records of the window left out of memory), in one
/// slice (one block read per lookup for all of them). Before the guard is shared, or, for a
/// partial filter, by the thread that streams the window's keys in (the rotation mutex serialises
/// it with rotation's evictions). With `completes` the filter is complete once they are in. False
/// when the filter could not take them (no memory for a slice): a partial filter then stays
/// partial, so claims keep reading the store.
template <template <class> class Atomic, class Clock>
inline bool record_table<Atomic, Clock>::remember_cold(std::span<const window_filter::entry> keys, bool completes) {
    std::lock_guard lock(rotate_mutex_);
    if (cold_ == nullptr || !cold_->add(keys, /*together=*/true)) return false;
    if (completes) cold_->complete();
    return true;
}

/// Loads a record during recovery. Only before the guard is shared (single-threaded). The
/// payload of a succeeded or failed record is copied into the generation's payload arena
/// (ignored for other states); capacity_exhausted when it does not fit there (over
/// options.max_payload, or the budget is spent). payload_mismatch: the image is not one a slot
/// can hold (record_image::representable).
template <template <class> class Atomic, class Clock>
inline begin_status record_table<Atomic, Clock>::restore(const key& k, const record_image& image) noexcept {
    if (!image.representable()) return begin_status::payload_mismatch;
    if (image.carries_payload() && image.payload.size() > opts_.max_payload) return begin_status::capacity_exhausted;
    const std::uint64_t epoch = epoch_.load(std::memory_order_seq_cst);  // (6)
    generation<Atomic>& cur = *gens_[epoch & 1];
    // The store knows the versions: each record's goes into the current map before the record
    // (a record whose version finds no room is not restored: the caller says what happens).
    if (versions_[0] != nullptr) {
        if (const auto c = version_claim_of(k);
            c && versions_[epoch & 1]->raise(*c, opts_.max_probe).what == version_map<Atomic>::raised::full)
            return begin_status::capacity_exhausted;
    }
    const hash128 h = hash(k);
    const auto t = cur.take(h, opts_.max_probe);
    note_probe(t.probes);
    slot_type* s = t.existing.s;
    const bool new_slot = s == nullptr;  // a key restored twice keeps its slot: one fill
    if (new_slot) {
        if (t.e == nullptr) return begin_status::capacity_exhausted;
        const std::uint64_t n = cur.slots().alloc(my_stripe());
        if (n == slot_arena<Atomic>::npos) {
            position::withdraw(*t.e, h);
            return begin_status::capacity_exhausted;
        }
        s = &cur.slots().at(n);
        s->lo.store(h.lo, std::memory_order_relaxed);  // relaxed: published by (2') below
        s->hi.store(h.hi, std::memory_order_relaxed);
        position::publish(*t.e, h, n);
    }
    const std::uint64_t word = s->word.load(std::memory_order_acquire);  // (3)
    // Single-threaded, so nobody holds a slot: a transient word means a restore into a shared guard.
    IDEM_ASSERT(!is_transient(state_word::state(word)), "restore() runs before the guard is shared: no slot is held");
    if (install(*s, cur, k, image, state_word::incarnation(word)) != install_result::installed)
        return begin_status::capacity_exhausted;
    if (new_slot) count(c_fill0 + static_cast<unsigned>(epoch & 1));
    return begin_status::acquired;
}

/// The one install step of restore() and recall(): writes `image` into slot s of generation gen,
/// which the caller holds (a recall holds claiming on it; a restore runs before the guard is
/// shared), and publishes it with (5), keeping the slot's `incarnation`. The key's text is appended
/// when the slot has none; a terminal image's payload is copied into the payload arena (refused
/// over options.max_payload or past the budget). On a refusal nothing is published: the word is
/// as the caller holds it (the key's entry may stay appended: the slot keeps it, as a claim's).
template <template <class> class Atomic, class Clock>
inline auto record_table<Atomic, Clock>::install(slot_type& s, generation<Atomic>& gen, const key& k,
                                                 const record_image& image, std::uint64_t incarnation) noexcept
    -> install_result {
    // The consumer's half of the pair: restore() refuses, and recall() reports store_unavailable
    // for, an image the slot word cannot hold.
    IDEM_ASSERT(image.representable(), "an installed record image has a record state and a fence in 1 .. max_fence");
    if (s.key_ref.load(std::memory_order_relaxed) == 0) {  // relaxed: the caller holds the slot
        const std::uint64_t ref = gen.keys().append(k, my_stripe());
        if (ref == 0) return install_result::no_key_room;
        s.key_ref.store(ref, seqlock::field_store);  // field_store: published by (5)
    }
    std::uint64_t key_ref = s.key_ref.load(std::memory_order_relaxed) & ~key_arena<Atomic>::has_payload;  // relaxed: held
    if (image.carries_payload()) {
        const std::uint64_t pref = image.payload.size() <= opts_.max_payload
                                       ? gen.payloads().append(image.payload, my_stripe())
                                       : 0;
        if (pref == 0) return install_result::no_payload_room;
        gen.set_payload_ref(s, pref);
        key_ref |= key_arena<Atomic>::has_payload;
    }
    // field_store: published by (5). Without a payload the mark is cleared (a record restored twice).
    s.key_ref.store(key_ref, seqlock::field_store);
    const snapshot snap = image.as_snapshot(incarnation);
    s.outcome.store(snap.outcome, seqlock::field_store);
    s.fingerprint.store(snap.fingerprint, seqlock::field_store);
    s.lease_until.store(snap.lease_until, seqlock::field_store);
    s.updated.store(snap.updated, seqlock::field_store);
    // Counted before it is visible: outstanding() then errs on scanning, so compensation sees it.
    if (image.state == record_state::processing) count(c_restored_processing);
    s.word.store(snap.word, std::memory_order_release);  // (5)
    return install_result::installed;
}

/// The slot holds claiming for key k, which memory did not know but the cold window may hold:
/// reads the store (blocking; sink_->recall). A terminal or processing record in the window is
/// installed in the slot and answered as a duplicate or in_progress: no claim. None (a false
/// positive of the filter, or a record past the window) lets the claim go on (nullopt), from
/// RELEASED when the store says so. A store that cannot be read: the slot goes back to `seen`
/// and the caller is told store_unavailable, nothing decided.
template <template <class> class Atomic, class Clock>
inline auto record_table<Atomic, Clock>::recall(slot_type& s, generation<Atomic>& gen, std::uint64_t seen, const key& k,
                                                std::uint64_t fingerprint, record_state& from, std::string* payload) noexcept
    -> std::optional<begin_answer> {
    // The caller (grant) holds claiming on s, as it asserts in a debug build.
    count(c_recalls);
    const recalled r = sink_->recall(k);
    const bool installable = r.found == recalled::kind::record &&
                             (r.state == record_state::processing || r.state == record_state::succeeded ||
                              r.state == record_state::failed);
    if (r.found == recalled::kind::record && r.state == record_state::released) from = record_state::released;
    if (r.found != recalled::kind::unavailable && !installable) return std::nullopt;
    const record_image image = record_image::of(r);  // views r.payload
    if (r.found == recalled::kind::unavailable || !image.representable()) {
        s.word.store(seen, std::memory_order_release);  // (5) undo: nothing changed
        count(c_recall_failed);
        return begin_answer{begin_status::store_unavailable, {}, 0, 0};
    }
    const std::uint64_t inc = state_word::incarnation(seen);
    switch (install(s, gen, k, image, inc)) {
        case install_result::installed: break;
        case install_result::no_key_room:
            s.word.store(seen, std::memory_order_release);  // (5) undo
            count(c_capacity);
            return begin_answer{begin_status::capacity_exhausted, {}, 0, 0};
        case install_result::no_payload_room:
            // The store's payload does not fit this generation (its budget is spent, or the store
            // holds more than options.max_payload): the record is not installed, the store's answer
            // is given as it is, and the next duplicate asks again.
            s.word.store(seen, std::memory_order_release);  // (5) undo: nothing installed
            return answer_recalled(r, fingerprint, payload);
    }
    count(c_recalled);
    const begin_answer a = existing(image.as_snapshot(inc), fingerprint);  // no slot given: the payload is r's
    if (payload != nullptr && (a.status == begin_status::succeeded || a.status == begin_status::failed))
        *payload = r.payload;
    return a;
}

/// The table is full and key k may be in the cold window: the store's record, if it is in the
/// window, is the answer (nothing is installed or granted); otherwise nullopt (the caller says
/// capacity_exhausted: a new key needs a slot).
template <template <class> class Atomic, class Clock>
inline auto record_table<Atomic, Clock>::recall_without_slot(const key& k, std::uint64_t fingerprint,
                                                             std::string* payload) noexcept -> std::optional<begin_answer> {
    count(c_recalls);
    const recalled r = sink_->recall(k);
    if (r.found == recalled::kind::unavailable) {
        count(c_recall_failed);
        return begin_answer{begin_status::store_unavailable, {}, 0, 0};
    }
    if (r.found != recalled::kind::record || r.state == record_state::released) return std::nullopt;
    return answer_recalled(r, fingerprint, payload);
}

/// The answer a store's record (processing, succeeded or failed) gives, without installing it.
template <template <class> class Atomic, class Clock>
inline auto record_table<Atomic, Clock>::answer_recalled(const recalled& r, std::uint64_t fingerprint, std::string* payload)
    -> begin_answer {
    count(c_recalled);
    if (r.state != record_state::processing && fingerprint != 0 && r.fingerprint != 0 && fingerprint != r.fingerprint) {
        count(c_mismatch);
        return begin_answer{begin_status::payload_mismatch, {}, 0, r.fence};
    }
    if (r.state == record_state::processing) {
        count(c_in_progress);
        return begin_answer{begin_status::in_progress, {}, 0, r.fence};
    }
    count(c_duplicates);
    if (payload != nullptr) *payload = r.payload;
    return begin_answer{
        r.state == record_state::succeeded ? begin_status::succeeded : begin_status::failed, {}, r.outcome, r.fence};
}

}  // namespace idem::detail::table
