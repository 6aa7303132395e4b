// idem/detail/table/payloads.hpp: response payloads in the table: attached by a completion (into the
// payload arena of the claim's generation, while it holds completing), copied out by a validated
// read (copy_payload, which holds the argument), replayed to a duplicate (replay).
//
// Included by record_table.hpp, whose class declares these members: each definition is `inline`, as
// a definition in the class is, except those the class declares [[gnu::noinline]] (never inlined).
//
// Invariant: a payload copied out belongs to the record of the snapshot it was read under, or the
// copy is discarded (the word changed); the bytes are written only while the completer holds
// completing and do not change until the generation is recycled.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "idem/detail/table/record_table.hpp"

namespace idem::detail::table {

/// existing() for a record whose snapshot says it has a payload: copies it into `payload`
/// first (so a record that changed meanwhile is looked at again before anything is counted),
/// and keeps it only for the answers that replay it (succeeded, failed). nullopt: the word
/// changed while it was copied. Out of line: the answers without a payload do not carry it.
template <template <class> class Atomic, class Clock>
auto record_table<Atomic, Clock>::replay(const snapshot& snap, std::uint64_t fingerprint, const slot_type& s,
                                         const generation<Atomic>& g, std::string& payload) noexcept
    -> std::optional<begin_answer> {
    if (!copy_payload(s, g, snap, payload)) {
        payload.clear();
        return std::nullopt;
    }
    begin_answer a = existing(snap, fingerprint);
    if (a.status != begin_status::succeeded && a.status != begin_status::failed) payload.clear();
    return a;
}

/// Copies the payload of the record seen as `snap` (a valid snapshot of slot s, in generation
/// g) into out; true when it belongs to that record (or it has none), false when the word
/// changed meanwhile (out is then garbage: the caller looks again or skips).
///
/// Why a validated copy is the record's payload: the bytes and their reference (the slot's entry in the payload table) were written
/// by the completer holding completing, before the release store (5) of the terminal word that
/// snap saw, into arena units handed to nobody else; they do not change until the generation is
/// recycled. The recycle moves every slot of the generation to recycling (incarnation + 1)
/// before it resets the arenas, and the units are handed out again only to a completion (or a
/// recall) of a claim made in that generation after the epoch increment (7) that followed the
/// reset: the claim's (6) read it, so the recycle happens-before the claim, which happens-before
/// its completion's CAS into completing, (9), and the new bytes' stores. So a field load here
/// that reads such a newer store synchronizes (9) with (8) below (under TSan: release field
/// store, acquire field load), the slot's recycling store happens-before the validation load,
/// and the validation fails: the word
/// cannot come back to snap.word (the incarnation only grows, 8 bits: 256 recycles of this
/// slot during one read, as for every seqlock read here). A torn payload reference is
/// bounds-checked by the arena before it is followed.
template <template <class> class Atomic, class Clock>
inline bool record_table<Atomic, Clock>::copy_payload(const slot_type& s, const generation<Atomic>& g, const snapshot& snap,
                                                      std::string& out) const {
    if ((snap.key_ref & key_arena<Atomic>::has_payload) == 0) [[likely]]
        return true;
    out = g.payloads().read(g.payload_ref_of(s));
    seqlock::reader_fence();                                     // (8)
    return s.word.load(std::memory_order_relaxed) == snap.word;  // relaxed: ordered by (8)
}

/// Copies `payload` into the payload arena of s's generation and records its reference in s
/// (the caller holds completing; published by its (5)); `stored` gets a view of the bytes
/// there, for the transition. False when the budget is spent (nothing written in s).
template <template <class> class Atomic, class Clock>
bool record_table<Atomic, Clock>::attach_payload(slot_type& s, std::string_view payload, std::string_view& stored) noexcept {
    generation<Atomic>& g = gens_[0]->holds(&s) ? *gens_[0] : *gens_[1];
    const std::uint64_t key_ref = s.key_ref.load(std::memory_order_relaxed);  // relaxed: we hold completing
    // The has_payload mark goes into key_ref beside the key's entry, which a processing record has:
    // a claim appends it before (5) publishes processing, restore and recall before they install.
    IDEM_ASSERT((key_ref & key_arena<Atomic>::at_mask) != 0, "a record being completed has its key text in the arena");
    const std::uint64_t pref = g.payloads().append(payload, my_stripe());
    if (pref == 0) return false;
    g.set_payload_ref(s, pref);
    s.key_ref.store(key_ref | key_arena<Atomic>::has_payload, seqlock::field_store);  // field_store: published by (5)
    stored = g.payloads().view(pref);
    return true;
}

}  // namespace idem::detail::table
