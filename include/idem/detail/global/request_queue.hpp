// idem/detail/global/request_queue.hpp: the request queue in front of a batcher thread (scope::global).
//
// Callers queue a request and wait for its answer; batcher threads take requests in batches, run
// them against the store, and answer them. Nothing here knows what a request asks: the claim and
// completion protocols are claim_batcher.hpp's and completion_batcher.hpp's.
//
// Invariants (all under `m`):
//   * a request is in `q` at most once, and a batch holds at most one request per key (take());
//     a second request for a key already taken waits, in order, for the next batch;
//   * once `stopping` is set nothing is queued any more (submit() answers false);
//   * a draining queue (completions: the effect happened, its record belongs in the store) keeps
//     its batchers retrying after `stopping` until `drain_deadline`; any other queue (claims) stops
//     at once;
//   * a request's answer is written by a batcher and read by its caller only after the caller saw
//     the request done under `m` (the batcher sets done under `m`, then notifies `done`);
//   * `in_flight` counts the batches taken and not yet finished (take() raises it for a batch it
//     filled, the batcher's in_flight_batch lowers it when the batch is over, however it ends). A
//     batcher starts a batch beside one in flight only when `beside` requests wait, or when no
//     batch was taken for `patience` (ready()): a handful of requests costs the server less in the
//     next batch than in a statement and a commit of their own (global_options::batch_beside has
//     the figures), but a batch that is stuck (a row lock held by another client, retries after
//     failures) must not hold the others back for longer than a normal batch takes.
//
// Thread-safety: every member takes `m`, except take(), drain_over() and the fields, which are used
// with `m` held. Progress: blocking (a mutex and two condition variables).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_set>

#include "idem/detail/assert.hpp"

namespace idem::detail::global {

/// A FIFO of requests (each with a key `k`), its batcher threads' wake-ups, and its callers'.
template <class Req>
struct request_queue {
    explicit request_queue(bool drains) noexcept : drains(drains) {}

    std::mutex m;
    std::condition_variable work;  // batchers wait for requests
    std::condition_variable done;  // callers wait for their request
    std::deque<std::shared_ptr<Req>> q;
    bool stopping = false;
    const bool drains;
    std::chrono::steady_clock::time_point drain_deadline = std::chrono::steady_clock::time_point::max();
    std::size_t in_flight = 0;  // batches taken and not finished
    std::size_t beside = 1;     // requests that must wait before a batch starts beside one in flight
    // How long fewer than `beside` requests wait for the batch in flight before one starts beside
    // it anyway: several times a normal batch (a round trip and a commit, a few ms), so only a
    // batch that is stuck lets one start early.
    std::chrono::milliseconds patience{20};
    std::chrono::steady_clock::time_point last_take{};  // when take() last filled a batch

    /// Whether a batcher should take a batch at `now`. With `m` held.
    [[nodiscard]] bool ready(std::chrono::steady_clock::time_point now) const noexcept {
        return !q.empty() && (in_flight == 0 || q.size() >= beside || now - last_take >= patience);
    }

    /// Waits, with `m` held through `lk`, until the queue is stopping or ready() (woken by a submit,
    /// the end of a batch, a stop, or the patience running out).
    void await_work(std::unique_lock<std::mutex>& lk) {
        for (;;) {
            const auto now = std::chrono::steady_clock::now();
            if (stopping || ready(now)) return;
            if (q.empty()) work.wait(lk);
            else work.wait_until(lk, last_take + patience);
        }
    }

    /// Queues `r` for a batcher; false once the queue is stopping (nothing was queued).
    bool submit(const std::shared_ptr<Req>& r) {
        {
            std::lock_guard lk(m);
            if (stopping) return false;
            q.push_back(r);
        }
        work.notify_one();
        return true;
    }

    /// Stops the queue; a draining one keeps its batchers retrying until `deadline`.
    void stop(std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max()) {
        {
            std::lock_guard lk(m);
            stopping = true;
            drain_deadline = deadline;
        }
        work.notify_all();
    }

    /// Stopping, and no longer draining. With `m` held.
    [[nodiscard]] bool drain_over() const noexcept {
        return stopping && (!drains || std::chrono::steady_clock::now() >= drain_deadline);
    }

    /// Moves up to max_batch requests, one per key, from the queue into `batch` (sorted by key),
    /// dropping those `skip` names and calling `mark` on those taken. With `m` held.
    template <class Batch, class Skip, class Mark>
    void take(Batch& batch, std::size_t max_batch, Skip skip, Mark mark) {
        IDEM_ASSERT(max_batch >= 1 && batch.empty(),
                    "a batcher takes into an empty batch, at least one request (global_options.max_batch >= 1)");
        std::unordered_set<std::string_view> keys;
        decltype(q) later;
        while (!q.empty() && batch.size() < max_batch) {
            auto r = std::move(q.front());
            q.pop_front();
            if (skip(r)) continue;
            if (!keys.insert(r->k.view()).second) {
                later.push_back(std::move(r));
                continue;
            }
            mark(r);
            batch.push_back(std::move(r));
        }
        for (auto it = later.rbegin(); it != later.rend(); ++it) q.push_front(std::move(*it));
        if (!batch.empty()) {
            ++in_flight;  // lowered by the batcher's in_flight_batch
            last_take = std::chrono::steady_clock::now();
        }
        std::sort(batch.begin(), batch.end(), [](const auto& a, const auto& b) { return a->k.view() < b->k.view(); });
    }

    /// Ends a batch take() filled, however the batch ends: another batcher may now start one with
    /// fewer than `beside` requests waiting.
    class in_flight_batch {
    public:
        in_flight_batch(request_queue& q, bool taken) noexcept : q_(taken ? &q : nullptr) {}
        in_flight_batch(const in_flight_batch&) = delete;
        in_flight_batch& operator=(const in_flight_batch&) = delete;
        ~in_flight_batch() {
            if (!q_) return;
            {
                std::lock_guard lk(q_->m);
                IDEM_ASSERT(q_->in_flight > 0, "a batch ends once, after take() counted it");
                --q_->in_flight;
            }
            q_->work.notify_one();
        }

    private:
        request_queue* q_;
    };

    /// Sleeps `pause` before a batcher retries (woken early by new work or a stop), doubling it up
    /// to `max_pause`. False when the batcher should give up instead (drain_over()).
    bool backoff(std::chrono::milliseconds& pause, std::chrono::milliseconds max_pause) {
        std::unique_lock lk(m);
        if (drain_over()) return false;
        work.wait_for(lk, pause);
        pause = std::min(max_pause, pause * 2);
        return true;
    }
};

}  // namespace idem::detail::global
