// idem/detail/table/record_table.hpp: the lock-free record table behind idem::guard: the claim protocol.
//
// This header holds the protocol: class record_table, claim_ref, admission. The members that make a
// claim's first step, the duplicate's read and the completion's entry are defined in the class
// (begin, prepare, claim, existing, complete); the others are declared in it and defined, `inline`
// as in the class, in companion headers included at the bottom:
//
//   claim_steps.hpp    hot: a claim's steps once claim() found where the key stands
//   completion.hpp     hot: the completion's steps (enter, complete_as), extend, hold_in_doubt
//   payloads.hpp       response payloads: attached by a completion, copied by a validated read
//   construction.hpp   the options' rules, the generations mapped, the toucher started
//   reads.hpp          query, for_each, counters and stats, diagnostics
//   rotation.hpp       what maintenance runs: compensation and the rotation (recycle)
//   restore.hpp        records from the store: recovery's restore, the cold window's recall, and the
//                      one install step both take (record_image.hpp)
//   versions.hpp       ordered versions and adaptive leases: the steps of options off by default
//
// Each component it builds on has a header of its own, with its invariants at its top:
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
//   ../assert.hpp      preconditions: IDEM_DEBUG_ASSERT on the hot path (nothing in a release
//                      build), IDEM_ASSERT in the cold members
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
// * Memory is mapped once, up front (construction.hpp), and committed lazily.
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
// Memory ordering (numbers are referred to at each atomic, here and in the companion headers)
// --------------------------------------------------------------------------------------------
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
#include <atomic>
#include <cstdint>
#include <memory>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "idem/detail/assert.hpp"
#include "idem/detail/table/arena_toucher.hpp"
#include "idem/detail/table/arenas.hpp"
#include "idem/detail/table/index.hpp"
#include "idem/detail/table/lease_histogram.hpp"
#include "idem/detail/table/seqlock_order.hpp"
#include "idem/detail/table/mapping.hpp"
#include "idem/detail/table/record_image.hpp"
#include "idem/detail/table/slot.hpp"
#include "idem/detail/table/snapshot.hpp"
#include "idem/detail/table/stripes.hpp"
#include "idem/detail/table/version_map.hpp"
#include "idem/detail/table/window_filter.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/options.hpp"
#include "idem/stats.hpp"
#include "idem/status.hpp"
#include "idem/transition.hpp"

namespace idem::detail::table {

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
class record_table {
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

    /// Checks the options (idem::error, errc::invalid_argument, naming the option) and maps both
    /// generations up front (construction.hpp).
    record_table(options opts, Clock clock, transition_sink* sink);

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
    /// Turns on the cold window: evicted terminal records are remembered in a filter
    /// (window_filter.hpp) and a claim of a key it may hold asks the store first (restore.hpp).
    void enable_cold_window(std::chrono::nanoseconds window);
    [[nodiscard]] window_filter::entry cold_entry(std::string_view text, std::chrono::nanoseconds at) const noexcept;
    /// In one slice; with `completes`, the filter is complete after them (begin_partial_cold).
    [[nodiscard]] bool remember_cold(std::span<const window_filter::entry> keys, bool completes = false);
    void begin_partial_cold() noexcept;  ///< before sharing: every miss reads the store until completed
    /// The cold window's filter (its rates and memory), or nullptr when it is off.
    [[nodiscard]] const window_filter* cold_window() const noexcept { return cold_.get(); }

