// idem/detail/table/arenas.hpp: a generation's slot arena, key arena and payload arena, and the chunk
// allocator that hands out their units.
//
// Invariants
// ----------
// * A unit (a slot, a word of key text) is handed to one allocation only until the arena is reset:
//   a stripe's cursor moves by a plain store on an owned stripe and by CAS on a shared one, and a
//   new chunk comes from one shared counter.
// * reset() happens only while no thread can allocate in the arena (the generation's recycle,
//   before the epoch increment (7) that publishes it).
// * Each arena holds one entry per index position plus a chunk per cursor, so it cannot fill before
//   the generation's index does.
// * A slot keeps its state word across resets, so its incarnation keeps counting up.
// * Key text is written once per record, by the claimer holding claiming, and published by the
//   word's release store (5); a reader of the text validates it against the slot's word. A key
//   reference is size << 40 | (first word + 1); 0 means none. Bit 63 of the slot's key_ref says
//   the record has a payload, whose reference is in the payload arena's table under the slot's
//   number (key_arena::has_payload, payload_arena::ref_of).
// * Payload bytes and their reference are written once per record, by the completer holding
//   completing, into units of the record's own generation that nobody else was handed (and the
//   table entry of its own slot), and published by (5). They do not
//   change until the generation is recycled, and the recycle changes every slot word of the
//   generation (recycling, incarnation + 1) before it resets the arena: a reader that copied
//   bytes and then validated its snapshot's word copied the bytes of that word's record.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>

#include "idem/detail/table/mapping.hpp"
#include "idem/detail/table/seqlock_order.hpp"
#include "idem/detail/table/slot.hpp"
#include "idem/detail/table/stripes.hpp"
#include "idem/key.hpp"

namespace idem::detail::table {

/// Hands out units of an arena in chunks, one current chunk per counter stripe (so, nearly always,
/// per thread): consecutive allocations of a thread are neighbours in memory. A stripe's cursor is
/// (chunk + 1) << 32 | units used, advanced by a plain store on an owned stripe and by CAS on a
/// shared one; a new chunk comes from a shared counter (threads racing for a new chunk on a shared
/// stripe give theirs back when they lose, unless another chunk was taken meanwhile: rarely a chunk
/// is left unused; a unit is never shared). Reset all at once.
template <template <class> class Atomic, unsigned Cursors>
class chunk_allocator {
public:
    static constexpr std::uint64_t npos = ~std::uint64_t{0};

    chunk_allocator(std::uint64_t chunk_units, std::uint64_t chunks) : chunk_units_(chunk_units), chunks_(chunks) {
        reset();
    }

    /// n consecutive units (n <= chunk_units), or npos when the arena is full. Progress: lock-free.
    /// Always inlined: it is on every fresh claim's path, and with a third caller (the payload
    /// arena) the compiler stopped inlining it there (about 40 instructions more per claim).
    [[gnu::always_inline]] inline std::uint64_t alloc(std::uint64_t n, stripe_ref stripe) noexcept {
        auto& cursor = cursors_[stripe.index % Cursors].v;
        // An owned stripe's cursor has one writer (reset happens only while nobody allocates), so
        // it is advanced by a plain store; a shared one by CAS.
        const bool owned = stripe.owned && Cursors == stripe_count;
        auto advance = [&](std::uint64_t& seen, std::uint64_t next) {
            if (owned) {
                cursor.store(next, std::memory_order_relaxed);  // relaxed: one writer; nothing is published
                return true;
            }
            // relaxed: the range is ours by the RMW's modification order; nothing is published
            return cursor.compare_exchange_strong(seen, next, std::memory_order_relaxed);
        };
        std::uint64_t c = cursor.load(std::memory_order_relaxed);  // relaxed: as above
        for (;;) {
            const std::uint64_t chunk = c >> 32;
            const std::uint64_t used = c & 0xffffffffu;
            if (chunk != 0 && used + n <= chunk_units_) {
                if (advance(c, c + n)) return (chunk - 1) * chunk_units_ + used;
                continue;
            }
            const std::uint64_t fresh = next_chunk_.fetch_add(1, std::memory_order_relaxed);  // relaxed: as above
            if (fresh >= chunks_) return npos;
            if (fresh >= call_at_.load(std::memory_order_relaxed)) [[unlikely]]  // relaxed: a hint
                ring(fresh);
            if (advance(c, ((fresh + 1) << 32) | n)) return fresh * chunk_units_;
            // Another sharer installed a chunk first: give ours back if nobody took one since, so
            // threads racing on a shared stripe do not leak a chunk each time.
            std::uint64_t after = fresh + 1;
            next_chunk_.compare_exchange_strong(after, fresh, std::memory_order_relaxed);  // relaxed: as above
        }
    }

