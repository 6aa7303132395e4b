// idem/detail/pipeline/recall_reads.hpp: the flush pipeline's recall requests (flush_pipeline::recall:
// a duplicate of a key memory evicted reads the store). Requests queue in reads_ for the reader
// thread (store::open_reader: a second connection, so a read does not wait for a batch in flight)
// or, for a store that cannot be opened twice, for the owner flusher, between batches (serve());
// the server takes the oldest, reads it, answers every waiter of it.
//
//   Invariant (bounded by waiting callers): a queued request has at least one caller waiting for
//   it. A caller whose recall_timeout passes leaves; the last one to leave a request still queued
//   removes it, so it is never read. A caller of a key whose request is queued joins it (one read
//   for all of them). So reads_ holds at most as many requests as callers wait, however long an
//   outage lasts and however many calls time out meanwhile, and the first recall after the store
//   recovers costs one read. A request already taken (being read) cannot be joined: its read may
//   have begun before the caller came, and a caller's answer must be read after its call began.
//
// Lock order: read_mutex_, then the pipeline's idle mutex (wake_owner, called under read_mutex_,
// takes it); never the reverse.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "idem/detail/assert.hpp"
#include "idem/key.hpp"
#include "idem/store.hpp"

namespace idem::detail::pipeline {

class recall_reads {
public:
    /// A recall request: one key, one store read, answered to every caller waiting for it. The
    /// fields are under read_mutex_ until done; rec and failed are only read after it.
    struct request {
        std::string key;
        std::optional<stored_record> rec;
        std::condition_variable answered;                  // its waiters wait here (one per request: no herd)
        std::size_t waiters = 0;                           // callers waiting for it now
        std::list<std::shared_ptr<request>>::iterator at;  // its place in reads_ while queued
        bool queued = false;                               // in reads_: no server took it yet, it can be joined or dropped
        bool failed = false;
        bool done = false;
    };

    struct counters {
        std::uint64_t queue = 0;    ///< requests queued, not yet being read (<= waiters)
        std::uint64_t waiters = 0;  ///< callers waiting in read() now
        std::uint64_t reads = 0;    ///< store reads made
        std::uint64_t joined = 0;   ///< reads that joined a queued request of their key
        std::uint64_t dropped = 0;  ///< requests dropped unread: every caller of them had timed out
    };

    /// `wake_owner` wakes the owner flusher to serve a request when there is no reader thread; it is
    /// called under read_mutex_.
    explicit recall_reads(std::function<void()> wake_owner) : wake_owner_(std::move(wake_owner)) {}
    ~recall_reads() { stop(); }
    recall_reads(const recall_reads&) = delete;
    recall_reads& operator=(const recall_reads&) = delete;

    /// Opens the reader (a second connection to `st`) and starts its thread; a store that cannot be
    /// opened twice is served by the owner flusher instead (serve()).
    void start(store& st) {
        try {
            reader_ = st.open_reader();
        } catch (const std::exception&) {
            reader_.reset();  // reads go between batches instead
        }
        if (reader_) {
            reader_->set_node(st.node());
            reader_thread_ = std::thread([this] { read_loop(); });
        }
    }

    /// Stops the reader thread; the requests it will not serve are answered as failed.
    void stop() {
        if (!reader_thread_.joinable()) return;
        {
            std::lock_guard lock(read_mutex_);
            reader_stop_ = true;
        }
        read_work_.notify_all();
        reader_thread_.join();
        fail_all();
    }

    /// Whether a reader thread serves the requests (else the owner flusher does, through serve()).
    [[nodiscard]] bool has_reader() const noexcept { return reader_ != nullptr; }

    /// Whether a request is queued. (R2) pairs with (R1) in enqueue(): a server that sees true sees
    /// the request.
    [[nodiscard]] bool waiting() const noexcept { return reads_waiting_.load(std::memory_order_acquire); }

    /// Waits up to `timeout` for k's record, joining the request of the same key still queued, if
    /// any: the answered request (its rec and failed are read-only now), or null when the timeout
    /// passed first (the request is then dropped unread if nobody else waits for it). Throws
    /// (bad_alloc) with nothing changed.
    std::shared_ptr<const request> read(const key& k, std::chrono::nanoseconds timeout) {
        std::shared_ptr<request> req;
        std::unique_lock lock(read_mutex_);
        if (const auto it = queued_.find(k.view()); it != queued_.end()) {
            req = *it->second;
            ++joined_;
        } else {
            req = enqueue(k);  // may throw: then nothing changed
            if (reader_) {
                read_work_.notify_one();
            } else {
                wake_owner_();  // the owner flusher serves it; lock order: read_mutex_, then its idle mutex
            }
        }
        waiter w(*this, *req);  // leaves (and drops an orphaned request) with the lock held
        if (!req->answered.wait_for(lock, timeout, [&] { return req->done; })) return nullptr;
        return req;
    }

