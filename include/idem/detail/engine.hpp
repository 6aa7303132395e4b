// idem/detail/engine.hpp: the lock-free record table behind idem::guard: the claim protocol.
//
// This header holds the protocol (class engine, claim_ref, admission). Each component it builds on
// has a header of its own, with its invariants at its top:
//
//   slot.hpp           one record slot and its packed state word (the transitions)
//   stripes.hpp        per-thread stripes of counters and arena cursors (one writer per owned stripe)
//   mapping.hpp        anonymous mappings, huge pages, zero pages as atomics
//   arenas.hpp         chunk allocator, slot arena, key arena (reset only while nobody allocates)
//   arena_toucher.hpp  the thread that populates arena pages ahead of the claims
//   index.hpp          hash128, the index position word, a generation: (1), (2), (2')
//   snapshot.hpp       the seqlock read of a slot (3)/(8)
//   seqlock_order.hpp  the fences (8)/(9), and what stands for them under ThreadSanitizer
//   window_filter.hpp  the cold window's filter of evicted keys
//   version_map.hpp    ordered versions: the newest version claimed per (txid, operation)
//   ../status.hpp      begin_status and record_view, the public answers
//
// Algorithm
// ---------
// Two generations, each an open-addressed index of 8-byte positions (linear probing, power-of-two
// size, bounded probe length) in front of a slot arena and a key arena. `epoch_` picks the current
// generation (epoch & 1); the other one is the previous generation. Keys are identified by a keyed
// 128-bit XXH3 hash with a per-instance random secret.
//
// * Claims are decided only in the current generation, by CAS on the slot's state word (slot.hpp).
// * The previous generation is read-only for lookups; claims that were made there while it was
//   current complete in place (their tickets point at their slot).
// * A key that has a vacant slot in the current generation is looked up in the previous one, so its
//   recorded outcome is replayed and its fence continues.
// * maintain() recycles the previous generation once every record in it is terminal and older than
//   the retention (evicting them all at once), then bumps the epoch so it becomes the current one.
//   This is expiry by generation: no per-key deletes, no tombstones, probe chains never break in a
//   generation that takes claims.
// * Memory is mapped once, 2 MiB aligned, arenas (and an index up to 32 MiB) in huge pages, and
//   committed lazily; a thread (arena_toucher) populates each arena a little ahead of the claims,
//   without writing, so they do not fault on the hot path (docs/design.md, "Memory").
//
// Linearization points
// --------------------
//   begin() acquired      new key: the position CAS (2); known key: the CAS released -> claiming (4);
//                         provided the epoch re-read after it is unchanged (otherwise the claim is
//                         withdrawn and begin() retries)
//   begin() duplicate     the acquire load of a terminal word that a later validation load confirms
//   begin_many (guard)    each key where its begin() would: begin() is claim(k, hash(k)), and a
//                         batch runs prepare() (hash and prefetch: decides nothing) for up to
//                         guard::batch_prefetch keys, then claim() for each of them in order
//   succeed()/fail()      the CAS processing(fence) -> completing(fence)
//   compensation          the CAS processing(fence) -> completing(fence) after the resolver answered
//   recycle               the CAS terminal -> recycling of each slot, then the epoch increment
//
// Memory ordering (numbers are referred to at each atomic below)
// ---------------------------------------------------------------
//   (1) index position load, seq_cst  pairs with (2) and (2'); seq_cst so that the previous-generation
//                                     consult takes part in the (2)/(4)/(6)/(7) total order
//   (1') index position load in a scan (published_slot), acquire: pairs with (2'), so the slot it
//        names shows its identity; a scan validates every slot it reads with a snapshot and takes
//        no part in the total order
//   (2) position CAS free -> tag|pending, seq_cst: a new key's claim
//   (2') position store tag|slot, release: publishes the slot's identity, written before it
//   (3) word load, acquire            pairs with the release stores (5) and CAS (4)
//   (4) word CAS, seq_cst             total order with the epoch load (6) and increment (7)
//   (4') word store vacant -> claiming on a slot just taken from the thread's chunk, release: nobody
//        else can change that word (design.md), so no CAS; ordered before the identity by (9)
//   (5) word store leaving a transient state, release: publishes the fields written while holding it
//   (6) epoch load, seq_cst           a claim whose (6) after (4) still sees the epoch of its start was
//                                     made before the rotation (7), so every reader that loads the new
//                                     epoch also sees the claim when it consults this generation
//   (7) epoch increment, seq_cst
//   (8) acquire fence before a seqlock validation load of the word, so the field loads before it
//       cannot be reordered after it
//   (9) release fence right after a CAS (or (4')) into a transient state (claiming, completing, recycling),
//       so the field stores that follow cannot become visible before the transient word (the
//       seqlock writer side; free on x86, a store barrier on ARM)
//   (8) and (9) are seqlock::reader_fence() and writer_fence() (seqlock_order.hpp). Under
//       ThreadSanitizer, which does not model fences, they are left out and the field accesses they
//       order are acquire loads (field_load) and release stores (field_store) instead: at least as
//       strong for this pairing (the argument is in seqlock_order.hpp).
// Readers validate (word, identity, fields, word): identity changes only under `recycling`, which
// bumps the incarnation, so an unchanged word proves the identity and fields belong together.
// Relaxed accesses are field reads and writes bracketed by (3)/(5)/(8)/(9) (seqlock::field_load and
// field_store: relaxed except under ThreadSanitizer), counters and arena cursors
// (plain load + store on a stripe the thread owns: see stripe_owner), and prepare()'s epoch load,
// which only picks the index line to prefetch.
#pragma once

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <limits>
#include <mutex>
#include <optional>
#include <new>
#include <random>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/mman.h>

#include "idem/detail/arena_toucher.hpp"
#include "idem/detail/arenas.hpp"
#include "idem/detail/index.hpp"
#include "idem/detail/lease_histogram.hpp"
#include "idem/detail/seqlock_order.hpp"
#include "idem/detail/mapping.hpp"
#include "idem/detail/slot.hpp"
#include "idem/detail/snapshot.hpp"
#include "idem/detail/stripes.hpp"
#include "idem/detail/version_map.hpp"
#include "idem/detail/window_filter.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/options.hpp"
#include "idem/stats.hpp"
#include "idem/status.hpp"
#include "idem/transition.hpp"

namespace idem::detail {

[[nodiscard]] constexpr record_state durable_state(slot_state s) noexcept {
    switch (s) {
        case slot_state::claiming:
        case slot_state::processing:
        case slot_state::completing: return record_state::processing;
        case slot_state::succeeded: return record_state::succeeded;
        case slot_state::failed: return record_state::failed;
        case slot_state::released: return record_state::released;
        default: return record_state::absent;
    }
}

/// Where a claim lives, as a ticket remembers it.
template <template <class> class Atomic>
struct claim_ref {
    slot<Atomic>* s = nullptr;
    std::uint64_t word = 0;  ///< the processing word with the claim's fence and incarnation
};

/// Room in the sink's queue for one transition, taken before a claim or completion changes anything
/// in memory (so a refusal leaves no trace) and given back unless a transition was offered with it.
class admission {
public:
    explicit admission(transition_sink* sink) noexcept : sink_(sink) {}
    ~admission() {
        if (held_) sink_->unreserve();
    }
    admission(const admission&) = delete;
    admission& operator=(const admission&) = delete;