    /// Only while no thread can allocate; published to allocators by the epoch increment (7).
    void reset() noexcept {
        next_chunk_.store(0, std::memory_order_relaxed);  // relaxed: published by (7)
        for (auto& c : cursors_) c.v.store(0, std::memory_order_relaxed);
    }

    /// Chunks handed out since the last reset. A hint for the toucher (arena_toucher): relaxed.
    [[nodiscard]] std::uint64_t taken() const noexcept {
        return std::min<std::uint64_t>(next_chunk_.load(std::memory_order_relaxed), chunks_);
    }
    /// Where ring() signals: set once, before the table is shared (the toucher's constructor).
    void attach(std::atomic<std::uint32_t>* bell) noexcept { bell_ = bell; }
    /// The next allocation of a chunk numbered `chunk` or above increments the bell and wakes its
    /// waiter, once; the toucher re-arms it. Not part of the record protocol: std::atomic always.
    void call_at(std::uint64_t chunk) noexcept {
        call_at_.store(chunk, std::memory_order_relaxed);  // relaxed: the toucher re-checks the frontier after waking
    }

private:
    void ring(std::uint64_t fresh) noexcept {
        std::uint64_t armed = call_at_.load(std::memory_order_relaxed);  // relaxed: one ringer wins the CAS
        if (fresh < armed || !call_at_.compare_exchange_strong(armed, npos, std::memory_order_relaxed)) return;
        bell_->fetch_add(1, std::memory_order_relaxed);  // relaxed: wakes the toucher; it reads the frontier itself
        bell_->notify_one();
    }

    struct alignas(64) cursor_line {
        Atomic<std::uint64_t> v;
    };
    std::uint64_t chunk_units_;
    std::uint64_t chunks_;
    std::atomic<std::uint32_t>* bell_ = nullptr;
    std::atomic<std::uint64_t> call_at_{npos};  ///< npos: nobody to call (model checkers, prefault, fired)
    alignas(64) Atomic<std::uint64_t> next_chunk_;
    cursor_line cursors_[Cursors];
};

/// Cursors per arena: one per counter stripe; with other atomic types (model checkers) a few.
template <template <class> class Atomic>
inline constexpr unsigned arena_cursors = std::is_same_v<Atomic<std::uint64_t>, std::atomic<std::uint64_t>> ? stripe_count
                                                                                                            : 4;

/// An arena's memory and its allocator, as the toucher sees them.
template <template <class> class Atomic>
struct arena_span {
    char* base;
    std::size_t bytes;
    std::size_t chunk_bytes;
    chunk_allocator<Atomic, arena_cursors<Atomic>>* alloc;
};

/// The key text of one generation's records, written once per record when it is first claimed and
/// read only by compensation, for_each and recovery (never by lookups, which compare hashes).
/// An entry is the key's bytes in whole words (8 * ceil(n / 8) bytes), in 4 KiB chunks per stripe:
/// a claim writes its key into lines its own thread wrote a moment ago. Its size travels in the
/// reference (the slot's key_ref): bits 40-47 the size (1 to 128), bits 0-39 the first word of the
/// text + 1, so an entry needs no size word of its own. Bit 63 of key_ref (has_payload) says the
/// record has a response payload, whose reference is in the payload arena's table (payload_arena,
/// by slot number): a record without one costs nothing more here. It holds at least max_size bytes
/// for every index position, plus a chunk per stripe, so it cannot fill before the index does.
template <template <class> class Atomic>
class key_arena {
public:
    static constexpr bool zero_pages_ok = std::is_same_v<Atomic<std::uint64_t>, std::atomic<std::uint64_t>>;
    static constexpr std::uint64_t max_words = key::max_size / 8;
    static constexpr std::uint64_t entry_words = max_words;
    static constexpr std::uint64_t chunk_words = zero_pages_ok ? 512 : entry_words;
    static constexpr unsigned size_shift = 40;
    static constexpr std::uint64_t at_mask = (std::uint64_t{1} << size_shift) - 1;
    static constexpr std::uint64_t size_mask = 0xff;
    /// In the slot's key_ref: the record has a payload (payload_arena::ref_of its slot number).
    static constexpr std::uint64_t has_payload = std::uint64_t{1} << 63;
    static_assert(key::max_size % 8 == 0 && key::max_size < 256, "a key's size must fit the reference's 8 size bits");

