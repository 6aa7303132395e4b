// idem/detail/flush_pipeline.hpp: from the hot path to the store, in batches.
//
// Hot path (offer): take a sequence number, copy the transition into a pre-allocated node of a
// bounded Boost.Lockfree MPMC queue (bounded_push never allocates), return. Full queue: spin with
// yield up to store_options::offer_wait, then report backpressure (offer returns 0); the caller's
// in-memory transition is undone, so nothing acknowledged is dropped.
//
// Flusher thread: pops up to max_batch rows, sorts them by (key, seq), and applies them in one store
// transaction. On failure it keeps the batch, backs off exponentially (up to max_backoff), reconnects
// and retries the same rows; a commit_unknown is resolved by asking the store whether the batch id
// committed, never by blind retry. Sync mode: await(seq) blocks until the contiguous committed
// watermark passes seq (group commit: every waiter whose row was in the batch wakes on one commit),
// or until sync_timeout, after which the caller gets store_unavailable while the row stays queued.
#pragma once

#include <boost/lockfree/queue.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "idem/options.hpp"
#include "idem/store.hpp"
#include "idem/transition.hpp"

namespace idem {

enum class durability : std::uint8_t {
    async,  ///< acknowledge at once; a crash loses at most the rows still queued
    sync,   ///< acknowledge when the batch holding the transition has committed (group commit)
};

struct store_options {
    durability mode = durability::async;
    std::size_t queue_capacity = 1u << 16;             ///< transitions the queue holds
    std::size_t max_batch = 4096;                      ///< rows per store transaction
    std::chrono::nanoseconds offer_wait{0};            ///< bounded wait on a full queue; 0: fail at once
    std::chrono::nanoseconds sync_timeout = 10s;       ///< longest wait for a commit in sync mode
    std::chrono::nanoseconds idle_poll = 200us;        ///< flusher sleep when the queue is empty
    std::chrono::nanoseconds max_backoff = 1s;         ///< longest pause between retries
    std::string node;                                  ///< audit node identity; empty: hostname:pid
};

namespace detail {

class flush_pipeline final : public transition_sink {
public:
    /// `to_wall_ms` maps a guard-clock time to Unix milliseconds.
    flush_pipeline(store& st, store_options opts, std::function<std::int64_t(std::chrono::nanoseconds)> to_wall_ms)
        : store_(st), opts_(std::move(opts)), to_wall_ms_(std::move(to_wall_ms)), queue_(opts_.queue_capacity) {
        if (opts_.queue_capacity == 0 || opts_.queue_capacity > 65535u * 16)
            throw error(errc::invalid_argument, "store_options.queue_capacity " + std::to_string(opts_.queue_capacity) +
                                                    " is outside 1..1048560");
        if (opts_.max_batch == 0) throw error(errc::invalid_argument, "store_options.max_batch is 0; it must be at least 1");
        std::random_device rd;
        batch_prefix_ = (static_cast<std::uint64_t>(rd()) << 32) & 0x7fffffff00000000ull;
        batch_.reserve(opts_.max_batch);
    }
    ~flush_pipeline() override { stop(); }

    void start() {
        running_.store(true, std::memory_order_relaxed);  // relaxed: the thread start below orders it
        thread_ = std::thread([this] { run(); });
    }

    /// Drains the queue and stops the flusher. If the store refuses the rows for longer than
    /// sync_timeout after stop() began, the flusher gives up: those rows were acknowledged only in
    /// async mode (sync callers were told store_unavailable), which is the async contract.
    void stop() {
        if (!thread_.joinable()) return;
        stop_deadline_.store((std::chrono::steady_clock::now() + opts_.sync_timeout).time_since_epoch().count(),
                             std::memory_order_relaxed);  // relaxed: published by (F1)
        running_.store(false, std::memory_order_release);  // (F1) pairs with (F2)
        thread_.join();
    }

    /// Rows the flusher gave up on at stop() (lost if the process now exits).
    [[nodiscard]] std::uint64_t abandoned_at_stop() const noexcept { return abandoned_at_stop_; }

    std::uint64_t offer(const transition& t) noexcept override {
        store_row row;
        row.t = t;
        row.at_ms = to_wall_ms_(t.at);
        row.lease_until_ms = t.to == record_state::processing ? to_wall_ms_(t.lease_until) : 0;
        row.seq = next_seq_.fetch_add(1, std::memory_order_relaxed) + 1;  // relaxed: only uniqueness matters
        if (queue_.bounded_push(row)) return row.seq;
        const auto deadline = std::chrono::steady_clock::now() + opts_.offer_wait;
        while (std::chrono::steady_clock::now() < deadline) {
            std::this_thread::yield();
            if (queue_.bounded_push(row)) return row.seq;
        }
        // The seq is burnt: mark it committed so the watermark can pass it.
        abandon(row.seq);
        return 0;
    }

    bool await(std::uint64_t seq) noexcept override {
        std::unique_lock lock(mutex_);
        return committed_cv_.wait_for(lock, opts_.sync_timeout, [&] { return watermark_ >= seq; });
    }

    bool synchronous() const noexcept override { return opts_.mode == durability::sync; }

    /// True when every transition offered so far has committed.
    [[nodiscard]] bool drained() {
        const std::uint64_t issued = next_seq_.load(std::memory_order_acquire);  // pairs with the fetch_add in offer
        std::lock_guard lock(mutex_);
        return watermark_ >= issued;
    }

