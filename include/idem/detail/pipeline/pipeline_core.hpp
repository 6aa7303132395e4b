// idem/detail/pipeline/pipeline_core.hpp: the flush pipeline's logic, with no thread and no clock.
//
// The core is what flush_pipeline.hpp drives from its flusher thread and what the deterministic
// simulation (verify/sim_test.cpp) drives by hand: the same code, so a seed exercises the pipeline
// users run. It has two sides.
//
// Hot path (any thread, lock-free, no allocation, no system call):
//   try_reserve()  takes room for one row, or fails at once when the queue is full. A refusal reads
//                  one shared word and writes nothing: no sequence number, no lock, no allocation,
//                  so callers that spin on backpressure cost the flusher almost nothing.
//   push(row)      uses a reservation: takes the row's sequence number and enqueues it. It cannot
//                  fail (the reservation guarantees a free cell: flush_queue.hpp).
//   unreserve()    gives back a reservation that will not be used.
//
// Flusher (one thread at a time): step(store) makes at most one store call and says what happened.
//   * Rows are popped (up to max_batch), sorted by (key, seq) and applied in one transaction under
//     a fresh batch id. Popping gives their room back.
//   * A store outage (store_unavailable, store_error) leaves the rows pending: the next step tries
//     again (the driver backs off and reconnects in between).
//   * commit_unknown: the rows stay pending under that batch id and the next steps only ask the
//     store whether it committed (store::committed); they are applied again, under a new id, only
//     when the store answered "not committed". Never a blind retry.
//   * rejected_row (the store can never take something a row holds): the rows are applied in
//     smaller prefixes (halving) until the one row is found; it is set aside (counted, named in
//     last_error, its seq remembered as rejected) and the others commit. The width grows back after
//     each success, so one bad row costs O(log max_batch) extra transactions. The record the row
//     would have written is kept (set_aside(key)) until a later row of its key commits: the guard
//     may evict the decided record from memory once its row is decided, and a duplicate must then
//     still find the decision (a recall answers from here before it reads the store).
//
// Lanes (pipelined commits; docs/pg_pipeline.md). A store that is also a pipelined_store with
// lanes() > 1 can commit on several connections at once: one flusher thread per lane calls
// step_lane(store, lane), and up to lanes() batches ("jobs") are in flight. Per-key order holds by
// one rule: a job is formed only of rows whose key no other job holds, where a job holds its keys
// from its forming until every one of its rows is decided: while in flight, and while it waits to
// be retried after an outage, an unknown commit, or a rejected row. Rows whose key is held wait in
// `deferred_` in pop order, ahead of the queue, so a key's rows still reach the store in the order
// a single lane would give them. A failed job is retried (by the next lane that is free) before any
// new job can hold one of its keys: the rule leaves no other way. The watermark below is unchanged:
// it advances over decided seqs only, so a sync waiter is woken for a contiguous committed prefix,
// whatever order the lanes finish in. A store with one lane uses step() and behaves as before.
//
// Watermark: every seq <= watermark() committed or was set aside. Rows can commit out of seq order
// (two producers take seqs 5 and 6 and push 6 first), so committed seqs above the watermark wait in
// a set until the gap closes; the set holds at most queue_capacity + lanes * max_batch seqs (plus
// the deferred rows, at most max(max_batch, 1024)), because no seq is ever skipped (reservations
// make push infallible).
//
// Memory ordering
//   (P1) room_ CAS (try_reserve), acq_rel: pairs with (P2) so a reservation sees the node the
//        flusher's pop freed.
//   (P2) room_ fetch_add after a pop, release.
//   (P3) watermark_ store, release, under mutex_: pairs with (P4), so a reader of watermark() >= seq
//        also sees the store's commit of that row (it happened before, on the flusher thread of the
//        lane that committed it, which then took mutex_).
//   (P4) watermark_ load, acquire.
//   (P5) next_seq_ fetch_add in push, seq_cst: pairs with (P6) and flush_pipeline's (S1)/(S2), the
//        producer's half of the idle flusher's lost-wake-up argument (flush_pipeline.hpp, "Idle").
//        On x86 a seq_cst RMW is the same locked instruction as a relaxed one: push costs nothing.
//   (P6) next_seq_ load in unpopped(), seq_cst: the sleeper's half; see (P5).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "idem/detail/assert.hpp"
#include "idem/detail/pipeline/flush_queue.hpp"
#include "idem/error.hpp"
#include "idem/pipelined_store.hpp"
#include "idem/store.hpp"