    key_arena(std::size_t positions, bool prefault)
        : chunks_((positions * entry_words + arena_cursors<Atomic> * chunk_words + chunk_words - 1) / chunk_words),
          alloc_(chunk_words, chunks_) {
        words_ = map_words<Atomic<std::uint64_t>>(chunks_ * chunk_words, prefault);
    }
    ~key_arena() { unmap_words(words_, chunks_ * chunk_words); }
    key_arena(const key_arena&) = delete;
    key_arena& operator=(const key_arena&) = delete;

    /// Appends k (not empty); returns its reference (size << 40 | first word + 1), or 0 when the
    /// arena is full.
    [[nodiscard]] std::uint64_t append(const key& k, stripe_ref stripe) noexcept {
        const std::uint64_t n = (k.size() + 7) / 8;
        const std::uint64_t at = alloc_.alloc(n, stripe);
        if (at == alloc_.npos) return 0;
        if constexpr (zero_pages_ok)  // the next keys' line
            if (at + n + 16 < chunks_ * chunk_words) __builtin_prefetch(words_ + at + n + 16, 1);
        // Whole words straight from the key's buffer: it holds max_size bytes, zero past size().
        const char* text = k.view().data();
        for (std::uint64_t i = 0; i < n; ++i) {
            std::uint64_t w;
            std::memcpy(&w, text + 8 * i, 8);
            words_[at + i].store(w, seqlock::field_store);  // field_store: published by (5)
        }
        return std::uint64_t{k.size()} << size_shift | (at + 1);
    }

    /// The key text at ref, or "" when ref is out of range (a torn read: the caller validates the
    /// slot word afterwards and discards the result).
    [[nodiscard]] std::string read(std::uint64_t ref) const {
        const std::uint64_t total = chunks_ * chunk_words;
        const std::uint64_t size = (ref >> size_shift) & size_mask;
        const std::uint64_t n = (size + 7) / 8;
        if ((ref & at_mask) == 0 || size == 0 || size > key::max_size || (ref & at_mask) - 1 + n > total) return {};
        const std::uint64_t at = (ref & at_mask) - 1;
        std::uint64_t bytes[max_words];
        for (std::uint64_t i = 0; i < n; ++i)
            bytes[i] = words_[at + i].load(seqlock::field_load);  // field_load: the caller validates
        return std::string(reinterpret_cast<const char*>(bytes), size);
    }