    /// Blocks until drained() or the timeout passes.
    bool flush(std::chrono::nanoseconds timeout) {
        const std::uint64_t issued = next_seq_.load(std::memory_order_acquire);
        std::unique_lock lock(mutex_);
        return committed_cv_.wait_for(lock, timeout, [&] { return watermark_ >= issued; });
    }

    struct counters {
        std::uint64_t batches = 0, rows = 0, errors = 0, commit_unknown = 0, queue_depth = 0;
        std::int64_t lag_ns = 0;
        std::string last_error;
    };
    [[nodiscard]] counters snapshot() {
        std::lock_guard lock(mutex_);
        counters c = counters_;
        c.queue_depth = next_seq_.load(std::memory_order_relaxed) - watermark_;  // relaxed: a statistic
        return c;
    }

private:
    std::size_t drain_count() {
        std::size_t n = 0;
        store_row row;
        while (queue_.pop(row)) ++n;
        return n;
    }

    void abandon(std::uint64_t seq) {
        std::lock_guard lock(mutex_);
        done_.insert(seq);
        advance_watermark();
    }

    void advance_watermark() {
        while (!done_.empty() && *done_.begin() == watermark_ + 1) {
            ++watermark_;
            done_.erase(done_.begin());
        }
    }

    void run() {
        std::chrono::nanoseconds backoff = 1ms;
        for (;;) {
            store_row row;
            if (batch_.empty()) oldest_pending_ = std::chrono::steady_clock::now();
            // A batch whose commit is unknown must not grow: its id names exactly these rows.
            while (unknown_batch_ == 0 && batch_.size() < opts_.max_batch && queue_.pop(row)) batch_.push_back(row);
            if (batch_.empty()) {
                if (!running_.load(std::memory_order_acquire)) return;  // (F2) pairs with (F1)
                std::this_thread::sleep_for(opts_.idle_poll);
                continue;
            }
            if (write_batch()) {
                backoff = 1ms;
                continue;
            }
            if (!running_.load(std::memory_order_acquire) &&  // (F2)
                std::chrono::steady_clock::now().time_since_epoch().count() >
                    stop_deadline_.load(std::memory_order_relaxed)) {
                abandoned_at_stop_ = batch_.size() + static_cast<std::uint64_t>(drain_count());
                return;
            }
            std::this_thread::sleep_for(backoff);
            backoff = std::min<std::chrono::nanoseconds>(backoff * 2, opts_.max_backoff);
            try {
                store_.reconnect();
            } catch (const std::exception& e) {
                note_error(e.what());
            }
        }
    }

    /// Applies batch_ once. True when it committed (batch_ is then cleared). After a
    /// commit_unknown the batch stays pending under its id and later calls only ask the store
    /// whether that id committed (never a blind re-apply); it is applied again, under a new id,
    /// only once the store answered that it did not commit.
    bool write_batch() {
        bool ok = false;
        if (unknown_batch_ != 0) {
            try {
                store_.reconnect();
                ok = store_.committed(unknown_batch_);
                unknown_batch_ = 0;  // answered: committed, or not (then re-apply below)
            } catch (const std::exception& e) {
                note_error(e.what());
                return false;  // still unknown: back off, ask again
            }
        }
        if (!ok) {
            std::sort(batch_.begin(), batch_.end(), [](const store_row& a, const store_row& b) {
                const auto ka = a.t.k.view(), kb = b.t.k.view();
                return ka != kb ? ka < kb : a.seq < b.seq;
            });
            const std::uint64_t id = batch_prefix_ | ++batch_counter_;
            try {
                store_.apply(batch_, id);
                ok = true;
            } catch (const commit_unknown& e) {
                note_error(e.what(), true);
                unknown_batch_ = id;
                return false;
            } catch (const std::exception& e) {
                note_error(e.what());
                return false;
            }
        }
        std::lock_guard lock(mutex_);
        for (const store_row& r : batch_) done_.insert(r.seq);
        advance_watermark();
        counters_.batches++;
        counters_.rows += batch_.size();
        counters_.lag_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - oldest_pending_)
                               .count();
        batch_.clear();
        committed_cv_.notify_all();
        return true;
    }

    void note_error(const std::string& what, bool unknown = false) {
        std::lock_guard lock(mutex_);
        counters_.errors++;
        if (unknown) counters_.commit_unknown++;
        counters_.last_error = what;
    }

    store& store_;
    store_options opts_;
    std::function<std::int64_t(std::chrono::nanoseconds)> to_wall_ms_;
    boost::lockfree::queue<store_row> queue_;
    alignas(64) std::atomic<std::uint64_t> next_seq_{0};
    alignas(64) std::atomic<bool> running_{false};
    std::atomic<std::int64_t> stop_deadline_{0};
    std::uint64_t abandoned_at_stop_ = 0;
    std::thread thread_;
    std::vector<store_row> batch_;
    std::uint64_t batch_prefix_ = 0;
    std::uint64_t unknown_batch_ = 0;  // id of the pending batch whose commit is unknown, else 0
    std::chrono::steady_clock::time_point oldest_pending_{};
    std::uint64_t batch_counter_ = 0;

    std::mutex mutex_;  // flusher <-> waiters only; never taken on the async hot path
    std::condition_variable committed_cv_;
    std::uint64_t watermark_ = 0;    // every seq <= watermark_ committed (or abandoned)
    std::set<std::uint64_t> done_;   // committed seqs above the watermark
    counters counters_;
};

}  // namespace detail
}  // namespace idem
