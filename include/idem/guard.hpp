// idem/guard.hpp: the idempotency guard.
//
//   idem::guard g;                                   // memory only; see sqlite_store.hpp for durability
//   auto r = g.begin(idem::key("TX1_TRANSFER_v1"));
//   switch (r.status) {
//     case idem::begin_status::acquired:  execute(); r.ticket.succeed(42); break;
//     case idem::begin_status::succeeded: reply(r.outcome); break;      // duplicate: replay
//     default: reply_busy(r.status);                                     // in progress, in doubt, ...
//   }
//
// Thread-safety: every member may be called from any thread concurrently.
// Progress: begin, query and the ticket's members are lock-free: no lock, no allocation, no system
// call (in async or memory mode; a durable guard's refusal, backpressure, yields the processor
// once before it answers, so callers that retry at once leave the flusher its CPU time). maintain(), compensate() and collect() scan the table and may call
// the resolver; they are meant for the background thread (options.maintenance_interval).
#pragma once

#include <condition_variable>
#include <functional>
#include <span>
#include <mutex>
#include <thread>
#include <type_traits>

#include "idem/detail/engine.hpp"
#include "idem/ticket.hpp"

namespace idem {

/// The answer of begin(): a status, and a ticket when status == acquired.
template <template <class> class Atomic = std::atomic, class Clock = steady_clock_source>
struct [[nodiscard]] basic_begin_result {
    begin_status status;
    basic_ticket<Atomic, Clock> ticket;  ///< valid only when status == acquired
    std::uint64_t outcome = 0;           ///< the recorded outcome (succeeded) or failure code (failed)
    std::uint64_t fence = 0;             ///< the record's fence
    explicit operator bool() const noexcept { return status == begin_status::acquired; }
};

struct run_options {
    duplicate_policy on_duplicate = duplicate_policy::replay;
    std::uint64_t fingerprint = 0;                       ///< 0: no payload check
    std::chrono::nanoseconds wait{0};                    ///< wait this long for an in-flight outcome
    std::chrono::nanoseconds record_timeout = std::chrono::seconds(5);  ///< retry recording success this long
};

/// A request fingerprint from payload bytes (XXH3-64; never 0, which means "none").
inline std::uint64_t fingerprint_of(std::string_view payload) noexcept {
    const std::uint64_t h = XXH3_64bits(payload.data(), payload.size());
    return h == 0 ? 1 : h;
}

template <template <class> class Atomic = std::atomic, class Clock = steady_clock_source>
class basic_guard {
public:
    using ticket_type = basic_ticket<Atomic, Clock>;
    using result_type = basic_begin_result<Atomic, Clock>;

    /// Allocates both generations (2 x next_pow2(2 x capacity) slots) up front. Throws idem::error
    /// (errc::invalid_argument) naming the bad option. `sink` receives every transition (durable
    /// stores); it must outlive the guard.
    /// With defer_maintenance the background thread starts only when start_maintenance() is
    /// called (the durable guard recovers first).
    explicit basic_guard(options opts = {}, Clock clock = {}, transition_sink* sink = nullptr,
                         bool defer_maintenance = false)
        : engine_(std::move(opts), clock, sink) {
        if (!defer_maintenance) start_maintenance();
    }

    /// Starts the maintenance thread if options.maintenance_interval > 0 and it is not running.
    void start_maintenance() {
        if (engine_.opts().maintenance_interval > std::chrono::nanoseconds::zero() && !maintenance_.joinable())
            maintenance_ = std::thread([this] { maintenance_loop(); });
    }
    ~basic_guard() { stop_maintenance(); }

    /// Stops the maintenance thread (the durable guard does this before stopping its flusher).
    void stop_maintenance_for_shutdown() { stop_maintenance(); }
    basic_guard(const basic_guard&) = delete;
    basic_guard& operator=(const basic_guard&) = delete;

