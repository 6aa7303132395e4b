// idem/detail/table/version_map.hpp: ordered versions (options.ordered_versions): the newest version
// claimed of each (txid, operation), in a lock-free table of fixed size beside each generation.
//
// A key made by key::compose ("TXID_OPERATION_vN", key::split) names a version N of the identity
// (TXID, OPERATION). With ordered versions on, a claim of version N that the table would grant (a new
// key, a released one, an expired one taken over) first takes the version step (record_table::claim):
//
//   newest = max(the identity's version in the current generation's map, in the previous one's)
//   newest > N:  answer superseded(newest); nothing changes (the admission is given back)
//   otherwise:   CAS-max the current map's entry up to N, then claim the key as usual
//
// An answer about a record that exists (succeeded, failed, in progress, in doubt, payload_mismatch)
// takes no version step: a replay of version N says truthfully what N did, and N < newest does not
// undo it. Only a claim that would run the operation is refused.
//
// Entry, two 64-bit words (an array of 2 x entries words):
//
//   id:  bits 63..0   the identity hash's low half (never 0; 0 = free entry)
//   val: bits 63..32  check: the top 32 bits of the hash's high half (never 0)
//        bits 31..0   the newest version claimed of the identity
//        val == 0: the entry's id is taken and no version is written yet
//
// The identity is a keyed 128-bit hash of "TXID_OPERATION" (the table's hash128 with its per-instance
// secret), of which the entry keeps 96 bits (id and check): two identities of one table are taken
// for one with probability about n^2 / 2^97 for n identities (2^-37 for 2^30 of them).
//
// Invariants
// ----------
// * An entry's id leaves 0 only by the CAS (V1) 0 -> id, and then changes only by reset(). So probe
//   sequences never break while the map takes versions, as in the index (index.hpp).
// * An entry's val leaves 0 only by a CAS (V2) 0 -> check|version by a caller whose identity has the
//   entry's id (its first version, written by whoever of them comes first; the id needs no pending
//   state: a caller that finds the id taken and val 0 writes val itself). Then it only grows: a CAS
//   (V2) from an observed val to check|N with N greater than the observed version. So the version of
//   an identity never decreases while its map lives (the CAS-max).
// * val's check is the identity's: a caller whose check differs (an id collision, 2^-32 per pair
//   of ids that are equal) probes on, so an entry never mixes two identities' versions.
// * A lookup or CAS-max visits at most max_probe entries. Full: no free entry within them.
//
// Linearization
// -------------
// The version step alone orders versions, not claims: a claim of v1 could pass its step, stall, and
// make its record visible only after a claim of v2 passed its own step and returned, so a third
// caller that looked up v1 in between (not there yet) would be told superseded while v1 then runs.
// So a claim announces, then validates (the pattern of a Dekker handshake, all accesses seq_cst):
//
//   step      CAS-max the current map's entry to N (V2), or load it >= N; refuse if newer
//   visible   the claim's record appears (position CAS (2), or slot CAS (4) into claiming):
//             from here on a duplicate of the key is answered in_progress
//   recheck   record_table::grant reads the claim's map again (V0; the other one too after a rotation):
//             a version newer than N refuses the claim with superseded (its slot goes back to the
//             word it replaced, as any undone claim)
//
// A claim of N that is granted linearizes when its record became visible. Take a claim of M > N
// that is granted too: its step (V2) comes before its own recheck; if it came before N's recheck,
// N's recheck saw M and refused, so it came after N's recheck, hence after N became visible: N is
// ordered first, which is a sequence in which both are granted. A caller that starts after M's
// claim returned either finds N's record (in_progress, or its outcome) or, if N had not become
// visible by M's step, N is refused by its recheck. The highest version raced for is never refused
// (no map holds more). Across a rotation: the claim's epoch check (6) follows its step, and the
// rotation (7) comes after that check in the seq_cst order; a claim that loads the new epoch reads
// the old current map as its previous map, so it sees the version. A claim whose epoch check fails
// retries from the epoch load and takes the step again (the CAS-max is idempotent for one version).
// So a claim of version N that starts after a claim of M > N returned acquired answers
// superseded, as long as the generation that holds M's claim is not recycled (below). A refusal
// may leave its version in the map (the step came first): a version counts from its step.
//
// Lifetime (sizing, reset)
// ------------------------
// One map per generation, with as many entries as the generation has index positions (a generation
// cannot hold more identities than keys) and the same probe bound. A claim writes only the current
// map; lookups read the current and the previous one, like keys. When maintain() recycles a
// generation (every record in it terminal and older than options.retention), its map is reset with
// it. So a version orders the claims of its identity while the generation holding its claim is in
// memory: at least options.retention after the record's last update, the same window as the key's
// own deduplication in memory. The map is mapped at construction, only when ordered versions are on,
// and committed lazily (4 KiB pages for a large map, as the index).
//
// reset() may meet a stale claimer (a thread that loaded the epoch two rotations ago, stalled, and
// writes the map now recycled). Its writes land before the reset (lost: it retries after its epoch
// check fails, in the current map) or after (the map keeps a version that was presented: at worst
// an extra entry; a lower claim refused for it is refused for a version that was really claimed).
// A half-reset entry (val without id, or id without val) is one these rules already handle: an entry
// whose id is 0 and val not 0 is taken by the next id CAS and then seen as another identity's (its
// check differs, almost surely) and probed past; id without val is an entry whose first version
// is not written yet.
//
// A version counts from its version step on, even when the claim then fails for another reason (no
// slot: capacity_exhausted; not durable in sync mode: store_unavailable; refused by the recheck):
// a newer version that was presented must not let an older one run, and its caller retries it.
// invalid_key and backpressure are decided before the step and never count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include <sys/mman.h>