    /// True when there is room (or no sink). Idempotent while held.
    [[nodiscard]] bool take() noexcept {
        if (sink_ == nullptr || held_) return true;
        held_ = sink_->reserve();
        return held_;
    }
    /// Offers t under the reservation; its sequence number, or 0 without a sink.
    [[nodiscard]] std::uint64_t offer(const transition& t) noexcept {
        if (sink_ == nullptr) return 0;
        held_ = false;
        return sink_->offer(t);
    }

private:
    transition_sink* sink_;
    bool held_ = false;
};

template <template <class> class Atomic = std::atomic, class Clock = steady_clock_source>
class engine {
public:
    using slot_type = slot<Atomic>;

    /// Largest options.capacity: a generation has next_pow2(2 * capacity) <= 2^31 index positions,
    /// and its slot arena (one slot per position plus a chunk per stripe) must stay within the
    /// slot numbers a 32-bit position ref can name.
    static constexpr std::size_t max_capacity = std::size_t{1} << 30;
    static_assert(2 * max_capacity + stripe_count * 64 <= position::max_slots,
                  "a 32-bit position ref must name every slot of the largest generation");
    static_assert(2 * max_capacity * key_arena<Atomic>::entry_words + stripe_count * 512 < key_arena<Atomic>::at_mask,
                  "a key reference's 40 bits must name every word of the largest key arena");

    engine(options opts, Clock clock, transition_sink* sink) : opts_(std::move(opts)), clock_(clock), sink_(sink) {
        if (opts_.capacity == 0) throw error(errc::invalid_argument, "options.capacity is 0; it must be at least 1");
        if (opts_.capacity > max_capacity)
            throw error(errc::invalid_argument, "options.capacity " + std::to_string(opts_.capacity) +
                                                    " exceeds the limit of 2^30 records");
        if (opts_.max_probe == 0) throw error(errc::invalid_argument, "options.max_probe is 0; it must be at least 1");
        if (opts_.lease <= std::chrono::nanoseconds::zero())
            throw error(errc::invalid_argument, "options.lease must be positive");
        if (opts_.retention < std::chrono::nanoseconds::zero())
            throw error(errc::invalid_argument, "options.retention must not be negative");
        if (opts_.adaptive.enabled) leases_ = std::make_unique<operation_leases>(opts_.adaptive);  // validates it
        if (opts_.max_payload > options::max_payload_limit)
            throw error(errc::invalid_argument, "options.max_payload " + std::to_string(opts_.max_payload) +
                                                    " exceeds the hard maximum of 1 MiB (1048576 bytes)");
        if (opts_.payload_budget != 0 && opts_.payload_budget < opts_.max_payload)
            throw error(errc::invalid_argument, "options.payload_budget " + std::to_string(opts_.payload_budget) +
                                                    " is below options.max_payload " +
                                                    std::to_string(opts_.max_payload) +
                                                    "; it must hold one payload of the largest size (or be 0: no payloads)");
        if (opts_.payload_budget > (std::size_t{1} << 40))
            throw error(errc::invalid_argument, "options.payload_budget " + std::to_string(opts_.payload_budget) +
                                                    " exceeds the limit of 2^40 bytes");
        std::size_t slots = 2;
        while (slots < 2 * opts_.capacity) slots <<= 1;
        gens_[0] = std::make_unique<generation<Atomic>>(slots, opts_.prefault, opts_.payload_budget, opts_.max_payload);
        gens_[1] = std::make_unique<generation<Atomic>>(slots, opts_.prefault, opts_.payload_budget, opts_.max_payload);
        std::random_device rd;
        for (auto& b : secret_) b = static_cast<unsigned char>(rd());
        for (auto& st : stripes_)
            for (auto& c : st.v) c.store(0, std::memory_order_relaxed);  // relaxed: before publication
        for (auto& b : fill_base_) b.store(0, std::memory_order_relaxed);  // relaxed: before publication
        if (opts_.ordered_versions)  // one map per generation, sized like it (version_map.hpp)
            for (auto& v : versions_) v = std::make_unique<version_map<Atomic>>(slots, opts_.prefault);
        if constexpr (std::is_same_v<Atomic<std::uint64_t>, std::atomic<std::uint64_t>>) {
            if (!opts_.prefault) {
                // Generation 0 takes the first claims: its arenas' first pages now, and its index if
                // it is small enough to be in huge pages (a few dozen claims would touch all of it).
                generation<Atomic>& g0 = *gens_[0];
                const bool small_index = g0.index_bytes() <= huge_index_limit;
                // The payload arenas come last: not populated now (a guard may never store a
                // payload); the toucher keeps one ahead once it is in use.
                std::vector<arena_toucher::span> spans{g0.slots().span(), g0.keys().span(), gens_[1]->slots().span(),
                                                       gens_[1]->keys().span()};
                for (auto& g : gens_)
                    if (g->payloads().capacity_bytes() != 0) spans.push_back(g->payloads().span());
                toucher_ = std::make_unique<arena_toucher>(std::move(spans), 2, small_index ? g0.index_memory() : nullptr,
                                                           small_index ? g0.index_bytes() : 0);
            }
        }
    }

    [[nodiscard]] hash128 hash(const key& k) const noexcept { return hash_text(k.view()); }
    /// The keyed hash of any text (a key's; the (txid, operation) of ordered versions).
    [[nodiscard]] hash128 hash_text(std::string_view text) const noexcept {
        const XXH128_hash_t h = XXH3_128bits_withSecret(text.data(), text.size(), secret_, sizeof secret_);
        // 0 marks "no identity" in a slot, so remap it (costs 2^-64 of the hash space).
        return {h.low64 == 0 ? 1 : h.low64, h.high64 == 0 ? 1 : h.high64};
    }

    /// Fences are (generation << 32) | count. A key's first claim in a generation takes
    /// (fence_base + epoch) << 32 | 1, so a key evicted and claimed again later, or claimed after a
    /// restart, gets a fence above every fence it had before. Call before the guard is shared.
    void set_fence_floor(std::uint64_t max_seen) noexcept { fence_base_ = (max_seen >> 32) + 1; }

    /// Turns on the cold window: terminal records that rotation evicts are remembered in a filter
    /// (window_filter.hpp) for `window` after their last update, and a claim of a key the filter
    /// may hold first asks the sink (transition_sink::recall) what the store knows. Call before the
    /// guard is shared, with a sink that can recall.
    void enable_cold_window(std::chrono::nanoseconds window) { cold_ = std::make_unique<window_filter>(window); }
    /// A key of the cold window as the filter takes it: its table hash and last update.
    [[nodiscard]] window_filter::entry cold_entry(const key& k, std::chrono::nanoseconds updated) const noexcept {
        const hash128 h = hash(k);
        return {h.lo, h.hi, updated.count()};
    }
    /// Adds keys to the cold window (recovery: records of the window left out of memory), in one
    /// slice (one block read per lookup for all of them). Before the guard is shared. False when
    /// the filter could not take them (no memory for a slice).
    [[nodiscard]] bool remember_cold(std::span<const window_filter::entry> keys) {
        std::lock_guard lock(rotate_mutex_);
        return cold_ != nullptr && cold_->add(keys, /*together=*/true);
    }
    /// The cold window's filter (its rates and memory), or nullptr when it is off.
    [[nodiscard]] const window_filter* cold_window() const noexcept { return cold_.get(); }

    [[nodiscard]] std::chrono::nanoseconds now() const noexcept { return clock_.now(); }