namespace idem::detail::pipeline {

/// What a sync waiter learns about its row.
enum class row_fate : std::uint8_t {
    pending,    ///< not yet decided
    committed,  ///< durable in the store
    rejected,   ///< the store can never take it; set aside (see last_error)
};

class pipeline_core {
public:
    /// Largest queue (its cells are allocated up front: about 218 MB at the limit, 208 bytes a row).
    static constexpr std::size_t max_queue_capacity = 65535u * 16;

    pipeline_core(std::size_t queue_capacity, std::size_t max_batch, std::uint64_t batch_prefix)
        : capacity_(check_capacity(queue_capacity)),
          max_batch_(max_batch == 0
                         ? throw error(errc::invalid_argument, "store_options.max_batch is 0; it must be at least 1")
                         : max_batch),
          batch_prefix_(batch_prefix),
          queue_(capacity_),
          room_(static_cast<std::int64_t>(capacity_)) {
        one_.rows.reserve(max_batch_);
        one_.width = max_batch_;
    }

    // ---- hot path ---------------------------------------------------------------------------

    /// Room for one row, or false when the queue is full. Progress: lock-free; a refusal writes
    /// nothing shared.
    [[nodiscard]] bool try_reserve() noexcept {
        std::int64_t room = room_.load(std::memory_order_relaxed);  // relaxed: the CAS decides
        while (room > 0) {
            if (room_.compare_exchange_weak(room, room - 1, std::memory_order_acq_rel,  // (P1) pairs with (P2)
                                            std::memory_order_relaxed))
                return true;
        }
        return false;
    }

    /// Gives back a reservation that was not used. Progress: wait-free.
    void unreserve() noexcept {
        // A caller holding a reservation keeps room_ below capacity_ for as long as it holds it.
        IDEM_DEBUG_ASSERT(room_.load(std::memory_order_relaxed) < static_cast<std::int64_t>(capacity_),
                          "unreserve() gives back a reservation try_reserve() took");
        room_.fetch_add(1, std::memory_order_release);  // (P2)
    }

    /// Enqueues a row under a reservation; returns its sequence number (> 0). Progress: lock-free.
    std::uint64_t push(store_row row) noexcept {
        IDEM_DEBUG_ASSERT(room_.load(std::memory_order_relaxed) < static_cast<std::int64_t>(capacity_),
                          "push() under a reservation (try_reserve): it guarantees the row's cell");
        // seq_cst (P5): the seq is unique whatever the order; seq_cst puts this RMW in the single
        // total order with an idle flusher's (S1) and (P6), so either the flusher sees this row
        // coming or the caller's (S2), after this push, sees the flusher asleep.
        row.seq = next_seq_.fetch_add(1, std::memory_order_seq_cst) + 1;
        queue_.push(row);  // the reservation guarantees its cell (flush_queue.hpp)
        return row.seq;
    }

    // ---- flusher ----------------------------------------------------------------------------

    enum class step_result : std::uint8_t {
        idle,      ///< nothing to write
        progress,  ///< rows committed or set aside; the watermark may have moved
        failed,    ///< the store call failed (outage or unknown commit); the rows stay pending
    };

    /// At most one store call. Not thread-safe: one flusher at a time.
    step_result step(store& st) {
        if (one_.rows.empty()) {
            fill();
            if (one_.rows.empty()) return step_result::idle;
        }
        return attempt(
            one_, [&](std::span<const store_row> rows, std::uint64_t id) { st.apply(rows, id); },
            [&](std::uint64_t id) {
                st.reconnect();
                return st.committed(id);
            });
    }