    /// Claims `k`, or says what its record is. One call, one answer. Progress: lock-free.
    result_type begin(const key& k, std::uint64_t fingerprint = 0) noexcept {
        auto a = engine_.begin(k, fingerprint);
        if (a.status == begin_status::acquired) return {a.status, ticket_type(&engine_, a.claim, k), 0, a.fence};
        return {a.status, ticket_type(), a.outcome, a.fence};
    }

    /// Like begin(), but while another caller holds the claim, waits up to `timeout` for its outcome
    /// (polling with exponential back-off, yielding the CPU). Not lock-free: it waits by design.
    result_type begin_wait(const key& k, std::uint64_t fingerprint, std::chrono::nanoseconds timeout) noexcept {
        const auto deadline = engine_.now() + timeout;
        const auto real_deadline = std::chrono::steady_clock::now() + timeout;
        std::chrono::microseconds pause{1};
        for (;;) {
            auto r = begin(k, fingerprint);
            if (r.status != begin_status::in_progress) return r;
            if (engine_.now() >= deadline || std::chrono::steady_clock::now() >= real_deadline) return r;
            std::this_thread::sleep_for(pause);
            pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
        }
    }

    /// The key's record as this process knows it (absent when unknown). Progress: lock-free.
    [[nodiscard]] record_view query(const key& k) const noexcept { return engine_.query(k); }

    /// Runs fn at most once per key and returns its outcome. fn returns an integral outcome or void
    /// (outcome 0). A duplicate returns the recorded outcome, or throws errc::duplicate_request when
    /// ro.on_duplicate == raise. Throws idem::error for in progress (after ro.wait), in doubt,
    /// payload mismatch, terminal failure, capacity and store errors. If fn throws, the claim fails
    /// per options.on_failure and the exception propagates.
    template <class Fn>
    std::uint64_t run(const key& k, Fn&& fn, const run_options& ro = {}) {
        auto r = ro.wait > std::chrono::nanoseconds::zero() ? begin_wait(k, ro.fingerprint, ro.wait)
                                                            : begin(k, ro.fingerprint);
        auto name = [&k] { return "key '" + key::printable(k.view()) + "'"; };  // only on the error paths
        switch (r.status) {
            case begin_status::acquired: break;
            case begin_status::succeeded:
                if (ro.on_duplicate == duplicate_policy::replay) return r.outcome;
                throw error(errc::duplicate_request, name() + " already succeeded (fence " + std::to_string(r.fence) + ")");
            case begin_status::failed:
                throw error(errc::duplicate_request,
                            name() + " already failed terminally with code " + std::to_string(r.outcome));
            case begin_status::in_progress: throw error(errc::in_progress, name() + " is being executed by another caller");
            case begin_status::in_doubt:
                throw error(errc::in_doubt, name() + " has an expired claim whose outcome is unknown");
            case begin_status::payload_mismatch:
                throw error(errc::payload_mismatch, name() + " was used before with a different request payload");
            case begin_status::capacity_exhausted:
                throw error(errc::capacity_exhausted, name() + " found no free slot within options.max_probe = " +
                                                          std::to_string(engine_.opts().max_probe));
            case begin_status::backpressure: throw error(errc::backpressure, name() + ": flush queue full");
            case begin_status::store_unavailable:
                throw error(errc::store_unavailable, name() + ": the claim could not be made durable; not executed");
            case begin_status::invalid_key:
                throw error(errc::invalid_key, k.empty() ? engine_.key_refusal(k) : name() + ": " + engine_.key_refusal(k));
        }
        std::uint64_t outcome = 0;
        if constexpr (std::is_void_v<std::invoke_result_t<Fn>>) {
            std::invoke(std::forward<Fn>(fn));
        } else {
            outcome = static_cast<std::uint64_t>(std::invoke(std::forward<Fn>(fn)));
        }
        // The effect happened: the success must be recorded. Retry while the queue is full or
        // compensation holds the record; give up after ro.record_timeout (the lease and the
        // resolver then decide, and the caller learns it from the exception).
        std::error_code ec = r.ticket.succeed(outcome);
        const auto give_up = std::chrono::steady_clock::now() + ro.record_timeout;
        while ((ec == errc::backpressure || ec == errc::busy) && std::chrono::steady_clock::now() < give_up) {
            std::this_thread::yield();
            ec = r.ticket.succeed(outcome);
        }
        if (ec) throw error(static_cast<errc>(ec.value()), name() + ": " + ec.message());
        return outcome;
    }