#include "idem/detail/table/index.hpp"
#include "idem/detail/table/mapping.hpp"

namespace idem::detail::table {

/// What a claim of version N of an identity is, for the version step (record_table::claim).
struct version_claim {
    std::uint64_t id = 0;     ///< the identity hash's low half, never 0
    std::uint64_t check = 0;  ///< the top 32 bits of its high half, never 0
    std::uint32_t version = 0;

    [[nodiscard]] static version_claim of(hash128 h, std::uint32_t version) noexcept {
        const std::uint64_t c = h.hi >> 32;
        return {h.lo == 0 ? 1 : h.lo, c == 0 ? 1 : c, version};
    }
    [[nodiscard]] std::uint64_t word() const noexcept { return check << 32 | version; }
};

template <template <class> class Atomic>
class version_map {
public:
    /// `entries` a power of two (the generation's index size). Throws idem::error when it cannot map.
    version_map(std::size_t entries, bool prefault) : mask_(entries - 1) {
        // Huge pages only for a map that fills at least one and that a few thousand identities would
        // touch all over anyway (as the index: mapping.hpp, backing); 4 KiB pages otherwise.
        const std::size_t bytes = 2 * entries * sizeof(std::uint64_t);
        words_ = map_words<Atomic<std::uint64_t>>(
            2 * entries, prefault, bytes >= huge_page && bytes <= huge_index_limit ? backing::huge : backing::small);
    }
    ~version_map() { unmap_words(words_, 2 * (mask_ + 1)); }
    version_map(const version_map&) = delete;
    version_map& operator=(const version_map&) = delete;

    [[nodiscard]] std::size_t size() const noexcept { return mask_ + 1; }

    /// The newest version recorded for the identity, or -1 when none. Progress: wait-free.
    [[nodiscard]] std::int64_t newest(const version_claim& c, std::size_t max_probe) const noexcept {
        const std::size_t limit = std::min(max_probe, mask_ + 1);
        for (std::size_t n = 0; n < limit; ++n) {
            const std::size_t i = (c.id + n) & mask_;
            const std::uint64_t id = words_[2 * i].load(std::memory_order_seq_cst);  // (V0) pairs with (V1)
            if (id == 0) return -1;
            if (id != c.id) continue;
            const std::uint64_t val = words_[2 * i + 1].load(std::memory_order_seq_cst);  // (V0) pairs with (V2)
            if (val != 0 && (val >> 32) == c.check) return static_cast<std::int64_t>(val & 0xffffffffu);
        }
        return -1;
    }

