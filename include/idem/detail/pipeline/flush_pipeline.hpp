// idem/detail/pipeline/flush_pipeline.hpp: from the hot path to the store, in batches: the flusher thread
// that drives detail::pipeline::pipeline_core (pipeline_core.hpp holds the logic: reservation, queue,
// batches, unknown commits, rejected rows, watermark).
//
// Hot path: reserve() takes room in the queue before the guard changes anything (a full queue:
// spin with yield up to store_options::offer_wait, then refuse: backpressure, nothing changed);
// offer() enqueues under that reservation and cannot fail.
//
// Flusher thread: steps the core. After a failed step it backs off exponentially (up to
// max_backoff) and reconnects; after every step that moved the watermark it wakes every sync
// waiter. Sync mode: await(seq) blocks until the row with seq is decided (group commit: every
// waiter whose row was in the batch wakes on one commit), or until sync_timeout, after which the
// caller gets store_unavailable while the row stays queued.
//
// Pipelined stores (pipelined_store with lanes() > 1, pipeline_core.hpp "Lanes"): one flusher
// thread per lane, each stepping the core on its lane (its own backoff and reconnect), so several
// commits are in flight at once; the watermark still moves over a contiguous prefix only. Idle lanes
// do not all look for work: one does, as the single flusher does below, the others wait on idle_cv_
// until a lane takes a job (one of them then looks) or the pipeline stops. So an idle pipeline costs
// what one flusher costs, and a busy one still starts a second commit as soon as rows arrive while
// the first is in flight.
//
// Idle. A flusher that finds the queue empty looks again every idle_poll while it last found work
// less than idle_linger (10 ms) ago: under a steady load it never sleeps longer, so batches fill as
// they always did and callers never have to wake it. After that it sleeps (sleep()) until an offer,
// a recall it must serve, stop() or a deadline wakes it: its next prune, else idle_sleep, a safety
// net only. An idle guard thus costs about 10 wake-ups a second instead of one per idle_poll.
//   Invariant (no lost wake-up): a row pushed while the flusher sleeps wakes it. The sleeper stores
//   sleeping_ = true (S1, seq_cst) and then asks the core whether a row was pushed that nobody
//   popped (P6, a seq_cst load of the sequence counter); offer() pushes (P5, a seq_cst RMW of that
//   counter) and then loads sleeping_ (S2, seq_cst). In the single total order of those four, either
//   (P5) precedes (P6), and the flusher sees the row coming and does not sleep, or (S1) precedes
//   (S2), and the caller sees it asleep and wakes it: the caller that swaps sleeping_ back to false
//   takes idle_mutex_ (which the sleeper holds from (S1) until it waits) and notifies wake_cv_.
//   The hot path pays one plain load (x86) and a branch; a system call only when the flusher is
//   really asleep, at most once per sleep. Recalls and stop() wake the sleeper under idle_mutex_.
//   The timed wait stays as a safety net: a missed notification would cost latency, never a row.
//
// Recall requests (recall(): a duplicate of a key memory evicted reads the store) are queued,
// joined and served as recall_reads.hpp says (its invariant: a queued request has a caller waiting
// for it); a store that cannot be opened twice has them served by the owner flusher, between batches.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>
#include <time.h>

#include "idem/detail/assert.hpp"
#include "idem/detail/pipeline/pipeline_core.hpp"
#include "idem/detail/pipeline/recall_reads.hpp"
#include "idem/options.hpp"
#include "idem/store.hpp"
#include "idem/store_options.hpp"
#include "idem/transition.hpp"

namespace idem::detail::pipeline {

class flush_pipeline final : public transition_sink {
public:
    /// `to_wall_ms` maps a guard-clock time to Unix milliseconds. Throws idem::error
    /// (invalid_argument) for a queue_capacity or max_batch out of range.
    flush_pipeline(store& st, store_options opts, std::function<std::int64_t(std::chrono::nanoseconds)> to_wall_ms)
        : store_(st),
          opts_(std::move(opts)),
          to_wall_ms_(std::move(to_wall_ms)),
          core_(opts_.queue_capacity, opts_.max_batch, random_batch_prefix()),
          pipelined_(dynamic_cast<pipelined_store*>(&st)),
          lanes_(pipelined_ != nullptr ? std::max<std::size_t>(1, pipelined_->lanes()) : 1),
          reads_([this] { wake_idle(); }) {}
    ~flush_pipeline() override { stop(); }