    /// Why begin() answered invalid_key for k, for error messages (not on the hot path).
    [[nodiscard]] std::string key_refusal(const key& k) const {
        if (k.empty()) return "the empty key{} is not a key; a key needs 1 to 128 bytes";
        std::string why;
        if (sink_ != nullptr && !sink_->accepts(k, &why)) return why;
        return "the store set aside its claim as a row it can never take (see last_store_error())";
    }
    [[nodiscard]] const options& opts() const noexcept { return opts_; }
    /// Where generation g's slot arena is mapped and how large it is (tests and diagnostics read
    /// its backing in /proc/self/smaps).
    [[nodiscard]] std::pair<const void*, std::size_t> slot_memory(unsigned g) noexcept {
        const auto sp = gens_[g & 1]->slots().span();
        return {sp.base, sp.bytes};
    }
    [[nodiscard]] Clock& clock() noexcept { return clock_; }

    struct begin_answer {
        begin_status status;
        claim_ref<Atomic> claim;
        std::uint64_t outcome = 0;
        std::uint64_t fence = 0;
    };

    /// Progress: lock-free (a retry happens only when another thread's CAS or a rotation succeeded).
    /// begin() is claim() of the key's hash: claim() prefetches the index line itself, so a single
    /// key needs no prepare() (the batch's first step).
    /// A duplicate's response payload is copied into *payload (when given; left empty otherwise):
    /// the answer itself carries no string, so an answer without one moves nothing more than before.
    begin_answer begin(const key& k, std::uint64_t fingerprint, std::string* payload = nullptr) noexcept {
        if (k.empty()) return {begin_status::invalid_key, {}, 0, 0};
        return claim(k, hash(k), fingerprint, payload);
    }

    /// The first step of a batched claim (guard::begin_many): hashes k and asks for its index line
    /// in the current generation (and its cold window blocks), so that the misses of a batch's keys
    /// overlap before any of them is claimed. Changes nothing; claim(k, h, fp) decides as begin().
    /// The empty key has no hash worth taking: its claim answers invalid_key.
    [[nodiscard]] hash128 prepare(const key& k) const noexcept {
        if (k.empty()) return {};
        const hash128 h = hash(k);
        // relaxed: a hint only. A stale epoch prefetches the other generation's line, which costs a
        // miss but decides nothing; claim() loads the epoch again with (6).
        gens_[epoch_.load(std::memory_order_relaxed) & 1]->prefetch(h);
        if (cold_ != nullptr) cold_->prefetch(h.lo, h.hi);
        return h;
    }

    /// The second step: begin() for a key hashed by prepare() (h == hash(k)). Progress: lock-free.
    begin_answer claim(const key& k, hash128 h, std::uint64_t fingerprint, std::string* payload = nullptr) noexcept {
        if (k.empty()) return {begin_status::invalid_key, {}, 0, 0};
        admission room(sink_);
        bool checked = false;
        // Before any claim: the store must be able to hold the key, and the queue must have room for
        // the claim's row. Refusals change nothing (no position, no slot, no sequence number). With
        // ordered versions, then the version step (version_map.hpp), whose refusal gives the room back.
        // `unknown`: memory has no record of the key (a new key, or one evicted into the cold window).
        auto refuse = [&](std::uint64_t epoch, bool unknown = false) noexcept -> std::optional<begin_answer> {
            if (!checked) {
                if (sink_ != nullptr && !sink_->accepts(k)) return begin_answer{begin_status::invalid_key, {}, 0, 0};
                checked = true;
            }
            if (!room.take()) {
                count(c_backpressure);
                return begin_answer{begin_status::backpressure, {}, 0, 0};
            }
            if (versions_[0] == nullptr) [[likely]] return std::nullopt;
            return version_step_after_recall(k, h, epoch, unknown, fingerprint, payload);
        };
        for (;;) {
            const std::uint64_t epoch = epoch_.load(std::memory_order_seq_cst);  // (6) pairs with (7)
            generation<Atomic>& cur = *gens_[epoch & 1];
            // The key's index line is nearly always a cache miss: start it, and read the clock (a
            // claim's lease starts now) while it is on its way.
            cur.prefetch(h);
            // A fresh key's claim reads the cold window's blocks: start them too (a hint; nothing
            // when the window is empty or off).
            if (cold_ != nullptr) cold_->prefetch(h.lo, h.hi);
            const std::chrono::nanoseconds now = clock_.now();
            const auto f = cur.find(h, opts_.max_probe);
            if (f.pending) return pending_claim();
            slot_type* s = f.s;
            snapshot snap;
            if (s != nullptr) {
                snap = read_slot(*s);
                if (!snap.is(h)) continue;
                switch (state_word::state(snap.word)) {
                    case slot_state::recycling: continue;  // our epoch is stale
                    case slot_state::vacant: break;        // never claimed here: consult below
                    case slot_state::released:
                        if (auto no = refuse(epoch)) return *no;
                        if (auto a = try_claim(*s, cur, snap.word, state_word::fence(snap.word) + 1,
                                               record_state::released, k, fingerprint, epoch, transition_cause::claim,
                                               room, payload))
                            return *a;
                        continue;
                    case slot_state::processing:
                        if (opts_.reclaim_expired && snap.lease_until <= clock_.now().count()) {
                            if (auto no = refuse(epoch)) return *no;
                            if (auto a = try_claim(*s, cur, snap.word, state_word::fence(snap.word) + 1,
                                                   record_state::processing, k, fingerprint, epoch,
                                                   transition_cause::reclaim, room, payload))
                                return *a;
                            continue;
                        }
                        return existing(snap, fingerprint);  // processing: no payload to copy
                    default:
                        if (payload != nullptr && (snap.key_ref & key_arena<Atomic>::has_payload) != 0) [[unlikely]] {
                            if (auto a = replay(snap, fingerprint, *s, cur, *payload)) return *a;
                            continue;  // the record changed while its payload was copied
                        }
                        return existing(snap, fingerprint);
                }
            }
            // Not claimed in the current generation: the previous generation may know the key
            // (until the first rotation it is empty, and skipping it saves a cache miss).
            std::uint64_t next_fence = first_fence(epoch);
            record_state from = record_state::absent;
            if (epoch != 0) {
                const auto pf = gens_[(epoch + 1) & 1]->find(h, opts_.max_probe);
                if (pf.pending) return pending_claim();
                if (slot_type* p = pf.s) {
                    const snapshot ps = read_slot(*p);
                    if (!ps.is(h)) continue;
                    const slot_state pst = state_word::state(ps.word);
                    if (pst == slot_state::released) {
                        next_fence = state_word::fence(ps.word) + 1;
                        from = record_state::released;
                    } else if (pst != slot_state::vacant && pst != slot_state::recycling) {
                        if (payload != nullptr && (ps.key_ref & key_arena<Atomic>::has_payload) != 0) [[unlikely]] {
                            if (auto a = replay(ps, fingerprint, *p, *gens_[(epoch + 1) & 1], *payload)) return *a;
                            continue;  // the record changed while its payload was copied
                        }
                        return existing(ps, fingerprint);
                    }
                }
            }
            if (auto no = refuse(epoch, from == record_state::absent)) return *no;
            if (s == nullptr) {
                const auto t = cur.take(h, opts_.max_probe);
                note_probe(t.probes);
                if (t.existing.pending) return pending_claim();
                if (t.existing.s != nullptr) continue;  // placed by another caller meanwhile: look again
                if (t.e == nullptr) {
                    // No room in memory: a key of the cold window is still answered from the store,
                    // without a slot (a retry storm of old keys must not look like a full table).
                    if (from == record_state::absent && cold_ != nullptr && cold_->may_contain(h.lo, h.hi))
                        if (auto a = recall_without_slot(k, fingerprint, payload)) return *a;
                    count(c_capacity);
                    return {begin_status::capacity_exhausted, {}, 0, 0};
                }
                // The fill counts positions, not grants: this one is used from now on in this
                // generation (published, or withdrawn below), and rotation is due at half fill.
                count(c_fill0 + static_cast<unsigned>(epoch & 1));
                if (auto a = claim_fresh(*t.e, cur, h, next_fence, from, k, fingerprint, epoch, now, room, payload))
                    return *a;
                continue;
            }
            if (auto a = try_claim(*s, cur, snap.word, next_fence, from, k, fingerprint, epoch, transition_cause::claim,
                                   room, payload))
                return *a;
        }
    }