    [[nodiscard]] std::chrono::nanoseconds now() const noexcept { return clock_.now(); }
    [[nodiscard]] const options& opts() const noexcept { return opts_; }
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
        // Another key's hash would claim, or answer with, that key's record.
        IDEM_DEBUG_ASSERT(is_hash_of(k, h), "claim(k, h): h is prepare(k), the keyed hash of k itself");
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
            if (versions_[0] == nullptr) [[likely]]
                return std::nullopt;
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
                        if (auto a = try_claim(*s, cur, snap.word, state_word::fence(snap.word) + 1, record_state::released,
                                               k, fingerprint, epoch, transition_cause::claim, room, payload))
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
    /// refused with errc::busy when the lease was renewed since it was seen expired. Sync mode and a
    /// response payload (a terminal `to` only): complete_as in completion.hpp.
    std::error_code complete(const key& k, claim_ref<Atomic>& c, slot_state to, std::uint64_t outcome,
                             transition_cause cause, bool check_lease = false, bool await = true,
                             std::string_view payload = {}) noexcept {
        IDEM_DEBUG_ASSERT(holds_claim(c), "complete() takes an acquired claim's claim_ref: its slot and processing word");
        IDEM_DEBUG_ASSERT(is_terminal(to) || to == slot_state::released,
                          "a completion ends in succeeded, failed or released");
        if (!payload.empty() && is_terminal(to)) [[unlikely]]
            return complete_with_payload(k, c, to, outcome, cause, check_lease, await, payload);
        return complete_as<false>(k, c, to, outcome, cause, check_lease, await, {});
    }

    /// Renews a claim's lease (and clears a doubt mark: the owner is alive). Progress: lock-free.
    std::error_code extend(claim_ref<Atomic>& c, std::chrono::nanoseconds by) noexcept;
    /// The claim stays processing, marked in doubt for the resolver (completion.hpp). Lock-free.
    void hold_in_doubt(const key& k, claim_ref<Atomic>& c) noexcept;

    // ---- off the hot path: reads.hpp, rotation.hpp, restore.hpp, versions.hpp ------------------
    /// A consistent view of the key's record (absent when unknown). Progress: lock-free.
    record_view query(const key& k) const noexcept;
    /// Calls fn(key text, view) for every record in memory (terminal, processing and released).
    template <class Fn>
    void for_each(Fn&& fn) const;
    [[nodiscard]] stats snapshot_stats() const noexcept;
    [[nodiscard]] std::string key_refusal(const key& k) const;
    [[nodiscard]] std::pair<const void*, std::size_t> slot_memory(unsigned g) noexcept;
    /// Asks the resolver about every processing claim whose lease expired; the claims resolved.
    std::size_t compensate();
    /// Recycles the previous generation when it is due; true on rotation. Serialised.
    template <class Marks>
    bool rotate_if_due(Marks&& marks);
    /// Installs a record read from the store at recovery; only before the guard is shared.
    begin_status restore(const key& k, const record_image& image) noexcept;
    void refresh_leases() noexcept;
    [[nodiscard]] std::vector<operation_latency> operation_latencies() const;

    /// The stripe this thread writes counters and arena cursors in; owned (plain adds) only when
    /// Atomic is std::atomic or built on it (real threads; a model checker runs its threads on one
    /// OS thread, which would own one stripe for all of them). Public for tests.
    static stripe_ref stripe() noexcept {
        constexpr bool real_threads = std::is_base_of_v<std::atomic<std::uint64_t>, Atomic<std::uint64_t>>;
        const stripe_ref st = this_thread_stripe();
        return {st.index, real_threads && st.owned};
    }

private:
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
        if (st == slot_state::processing && state_word::in_doubt(snap.word)) return {begin_status::in_doubt, {}, 0, fence};
        return {begin_status::in_progress, {}, 0, fence};
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

    [[nodiscard]] std::uint64_t first_fence(std::uint64_t epoch) const noexcept { return ((fence_base_ + epoch) << 32) | 1; }

    void note_probe(std::size_t probes) noexcept {
        std::uint64_t seen = max_probe_.load(std::memory_order_relaxed);  // relaxed: a statistic
        while (probes > seen && !max_probe_.compare_exchange_weak(seen, probes, std::memory_order_relaxed)) {
        }
    }

    void count(unsigned c, std::uint64_t n = 1) noexcept { count_here(c, n); }
    /// count(), always inlined: for the steps every claim and completion takes (grant, complete),
    /// where a call costs more than the count (the compiler stopped inlining it there once the
    /// table grew; measured with callgrind).
    [[gnu::always_inline]] void count_here(unsigned c, std::uint64_t n = 1) noexcept {
        const stripe_ref st = my_stripe_here();
        stripe_add(stripes_[st.index].v[c], n, st.owned);
    }