    void start() {
        IDEM_ASSERT(threads_.empty(), "start() once: the flusher threads are not running");
        running_.store(true, std::memory_order_relaxed);  // relaxed: the thread starts below order it
        reads_.start(store_);
        if (lanes_ == 1) {
            threads_.emplace_back([this] { run(); });
            return;
        }
        for (std::size_t lane = 0; lane < lanes_; ++lane) threads_.emplace_back([this, lane] { run(lane); });
    }

    /// Flusher threads (and commits in flight at most): the store's lanes, else 1.
    [[nodiscard]] std::size_t lanes() const noexcept { return lanes_; }

    /// Drains the queue and stops the flusher. If the store refuses the rows for longer than
    /// sync_timeout after stop() began, the flusher gives up: those rows were acknowledged only in
    /// async mode (sync callers were told store_unavailable), which is the async contract.
    void stop() {
        reads_.stop();
        if (threads_.empty()) return;
        stop_deadline_.store((std::chrono::steady_clock::now() + opts_.sync_timeout).time_since_epoch().count(),
                             std::memory_order_relaxed);   // relaxed: published by (F1)
        running_.store(false, std::memory_order_release);  // (F1) pairs with (F2)
        wake_idle();  // a sleeper or idle lane between its check of running_ and its wait sees the notify
        for (auto& t : threads_) t.join();
        threads_.clear();
    }

    /// Rows the flusher gave up on at stop() (lost if the process now exits). After stop().
    [[nodiscard]] std::uint64_t abandoned_at_stop() const noexcept {
        return abandoned_at_stop_.load(std::memory_order_relaxed);  // relaxed: the joins in stop() order it
    }

    bool reserve() noexcept override {
        if (core_.try_reserve()) return true;
        if (opts_.offer_wait <= std::chrono::nanoseconds::zero()) {
            // A refusal means the flusher is behind, and callers commonly retry at once. Give the
            // processor up once before saying so: on a machine with fewer cores than callers, a
            // caller spinning on backpressure would otherwise take the flusher's CPU time, the one
            // thing that makes room. Only refusals pay this system call; admitted calls never do.
            std::this_thread::yield();
            return core_.try_reserve();
        }
        const auto deadline = std::chrono::steady_clock::now() + opts_.offer_wait;
        while (std::chrono::steady_clock::now() < deadline) {
            std::this_thread::yield();
            if (core_.try_reserve()) return true;
        }
        return false;
    }

    void unreserve() noexcept override { core_.unreserve(); }

    std::uint64_t offer(const transition& t) noexcept override {
        store_row row;
        row.t = t;
        row.at_ms = to_wall_ms_(t.at);
        row.lease_until_ms = t.to == record_state::processing ? to_wall_ms_(t.lease_until) : 0;
        const std::uint64_t seq = core_.push(row);  // (P5) inside: a seq_cst RMW
        // (S2) pairs with (S1): a flusher asleep is woken ("Idle"); an awake one costs this load.
        if (sleeping_.load(std::memory_order_seq_cst)) [[unlikely]]
            wake_flusher();
        return seq;
    }

    durability_wait await(std::uint64_t seq) noexcept override {
        IDEM_DEBUG_ASSERT(seq != 0 && seq <= core_.issued(), "await() a sequence number offer() handed out");
        std::unique_lock lock(mutex_);
        if (!decided_.wait_for(lock, opts_.sync_timeout, [&] { return core_.watermark() >= seq; }))
            return durability_wait::timed_out;
        lock.unlock();
        return core_.fate(seq) == row_fate::rejected ? durability_wait::rejected : durability_wait::committed;
    }

    bool durable(std::uint64_t seq) const noexcept override {
        return core_.watermark() >= seq && core_.fate(seq) == row_fate::committed;
    }

    bool synchronous() const noexcept override { return opts_.mode == durability::sync; }

    bool accepts(const key& k, std::string* why) const noexcept override { return store_.accepts(k, why); }