    void reset() noexcept { alloc_.reset(); }
    [[nodiscard]] arena_span<Atomic> span() noexcept {
        return {reinterpret_cast<char*>(words_), chunks_ * chunk_words * sizeof(words_[0]), chunk_words * sizeof(words_[0]),
                &alloc_};
    }

private:
    std::uint64_t chunks_;
    chunk_allocator<Atomic, arena_cursors<Atomic>> alloc_;
    std::uint64_t slots_;
    Atomic<std::uint64_t>* words_ = nullptr;
    Atomic<std::uint64_t>* refs_ = nullptr;  ///< by slot number: the record's payload reference
};

/// The response payloads of one generation's records, in whole words (8 * ceil(n / 8) bytes), in
/// chunks of max(64 KiB, max_payload) per stripe, carved by the stripe's cursor and reset only when
/// the generation is recycled (after the sink flushed everything offered, so a transition's view
/// of the bytes stays valid until it is flushed).
///
/// Its own budget: payload_budget bytes of payloads (in whole words), counted exactly by one
/// shared counter, so a payload is refused only when the bytes stored in this generation would
/// exceed it, however the threads' chunks are spread. (Counting whole chunks against the budget
/// refused a 10-byte payload once as many threads as the budget had chunks had stored one each.)
/// A payload that does not fit the rest of its thread's chunk starts a new one, and the rest
/// stays unused until the recycle: that waste is never more than the bytes of the payloads that
/// started new chunks, so the mapping holds twice the budget plus a chunk per cursor. It is only
/// address space: pages are committed as payloads are written. A reference is size << 40 | (first word + 1); 0 means none (the
/// empty payload is no payload). A record's reference is kept in a table by slot number (set_ref,
/// ref_of), read only when the slot's key_ref says has_payload, so a record without a payload
/// touches neither. Both are mapped lazily: a guard that never stores a payload commits none of
/// them, and they are never prefaulted.
template <template <class> class Atomic>
class payload_arena {
public:
    static constexpr bool zero_pages_ok = std::is_same_v<Atomic<std::uint64_t>, std::atomic<std::uint64_t>>;
    static constexpr unsigned size_shift = 40;
    static constexpr std::uint64_t at_mask = (std::uint64_t{1} << size_shift) - 1;
    static constexpr std::uint64_t min_chunk_bytes = zero_pages_ok ? std::uint64_t{64} << 10 : 64;

    /// With other atomic types (test hooks, model checkers), whose words are constructed one by
    /// one instead of mapped, the arena is one chunk of at most 64 bytes per index position (and
    /// at most max_payload): enough for their tests, and a guard of a model checker does not
    /// construct millions of its atomics.
    payload_arena(std::size_t positions, std::size_t slots, std::size_t budget, std::size_t max_payload)
        : chunk_words_(zero_pages_ok ? (std::max<std::uint64_t>(min_chunk_bytes, max_payload) + 7) / 8
                                     : std::min<std::uint64_t>((std::max<std::uint64_t>(8, max_payload) + 7) / 8,
                                                               8 * std::max<std::size_t>(positions, 1))),
          chunks_(budget == 0     ? 0
                  : zero_pages_ok ? (2 * budget + chunk_words_ * 8 - 1) / (chunk_words_ * 8) + arena_cursors<Atomic> + 2
                                  : 1),
          budget_words_(zero_pages_ok ? (budget + 7) / 8 : chunks_ * chunk_words_),
          alloc_(chunk_words_, chunks_),
          slots_(chunks_ == 0 ? 0 : slots) {
        if (chunks_ != 0) {
            words_ = map_words<Atomic<std::uint64_t>>(chunks_ * chunk_words_, /*prefault=*/false);
            refs_ = map_words<Atomic<std::uint64_t>>(slots_, /*prefault=*/false);
        }
    }
    ~payload_arena() {
        if (words_ != nullptr) unmap_words(words_, chunks_ * chunk_words_);
        if (refs_ != nullptr) unmap_words(refs_, slots_);
    }
    payload_arena(const payload_arena&) = delete;
    payload_arena& operator=(const payload_arena&) = delete;

    /// Copies `bytes` (1 to max_payload of them) in; returns their reference, or 0 when the budget
    /// is spent (the payloads stored in this generation and these bytes would exceed it). The
    /// count is taken before the units and given back when they cannot be had, so racing threads
    /// never overshoot the budget. Progress: lock-free.
    [[gnu::noinline, gnu::cold]] [[nodiscard]] std::uint64_t append(std::string_view bytes, stripe_ref stripe) noexcept {
        const std::uint64_t n = (bytes.size() + 7) / 8;
        if (n == 0 || n > chunk_words_) return 0;
        // relaxed: a count; the bytes are published by the slot word's (5), not by this counter
        if (spent_words_.fetch_add(n, std::memory_order_relaxed) + n > budget_words_) {
            spent_words_.fetch_sub(n, std::memory_order_relaxed);
            return 0;
        }
        const std::uint64_t at = alloc_.alloc(n, stripe);
        if (at == alloc_.npos) {  // the mapping's slack is spent (see above: not expected)
            spent_words_.fetch_sub(n, std::memory_order_relaxed);
            return 0;
        }
        const char* p = bytes.data();
        const std::uint64_t whole = bytes.size() / 8;
        for (std::uint64_t i = 0; i < whole; ++i) {
            std::uint64_t w;
            std::memcpy(&w, p + 8 * i, 8);
            words_[at + i].store(w, seqlock::field_store);  // field_store: published by (5)
        }
        if (whole != n) {  // the last bytes, zero padded
            std::uint64_t w = 0;
            std::memcpy(&w, p + 8 * whole, bytes.size() - 8 * whole);
            words_[at + whole].store(w, seqlock::field_store);  // field_store: published by (5)
        }
        return std::uint64_t{bytes.size()} << size_shift | (at + 1);
    }