    /// Completes a claim. Progress: lock-free; wait-free when the claim is current.
    /// errc::busy: compensation or a reclaim holds the record for a moment; the claim may still be
    /// ours, so the ticket stays valid (retry). With check_lease (compensation) the completion is
    /// refused with errc::busy when the lease was renewed since it was seen expired.
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
    std::error_code complete(const key& k, claim_ref<Atomic>& c, slot_state to, std::uint64_t outcome,
                             transition_cause cause, bool check_lease = false, bool await = true,
                             std::string_view payload = {}) noexcept {
        if (!payload.empty() && is_terminal(to)) [[unlikely]]
            return complete_with_payload(k, c, to, outcome, cause, check_lease, await, payload);
        return complete_as<false>(k, c, to, outcome, cause, check_lease, await, {});
    }

private:
    /// complete() with a payload to attach. Out of line, and complete_as<false> has no payload
    /// code at all: a completion without one costs what it cost before payloads existed.
    [[gnu::noinline]] std::error_code complete_with_payload(const key& k, claim_ref<Atomic>& c, slot_state to,
                                                            std::uint64_t outcome, transition_cause cause,
                                                            bool check_lease, bool await, std::string_view payload) noexcept {
        if (payload.size() > opts_.max_payload) return errc::invalid_argument;
        return complete_as<true>(k, c, to, outcome, cause, check_lease, await, payload);
    }

    template <bool WithPayload>
    std::error_code complete_as(const key& k, claim_ref<Atomic>& c, slot_state to, std::uint64_t outcome,
                                transition_cause cause, bool check_lease, bool await, std::string_view payload) noexcept {
        slot_type& s = *c.s;
        admission room(sink_);
        if (!room.take()) {  // before anything changes: a refusal leaves the claim as it was
            count(c_backpressure);
            return errc::backpressure;
        }
        std::uint64_t replaced = 0;
        if (std::error_code ec = enter(c, replaced, !check_lease)) return ec;
        const auto now = clock_.now();
        if (check_lease && s.lease_until.load(std::memory_order_relaxed) > now.count()) {  // relaxed: we hold completing
            s.word.store(replaced, std::memory_order_release);  // (5) the owner renewed: not expired
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
            sink_ == nullptr ? 0
                             : room.offer(transition{k, record_state::processing, durable_state(to), cause,
                                                     state_word::fence(c.word), outcome,
                                                     s.fingerprint.load(std::memory_order_relaxed),  // relaxed: we hold completing
                                                     std::chrono::nanoseconds(0), now, stored});
        const bool unconfirmed = seq != 0 && is_terminal(to) && sink_->synchronous();
        if (leases_ != nullptr && (cause == transition_cause::succeed || cause == transition_cause::fail)) [[unlikely]]
            observe(k, now - std::chrono::nanoseconds(s.updated.load(std::memory_order_relaxed)));  // relaxed: we hold completing; the claim time
        s.outcome.store(outcome, seqlock::field_store);  // field_store: published by (5)
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

public:
    /// Renews a claim's lease (and clears a doubt mark: the owner is alive). Progress: lock-free.
    std::error_code extend(claim_ref<Atomic>& c, std::chrono::nanoseconds by) noexcept {
        slot_type& s = *c.s;
        std::uint64_t replaced = 0;
        if (std::error_code ec = enter(c, replaced)) return ec;
        s.lease_until.store((clock_.now() + by).count(), seqlock::field_store);  // field_store: published by (5)
        s.word.store(c.word, std::memory_order_release);                                // (5)
        return {};
    }

    /// The owner says its operation ran (or may have run) and its completion could not be
    /// recorded: the claim stays PROCESSING, marked in doubt now (duplicates answer in_doubt, the
    /// doubt is audited), and compensation asks the resolver once the lease expires. Never
    /// releases the key. When the mark cannot be written (the queue is full, or compensation
    /// holds the record), the claim is left as it is: the lease and the resolver decide the same
    /// way, only the duplicates see in_progress until then. Progress: lock-free.
    void hold_in_doubt(const key& k, claim_ref<Atomic>& c) noexcept {
        slot_type& s = *c.s;
        admission room(sink_);
        if (!room.take()) return;
        std::uint64_t replaced = 0;
        if (enter(c, replaced)) return;  // stale (counted, like a drop's) or busy: someone else decides
        const auto now = clock_.now();
        if (sink_ != nullptr)
            (void)room.offer(transition{k, record_state::processing, record_state::processing, transition_cause::doubt,
                                        state_word::fence(c.word), 0,
                                        s.fingerprint.load(std::memory_order_relaxed),  // relaxed: we hold completing
                                        std::chrono::nanoseconds(0), now});
        s.word.store(c.word | state_word::doubt_bit, std::memory_order_release);  // (5)
        if (!state_word::in_doubt(replaced)) count(c_in_doubt);  // a claim is counted in doubt once
    }

    /// A consistent view of the key's record (absent when unknown). Progress: lock-free.
    record_view query(const key& k) const noexcept {
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

    /// Asks the resolver about every processing claim whose lease expired. Not on the hot path;
    /// scans both generations (skipped when no claim is outstanding). Returns the claims resolved.
    std::size_t compensate() {
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
                seqlock::reader_fence();  // (8)
                if (s.word.load(std::memory_order_relaxed) != snap.word) continue;  // the key bytes may be newer
                const auto k = key::parse(text);
                if (!k) continue;
                resolver_answer answer{};
                if (opts_.resolve) answer = opts_.resolve(expired_claim{text, state_word::fence(snap.word), snap.fingerprint});
                if (resolve_claim(s, snap.word, *k, answer)) ++resolved;
            }
        }
        return resolved;
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
    template <class Marks>
    bool rotate_if_due(Marks&& marks) {
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
        epoch_.compare_exchange_strong(expected_epoch, epoch + 1, std::memory_order_seq_cst);  // (7) pairs with (6)
        rotations_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
        return true;
    }

    /// Loads a record during recovery. Only before the guard is shared (single-threaded). The
    /// payload of a succeeded or failed record is copied into the generation's payload arena
    /// (ignored for other states); capacity_exhausted when it does not fit there (over
    /// options.max_payload, or the budget is spent).
    begin_status restore(const key& k, record_state state, std::uint64_t fence, std::uint64_t outcome,
                         std::uint64_t fingerprint, std::chrono::nanoseconds lease_until,
                         std::chrono::nanoseconds updated, std::string_view payload = {}) noexcept {
        if (fence == 0 || fence > state_word::max_fence || state == record_state::absent)
            return begin_status::payload_mismatch;
        const bool with_payload =
            !payload.empty() && (state == record_state::succeeded || state == record_state::failed);
        if (with_payload && payload.size() > opts_.max_payload) return begin_status::capacity_exhausted;
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
        const slot_state st = state == record_state::processing  ? slot_state::processing
                              : state == record_state::succeeded ? slot_state::succeeded
                              : state == record_state::failed    ? slot_state::failed
                                                                 : slot_state::released;
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
        const std::uint64_t inc = state_word::incarnation(s->word.load(std::memory_order_acquire));  // (3)
        if (s->key_ref.load(std::memory_order_relaxed) == 0) {  // relaxed: single-threaded here
            const std::uint64_t ref = cur.keys().append(k, my_stripe());
            if (ref == 0) return begin_status::capacity_exhausted;
            s->key_ref.store(ref, std::memory_order_relaxed);  // relaxed: published by (5)
        }
        const std::uint64_t key_ref = s->key_ref.load(std::memory_order_relaxed) & ~key_arena<Atomic>::has_payload;  // relaxed: single-threaded here
        if (with_payload) {
            const std::uint64_t pref = cur.payloads().append(payload, my_stripe());
            if (pref == 0) return begin_status::capacity_exhausted;
            cur.set_payload_ref(*s, pref);
            s->key_ref.store(key_ref | key_arena<Atomic>::has_payload, std::memory_order_relaxed);  // relaxed: published by (5)
        } else {
            s->key_ref.store(key_ref, std::memory_order_relaxed);  // relaxed: published by (5); a second restore without one
        }
        s->outcome.store(outcome, std::memory_order_relaxed);  // relaxed: published by (5)
        s->fingerprint.store(fingerprint, std::memory_order_relaxed);
        s->lease_until.store(lease_until.count(), std::memory_order_relaxed);
        s->updated.store(updated.count(), std::memory_order_relaxed);
        s->word.store(state_word::make(st, inc, fence), std::memory_order_release);  // (5)
        if (new_slot) count(c_fill0 + static_cast<unsigned>(epoch & 1));
        if (st == slot_state::processing) count(c_restored_processing);
        return begin_status::acquired;
    }

    /// Calls fn(key text, view) for every record in memory (terminal, processing and released).
    template <class Fn>
    void for_each(Fn&& fn) const {
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
                seqlock::reader_fence();  // (8)
                if (s.word.load(std::memory_order_relaxed) != snap.word) continue;  // changed meanwhile: skip
                fn(std::move(text), std::move(v));
            }
        }
    }

