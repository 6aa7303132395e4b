// idem/detail/flush_pipeline.hpp: from the hot path to the store, in batches: the flusher thread
// that drives detail::pipeline_core (pipeline_core.hpp holds the logic: reservation, queue,
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
// do not all poll: one polls the queue (sleeping idle_poll between looks), the others sleep on
// idle_cv_ until a lane takes a job (one of them then looks, and polls if it finds nothing) or the
// pipeline stops. So an idle pipeline costs what one flusher costs, and a busy one still starts a
// second commit as soon as rows arrive while the first is in flight.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <mutex>
#include <functional>
#include <random>
#include <thread>
#include <vector>
#include <time.h>

#include "idem/detail/pipeline_core.hpp"
#include "idem/options.hpp"
#include "idem/store.hpp"
#include "idem/store_options.hpp"
#include "idem/transition.hpp"

namespace idem::detail {

class flush_pipeline final : public transition_sink {
public:
    /// `to_wall_ms` maps a guard-clock time to Unix milliseconds. Throws idem::error
    /// (invalid_argument) for a queue_capacity or max_batch out of range.
    flush_pipeline(store& st, store_options opts, std::function<std::int64_t(std::chrono::nanoseconds)> to_wall_ms)
        : store_(st), opts_(std::move(opts)), to_wall_ms_(std::move(to_wall_ms)),
          core_(opts_.queue_capacity, opts_.max_batch, random_batch_prefix()),
          pipelined_(dynamic_cast<pipelined_store*>(&st)),
          lanes_(pipelined_ != nullptr ? std::max<std::size_t>(1, pipelined_->lanes()) : 1) {}
    ~flush_pipeline() override { stop(); }

    void start() {
        running_.store(true, std::memory_order_relaxed);  // relaxed: the thread starts below order it
        try {
            reader_ = store_.open_reader();
        } catch (const std::exception&) {
            reader_.reset();  // reads go between batches instead
        }
        if (reader_) {
            reader_->set_node(store_.node());
            reader_thread_ = std::thread([this] { read_loop(); });
        }
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
        if (reader_thread_.joinable()) {
            {
                std::lock_guard lock(read_mutex_);
                reader_stop_ = true;
            }
            read_work_.notify_all();
            reader_thread_.join();
            fail_reads();
        }
        if (threads_.empty()) return;
        stop_deadline_.store((std::chrono::steady_clock::now() + opts_.sync_timeout).time_since_epoch().count(),
                             std::memory_order_relaxed);  // relaxed: published by (F1)
        running_.store(false, std::memory_order_release);  // (F1) pairs with (F2)
        {
            std::lock_guard lock(idle_mutex_);  // a lane between its check of running_ and its wait sees the notify
        }
        idle_cv_.notify_all();
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
        return core_.push(row);
    }