    /// Turns a stored record into the guard's answer (its clock, the idempotency window). Set by
    /// the durable guard before start().
    void set_recall(std::function<recalled(const stored_record&)> convert) {
        IDEM_ASSERT(threads_.empty(), "set_recall() before start(): the flusher threads read it unsynchronised");
        to_recalled_ = std::move(convert);
    }

    /// Now (Unix ms) on the clock the idempotency window is judged on: the durable guard's clock
    /// mapped to wall time, the mapping the rows' at_ms are written with (durable.hpp,
    /// window_now_ms). The prune bounds are taken from it, so a prune removes what the guard's cold
    /// window calls past the window, no more, after a suspend or a wall-clock step too. Set by the
    /// durable guard before start(); unset (a pipeline without a guard), system_clock.
    void set_window_clock(std::function<std::int64_t()> now_ms) {
        IDEM_ASSERT(threads_.empty(), "set_window_clock() before start(): the owner flusher reads it unsynchronised");
        window_now_ms_ = std::move(now_ms);
    }

    /// Reads the key's record on the reader thread (store::open_reader: a second connection, so
    /// the read does not wait for a batch in flight), or, for a store that cannot be opened twice,
    /// on the flusher thread between two batches; waits up to store_options::recall_timeout. Joins
    /// the request of the same key still queued, if any; a caller that times out leaves its request,
    /// which is dropped unread when nobody else waits for it ("Recall requests").
    recalled recall(const key& k) noexcept override {
        recalled none;
        none.found = recalled::kind::unavailable;
        try {
            // A decision whose row the store refused is answered from the pipeline's memory: the
            // store does not have it, and the guard may have evicted the record (pipeline_core.hpp).
            if (auto kept = core_.set_aside(k.view())) return to_recalled_ ? to_recalled_(*kept) : none;
            const auto req = reads_.read(k, opts_.recall_timeout);
            // Answered: rec and failed are written once, before done, and only read from now on.
            if (!req || req->failed) return none;
            if (!req->rec) return {};
            return to_recalled_ ? to_recalled_(*req->rec) : none;
        } catch (...) {
            return none;
        }
    }

    /// True when every transition offered so far is decided (committed or set aside).
    [[nodiscard]] bool drained() const noexcept { return core_.drained(); }
    /// The last sequence number handed out (a transition offered before this call has one <= it).
    [[nodiscard]] std::uint64_t issued() const noexcept { return core_.issued(); }
    /// True when every transition up to `seq` is decided (committed or set aside).
    [[nodiscard]] bool decided_through(std::uint64_t seq) const noexcept { return core_.watermark() >= seq; }

    /// Blocks until drained() or the timeout passes.
    bool flush(std::chrono::nanoseconds timeout) {
        const std::uint64_t issued = core_.issued();
        std::unique_lock lock(mutex_);
        return decided_.wait_for(lock, timeout, [&] { return core_.watermark() >= issued; });
    }

    struct counters {
        std::uint64_t batches = 0, rows = 0, errors = 0, commit_unknown = 0, rejected = 0, queue_depth = 0;
        std::int64_t lag_ns = 0;
        std::uint64_t cpu_ns = 0;  ///< CPU time the flusher threads have used (their thread CPU clocks, summed)
        std::uint64_t pruned_records = 0, pruned_audit_rows = 0;
        /// Idle flusher threads' returns from a pause, a sleep or a wait (not the backoff after a
        /// failed store call): about 10 a second when idle ("Idle").
        std::uint64_t wakeups = 0;
        bool sleeping = false;              ///< a flusher sleeps now, until an offer wakes it (or idle_sleep)
        std::uint64_t recall_queue = 0;     ///< recall requests queued, not yet being read (<= recall_waiters)
        std::uint64_t recall_waiters = 0;   ///< callers waiting in recall() now
        std::uint64_t recall_reads = 0;     ///< store reads made for recalls
        std::uint64_t recalls_joined = 0;   ///< recalls that joined a queued request of their key
        std::uint64_t recalls_dropped = 0;  ///< requests dropped unread: every caller of them had timed out
        std::string last_error;
    };
    [[nodiscard]] counters snapshot() const {
        const auto c = core_.snapshot();
        counters out;
        out.batches = c.batches;
        out.rows = c.rows;
        out.errors = c.errors;
        out.commit_unknown = c.commit_unknown;
        out.rejected = c.rejected;
        out.last_error = c.last_error;
        out.queue_depth = core_.depth();
        out.lag_ns = lag_ns_.load(std::memory_order_relaxed);                  // relaxed: a statistic
        out.cpu_ns = cpu_ns_.load(std::memory_order_relaxed);                  // relaxed: a statistic
        out.pruned_records = pruned_records_.load(std::memory_order_relaxed);  // relaxed: statistics
        out.pruned_audit_rows = pruned_audit_.load(std::memory_order_relaxed);
        out.wakeups = wakeups_.load(std::memory_order_relaxed);    // relaxed: a statistic
        out.sleeping = sleeping_.load(std::memory_order_relaxed);  // relaxed: a statistic
        const recall_reads::counters r = reads_.snapshot();        // one instant: recall_queue <= recall_waiters
        out.recall_queue = r.queue;
        out.recall_waiters = r.waiters;
        out.recall_reads = r.reads;
        out.recalls_joined = r.joined;
        out.recalls_dropped = r.dropped;
        return out;
    }

private:
    static std::uint64_t random_batch_prefix() {
        std::random_device rd;
        return (static_cast<std::uint64_t>(rd()) << 32) & 0x7fffffff00000000ull;
    }