    /// The lease of a new claim of k: options.lease, or with options.adaptive its operation's
    /// (detail/lease_histogram.hpp). Off, one predictable branch.
    [[nodiscard]] std::chrono::nanoseconds lease_for(const key& k) const noexcept {
        if (leases_ == nullptr) [[likely]] return opts_.lease;
        return adaptive_lease_for(k);
    }
    /// lease_for() with options.adaptive. Out of line, like every step of an option that is off by
    /// default: inlined, its key parsing would make the claim too large for the compiler to inline
    /// the claim's own small steps (measured with callgrind: the counters' adds became calls).
    [[gnu::noinline]] [[nodiscard]] std::chrono::nanoseconds adaptive_lease_for(const key& k) const noexcept {
        const auto parts = k.split();
        const auto l = parts ? leases_->lease(parts->operation) : std::chrono::nanoseconds::zero();
        return l.count() != 0 ? l : opts_.lease;
    }
    /// Records a terminal completion's claim-to-completion time (options.adaptive).
    [[gnu::noinline]] void observe(const key& k, std::chrono::nanoseconds took) noexcept {
        if (const auto parts = k.split()) leases_->record(parts->operation, took);
    }
    /// Recomputes the adaptive leases (guard::maintain()); nothing when options.adaptive is off.
    void refresh_leases() noexcept {
        if (leases_ != nullptr) leases_->refresh();
    }
    /// Each measured operation's latencies and lease in force; empty when options.adaptive is off.
    [[nodiscard]] std::vector<operation_latency> operation_latencies() const {
        return leases_ != nullptr ? leases_->snapshot(opts_.lease) : std::vector<operation_latency>{};
    }

    [[nodiscard]] stats snapshot_stats() const noexcept {
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
        s.rotations = rotations_.load(std::memory_order_relaxed);   // relaxed: a statistic
        s.max_probe = max_probe_.load(std::memory_order_relaxed);   // relaxed: a statistic
        return s;
    }

    void count(unsigned c, std::uint64_t n = 1) noexcept { count_here(c, n); }
    /// count(), always inlined: for the steps every claim and completion takes (grant, complete),
    /// where a call costs more than the count (the compiler stopped inlining it there once the
    /// engine grew; measured with callgrind).
    [[gnu::always_inline]] void count_here(unsigned c, std::uint64_t n = 1) noexcept {
        const stripe_ref st = my_stripe_here();
        stripe_add(stripes_[st.index].v[c], n, st.owned);
    }

    /// The stripe this thread writes counters and arena cursors in; owned (plain adds) only when
    /// Atomic is std::atomic or built on it (real threads; a model checker runs its threads on one
    /// OS thread, which would own one stripe for all of them). Public for tests.
    static stripe_ref stripe() noexcept {
        constexpr bool real_threads = std::is_base_of_v<std::atomic<std::uint64_t>, Atomic<std::uint64_t>>;
        const stripe_ref st = this_thread_stripe();
        return {st.index, real_threads && st.owned};
    }

    /// The stripe this thread writes in this engine: stripe(), unless the thread's owned stripe
    /// was handed out by another copy of this code than the one that first used an owned stripe
    /// of this engine (a guard shared between two shared objects that each carry idem with hidden
    /// visibility: both copies may give index 0 to one of their threads). Threads of the other
    /// copy use the shared stripes (RMWs), so no owned stripe or arena cursor of this engine ever
    /// has two plain writers.
    [[nodiscard]] stripe_ref my_stripe() noexcept { return my_stripe_here(); }
    /// my_stripe(), always inlined: for the claim path's slot and key allocation (grant), where
    /// the compiler stopped inlining my_stripe() once the engine grew (17 instructions a fresh
    /// key, counted with scripts/count-instructions).
    [[gnu::always_inline]] [[nodiscard]] stripe_ref my_stripe_here() noexcept {
        const stripe_ref st = stripe();
        if (!st.owned) return st;
        const void* const mine = stripe_owner::registry();
        const void* seen = registry_.load(std::memory_order_relaxed);  // relaxed: set once; the CAS decides
        if (seen == mine) [[likely]] return st;
        if (seen == nullptr && registry_.compare_exchange_strong(seen, mine, std::memory_order_relaxed)) return st;
        return stripe_owner::as_shared(st);
    }

private:
    [[nodiscard]] std::uint64_t sum(unsigned c) const noexcept {
        std::uint64_t v = 0;
        for (auto& st : stripes_) v += st.v[c].load(std::memory_order_relaxed);  // relaxed: a statistic
        return v;
    }

    /// The slot published at index position i, or nullptr (free, pending or withdrawn position).
    static slot_type* published_slot(generation<Atomic>& g, std::size_t i) noexcept {
        const std::uint64_t ref = position::ref_of(g.entry(i).load(std::memory_order_acquire));  // (1') pairs with (2')
        return ref < 2 ? nullptr : &g.slot_at(ref);
    }

    /// Claims granted (or restored) minus claims completed: zero means nothing can have expired.
    [[nodiscard]] std::uint64_t outstanding() const noexcept {
        const std::uint64_t opened = sum(c_acquired) + sum(c_reclaimed) + sum(c_restored_processing);
        const std::uint64_t closed = sum(c_succeeded) + sum(c_failed) + sum(c_released) + sum(c_reclaimed);
        return opened > closed ? opened - closed : 1;  // counters are not a snapshot: err on scanning
    }