    durability_wait await(std::uint64_t seq) noexcept override {
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
    void set_recall(std::function<recalled(const stored_record&)> convert) { to_recalled_ = std::move(convert); }

    /// Reads the key's record on the reader thread (store::open_reader: a second connection, so
    /// the read does not wait for a batch in flight), or, for a store that cannot be opened twice,
    /// on the flusher thread between two batches; waits up to store_options::recall_timeout.
    recalled recall(const key& k) noexcept override {
        recalled none;
        none.found = recalled::kind::unavailable;
        try {
            auto req = std::make_shared<read_request>();
            req->key.assign(k.view());
            std::unique_lock lock(read_mutex_);
            reads_.push_back(req);
            reads_waiting_.store(true, std::memory_order_release);  // (R1) pairs with (R2)
            if (reader_) {
                read_work_.notify_one();
            } else {
                lock.unlock();
                {
                    std::lock_guard idle(idle_mutex_);  // an idle lane 0 between its check and its wait sees it
                }
                idle_cv_.notify_all();
                lock.lock();
            }
            if (!read_done_.wait_for(lock, opts_.recall_timeout, [&] { return req->done; })) return none;
            if (req->failed) return none;
            if (!req->rec) return {};
            return to_recalled_ ? to_recalled_(*req->rec) : none;
        } catch (...) {
            return none;
        }
    }

    /// True when every transition offered so far is decided (committed or set aside).
    [[nodiscard]] bool drained() const noexcept { return core_.drained(); }

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
        out.lag_ns = lag_ns_.load(std::memory_order_relaxed);  // relaxed: a statistic
        out.cpu_ns = cpu_ns_.load(std::memory_order_relaxed);  // relaxed: a statistic
        out.pruned_records = pruned_records_.load(std::memory_order_relaxed);  // relaxed: statistics
        out.pruned_audit_rows = pruned_audit_.load(std::memory_order_relaxed);
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
                if (!reader_) serve_reads();
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
                    if (!core_.batch_pending())
                        lag_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now() - oldest)
                                          .count(),
                                      std::memory_order_relaxed);  // relaxed: a statistic
                    wake_waiters();
                    continue;
                case pipeline_core::step_result::idle:
                    if (!running_.load(std::memory_order_acquire)) {  // (F2) pairs with (F1)
                        if (owner && !reader_) fail_reads();
                        return;
                    }
                    if (owner && !reader_ && reads_waiting_.load(std::memory_order_acquire)) continue;  // (R2)
                    if (one) std::this_thread::sleep_for(opts_.idle_poll);
                    else idle_lane();
                    continue;
                case pipeline_core::step_result::failed: break;
            }
            if (!running_.load(std::memory_order_acquire) &&  // (F2)
                std::chrono::steady_clock::now().time_since_epoch().count() >
                    stop_deadline_.load(std::memory_order_relaxed)) {
                abandoned_at_stop_.fetch_add(core_.abandon(), std::memory_order_relaxed);  // relaxed: read after join
                if (owner && !reader_) fail_reads();
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

    struct read_request {
        std::string key;
        std::optional<stored_record> rec;
        bool failed = false;
        bool done = false;
    };

    /// The reader thread: answers recall requests on reader_ as they come.
    void read_loop() {
        for (;;) {
            {
                std::unique_lock lock(read_mutex_);
                read_work_.wait(lock, [this] { return reader_stop_ || !reads_.empty(); });
                if (reader_stop_) return;
            }
            serve_reads();
        }
    }

    /// Answers the recall requests waiting now, one get each: on reader_ (the reader thread), else
    /// on store_ (the owner flusher thread, between batches).
    void serve_reads() {
        if (!reads_waiting_.load(std::memory_order_acquire)) return;  // (R2) pairs with (R1)
        std::deque<std::shared_ptr<read_request>> batch;
        {
            std::lock_guard lock(read_mutex_);
            batch.swap(reads_);
            reads_waiting_.store(false, std::memory_order_relaxed);  // relaxed: under read_mutex_
        }
        store& from = reader_ ? *reader_ : store_;
        for (auto& r : batch) {
            try {
                r->rec = from.get(r->key);
            } catch (const std::exception&) {
                r->failed = true;  // the caller answers store_unavailable
                if (reader_) {
                    try {
                        reader_->reconnect();  // for the next request
                    } catch (const std::exception&) {
                    }
                }
            }
        }
        {
            std::lock_guard lock(read_mutex_);
            for (auto& r : batch) r->done = true;
        }
        read_done_.notify_all();
    }

    /// At stop: requests nobody will serve any more are answered as failed.
    void fail_reads() {
        {
            std::lock_guard lock(read_mutex_);
            for (auto& r : reads_) {
                r->failed = true;
                r->done = true;
            }
            reads_.clear();
            reads_waiting_.store(false, std::memory_order_relaxed);  // relaxed: under read_mutex_
        }
        read_done_.notify_all();
    }

    /// Every prune_interval, one bounded store::prune between two batches, again at the next
    /// turn while the store says there is more: a prune never holds the store for longer than one
    /// call of store_options' bounds.
    void prune_if_due() {
        if (opts_.prune_interval <= std::chrono::nanoseconds::zero()) return;
        const bool records = opts_.window != store_options::forever;
        const bool audit = opts_.audit_window != store_options::forever;
        if (!records && !audit) return;
        const auto now = std::chrono::steady_clock::now();
        if (now < next_prune_) return;
        const std::int64_t wall = std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::chrono::system_clock::now().time_since_epoch())
                                      .count();
        prune_limits limits;
        if (records) limits.records_before_ms = wall - opts_.window.count();
        if (audit) limits.audit_before_ms = wall - opts_.audit_window.count();
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

    /// An idle lane: polls when no other lane does, else sleeps until a lane takes a job or stop().
    /// The wait is bounded too (a lost wake-up costs at most that long, never a hang).
    void idle_lane() {
        std::unique_lock lock(idle_mutex_);
        if (!polling_) {
            polling_ = true;
            lock.unlock();
            std::this_thread::sleep_for(opts_.idle_poll);
            lock.lock();
            polling_ = false;
            return;
        }
        if (!running_.load(std::memory_order_acquire)) return;  // (F2)
        idle_cv_.wait_for(lock, std::chrono::milliseconds(50));
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
    std::atomic<std::uint64_t> cpu_ns_{0};  // summed over the flusher threads
    std::atomic<std::uint64_t> abandoned_at_stop_{0};
    std::function<recalled(const stored_record&)> to_recalled_;
    std::mutex read_mutex_;
    std::condition_variable read_done_;
    std::deque<std::shared_ptr<read_request>> reads_;  // under read_mutex_
    std::condition_variable read_work_;                // the reader thread waits for requests
    bool reader_stop_ = false;                         // under read_mutex_
    std::unique_ptr<store> reader_;                    // store::open_reader(), used by reader_thread_ only
    std::thread reader_thread_;
    std::atomic<bool> reads_waiting_{false};
    std::chrono::steady_clock::time_point next_prune_{};  // owner thread only
    std::atomic<std::uint64_t> pruned_records_{0}, pruned_audit_{0};
    std::vector<std::thread> threads_;
    std::mutex idle_mutex_;  // idle lanes (lanes > 1 only): who polls
    std::condition_variable idle_cv_;
    bool polling_ = false;

    std::mutex mutex_;  // flusher <-> sync waiters only; never taken on the async hot path
    std::condition_variable decided_;
};

}  // namespace idem::detail