    /// One store call on `lane` of a pipelined store (see "Lanes" above): retries a job that failed,
    /// or forms a new one of rows whose keys no other job holds, and applies it. Thread-safe across
    /// lanes; one thread per lane. Returns idle when there is nothing this lane may take now.
    /// `taken()` runs once the lane holds a job, before its store call (the driver wakes another
    /// lane to look for more work while this one waits for its commit).
    template <class Taken>
    step_result step_lane(pipelined_store& st, std::size_t lane, Taken&& taken) {
        std::unique_ptr<job> j;
        {
            std::lock_guard lock(lanes_mutex_);
            if (!retry_.empty()) {
                j = std::move(retry_.front());
                retry_.erase(retry_.begin());
            } else {
                // Another commit is in flight: start a second one only for a batch worth a
                // transaction; fewer rows wait for the next free lane and join a larger batch.
                if (in_flight_ != 0 && queued() + deferred_.size() < pipelined_rows()) return step_result::idle;
                j = form_job();
                if (!j) return step_result::idle;
            }
            ++in_flight_;
        }
        taken();
        const step_result result = attempt(
            *j, [&](std::span<const store_row> rows, std::uint64_t id) { st.apply_on(lane, rows, id); },
            [&](std::uint64_t id) {
                st.reconnect_on(lane);
                return st.committed_on(lane, id);
            });
        std::lock_guard lock(lanes_mutex_);
        --in_flight_;
        if (j->rows.empty()) {
            for (const std::size_t h : j->keys)
                if (auto it = held_.find(h); it != held_.end() && --it->second == 0) held_.erase(it);
        } else {
            retry_.push_back(std::move(j));  // its keys stay held until every row is decided
        }
        return result;
    }
    step_result step_lane(pipelined_store& st, std::size_t lane) {
        return step_lane(st, lane, [] {});
    }