    /// The stripe this thread writes in this table: stripe(), unless the thread's owned stripe
    /// was handed out by another copy of this code than the one that first used an owned stripe
    /// of this table (a guard shared between two shared objects that each carry idem with hidden
    /// visibility: both copies may give index 0 to one of their threads). Threads of the other
    /// copy use the shared stripes (RMWs), so no owned stripe or arena cursor of this table ever
    /// has two plain writers.
    [[nodiscard]] stripe_ref my_stripe() noexcept { return my_stripe_here(); }
    /// my_stripe(), always inlined: for the claim path's slot and key allocation (grant), where
    /// the compiler stopped inlining my_stripe() once the table grew (17 instructions a fresh
    /// key, counted with scripts/count-instructions).
    [[gnu::always_inline]] [[nodiscard]] stripe_ref my_stripe_here() noexcept {
        const stripe_ref st = stripe();
        if (!st.owned) return st;
        const void* const mine = stripe_owner::registry();
        const void* seen = registry_.load(std::memory_order_relaxed);  // relaxed: set once; the CAS decides
        if (seen == mine) [[likely]]
            return st;
        if (seen == nullptr && registry_.compare_exchange_strong(seen, mine, std::memory_order_relaxed)) return st;
        return stripe_owner::as_shared(st);
    }

    // What the hot path asserts (IDEM_DEBUG_ASSERT: evaluated only where IDEM_DEBUG_ASSERTS is 1).
    /// c names a slot and holds a claim's processing word without the doubt mark: what begin()
    /// hands out (a doubt mark is the slot's, never the ticket's).
    [[nodiscard]] static bool holds_claim(const claim_ref<Atomic>& c) noexcept {
        return c.s != nullptr && state_word::state(c.word) == slot_state::processing && !state_word::in_doubt(c.word);
    }
    /// h is k's keyed hash (claim()'s precondition); hashes k again.
    [[nodiscard]] bool is_hash_of(const key& k, hash128 h) const noexcept { return hash(k) == h; }