    /// CPU time this thread has used: one vDSO call per store step, so the cost per transition
    /// of a store and mode can be reported (stats::flusher_cpu_ns) without a profiler.
    static std::uint64_t thread_cpu_ns() noexcept {
        timespec ts{};
        ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
    }

    /// One flusher thread: the whole store (lane == npos, core_.step) or one lane of a pipelined
    /// store (core_.step_lane). Their CPU time adds up in cpu_ns_.
    void run(std::size_t lane = static_cast<std::size_t>(-1)) {
        const bool one = lane == static_cast<std::size_t>(-1);
        const bool owner = one || lane == 0;  // the thread that reads and prunes through store_
        std::chrono::nanoseconds backoff = 1ms;
        auto oldest = std::chrono::steady_clock::now();
        std::uint64_t cpu_seen = thread_cpu_ns();
        for (;;) {
            if (owner) {
                if (!reads_.has_reader()) reads_.serve(store_);
                prune_if_due();
            }
            if (!core_.batch_pending()) oldest = std::chrono::steady_clock::now();
            const auto result = one ? core_.step(store_) : core_.step_lane(*pipelined_, lane, [this] {
                idle_cv_.notify_one();  // this lane is busy now: another one looks for work
            });
            const std::uint64_t cpu = thread_cpu_ns();
            cpu_ns_.fetch_add(cpu - cpu_seen, std::memory_order_relaxed);  // relaxed: a statistic
            cpu_seen = cpu;
            switch (result) {
                case pipeline_core::step_result::progress:
                    backoff = 1ms;
                    {
                        const auto now = std::chrono::steady_clock::now();
                        busy_at_.store(now.time_since_epoch().count(), std::memory_order_relaxed);  // relaxed: a hint
                        if (!core_.batch_pending())
                            lag_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(now - oldest).count(),
                                          std::memory_order_relaxed);  // relaxed: a statistic
                    }
                    wake_waiters();
                    continue;
                case pipeline_core::step_result::idle:
                    if (!running_.load(std::memory_order_acquire)) {  // (F2) pairs with (F1)
                        if (owner && !reads_.has_reader()) reads_.fail_all();
                        return;
                    }
                    if (owner && !reads_.has_reader() && reads_.waiting()) continue;  // (R2)
                    idle(one, owner);
                    continue;
                case pipeline_core::step_result::failed: break;
            }
            if (!running_.load(std::memory_order_acquire) &&  // (F2)
                std::chrono::steady_clock::now().time_since_epoch().count() >
                    stop_deadline_.load(std::memory_order_relaxed)) {
                abandoned_at_stop_.fetch_add(core_.abandon(), std::memory_order_relaxed);  // relaxed: read after join
                if (owner && !reads_.has_reader()) reads_.fail_all();
                return;
            }
            std::this_thread::sleep_for(backoff);
            backoff = std::min<std::chrono::nanoseconds>(backoff * 2, opts_.max_backoff);
            try {
                if (one) store_.reconnect();
                else pipelined_->reconnect_on(lane);
            } catch (const std::exception&) {
                // The next step reports the outage (with its own message) if it persists.
            }
        }
    }