    /// Every seq <= watermark() committed or was set aside. Progress: wait-free.
    [[nodiscard]] std::uint64_t watermark() const noexcept {
        return watermark_.load(std::memory_order_acquire);  // (P4) pairs with (P3)
    }
    /// True when a row was pushed, or is being pushed (its seq taken, its cell not yet written), that
    /// no flusher has popped: what an idle flusher asks after declaring itself asleep (S1). A stale
    /// popped_ (another lane's pop not yet seen) only answers true. Progress: wait-free.
    [[nodiscard]] bool unpopped() const noexcept {
        return next_seq_.load(std::memory_order_seq_cst) !=  // (P6) pairs with (P5)
               popped_.load(std::memory_order_relaxed);      // relaxed: see above; this thread's own pops are seen
    }
    /// Sequence numbers taken so far (the last one pushed or being pushed).
    [[nodiscard]] std::uint64_t issued() const noexcept {
        // relaxed: there is nothing to pair with (push's fetch_add is relaxed) and nothing to order.
        // A push that happened before this load is counted by coherence alone; what a caller then
        // reads of the store is ordered by the watermark's acquire (P4).
        return next_seq_.load(std::memory_order_relaxed);
    }
    /// What became of `seq`. Progress: wait-free unless a row was ever rejected (then a mutex).
    [[nodiscard]] row_fate fate(std::uint64_t seq) const {
        if (watermark() < seq) return row_fate::pending;
        if (rejected_count_.load(std::memory_order_acquire) == 0) return row_fate::committed;  // pairs with note_rejected
        std::lock_guard lock(mutex_);
        return rejected_seqs_.count(seq) != 0 ? row_fate::rejected : row_fate::committed;
    }
    /// The terminal record the store would hold for `key` had its newest row not been set aside,
    /// while no later row of the key committed; nullopt otherwise. A decided record whose row the store
    /// refused leaves memory like any other (the eviction waits only for its row to be decided),
    /// so this is where a duplicate of it is answered from for the pipeline's life. Progress:
    /// wait-free unless a row was ever rejected (then a mutex).
    [[nodiscard]] std::optional<stored_record> set_aside(std::string_view key) const {
        if (rejected_count_.load(std::memory_order_acquire) == 0) return std::nullopt;  // pairs with note_rejected
        std::lock_guard lock(mutex_);
        const auto it = set_aside_.find(key);
        if (it == set_aside_.end()) return std::nullopt;
        return it->second.rec;
    }
    /// True when every row pushed so far is decided: every push that happened before the call has a
    /// seq <= issued() (coherence of next_seq_), and every seq <= watermark() is decided, the store's
    /// commit of it visible through (P4) pairs with (P3). The two loads may see different instants;
    /// both counters only grow, so a race can only answer false.
    [[nodiscard]] bool drained() const noexcept { return watermark() >= issued(); }
    /// Rows pushed and not yet decided (in the queue, in the batch, or awaiting a gap).
    [[nodiscard]] std::uint64_t depth() const noexcept {
        const std::uint64_t w = watermark(), i = issued();
        return i > w ? i - w : 0;
    }
    /// Rows still pending (batch, jobs waiting for a retry, deferred rows, queue), dropped: the
    /// driver gives up at shutdown. Jobs in flight on other lanes are theirs to finish or abandon.
    std::uint64_t abandon() {
        std::uint64_t n = one_.rows.size();
        if (n != 0) one_.rows.clear();  // lanes never fill one_: they only read it, so two may abandon at once
        {
            std::lock_guard lock(lanes_mutex_);
            n += deferred_.size();
            deferred_.clear();
            for (const auto& j : retry_) n += j->rows.size();
            retry_.clear();  // their keys stay held: nothing of those keys may be written after them
        }
        store_row row;
        std::uint64_t popped = 0;
        while (queue_.try_pop(row)) ++popped;
        popped_.fetch_add(popped, std::memory_order_relaxed);  // relaxed: see unpopped(); no room given back
        return n + popped;
    }
    /// Rows popped and not yet decided: the batch (one lane), or deferred rows and jobs waiting for
    /// a retry (lanes; jobs in flight not counted). Flusher threads only.
    [[nodiscard]] bool batch_pending() const {
        if (!one_.rows.empty()) return true;
        std::lock_guard lock(lanes_mutex_);
        return !deferred_.empty() || !retry_.empty();
    }

    struct counters {
        std::uint64_t batches = 0, rows = 0, errors = 0, commit_unknown = 0, rejected = 0;
        std::uint64_t unanswered = 0;  ///< failed store::committed() questions about an unknown commit
        std::string last_error;
    };
    [[nodiscard]] counters snapshot() const {
        std::lock_guard lock(mutex_);
        return counters_;
    }

private:
    static std::size_t check_capacity(std::size_t n) {
        if (n == 0 || n > max_queue_capacity)
            throw error(errc::invalid_argument, "store_options.queue_capacity " + std::to_string(n) + " is outside 1.." +
                                                    std::to_string(max_queue_capacity));
        return n;
    }

    void fill() {
        store_row row;
        std::int64_t popped = 0;
        while (one_.rows.size() < max_batch_ && queue_.try_pop(row)) {
            one_.rows.push_back(row);
            ++popped;
        }
        if (popped != 0) note_popped(popped);
        sort_rows(one_.rows);
        one_.width = max_batch_;
    }

    /// Rows popped: their room goes back to the producers, and unpopped() counts them.
    void note_popped(std::int64_t n) noexcept {
        popped_.fetch_add(static_cast<std::uint64_t>(n), std::memory_order_relaxed);  // relaxed: see unpopped()
        room_.fetch_add(n, std::memory_order_release);                                // (P2) pairs with (P1)
    }