    // ---- declared here, defined in the companion headers ---------------------------------------
    // claim_steps.hpp (hot)
    std::optional<begin_answer> try_claim(slot_type& s, generation<Atomic>& gen, std::uint64_t seen, std::uint64_t fence,
                                          record_state from, const key& k, std::uint64_t fingerprint, std::uint64_t epoch,
                                          transition_cause cause, admission& room, std::string* payload) noexcept;
    std::optional<begin_answer> claim_fresh(index_entry<Atomic>& e, generation<Atomic>& gen, hash128 h, std::uint64_t fence,
                                            record_state from, const key& k, std::uint64_t fingerprint, std::uint64_t epoch,
                                            std::chrono::nanoseconds now, admission& room, std::string* payload) noexcept;
    begin_answer pending_claim() noexcept;
    std::optional<begin_answer> grant(slot_type& s, generation<Atomic>& gen, std::uint64_t seen, std::uint64_t fence,
                                      record_state from, const key& k, std::uint64_t fingerprint, transition_cause cause,
                                      std::chrono::nanoseconds now, admission& room, std::string* payload) noexcept;
    // completion.hpp (hot)
    [[gnu::noinline]] std::error_code complete_with_payload(const key& k, claim_ref<Atomic>& c, slot_state to,
                                                            std::uint64_t outcome, transition_cause cause, bool check_lease,
                                                            bool await, std::string_view payload) noexcept;
    template <bool WithPayload>
    std::error_code complete_as(const key& k, claim_ref<Atomic>& c, slot_state to, std::uint64_t outcome,
                                transition_cause cause, bool check_lease, bool await, std::string_view payload) noexcept;
    std::error_code enter(claim_ref<Atomic>& c, std::uint64_t& replaced, bool by_owner = true) noexcept;
    void confirm(slot_type& s, std::uint64_t marked, std::uint64_t seq, bool committed) noexcept;
    // payloads.hpp
    [[gnu::noinline]] std::optional<begin_answer> replay(const snapshot& snap, std::uint64_t fingerprint, const slot_type& s,
                                                         const generation<Atomic>& g, std::string& payload) noexcept;
    bool copy_payload(const slot_type& s, const generation<Atomic>& g, const snapshot& snap, std::string& out) const;
    [[gnu::noinline, gnu::cold]] bool attach_payload(slot_type& s, std::string_view payload,
                                                     std::string_view& stored) noexcept;
    // construction.hpp
    static void check_options(const options& o);
    // reads.hpp
    [[nodiscard]] std::uint64_t sum(unsigned c) const noexcept;
    static slot_type* published_slot(generation<Atomic>& g, std::size_t i) noexcept;
    [[nodiscard]] static record_view view_of(const snapshot& snap) noexcept;
    // rotation.hpp
    [[nodiscard]] std::uint64_t outstanding() const noexcept;
    bool resolve_claim(slot_type& s, std::uint64_t seen, const key& k, const resolver_answer& answer);
    [[nodiscard]] bool under_pressure(std::uint64_t epoch) const noexcept;
    [[nodiscard]] std::uint64_t fill(std::uint64_t g) const noexcept;
    // restore.hpp
    enum class install_result { installed, no_key_room, no_payload_room };
    install_result install(slot_type& s, generation<Atomic>& gen, const key& k, const record_image& image,
                           std::uint64_t incarnation) noexcept;
    std::optional<begin_answer> recall(slot_type& s, generation<Atomic>& gen, std::uint64_t seen, const key& k,
                                       std::uint64_t fingerprint, record_state& from, std::string* payload) noexcept;
    std::optional<begin_answer> recall_without_slot(const key& k, std::uint64_t fingerprint, std::string* payload) noexcept;
    begin_answer answer_recalled(const recalled& r, std::uint64_t fingerprint, std::string* payload);
    // versions.hpp
    [[nodiscard]] std::chrono::nanoseconds lease_for(const key& k) const noexcept;
    [[gnu::noinline]] [[nodiscard]] std::chrono::nanoseconds adaptive_lease_for(const key& k) const noexcept;
    [[gnu::noinline]] void observe(const key& k, std::chrono::nanoseconds took) noexcept;
    [[nodiscard]] std::optional<version_claim> version_claim_of(const key& k) const noexcept;
    [[gnu::noinline]] std::optional<begin_answer> version_step_of(const key& k, std::uint64_t epoch) noexcept;
    [[gnu::noinline]] std::optional<begin_answer> version_step_after_recall(const key& k, hash128 h, std::uint64_t epoch,
                                                                            bool unknown, std::uint64_t fingerprint,
                                                                            std::string* payload) noexcept;
    [[gnu::noinline]] [[nodiscard]] std::optional<std::uint32_t> newer_version(const key& k,
                                                                               const generation<Atomic>& gen) const noexcept;

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
    Atomic<std::uint64_t> fill_base_[2];                ///< sum of a generation's fill counters when it was last recycled
    std::unique_ptr<window_filter> cold_;               ///< the cold window (durable guards with a window), else null
    std::unique_ptr<operation_leases> leases_;          ///< options.adaptive: per-operation latencies and leases, else null
    std::unique_ptr<version_map<Atomic>> versions_[2];  ///< per generation, with ordered versions; else null
    std::unique_ptr<arena_toucher> toucher_;            ///< declared last: stopped before the generations are unmapped
};

}  // namespace idem::detail::table

// The members declared in the class and defined out of it, each `inline` as an in-class
// definition is, so the compiler makes the inlining decisions it made when they were in the class.
#include "idem/detail/table/claim_steps.hpp"
#include "idem/detail/table/completion.hpp"
#include "idem/detail/table/payloads.hpp"
#include "idem/detail/table/construction.hpp"
#include "idem/detail/table/reads.hpp"
#include "idem/detail/table/rotation.hpp"
#include "idem/detail/table/restore.hpp"
#include "idem/detail/table/versions.hpp"