    /// Every prune_interval, one bounded store::prune between two batches, again at the next
    /// turn while the store says there is more: a prune never holds the store for longer than one
    /// call of store_options' bounds.
    void prune_if_due() {
        if (!prunes()) return;
        const bool records = opts_.window != store_options::forever;
        const bool audit = opts_.audit_window != store_options::forever;
        const auto now = std::chrono::steady_clock::now();
        if (now < next_prune_) return;
        const std::int64_t now_ms = window_now_ms_ ? window_now_ms_()
                                                   : std::chrono::duration_cast<std::chrono::milliseconds>(
                                                         std::chrono::system_clock::now().time_since_epoch())
                                                         .count();
        prune_limits limits;
        if (records) limits.records_before_ms = now_ms - opts_.window.count();
        if (audit) limits.audit_before_ms = now_ms - opts_.audit_window.count();
        next_prune_ = now + opts_.prune_interval;
        try {
            const prune_result r = store_.prune(limits);
            pruned_records_.fetch_add(r.records, std::memory_order_relaxed);  // relaxed: statistics
            pruned_audit_.fetch_add(r.audit_rows, std::memory_order_relaxed);
            if (r.more) next_prune_ = now;
        } catch (const std::exception&) {
            // An outage: the batches report it; pruning waits for the next interval.
        }
    }

    /// Whether the owner flusher prunes in the background at all.
    [[nodiscard]] bool prunes() const noexcept {
        return opts_.prune_interval > std::chrono::nanoseconds::zero() &&
               (opts_.window != store_options::forever || opts_.audit_window != store_options::forever);
    }

    /// The longest sleep: idle_sleep, at least idle_poll (a sleep shorter than the pause would be
    /// a spin).
    [[nodiscard]] std::chrono::nanoseconds idle_sleep() const noexcept {
        return std::max(opts_.idle_sleep, opts_.idle_poll);
    }

    /// Nothing to write (step said idle). While some flusher found work less than idle_linger ago,
    /// looks again after idle_poll; after that sleeps until woken or a deadline ("Idle"). Lanes: one
    /// idle lane does that; the others wait until a lane takes a job (taken() wakes one), stop() or
    /// idle_sleep: a wake-up they miss costs a second commit's start, never a row.
    void idle(bool one, bool owner) {
        if (!one) {
            std::unique_lock lock(idle_mutex_);
            if (polling_) {
                if (!running_.load(std::memory_order_acquire)) return;  // (F2)
                idle_cv_.wait_for(lock, idle_sleep());
                wakeups_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
                return;
            }
            polling_ = true;
        }
        const auto now = std::chrono::steady_clock::now();
        const std::chrono::steady_clock::time_point busy{
            std::chrono::steady_clock::duration(busy_at_.load(std::memory_order_relaxed))};  // relaxed: a hint
        if (now - busy < idle_linger) {
            std::this_thread::sleep_for(opts_.idle_poll);
            wakeups_.fetch_add(1, std::memory_order_relaxed);  // relaxed: a statistic
        } else {
            auto deadline = now + idle_sleep();
            if (owner && prunes()) deadline = std::min(deadline, next_prune_);
            if (deadline > now) {  // else a prune is due: the loop does it now
                if (sleep(owner, deadline)) wakeups_.fetch_add(1, std::memory_order_relaxed);    // relaxed: a statistic
                else busy_at_.store(now.time_since_epoch().count(), std::memory_order_relaxed);  // work: linger again
            }
        }
        if (!one) {
            std::lock_guard lock(idle_mutex_);
            polling_ = false;
        }
    }