    /// The bytes at ref, or "" when ref is out of range (a torn read: the caller validates the slot
    /// word afterwards and discards the result). Allocates when they exceed std::string's SSO.
    [[nodiscard]] std::string read(std::uint64_t ref) const {
        if (!in_range(ref)) return {};
        const std::uint64_t size = ref >> size_shift;
        const std::uint64_t at = (ref & at_mask) - 1;
        std::string out(size, '\0');
        const std::uint64_t whole = size / 8;
        for (std::uint64_t i = 0; i < whole; ++i) {
            const std::uint64_t w = words_[at + i].load(seqlock::field_load);  // field_load: the caller validates
            std::memcpy(out.data() + 8 * i, &w, 8);
        }
        if (8 * whole != size) {
            const std::uint64_t w = words_[at + whole].load(seqlock::field_load);  // field_load: as above
            std::memcpy(out.data() + 8 * whole, &w, size - 8 * whole);
        }
        return out;
    }

    /// The bytes at ref in place, for the sink (transition::payload): immutable until the
    /// generation is recycled, which waits until the sink flushed everything offered. Only where
    /// the words are plain integers in memory (std::atomic); other atomic types (model checkers,
    /// which run without a sink) get an empty view.
    [[nodiscard]] std::string_view view(std::uint64_t ref) const noexcept {
        if constexpr (zero_pages_ok) {
            if (!in_range(ref)) return {};
            return {reinterpret_cast<const char*>(words_ + (ref & at_mask) - 1),
                    static_cast<std::size_t>(ref >> size_shift)};
        } else {
            (void)ref;
            return {};
        }
    }

    /// Records the payload reference of the record in slot number n (by its completer holding
    /// completing, or by recovery or a recall holding claiming; published by (5)). The caller then
    /// sets has_payload in the slot's key_ref. Never reset: an entry is read only under that bit,
    /// which only a new set_ref() sets again after a recycle.
    void set_ref(std::uint64_t n, std::uint64_t ref) noexcept {
        if (n < slots_) refs_[n].store(ref, seqlock::field_store);  // field_store: published by (5)
    }
    /// The payload reference of the record in slot number n, or 0 (out of range, or no payload
    /// arena). Read under a snapshot: the caller validates the slot word afterwards.
    [[nodiscard]] std::uint64_t ref_of(std::uint64_t n) const noexcept {
        return n < slots_ ? refs_[n].load(seqlock::field_load) : 0;  // field_load: the caller validates
    }

    /// Bytes of payloads stored since the last reset, in whole words (what the budget counts).
    [[nodiscard]] std::uint64_t used_bytes() const noexcept {
        return spent_words_.load(std::memory_order_relaxed) * 8;  // relaxed: a statistic
    }
    /// payload_budget, in whole words.
    [[nodiscard]] std::uint64_t budget_bytes() const noexcept { return budget_words_ * 8; }
    /// The address space mapped for payloads (committed only where written).
    [[nodiscard]] std::uint64_t capacity_bytes() const noexcept { return chunks_ * chunk_words_ * 8; }