    static void sort_rows(std::vector<store_row>& rows) {
        std::sort(rows.begin(), rows.end(), [](const store_row& a, const store_row& b) {
            const auto ka = a.t.k.view(), kb = b.t.k.view();
            return ka != kb ? ka < kb : a.seq < b.seq;
        });
    }

    /// Rows decided: the watermark advances over the contiguous prefix of decided seqs. Called by
    /// every lane's thread; mutex_ orders them.
    void decide(std::span<const store_row> rows, bool rejected) {
        std::lock_guard lock(mutex_);
        decided_seqs_.clear();
        for (const store_row& r : rows) {
            decided_seqs_.push_back(r.seq);
            if (rejected) {
                rejected_seqs_.insert(r.seq);
            } else if (!set_aside_.empty()) {  // a later row of the key committed: the store is newer
                const auto it = set_aside_.find(r.t.k.view());
                if (it != set_aside_.end() && it->second.seq < r.seq) set_aside_.erase(it);
            }
        }
        if (!rejected) {
            counters_.batches++;
            counters_.rows += rows.size();
        }
        // The watermark moves over the batch's seqs and done_ together, in order. A batch usually
        // holds the very next seqs (every row popped since the last one), so they advance it
        // without entering done_; only seqs past a gap (a row still in another lane, or being
        // isolated) wait there. (A set insert and erase per row cost the flusher about 4 % of its
        // CPU on SQLite, with their allocations.)
        std::sort(decided_seqs_.begin(), decided_seqs_.end());
        std::uint64_t w = watermark_.load(std::memory_order_relaxed);  // relaxed: written under mutex_ only
        std::size_t i = 0;
        for (;;) {
            if (i < decided_seqs_.size() && decided_seqs_[i] == w + 1) {
                ++w;
                ++i;
            } else if (!done_.empty() && *done_.begin() == w + 1) {
                ++w;
                done_.erase(done_.begin());
            } else {
                break;
            }
        }
        IDEM_ASSERT(i == decided_seqs_.size() || decided_seqs_[i] > w + 1,
                    "a decided seq is decided once: never at or below the watermark");
        done_.insert(decided_seqs_.begin() + static_cast<std::ptrdiff_t>(i), decided_seqs_.end());
        watermark_.store(w, std::memory_order_release);  // (P3) pairs with (P4)
    }

    /// A batch: the single flusher's (one_), or a lane's job. Rows sorted by (key, seq), the state
    /// of the halving and of an unknown commit, and for a job the hashes of its distinct keys (held
    /// in held_ while the job lives).
    struct job {
        std::vector<store_row> rows;
        std::vector<std::size_t> keys;
        std::size_t width = 0;            // rows the next apply takes (halved to isolate a rejected row)
        std::uint64_t unknown_batch = 0;  // id of the prefix whose commit is unknown, else 0
        std::size_t unknown_width = 0;
    };

    /// Rows a lane needs waiting before it starts a commit beside one in flight. Small batches in
    /// parallel cost more per row (a transaction each) than they save; large ones (async mode under
    /// load) are where a second connection pays. A quarter of max_batch, at most 1,024 rows (the
    /// figure measured with max_batch 4,096; a larger max_batch must not keep the lanes idle).
    [[nodiscard]] std::size_t pipelined_rows() const noexcept { return std::clamp<std::size_t>(max_batch_ / 4, 1, 1024); }
    /// Rows reserved and not yet popped: the queue's depth, give or take reservations in progress.
    [[nodiscard]] std::size_t queued() const noexcept {
        const std::int64_t room = room_.load(std::memory_order_relaxed);  // relaxed: an estimate
        if (room >= static_cast<std::int64_t>(capacity_)) return 0;
        return capacity_ - static_cast<std::size_t>(std::max<std::int64_t>(room, 0));
    }

    /// Most rows deferred at once (rows popped, room given back): beyond it the queue waits.
    [[nodiscard]] std::size_t deferred_limit() const noexcept { return std::max<std::size_t>(max_batch_, 1024); }

    static std::size_t key_hash(const store_row& r) noexcept { return std::hash<std::string_view>{}(r.t.k.view()); }