    /// Sleeps until an offer (S2), a recall this thread serves, stop() or `deadline`. Returns false
    /// at once, without sleeping, when a row was pushed that no flusher popped (it may still be on
    /// its way into its cell) or a recall waits for this thread. One sleeper at a time: the single
    /// flusher, or the lane that holds polling_.
    bool sleep(bool owner, std::chrono::steady_clock::time_point deadline) {
        std::unique_lock lock(idle_mutex_);                // held from (S1) until the wait: a waker's lock waits for it
        sleeping_.store(true, std::memory_order_seq_cst);  // (S1) pairs with (S2) through (P5)/(P6)
        if (core_.unpopped() ||                            // (P6) pairs with (P5)
            !running_.load(std::memory_order_acquire) ||   // (F2); stop() wakes under idle_mutex_
            (owner && !reads_.has_reader() && reads_.waiting())) {  // (R2); recall() too
            sleeping_.store(false, std::memory_order_relaxed);      // relaxed: nobody waits for this
            return false;
        }
        wake_cv_.wait_until(lock, deadline, [this] {
            // relaxed: a waker clears the flag before taking idle_mutex_, which this check holds
            return !sleeping_.load(std::memory_order_relaxed) || !running_.load(std::memory_order_acquire);  // (F2)
        });
        sleeping_.store(false, std::memory_order_relaxed);  // relaxed: a late waker's exchange then finds false
        return true;
    }

    /// An offer found the flusher asleep (S2). Only the caller that swaps sleeping_ back wakes it,
    /// so a sleep costs at most one notification. Taking idle_mutex_ first means the sleeper is
    /// either before its predicate (it finds sleeping_ false) or waiting (it gets the notify).
    void wake_flusher() noexcept {
        if (!sleeping_.exchange(false, std::memory_order_acq_rel)) return;  // another caller did, or it woke
        { std::lock_guard lock(idle_mutex_); }
        wake_cv_.notify_one();
    }

    /// Wakes the sleeper and every idle lane: stop(), or a recall the owner flusher must serve.
    void wake_idle() {
        {
            std::lock_guard lock(idle_mutex_);
            sleeping_.store(false,
                            std::memory_order_relaxed);  // relaxed: under idle_mutex_, which the sleeper's check holds
        }
        wake_cv_.notify_all();
        idle_cv_.notify_all();
    }

    /// The watermark moved: every waiter re-checks its row. Taking the mutex between the core's
    /// watermark store and the notify means no waiter can miss it between its check and its wait.
    void wake_waiters() {
        { std::lock_guard lock(mutex_); }
        decided_.notify_all();
    }

    store& store_;
    store_options opts_;
    std::function<std::int64_t(std::chrono::nanoseconds)> to_wall_ms_;
    pipeline_core core_;
    pipelined_store* const pipelined_;  // the same store, when it can commit on several lanes
    const std::size_t lanes_;
    alignas(64) std::atomic<bool> running_{false};
    std::atomic<std::int64_t> stop_deadline_{0};
    std::atomic<std::int64_t> lag_ns_{0};
    std::atomic<std::uint64_t> cpu_ns_{0};   // summed over the flusher threads
    std::atomic<std::uint64_t> wakeups_{0};  // idle wake-ups, summed over the flusher threads
    std::atomic<std::int64_t> busy_at_{0};   // steady_clock ticks of the last progress of any lane ("Idle")
    std::atomic<std::uint64_t> abandoned_at_stop_{0};
    std::function<recalled(const stored_record&)> to_recalled_;
    std::function<std::int64_t()> window_now_ms_;  // set before start(); called by the owner thread only
    // Recall requests (recall_reads.hpp). Lock order: its read mutex, then idle_mutex_; never the reverse.
    recall_reads reads_;
    std::chrono::steady_clock::time_point next_prune_{};  // owner thread only
    std::atomic<std::uint64_t> pruned_records_{0}, pruned_audit_{0};
    std::vector<std::thread> threads_;
    // Idle ("Idle"). After the last batch, a flusher looks at the queue every idle_poll this long
    // before it sleeps: a steady load never meets a sleeping flusher (no caller pays a wake-up, and
    // batches fill as before), and an idle one pauses 10 ms / idle_poll times (50) once.
    static constexpr std::chrono::milliseconds idle_linger{10};
    alignas(64) std::atomic<bool> sleeping_{false};  // a line of its own: offer() reads it, rarely written
    alignas(64) std::mutex idle_mutex_;              // the sleeper's check and wait; idle lanes: who polls
    std::condition_variable wake_cv_;                // the sleeper
    std::condition_variable idle_cv_;                // idle lanes that do not poll (lanes > 1 only)
    bool polling_ = false;                           // under idle_mutex_: a lane looks for work (lanes > 1)

    std::mutex mutex_;  // flusher <-> sync waiters only; never taken on the async hot path
    std::condition_variable decided_;
};

}  // namespace idem::detail::pipeline