    /// Sends expired claims to the resolver. Returns how many were resolved.
    std::size_t compensate() { return engine_.compensate(); }

    /// Recycles the previous generation if it is due (see detail/engine.hpp). Returns true on rotation.
    bool collect() {
        return engine_.rotate_if_due([this] { return !all_flushed_ || all_flushed_(); });
    }

    /// compensate() then collect(); what the background thread runs every maintenance_interval.
    void maintain() {
        compensate();
        collect();
    }

    /// Counters. Progress: wait-free (sums per-thread stripes).
    [[nodiscard]] stats snapshot() const noexcept { return engine_.snapshot_stats(); }

    /// Restores one record during recovery; used by the durable stores before the guard is shared.
    begin_status restore(const key& k, record_state st, std::uint64_t fence, std::uint64_t outcome,
                         std::uint64_t fingerprint, std::chrono::nanoseconds lease_until,
                         std::chrono::nanoseconds updated) noexcept {
        return engine_.restore(k, st, fence, outcome, fingerprint, lease_until, updated);
    }

    /// The cold window (durable guards, detail/window_filter.hpp): keys evicted from memory that
    /// the store remembers. Enable before the guard is shared; remember_cold() at recovery.
    void enable_cold_window(std::chrono::nanoseconds window) { engine_.enable_cold_window(window); }
    [[nodiscard]] detail::window_filter::entry cold_entry(const key& k, std::chrono::nanoseconds updated) const noexcept {
        return engine_.cold_entry(k, updated);
    }
    [[nodiscard]] bool remember_cold(std::span<const detail::window_filter::entry> keys) {
        return engine_.remember_cold(keys);
    }
    [[nodiscard]] const detail::window_filter* cold_window() const noexcept { return engine_.cold_window(); }

    /// Calls fn(std::string key, record_view) for every record in memory.
    template <class Fn>
    void for_each(Fn&& fn) const { engine_.for_each(std::forward<Fn>(fn)); }

    /// Recovery: new fences start above `max_seen` (the store's largest fence).
    void set_fence_floor(std::uint64_t max_seen) noexcept { engine_.set_fence_floor(max_seen); }

    /// A store pipeline sets this so that only durably flushed records are evicted.
    void set_all_flushed(std::function<bool()> f) { all_flushed_ = std::move(f); }

    [[nodiscard]] const options& opts() const noexcept { return engine_.opts(); }
    [[nodiscard]] std::chrono::nanoseconds now() const noexcept { return engine_.now(); }

private:
    void maintenance_loop() {
        std::unique_lock lock(mutex_);
        while (!stopping_) {
            cv_.wait_for(lock, engine_.opts().maintenance_interval, [this] { return stopping_; });
            if (stopping_) break;
            lock.unlock();
            try {
                maintain();
            } catch (...) {
                // A throwing resolver must not kill the process; the claim stays and is asked again.
            }
            lock.lock();
        }
    }
    void stop_maintenance() {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        cv_.notify_all();
        if (maintenance_.joinable()) maintenance_.join();
    }

    detail::engine<Atomic, Clock> engine_;
    std::function<bool()> all_flushed_;
    std::mutex mutex_;
    std::condition_variable cv_;
    bool stopping_ = false;
    std::thread maintenance_;
};

using guard = basic_guard<>;
using begin_result = basic_begin_result<>;

}  // namespace idem