    enum class raised : std::uint8_t {
        granted,     ///< the entry holds c.version now (or held it already)
        superseded,  ///< it holds a newer version: `newest`
        full,        ///< no entry for the identity and no free one within max_probe: nothing changed
    };
    struct raise_result {
        raised what;
        std::uint32_t newest;
    };

    /// CAS-max: the identity's entry up to c.version, unless it holds a newer one. Progress:
    /// lock-free (a retry only after another caller's CAS succeeded).
    raise_result raise(const version_claim& c, std::size_t max_probe) noexcept {
        const std::size_t limit = std::min(max_probe, mask_ + 1);
        const std::uint64_t mine = c.word();
        for (std::size_t n = 0; n < limit; ++n) {
            const std::size_t i = (c.id + n) & mask_;
            Atomic<std::uint64_t>& idw = words_[2 * i];
            std::uint64_t id = idw.load(std::memory_order_seq_cst);                                      // (V0)
            if (id == 0 && idw.compare_exchange_strong(id, c.id, std::memory_order_seq_cst)) id = c.id;  // (V1)
            if (id != c.id) continue;  // (after a lost CAS, id is the winner's)
            Atomic<std::uint64_t>& val = words_[2 * i + 1];
            std::uint64_t seen = val.load(std::memory_order_seq_cst);  // (V0)
            for (;;) {
                if (seen != 0 && (seen >> 32) != c.check) break;  // another identity with this id: probe on
                if (seen != 0 && (seen & 0xffffffffu) > c.version)
                    return {raised::superseded, static_cast<std::uint32_t>(seen & 0xffffffffu)};
                if (seen != 0 && (seen & 0xffffffffu) == c.version) return {raised::granted, c.version};
                if (val.compare_exchange_weak(seen, mine, std::memory_order_seq_cst))  // (V2) CAS-max
                    return {raised::granted, c.version};
            }
        }
        return {raised::full, 0};
    }

    /// Forgets every version. Only while the generation is recycled (under the rotation mutex),
    /// when no claim of the current epoch writes this map (see the header on stale claimers).
    void reset() noexcept {
        if constexpr (zero_pages_ok_v<Atomic<std::uint64_t>>) {
            // Anonymous private memory reads as zero pages after MADV_DONTNEED: the map is empty and
            // its memory given back, without touching the pages a few identities were spread over.
            // Each word still reads and changes atomically (a racing store lands on a fresh page).
            (void)::madvise(words_, 2 * (mask_ + 1) * sizeof(std::uint64_t), MADV_DONTNEED);
        } else {
            for (std::size_t i = 0; i < 2 * (mask_ + 1); ++i)
                words_[i].store(0, std::memory_order_relaxed);  // relaxed: published by the epoch increment (7)
        }
    }

private:
    Atomic<std::uint64_t>* words_ = nullptr;
    std::size_t mask_;
};

/// The version step of a claim (top of this file): superseded(newest) when the current or the
/// previous map (nullptr until the first rotation) holds a newer version, else the current map's
/// CAS-max to c.version.
template <template <class> class Atomic>
typename version_map<Atomic>::raise_result version_step(version_map<Atomic>& current, const version_map<Atomic>* previous,
                                                        const version_claim& c, std::size_t max_probe) noexcept {
    using raised = typename version_map<Atomic>::raised;
    if (previous != nullptr) {
        const std::int64_t before = previous->newest(c, max_probe);
        if (before > static_cast<std::int64_t>(c.version))  // the answer names the newest of both maps
            return {raised::superseded, static_cast<std::uint32_t>(std::max(before, current.newest(c, max_probe)))};
    }
    return current.raise(c, max_probe);
}

}  // namespace idem::detail::table
