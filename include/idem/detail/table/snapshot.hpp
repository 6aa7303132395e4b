// idem/detail/table/snapshot.hpp: the seqlock read of a slot.
//
// Invariants
// ----------
// * A snapshot is valid when the word loaded after the fields ((8), then a relaxed load) equals the
//   word loaded before them (3). The fields and the identity change only while the word holds a
//   transient state entered before the release fence (9), and the identity only with an
//   incarnation bump, so a valid snapshot's identity and fields belong to its word.
// * The fields of a valid snapshot of a transient word (claiming, completing, recycling) may be
//   half written.
// * The reader writes nothing: a lookup never contends with the writers' cache lines.
// * Bytes a valid snapshot refers to outside the slot (key text, payload) are read after it and
//   validated again by the caller (payloads.hpp, copy_payload): they are immutable until their
//   generation is recycled, and the recycle changes the word first.
#pragma once

#include <atomic>
#include <cstdint>

#include "idem/detail/table/index.hpp"
#include "idem/detail/table/seqlock_order.hpp"
#include "idem/detail/table/slot.hpp"

namespace idem::detail::table {

/// A seqlock snapshot of a slot's fields. valid == false when the word changed while reading.
struct snapshot {
    std::uint64_t word = 0;
    std::uint64_t outcome = 0;
    std::uint64_t fingerprint = 0;
    std::int64_t lease_until = 0;
    std::int64_t updated = 0;
    std::uint64_t key_ref = 0;     ///< where the key text (and the payload reference) live
    std::uint64_t lo = 0, hi = 0;  ///< the identity that goes with `word`
    bool valid = false;
    [[nodiscard]] bool is(hash128 h) const noexcept { return valid && lo == h.lo && hi == h.hi; }
};

template <template <class> class Atomic>
snapshot read_slot(const slot<Atomic>& s) noexcept {
    snapshot r;
    r.word = s.word.load(std::memory_order_seq_cst);             // (3) pairs with (5); seq_cst: see (6)
    r.lo = s.lo.load(seqlock::field_load);                       // field_load: validated below
    r.hi = s.hi.load(seqlock::field_load);                       // field_load: validated below
    r.outcome = s.outcome.load(seqlock::field_load);             // field_load: validated below
    r.fingerprint = s.fingerprint.load(seqlock::field_load);     // field_load: validated below
    r.lease_until = s.lease_until.load(seqlock::field_load);     // field_load: validated below
    r.updated = s.updated.load(seqlock::field_load);             // field_load: validated below
    r.key_ref = s.key_ref.load(seqlock::field_load);             // field_load: validated below (same line)
    seqlock::reader_fence();                                     // (8)
    r.valid = s.word.load(std::memory_order_relaxed) == r.word;  // relaxed: ordered by (8)
    return r;
}

}  // namespace idem::detail::table