    /// A new job: deferred rows first, then the queue, in pop order; a row whose key another job
    /// holds is deferred (a hash collision only defers more). Under lanes_mutex_. Null when there is
    /// nothing to take.
    std::unique_ptr<job> form_job() {
        auto j = std::make_unique<job>();
        const auto held = [&](const store_row& r) { return held_.find(key_hash(r)) != held_.end(); };
        if (!deferred_.empty()) {
            std::vector<store_row> keep;
            for (const store_row& r : deferred_) {
                // Once the job is full every later row stays, so no row overtakes one of its key.
                if (j->rows.size() < max_batch_ && !held(r)) j->rows.push_back(r);
                else keep.push_back(r);
            }
            deferred_.swap(keep);
        }
        store_row row;
        std::int64_t popped = 0;
        while (j->rows.size() < max_batch_ && deferred_.size() < deferred_limit() && queue_.try_pop(row)) {
            ++popped;
            if (held(row)) deferred_.push_back(row);
            else j->rows.push_back(row);
        }
        if (popped != 0) note_popped(popped);
        if (j->rows.empty()) return nullptr;
        sort_rows(j->rows);
        for (std::size_t i = 0; i < j->rows.size(); ++i)
            if (i == 0 || j->rows[i].t.k.view() != j->rows[i - 1].t.k.view()) {
                j->keys.push_back(key_hash(j->rows[i]));
                ++held_[j->keys.back()];
            }
        j->width = max_batch_;
        return j;
    }

    /// One store call for a batch (the single flusher's, or a lane's job): asks about its unknown
    /// commit, or applies its first `width` rows under a fresh batch id. Rows decided leave j.rows.
    /// apply(rows, id) and committed(id) (which reconnects first) name the store and lane.
    template <class Apply, class Committed>
    step_result attempt(job& j, Apply&& apply, Committed&& committed) {
        const std::size_t width = j.unknown_batch != 0 ? j.unknown_width : std::min(j.width, j.rows.size());
        std::span<const store_row> rows(j.rows.data(), width);
        const auto done = [&](std::size_t n, bool rejected) {
            decide(std::span<const store_row>(j.rows.data(), n), rejected);
            j.rows.erase(j.rows.begin(), j.rows.begin() + static_cast<std::ptrdiff_t>(n));
            if (!rejected) j.width = std::min(max_batch_, j.width * 2);  // grow back after a success
            return step_result::progress;
        };
        if (j.unknown_batch != 0) {
            try {
                const bool was = committed(j.unknown_batch);
                j.unknown_batch = 0;  // answered
                if (was) return done(width, false);
            } catch (const std::exception& e) {
                note_error(e.what(), false, true);
                return step_result::failed;  // still unknown: ask again
            }
        }
        // relaxed: the counter only makes ids unique; lanes take them concurrently
        const std::uint64_t id = batch_prefix_ | (batch_counter_.fetch_add(1, std::memory_order_relaxed) + 1);
        try {
            apply(rows, id);
        } catch (const commit_unknown& e) {
            note_error(e.what(), true);
            j.unknown_batch = id;
            j.unknown_width = width;
            return step_result::failed;
        } catch (const rejected_row& e) {
            if (width > 1) {
                j.width = width / 2;  // find the row: halve the prefix
                note_error(e.what(), false);
                return step_result::progress;
            }
            note_rejected(rows.front(), e.what());
            return done(1, true);
        } catch (const std::exception& e) {
            note_error(e.what(), false);
            return step_result::failed;
        }
        return done(width, false);
    }

    void note_error(const std::string& what, bool unknown, bool unanswered = false) {
        std::lock_guard lock(mutex_);
        counters_.errors++;
        if (unknown) counters_.commit_unknown++;
        if (unanswered) counters_.unanswered++;
        counters_.last_error = what;
    }