    /// Answers the requests queued now, oldest first, one store read each: on the reader (the reader
    /// thread), else on `owner_store` (the owner flusher thread, between batches). One at a time, so
    /// a request whose callers all gave up while an earlier one was read is dropped, not read; and
    /// no more than were queued at the start, so a stream of recalls cannot hold batches back.
    void serve(store& owner_store) {
        if (!waiting()) return;  // (R2)
        store& from = reader_ ? *reader_ : owner_store;
        std::size_t turn = 0;
        {
            std::lock_guard lock(read_mutex_);
            turn = reads_.size();
        }
        for (; turn != 0; --turn) {
            std::shared_ptr<request> r;
            {
                std::lock_guard lock(read_mutex_);
                if (reader_stop_) return;  // stop(): fail_all() answers the rest
                r = take();
            }
            if (!r) return;
            std::optional<stored_record> rec;
            bool failed = false;
            try {
                rec = from.get(r->key);  // r->key never changes: read without the lock
            } catch (const std::exception&) {
                failed = true;  // its callers answer store_unavailable
                if (reader_) {
                    try {
                        reader_->reconnect();  // for the next request
                    } catch (const std::exception&) {
                    }
                }
            }
            {
                std::lock_guard lock(read_mutex_);
                r->rec = std::move(rec);
                r->failed = failed;
                r->done = true;
            }
            r->answered.notify_all();  // r keeps the request (and its condition variable) alive
        }
    }

    /// Requests nobody will serve any more (the server stopped) are answered as failed.
    void fail_all() {
        std::lock_guard lock(read_mutex_);
        for (auto& r : reads_) {
            r->queued = false;
            r->failed = true;
            r->done = true;
            r->answered.notify_all();
        }
        reads_.clear();
        queued_.clear();
        reads_waiting_.store(false, std::memory_order_relaxed);  // relaxed: under read_mutex_
    }

    /// One instant: queue <= waiters holds in it.
    [[nodiscard]] counters snapshot() const {
        std::lock_guard lock(read_mutex_);
        counters c;
        c.queue = reads_.size();
        c.waiters = waiters_;
        c.reads = reads_made_;
        c.joined = joined_;
        c.dropped = dropped_;
        return c;
    }

private:
    /// A caller waiting for a request, for one scope: leaves it at the end (also on an exception;
    /// the lock is held then), and the last caller to leave a request still queued drops it.
    class waiter {
    public:
        waiter(recall_reads& p, request& r) noexcept : p_(p), r_(r) {
            ++r_.waiters;
            ++p_.waiters_;
        }
        waiter(const waiter&) = delete;
        waiter& operator=(const waiter&) = delete;
        ~waiter() {
            --p_.waiters_;
            if (--r_.waiters == 0 && r_.queued) p_.drop(r_);
        }

    private:
        recall_reads& p_;
        request& r_;
    };

    /// A new request for k at the back of reads_. Under read_mutex_. Throws (bad_alloc) with
    /// nothing changed.
    std::shared_ptr<request> enqueue(const key& k) {
        auto req = std::make_shared<request>();
        req->key.assign(k.view());
        reads_.push_back(req);
        try {
            queued_.emplace(std::string_view(req->key), std::prev(reads_.end()));
        } catch (...) {
            reads_.pop_back();
            throw;
        }
        req->at = std::prev(reads_.end());
        req->queued = true;
        reads_waiting_.store(true, std::memory_order_release);  // (R1) pairs with (R2)
        return req;
    }

    /// Removes a queued request nobody waits for: it is never read. Under read_mutex_.
    void drop(request& r) noexcept {
        IDEM_ASSERT(r.queued && r.waiters == 0, "only a queued request nobody waits for is dropped");
        queued_.erase(std::string_view(r.key));
        r.queued = false;
        ++dropped_;
        reads_.erase(r.at);  // may release the last reference but the dropping caller's
        if (reads_.empty()) reads_waiting_.store(false, std::memory_order_relaxed);  // relaxed: under read_mutex_
    }

    /// The oldest queued request, now being read (no longer joinable nor droppable), or null.
    /// Under read_mutex_.
    std::shared_ptr<request> take() noexcept {
        if (reads_.empty()) return nullptr;
        std::shared_ptr<request> r = std::move(reads_.front());
        reads_.pop_front();
        queued_.erase(std::string_view(r->key));
        r->queued = false;
        ++reads_made_;
        if (reads_.empty()) reads_waiting_.store(false, std::memory_order_relaxed);  // relaxed: under read_mutex_
        return r;
    }

    /// The reader thread: answers requests on reader_ as they come.
    void read_loop() {
        for (;;) {
            {
                std::unique_lock lock(read_mutex_);
                read_work_.wait(lock, [this] { return reader_stop_ || !reads_.empty(); });
                if (reader_stop_) return;
            }
            serve(*reader_);
        }
    }

    std::function<void()> wake_owner_;
    mutable std::mutex read_mutex_;
    std::list<std::shared_ptr<request>> reads_;  // queued, oldest first; under read_mutex_
    std::unordered_map<std::string_view, std::list<std::shared_ptr<request>>::iterator> queued_;  // by key
    std::size_t waiters_ = 0;  // under read_mutex_, as the statistics below
    std::uint64_t reads_made_ = 0, joined_ = 0, dropped_ = 0;
    std::condition_variable read_work_;  // the reader thread waits for requests
    bool reader_stop_ = false;           // under read_mutex_
    std::unique_ptr<store> reader_;      // store::open_reader(), used by reader_thread_ only
    std::thread reader_thread_;
    std::atomic<bool> reads_waiting_{false};
};

}  // namespace idem::detail::pipeline