    /// Moves the claim's slot from processing(fence) (with or without the doubt mark) into
    /// completing. `replaced` receives the exact word replaced, for an undo.
    std::error_code enter(claim_ref<Atomic>& c, std::uint64_t& replaced, bool by_owner = true) noexcept {
        slot_type& s = *c.s;
        const std::uint64_t busy = state_word::with_state(c.word, slot_state::completing);
        for (std::uint64_t expected : {c.word, c.word | state_word::doubt_bit}) {
            const std::uint64_t want = expected;
            if (s.word.compare_exchange_strong(expected, busy, std::memory_order_seq_cst)) {  // (4)
                seqlock::writer_fence();  // (9)
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

    [[nodiscard]] static record_view view_of(const snapshot& snap) noexcept {
        record_view v;
        v.state = durable_state(state_word::state(snap.word));
        v.fence = state_word::fence(snap.word);
        v.outcome = snap.outcome;
        v.fingerprint = snap.fingerprint;
        v.in_doubt = state_word::state(snap.word) == slot_state::processing && state_word::in_doubt(snap.word);
        v.lease_until = std::chrono::nanoseconds(snap.lease_until);
        return v;
    }

    /// Sync mode: lease_until of a terminal record with the unconfirmed mark holds its row's
    /// sequence number, with this bit set once the owner gave up waiting for the commit.
    static constexpr std::uint64_t gave_up_flag = std::uint64_t{1} << 62;

    /// What a terminal record with the unconfirmed mark may show: nullopt when its row is durable
    /// (show the record), else in_progress, or in_doubt once the owner was told store_unavailable.
    [[nodiscard]] std::optional<begin_status> unconfirmed(const snapshot& snap) const noexcept {
        if (!is_terminal(state_word::state(snap.word)) || !state_word::in_doubt(snap.word) || sink_ == nullptr)
            return std::nullopt;
        const auto mark = static_cast<std::uint64_t>(snap.lease_until);
        if (sink_->durable(mark & ~gave_up_flag)) return std::nullopt;
        return (mark & gave_up_flag) != 0 ? begin_status::in_doubt : begin_status::in_progress;
    }

    /// After the owner's wait for its terminal row: a commit clears the unconfirmed mark; a wait
    /// that ended without one records that the owner gave up (through the transient completing, so
    /// readers see the flag and the word together). Either CAS fails only if the record moved on.
    void confirm(slot_type& s, std::uint64_t marked, std::uint64_t seq, bool committed) noexcept {
        std::uint64_t expected = marked;
        if (committed) {
            s.word.compare_exchange_strong(expected, marked & ~state_word::doubt_bit, std::memory_order_seq_cst);  // (4)
            return;
        }
        if (!s.word.compare_exchange_strong(expected, state_word::with_state(marked, slot_state::completing),
                                            std::memory_order_seq_cst))  // (4)
            return;
        seqlock::writer_fence();  // (9)
        s.lease_until.store(static_cast<std::int64_t>(seq | gave_up_flag), seqlock::field_store);  // field_store: published by (5)
        s.word.store(marked, std::memory_order_release);  // (5)
    }

    [[nodiscard]] std::uint64_t first_fence(std::uint64_t epoch) const noexcept {
        return ((fence_base_ + epoch) << 32) | 1;
    }

    /// The current generation (of `epoch`) holds options.capacity records, or has used half its
    /// payload budget: memory is full of what the store can answer for (rotate_if_due).
    [[nodiscard]] bool under_pressure(std::uint64_t epoch) const noexcept {
        if (fill(epoch & 1) >= opts_.capacity) return true;
        const auto& p = gens_[epoch & 1]->payloads();
        return p.budget_bytes() != 0 && p.used_bytes() >= p.budget_bytes() / 2;
    }

    [[nodiscard]] std::uint64_t fill(std::uint64_t g) const noexcept {
        return sum(c_fill0 + static_cast<unsigned>(g)) - fill_base_[g & 1].load(std::memory_order_relaxed);  // relaxed: a statistic
    }

    void note_probe(std::size_t probes) noexcept {
        std::uint64_t seen = max_probe_.load(std::memory_order_relaxed);  // relaxed: a statistic
        while (probes > seen && !max_probe_.compare_exchange_weak(seen, probes, std::memory_order_relaxed)) {
        }
    }

    /// existing() for a record whose snapshot says it has a payload: copies it into `payload`
    /// first (so a record that changed meanwhile is looked at again before anything is counted),
    /// and keeps it only for the answers that replay it (succeeded, failed). nullopt: the word
    /// changed while it was copied. Out of line: the answers without a payload do not carry it.
    [[gnu::noinline]] std::optional<begin_answer> replay(const snapshot& snap, std::uint64_t fingerprint,
                                                         const slot_type& s, const generation<Atomic>& g,
                                                         std::string& payload) noexcept {
        if (!copy_payload(s, g, snap, payload)) {
            payload.clear();
            return std::nullopt;
        }
        begin_answer a = existing(snap, fingerprint);
        if (a.status != begin_status::succeeded && a.status != begin_status::failed) payload.clear();
        return a;
    }

    /// The answer for a record found published: a duplicate, in progress, a mismatch (its payload,
    /// if any, is replay()'s).
    begin_answer existing(const snapshot& snap, std::uint64_t fingerprint) noexcept {
        const slot_state st = state_word::state(snap.word);
        const std::uint64_t fence = state_word::fence(snap.word);
        const bool published = st == slot_state::processing || is_terminal(st);
        if (published && fingerprint != 0 && snap.fingerprint != 0 && fingerprint != snap.fingerprint) {
            count(c_mismatch);
            return {begin_status::payload_mismatch, {}, 0, fence};
        }
        if (const auto hidden = unconfirmed(snap)) {  // sync mode: not durable yet, so not visible
            count(c_in_progress);
            return {*hidden, {}, 0, fence};
        }
        if (st == slot_state::succeeded) {
            count(c_duplicates);
            return {begin_status::succeeded, {}, snap.outcome, fence};
        }
        if (st == slot_state::failed) {
            count(c_duplicates);
            return {begin_status::failed, {}, snap.outcome, fence};
        }
        count(c_in_progress);
        if (st == slot_state::processing && state_word::in_doubt(snap.word))
            return {begin_status::in_doubt, {}, 0, fence};
        return {begin_status::in_progress, {}, 0, fence};
    }

    /// The key's (txid, operation) identity and version, or nullopt for a key key::compose could
    /// not have made. The identity hashes "TXID_OPERATION", the key up to its last '_'.
    [[nodiscard]] std::optional<version_claim> version_claim_of(const key& k) const noexcept {
        const auto parts = k.split();
        if (!parts) return std::nullopt;
        const std::size_t prefix = static_cast<std::size_t>(parts->operation.data() - k.view().data()) +
                                   parts->operation.size();
        return version_claim::of(hash_text(k.view().substr(0, prefix)), parts->version);
    }

    /// The version step (version_map.hpp) of a claim that would be granted in epoch `epoch`:
    /// nullopt to go on claiming, or superseded (a newer version was claimed), or capacity_exhausted
    /// (the current map has no room for the identity; nothing changed).
    /// The key is split and hashed on each call (a claim retried after a lost race calls it again):
    /// nothing is kept on the stack of a claim that never asks.
    [[gnu::noinline]] std::optional<begin_answer> version_step_of(const key& k, std::uint64_t epoch) noexcept {
        const std::optional<version_claim> claim = version_claim_of(k);  // nullopt: not composed, no ordering
        if (!claim) return std::nullopt;
        const version_map<Atomic>* previous = epoch != 0 ? versions_[(epoch + 1) & 1].get() : nullptr;
        const auto r = version_step(*versions_[epoch & 1], previous, *claim, opts_.max_probe);
        switch (r.what) {
            case version_map<Atomic>::raised::granted: return std::nullopt;
            case version_map<Atomic>::raised::superseded:
                count(c_superseded);
                return begin_answer{begin_status::superseded, {}, r.newest, 0};
            case version_map<Atomic>::raised::full: break;
        }
        count(c_capacity);
        return begin_answer{begin_status::capacity_exhausted, {}, 0, 0};
    }

    /// The version step for a claim of a key memory may not know (`unknown`: no record in either
    /// generation). A newer version supersedes k only if k itself never ran: a version that ran
    /// and left memory is in the cold window, and its duplicate must get its recorded answer, not
    /// superseded ("not executed" for a charge that ran would have it charged again by other
    /// means). So a superseded answer for a key the cold window may hold asks the store first:
    /// its record (replayed, nothing installed) or store_unavailable when it cannot be read.
    [[gnu::noinline]] std::optional<begin_answer> version_step_after_recall(const key& k, hash128 h, std::uint64_t epoch,
                                                                             bool unknown, std::uint64_t fingerprint,
                                                                             std::string* payload) noexcept {
        std::optional<begin_answer> v = version_step_of(k, epoch);
        if (!v || v->status != begin_status::superseded || !unknown || cold_ == nullptr || !cold_->may_contain(h.lo, h.hi))
            return v;
        if (auto recalled = recall_without_slot(k, fingerprint, payload)) return recalled;
        return v;  // the store has no record of k (or only a released one): it never ran
    }

    /// The recheck: the newest version of k's (txid, operation), if newer than k's own version.
    /// `gen` is the generation of the claim, whose map was current at its step. While it is still
    /// current (a claim it holds keeps it from being recycled, so the parity tells), a newer version
    /// granted after our step took its own step there: a step in a later epoch follows the rotation
    /// (7) that this load (6) would see, and a step in an earlier epoch fails its epoch check and is
    /// taken again here. Otherwise the other map is read too.
    [[gnu::noinline]] [[nodiscard]] std::optional<std::uint32_t> newer_version(const key& k, const generation<Atomic>& gen) const noexcept {
        const auto c = version_claim_of(k);
        if (!c) return std::nullopt;
        const unsigned g = &gen == gens_[0].get() ? 0 : 1;
        std::int64_t newest = versions_[g]->newest(*c, opts_.max_probe);
        if ((epoch_.load(std::memory_order_seq_cst) & 1) != g)  // (6)
            newest = std::max(newest, versions_[g ^ 1]->newest(*c, opts_.max_probe));
        if (newest <= static_cast<std::int64_t>(c->version)) return std::nullopt;
        return static_cast<std::uint32_t>(newest);
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
    bool copy_payload(const slot_type& s, const generation<Atomic>& g, const snapshot& snap, std::string& out) const {
        if ((snap.key_ref & key_arena<Atomic>::has_payload) == 0) [[likely]] return true;
        out = g.payloads().read(g.payload_ref_of(s));
        seqlock::reader_fence();  // (8)
        return s.word.load(std::memory_order_relaxed) == snap.word;  // relaxed: ordered by (8)
    }

    /// Copies `payload` into the payload arena of s's generation and records its reference in s
    /// (the caller holds completing; published by its (5)); `stored` gets a view of the bytes
    /// there, for the transition. False when the budget is spent (nothing written in s).
    [[gnu::noinline, gnu::cold]] bool attach_payload(slot_type& s, std::string_view payload, std::string_view& stored) noexcept {
        generation<Atomic>& g = gens_[0]->holds(&s) ? *gens_[0] : *gens_[1];
        const std::uint64_t key_ref = s.key_ref.load(std::memory_order_relaxed);  // relaxed: we hold completing
        if ((key_ref & key_arena<Atomic>::at_mask) == 0) return false;  // no key entry: never expected
        const std::uint64_t pref = g.payloads().append(payload, my_stripe());
        if (pref == 0) return false;
        g.set_payload_ref(s, pref);
        s.key_ref.store(key_ref | key_arena<Atomic>::has_payload, seqlock::field_store);  // field_store: published by (5)
        stored = g.payloads().view(pref);
        return true;
    }

    /// CAS `seen` -> claiming(fence). nullopt: the CAS lost or the claim was withdrawn (retry).
    std::optional<begin_answer> try_claim(slot_type& s, generation<Atomic>& gen, std::uint64_t seen, std::uint64_t fence,
                                          record_state from, const key& k, std::uint64_t fingerprint,
                                          std::uint64_t epoch, transition_cause cause, admission& room,
                                          std::string* payload) noexcept {
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
    std::optional<begin_answer> claim_fresh(index_entry<Atomic>& e, generation<Atomic>& gen, hash128 h,
                                            std::uint64_t fence, record_state from, const key& k,
                                            std::uint64_t fingerprint, std::uint64_t epoch,
                                            std::chrono::nanoseconds now, admission& room,
                                            std::string* payload) noexcept {
        if (epoch_.load(std::memory_order_seq_cst) != epoch) {  // (6) a rotation overtook us: withdraw
            position::withdraw(e, h);
            return std::nullopt;
        }
        // The epoch is current, so this generation cannot be recycled (its arenas reset) while the
        // position is pending: a pending position blocks recycling like a claim in progress.
        const std::uint64_t n = fence > state_word::max_fence ? slot_arena<Atomic>::npos
                                                              : gen.slots().alloc(my_stripe_here());
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
        if (state_word::state(seen) != slot_state::vacant) {
            position::withdraw(e, h);  // never expected; the slot is left unused
            return std::nullopt;
        }
        // release: a reader that acquires this word also sees the recycle's reset of the identity
        // (which this thread saw through (6)), so it cannot validate the identity of an earlier life.
        s.word.store(state_word::make(slot_state::claiming, inc, fence), std::memory_order_release);  // (4')
        seqlock::writer_fence();  // (9)
        s.lo.store(h.lo, seqlock::field_store);  // field_store: published by (2')
        s.hi.store(h.hi, seqlock::field_store);
        s.key_ref.store(0, seqlock::field_store);
        position::publish(e, h, n);  // (2') the slot, claiming, with its identity
        return grant(s, gen, seen, fence, from, k, fingerprint, transition_cause::claim, now, room, payload);
    }

    /// Another caller is placing the key's first slot in this generation right now.
    begin_answer pending_claim() noexcept {
        count(c_in_progress);
        return {begin_status::in_progress, {}, 0, 0};
    }

    /// The claim is ours (the slot holds claiming(fence), replacing `seen`): writes its fields,
    /// offers it to the sink under the reservation `room` (taken before the claim, so the offer
    /// cannot be refused) and publishes it as processing, or undoes it (full key arena).
    std::optional<begin_answer> grant(slot_type& s, generation<Atomic>& gen, std::uint64_t seen, std::uint64_t fence,
                                      record_state from, const key& k, std::uint64_t fingerprint,
                                      transition_cause cause, std::chrono::nanoseconds now, admission& room,
                                      std::string* payload) noexcept {
        const std::uint64_t inc = state_word::incarnation(seen);
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
            cold_->may_contain(s.lo.load(std::memory_order_relaxed), s.hi.load(std::memory_order_relaxed))) {  // relaxed: we hold claiming
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
            sink_ == nullptr ? 0 : room.offer(transition{k, from, record_state::processing, cause, fence, 0, fingerprint, lease_until, now});
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
                return begin_answer{w == durability_wait::rejected ? begin_status::invalid_key
                                                                  : begin_status::store_unavailable,
                                    {}, 0, fence};
            }
        }
        return begin_answer{begin_status::acquired, ref, 0, fence};
    }

    /// The slot holds claiming for key k, which memory did not know but the cold window may hold:
    /// reads the store (blocking; sink_->recall). A terminal or processing record in the window is
    /// installed in the slot and answered as a duplicate or in_progress: no claim. None (a false
    /// positive of the filter, or a record past the window) lets the claim go on (nullopt), from
    /// RELEASED when the store says so. A store that cannot be read: the slot goes back to `seen`
    /// and the caller is told store_unavailable, nothing decided.
    std::optional<begin_answer> recall(slot_type& s, generation<Atomic>& gen, std::uint64_t seen, const key& k,
                                       std::uint64_t fingerprint, record_state& from, std::string* payload) noexcept {
        count(c_recalls);
        const recalled r = sink_->recall(k);
        const bool installable = r.found == recalled::kind::record &&
                                 (r.state == record_state::processing || r.state == record_state::succeeded ||
                                  r.state == record_state::failed);
        if (r.found == recalled::kind::record && r.state == record_state::released) from = record_state::released;
        if (r.found != recalled::kind::unavailable && !installable) return std::nullopt;
        const bool representable = r.fence != 0 && r.fence <= state_word::max_fence;
        if (r.found == recalled::kind::unavailable || !representable) {
            s.word.store(seen, std::memory_order_release);  // (5) undo: nothing changed
            count(c_recall_failed);
            return begin_answer{begin_status::store_unavailable, {}, 0, 0};
        }
        if (s.key_ref.load(std::memory_order_relaxed) == 0) {  // relaxed: we hold claiming
            const std::uint64_t ref = gen.keys().append(k, my_stripe());
            if (ref == 0) {
                s.word.store(seen, std::memory_order_release);  // (5) undo
                count(c_capacity);
                return begin_answer{begin_status::capacity_exhausted, {}, 0, 0};
            }
            s.key_ref.store(ref, seqlock::field_store);  // field_store: published by (5)
        }
        // The store's payload goes to this generation's arena with the record. When it cannot (its
        // budget is spent, or the store holds more than options.max_payload), the record is not
        // installed: the store's answer is given as it is, and the next duplicate asks again.
        const bool terminal = r.state == record_state::succeeded || r.state == record_state::failed;
        if (terminal && !r.payload.empty()) {
            const std::uint64_t key_ref = s.key_ref.load(std::memory_order_relaxed);  // relaxed: we hold claiming
            const std::uint64_t pref =
                r.payload.size() <= opts_.max_payload ? gen.payloads().append(r.payload, my_stripe()) : 0;
            if (pref == 0) {
                s.word.store(seen, std::memory_order_release);  // (5) undo: nothing installed
                return answer_recalled(r, fingerprint, payload);
            }
            gen.set_payload_ref(s, pref);
            s.key_ref.store(key_ref | key_arena<Atomic>::has_payload, seqlock::field_store);  // field_store: published by (5)
        }
        const slot_state st = r.state == record_state::processing  ? slot_state::processing
                              : r.state == record_state::succeeded ? slot_state::succeeded
                                                                   : slot_state::failed;
        snapshot snap;
        snap.word = state_word::make(st, state_word::incarnation(seen), r.fence);
        snap.outcome = r.outcome;
        snap.fingerprint = r.fingerprint;
        snap.lease_until = r.lease_until.count();
        snap.updated = r.updated.count();
        snap.lo = s.lo.load(std::memory_order_relaxed);  // relaxed: we hold claiming
        snap.hi = s.hi.load(std::memory_order_relaxed);
        snap.valid = true;
        s.outcome.store(snap.outcome, seqlock::field_store);  // field_store: published by (5)
        s.fingerprint.store(snap.fingerprint, seqlock::field_store);
        s.lease_until.store(snap.lease_until, seqlock::field_store);
        s.updated.store(snap.updated, seqlock::field_store);
        if (st == slot_state::processing) count(c_restored_processing);  // compensation looks at it
        s.word.store(snap.word, std::memory_order_release);  // (5)
        count(c_recalled);
        const begin_answer a = existing(snap, fingerprint);  // no slot given: the payload is r's
        if (payload != nullptr && (a.status == begin_status::succeeded || a.status == begin_status::failed))
            *payload = r.payload;
        return a;
    }

    /// The table is full and key k may be in the cold window: the store's record, if it is in the
    /// window, is the answer (nothing is installed or granted); otherwise nullopt (the caller says
    /// capacity_exhausted: a new key needs a slot).
    std::optional<begin_answer> recall_without_slot(const key& k, std::uint64_t fingerprint,
                                                    std::string* payload) noexcept {
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
    begin_answer answer_recalled(const recalled& r, std::uint64_t fingerprint, std::string* payload) {
        count(c_recalled);
        if (r.state != record_state::processing && fingerprint != 0 && r.fingerprint != 0 &&
            fingerprint != r.fingerprint) {
            count(c_mismatch);
            return begin_answer{begin_status::payload_mismatch, {}, 0, r.fence};
        }
        if (r.state == record_state::processing) {
            count(c_in_progress);
            return begin_answer{begin_status::in_progress, {}, 0, r.fence};
        }
        count(c_duplicates);
        if (payload != nullptr) *payload = r.payload;
        return begin_answer{r.state == record_state::succeeded ? begin_status::succeeded : begin_status::failed, {},
                            r.outcome, r.fence};
    }

    /// Applies the resolver's answer to the claim seen as `seen` (processing, expired). A succeeded
    /// or failed answer is completed with its payload; one whose payload the guard cannot hold
    /// (over options.max_payload, budget spent) is marked in doubt, like unknown.
    bool resolve_claim(slot_type& s, std::uint64_t seen, const key& k, const resolver_answer& answer) {
        claim_ref<Atomic> ref{&s, seen & ~state_word::doubt_bit};
        if (answer.verdict != resolution::unknown) {
            const slot_state to = answer.verdict == resolution::succeeded ? slot_state::succeeded
                                  : answer.verdict == resolution::failed  ? slot_state::failed
                                                                          : slot_state::released;
            const std::error_code ec =
                complete(k, ref, to, answer.outcome, transition_cause::compensate, /*check_lease=*/true, true, answer.payload);
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
        if (s.lease_until.load(std::memory_order_relaxed) > clock_.now().count()) {  // relaxed: we hold completing
            s.word.store(replaced, std::memory_order_release);                         // (5) renewed meanwhile
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

    options opts_;
    Clock clock_;
    transition_sink* sink_;
    std::uint64_t fence_base_ = 0;  // generations before this process (from the store's max fence)
    std::unique_ptr<generation<Atomic>> gens_[2];
    unsigned char secret_[XXH3_SECRET_DEFAULT_SIZE];
    std::atomic<const void*> registry_{nullptr};  ///< the copy of this code whose threads own stripes here (my_stripe)
    alignas(64) Atomic<std::uint64_t> epoch_{0};
    std::mutex rotate_mutex_;  // rotation only; never taken on the hot path
    struct flush_mark {
        std::uint64_t epoch = 0;
        std::uint64_t seq = 0;
        bool taken = false;  ///< a mark was taken in `epoch`
    };
    flush_mark mark_;  ///< under rotate_mutex_: rotate_if_due's durability mark for the previous generation
    alignas(64) Atomic<std::uint64_t> max_probe_{0};
    Atomic<std::uint64_t> rotations_{0};
    counter_stripe<Atomic> stripes_[stripe_count];
    Atomic<std::uint64_t> fill_base_[2];  ///< sum of a generation's fill counters when it was last recycled
    std::unique_ptr<window_filter> cold_;  ///< the cold window (durable guards with a window), else null
    std::unique_ptr<operation_leases> leases_;  ///< options.adaptive: per-operation latencies and leases, else null
    std::unique_ptr<version_map<Atomic>> versions_[2];  ///< per generation, with ordered versions; else null
    std::unique_ptr<arena_toucher> toucher_;  ///< declared last: stopped before the generations are unmapped
};

}  // namespace idem::detail