    /// Only while no thread can allocate (the generation's recycle); published by (7).
    void reset() noexcept {
        alloc_.reset();
        spent_words_.store(0, std::memory_order_relaxed);  // relaxed: published by (7)
    }
    [[nodiscard]] arena_span<Atomic> span() noexcept {
        return {reinterpret_cast<char*>(words_), chunks_ * chunk_words_ * sizeof(std::uint64_t),
                chunk_words_ * sizeof(std::uint64_t), &alloc_};
    }

private:
    [[nodiscard]] bool in_range(std::uint64_t ref) const noexcept {
        const std::uint64_t size = ref >> size_shift;
        const std::uint64_t at = ref & at_mask;
        return at != 0 && size != 0 && (size + 7) / 8 <= chunk_words_ && at - 1 + (size + 7) / 8 <= chunks_ * chunk_words_;
    }

    std::uint64_t chunk_words_;
    std::uint64_t chunks_;
    std::uint64_t budget_words_;
    std::atomic<std::uint64_t> spent_words_{0};  ///< words of payloads stored since the last reset
    chunk_allocator<Atomic, arena_cursors<Atomic>> alloc_;
    std::uint64_t slots_;
    Atomic<std::uint64_t>* words_ = nullptr;
    Atomic<std::uint64_t>* refs_ = nullptr;  ///< by slot number: the record's payload reference
};

/// The slots of one generation's records, handed out in chunks per stripe (consecutive claims of a
/// thread write neighbouring lines) and recycled all at once with the generation. A slot keeps its
/// state word across recycles, so its incarnation keeps counting up (see begin()'s fresh claim).
template <template <class> class Atomic>
class slot_arena {
public:
    static constexpr bool zero_pages_ok = std::is_same_v<Atomic<std::uint64_t>, std::atomic<std::uint64_t>>;
    static constexpr std::uint64_t chunk_slots = zero_pages_ok ? 64 : 1;  // 4 KiB
    static constexpr std::uint64_t prefetch_ahead = 2;

    slot_arena(std::size_t positions, bool prefault)
        : chunks_((positions + arena_cursors<Atomic> * chunk_slots + chunk_slots - 1) / chunk_slots),
          alloc_(chunk_slots, chunks_) {
        slots_ = map_words<slot<Atomic>>(chunks_ * chunk_slots, prefault);
    }
    ~slot_arena() { unmap_words(slots_, chunks_ * chunk_slots); }
    slot_arena(const slot_arena&) = delete;
    slot_arena& operator=(const slot_arena&) = delete;

    /// A slot number, or npos when the arena is full (it holds one slot per index position plus a
    /// chunk per stripe, so it cannot fill before the index does).
    [[nodiscard]] std::uint64_t alloc(stripe_ref stripe) noexcept {
        const std::uint64_t n = alloc_.alloc(1, stripe);
        // The thread's next claims write the next slots of its chunk: ask for their lines now, so
        // the next claim does not wait for them (a hint: never faults, harmless past the chunk).
        if constexpr (zero_pages_ok)
            if (n != npos && n + prefetch_ahead < size()) __builtin_prefetch(slots_ + n + prefetch_ahead, 1);
        return n;
    }
    [[nodiscard]] slot<Atomic>& at(std::uint64_t n) noexcept { return slots_[n]; }
    /// The number of a slot of this arena (holds(s)).
    [[nodiscard]] std::uint64_t number_of(const slot<Atomic>& s) const noexcept {
        return static_cast<std::uint64_t>(&s - slots_);
    }
    [[nodiscard]] bool holds(const slot<Atomic>* s) const noexcept {
        return std::less_equal<>{}(slots_, s) && std::less<>{}(s, slots_ + size());
    }
    [[nodiscard]] std::uint64_t size() const noexcept { return chunks_ * chunk_slots; }
    void reset() noexcept { alloc_.reset(); }
    [[nodiscard]] arena_span<Atomic> span() noexcept {
        return {reinterpret_cast<char*>(slots_), size() * sizeof(slot<Atomic>), chunk_slots * sizeof(slot<Atomic>), &alloc_};
    }
    static constexpr std::uint64_t npos = chunk_allocator<Atomic, arena_cursors<Atomic>>::npos;

private:
    std::uint64_t chunks_;
    chunk_allocator<Atomic, arena_cursors<Atomic>> alloc_;
    slot<Atomic>* slots_ = nullptr;
};

}  // namespace idem::detail::table
