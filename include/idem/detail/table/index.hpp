// idem/detail/table/index.hpp: a generation: the index of 8-byte positions in front of its slot, key and
// payload arenas, and the keyed hash that places a key in it.
//
// Position word, 64 bits: tag << 32 | ref (bit map at index_entry below).
//
// Invariants
// ----------
// * A position leaves free only by the CAS (2) free -> tag|pending. Then only its pending claimer
//   writes it (publish (2'), or withdraw); otherwise only the recycle, under the rotation mutex
//   and with no position pending, frees it. So probe sequences never break in a generation that
//   takes claims.
// * A published position names a slot whose identity (lo, hi) was written before (2'): a load of
//   the position that pairs with (2') sees that identity.
// * A lookup or insert visits at most max_probe positions.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "idem/detail/assert.hpp"
#include "idem/detail/table/arenas.hpp"
#include "idem/detail/table/mapping.hpp"
#include "idem/detail/table/slot.hpp"

namespace idem::detail::table {

struct hash128 {
    std::uint64_t lo, hi;
    friend constexpr bool operator==(const hash128&, const hash128&) noexcept = default;
};

/// One position of a generation's index: one 64-bit word, tag << 32 | ref; 0 = free.
/// tag: the top 32 bits of the key's hash high half (never 0: 0 is remapped to 1); the position in
/// the index comes from the low half, so the two are independent bits.
/// ref: 0 = pending (the position's first claim is being made; its slot is not published yet);
/// 1 = withdrawn (no slot; lookups probe on); otherwise the slot's number in the slot arena + 2.
template <template <class> class Atomic>
using index_entry = Atomic<std::uint64_t>;

namespace position {
inline constexpr std::uint64_t free = 0;
inline constexpr std::uint64_t pending = 0;
inline constexpr std::uint64_t withdrawn = 1;
/// Slot numbers a position can name: ref is 32 bits and 0, 1 are taken.
inline constexpr std::uint64_t max_slots = (std::uint64_t{1} << 32) - 2;
[[nodiscard]] constexpr std::uint64_t tag(hash128 h) noexcept {
    const std::uint64_t t = h.hi >> 32;
    return t == 0 ? 1 : t;
}
[[nodiscard]] constexpr std::uint64_t make(std::uint64_t tag, std::uint64_t ref) noexcept { return tag << 32 | ref; }
[[nodiscard]] constexpr std::uint64_t tag_of(std::uint64_t word) noexcept { return word >> 32; }
[[nodiscard]] constexpr std::uint64_t ref_of(std::uint64_t word) noexcept { return word & 0xffffffffu; }
/// Publishes slot n in a position its caller holds pending (2'): the slot's identity, written
/// before, is visible to whoever loads the word.
template <class Entry>
void publish(Entry& e, hash128 h, std::uint64_t n) noexcept {
    IDEM_DEBUG_ASSERT(e.load(std::memory_order_relaxed) == make(tag(h), pending),
                      "only a position's pending claimer publishes a slot in it (the CAS (2) made it its own)");
    e.store(make(tag(h), n + 2), std::memory_order_release);  // (2')
}
/// Gives up a position its caller holds pending: lookups probe past it; the next recycle frees it.
template <class Entry>
void withdraw(Entry& e, hash128 h) noexcept {
    IDEM_DEBUG_ASSERT(e.load(std::memory_order_relaxed) == make(tag(h), pending),
                      "only a position's pending claimer withdraws it (the CAS (2) made it its own)");
    e.store(make(tag(h), withdrawn), std::memory_order_seq_cst);
}
}  // namespace position

/// One generation: an index of 8-byte positions (open addressing, linear probing, power-of-two
/// size) in front of the slot and key arenas. A lookup reads one index line and then its slot; a
/// new key's claim takes a free position and writes a slot its thread's chunk holds in cache.
template <template <class> class Atomic>
class generation {
public:
    generation(std::size_t positions, bool prefault, std::size_t payload_budget = 0, std::size_t max_payload = 0)
        : mask_(positions - 1),
          slots_(positions, prefault),
          keys_(positions, prefault),
          payloads_(positions, slots_.size(), payload_budget, max_payload) {
        index_ = map_words<index_entry<Atomic>>(
            positions, prefault,
            positions * sizeof(index_entry<Atomic>) <= huge_index_limit ? backing::huge : backing::small);
    }
    ~generation() { unmap_words(index_, mask_ + 1); }
    generation(const generation&) = delete;
    generation& operator=(const generation&) = delete;