    void note_rejected(const store_row& r, const std::string& what) {
        std::lock_guard lock(mutex_);
        counters_.errors++;
        counters_.rejected++;
        counters_.last_error = "set aside the " + std::string(to_string(r.t.cause)) + " row of key '" +
                               key::printable(r.t.k.view()) + "' (fence " + std::to_string(r.t.fence) +
                               "), which the store can never take: " + what;
        remember_set_aside(r);
        rejected_count_.fetch_add(1, std::memory_order_release);  // pairs with the acquire loads in fate(), set_aside()
    }

    /// Keeps the terminal record `r` would have written (a rejected row is the newest of its key
    /// decided so far: rows of one key are decided in seq order). Only terminal records leave the
    /// guard's memory while their key is still in the window, so only they need a home here; a
    /// later non-terminal row set aside drops the entry (the key moved on). The payload is copied:
    /// the row's view points into the guard's arena, recycled with the record.
    void remember_set_aside(const store_row& r) {  // under mutex_
        const auto it = set_aside_.find(r.t.k.view());
        if (it != set_aside_.end() && it->second.seq > r.seq) return;
        if (r.t.to != record_state::succeeded && r.t.to != record_state::failed) {
            if (it != set_aside_.end()) set_aside_.erase(it);
            return;
        }
        kept_row& kept = it != set_aside_.end() ? it->second : set_aside_[std::string(r.t.k.view())];
        stored_record& rec = kept.rec;
        kept.seq = r.seq;
        rec.key = std::string(r.t.k.view());
        rec.state = r.t.to;
        rec.fence = r.t.fence;
        rec.outcome = r.t.outcome;
        rec.fingerprint = r.t.fingerprint;
        rec.created_ms = rec.created_ms == 0 ? r.at_ms : rec.created_ms;
        rec.updated_ms = r.at_ms;
        rec.payload.assign(r.t.payload.data(), r.t.payload.size());
    }

    struct kept_row {
        std::uint64_t seq = 0;
        stored_record rec;
    };

    const std::size_t capacity_;
    const std::size_t max_batch_;
    const std::uint64_t batch_prefix_;
    flush_queue<store_row> queue_;
    alignas(64) std::atomic<std::int64_t> room_;
    alignas(64) std::atomic<std::uint64_t> next_seq_{0};
    alignas(64) std::atomic<std::uint64_t> watermark_{0};
    std::atomic<std::uint64_t> rejected_count_{0};
    std::atomic<std::uint64_t> popped_{0};  // rows taken out of the queue (flusher threads; unpopped())

    // Flusher-only state.
    job one_;  // the single flusher's batch (step()); lanes leave it empty
    std::atomic<std::uint64_t> batch_counter_{0};

    // Lanes (step_lane), under lanes_mutex_.
    mutable std::mutex lanes_mutex_;
    std::vector<store_row> deferred_;                      // popped, key held by a job; pop order
    std::vector<std::unique_ptr<job>> retry_;              // failed (or halving) jobs, keys still held
    std::unordered_map<std::size_t, std::uint32_t> held_;  // key hash -> jobs holding it
    std::size_t in_flight_ = 0;                            // jobs taken by a lane and not yet back

    mutable std::mutex mutex_;                 // flusher <-> readers of counters and rejected seqs; never on the hot path
    std::set<std::uint64_t> done_;             // decided seqs above the watermark, past a gap
    std::vector<std::uint64_t> decided_seqs_;  // decide()'s scratch: the batch's seqs, sorted
    // Decided as rejected. Kept for the pipeline's life (about 48 bytes a row): a sync-mode terminal
    // record whose row was rejected asks fate(seq) whenever a duplicate reads it, and must never be
    // told "committed". Rejections are rare: keys a store declares it cannot hold never get here.
    std::set<std::uint64_t> rejected_seqs_;
    // Keys whose newest rows were set aside, with the record those rows make (set_aside()).
    std::map<std::string, kept_row, std::less<>> set_aside_;
    counters counters_;
};

}  // namespace idem::detail::pipeline