    [[nodiscard]] std::size_t size() const noexcept { return mask_ + 1; }
    [[nodiscard]] index_entry<Atomic>& entry(std::size_t i) noexcept { return index_[i & mask_]; }
    [[nodiscard]] slot_arena<Atomic>& slots() noexcept { return slots_; }
    [[nodiscard]] key_arena<Atomic>& keys() noexcept { return keys_; }
    [[nodiscard]] const key_arena<Atomic>& keys() const noexcept { return keys_; }
    [[nodiscard]] payload_arena<Atomic>& payloads() noexcept { return payloads_; }
    [[nodiscard]] const payload_arena<Atomic>& payloads() const noexcept { return payloads_; }
    /// The payload reference of the record in slot s of this generation (read under has_payload).
    [[nodiscard]] std::uint64_t payload_ref_of(const slot<Atomic>& s) const noexcept {
        return payloads_.ref_of(slots_.number_of(s));
    }
    void set_payload_ref(const slot<Atomic>& s, std::uint64_t ref) noexcept { payloads_.set_ref(slots_.number_of(s), ref); }
    /// True when s is one of this generation's slots (a claim's generation, from its ticket's slot).
    [[nodiscard]] bool holds(const slot<Atomic>* s) const noexcept { return slots_.holds(s); }
    /// The index's memory (the toucher populates a small index at construction).
    [[nodiscard]] char* index_memory() noexcept { return reinterpret_cast<char*>(index_); }
    [[nodiscard]] std::size_t index_bytes() const noexcept { return size() * sizeof(index_entry<Atomic>); }
    /// The slot a position's ref names (ref >= 2).
    [[nodiscard]] slot<Atomic>& slot_at(std::uint64_t ref) noexcept {
        IDEM_DEBUG_ASSERT(ref >= 2, "a position names a slot only with ref >= 2 (0: pending, 1: withdrawn)");
        return slots_.at(ref - 2);
    }

    struct found {
        slot<Atomic>* s = nullptr;
        bool pending = false;  ///< the key's first claim here is being made right now
    };

    /// Starts loading the line where the key's probe sequence begins.
    void prefetch(hash128 h) const noexcept { __builtin_prefetch(&index_[h.lo & mask_]); }

    /// Finds the key's slot without inserting. Progress: wait-free (bounded by max_probe).
    found find(hash128 h, std::size_t max_probe) noexcept {
        const std::size_t start = h.lo & mask_;
        const std::size_t limit = std::min(max_probe, mask_ + 1);
        const std::uint64_t tag = position::tag(h);
        for (std::size_t n = 0; n < limit; ++n) {
            const std::uint64_t w = index_[(start + n) & mask_].load(std::memory_order_seq_cst);  // (1) pairs with (2), (2')
            if (w == position::free) return {};
            if (position::tag_of(w) != tag) continue;
            if (auto m = match(w, h)) return *m;
        }
        return {};
    }

    struct taken {
        index_entry<Atomic>* e = nullptr;  ///< a free position now pending with the key's tag, ours to publish a slot in
        found existing;                    ///< or the key's slot / pending claim met on the way
        std::size_t probes = 0;
    };

    /// Takes the first free position of the key's probe sequence (CAS free -> tag|pending), unless
    /// the key is met first. Neither: max_probe positions hold other keys. Progress: lock-free.
    taken take(hash128 h, std::size_t max_probe) noexcept {
        const std::size_t start = h.lo & mask_;
        const std::size_t limit = std::min(max_probe, mask_ + 1);
        const std::uint64_t tag = position::tag(h);
        for (std::size_t n = 0; n < limit; ++n) {
            index_entry<Atomic>& e = index_[(start + n) & mask_];
            std::uint64_t w = e.load(std::memory_order_seq_cst);  // (1)
            if (w == position::free &&
                e.compare_exchange_strong(w, position::make(tag, position::pending), std::memory_order_seq_cst))  // (2)
                return {&e, {}, n + 1};
            if (position::tag_of(w) != tag) continue;  // (after a lost CAS, w is the winner's)
            if (auto m = match(w, h)) return {nullptr, *m, n + 1};
        }
        return {nullptr, {}, limit};
    }

private:
    /// What a position word carrying the key's tag says about the key: its slot (if the slot's
    /// identity is the key's hash; the caller validates it with a snapshot), a pending first claim
    /// (of this key, or, with probability 2^-32, of another key with the same tag: see design.md),
    /// or nullopt (withdrawn, or another key with the same tag: probe on).
    std::optional<found> match(std::uint64_t w, hash128 h) noexcept {
        const std::uint64_t ref = position::ref_of(w);
        if (ref == position::pending) return found{nullptr, true};
        if (ref == position::withdrawn) return std::nullopt;
        slot<Atomic>& s = slot_at(ref);  // its identity was written before (2'), which w comes from
        if (s.hi.load(std::memory_order_seq_cst) == h.hi && s.lo.load(std::memory_order_seq_cst) == h.lo)
            return found{&s, false};
        return std::nullopt;
    }

    index_entry<Atomic>* index_ = nullptr;
    std::size_t mask_;
    slot_arena<Atomic> slots_;
    key_arena<Atomic> keys_;
    payload_arena<Atomic> payloads_;
};

}  // namespace idem::detail::table
