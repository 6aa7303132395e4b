// idem/guard.hpp: the idempotency guard (scope: this process).
//
//   idem::guard g;                                   // memory only; durable.hpp makes it durable
//   auto r = g.begin(idem::key("TX1_TRANSFER_v1"));
//   switch (r.status) {
//     case idem::begin_status::acquired: (void)r.ticket.succeed(42); break;  // executed: record 42
//     case idem::begin_status::succeeded: break;     // a duplicate: r.outcome == 42, replay it
//     default: break;                                // in progress, in doubt, ...: r.status says
//   }
//   const std::uint64_t again = g.run(idem::key("TX1_TRANSFER_v1"), [] { return 7; });  // not run: 42
//   (void)again;
//
// begin() is this scope's; begin_wait(), run(), the result shape and the ticket's completion are
// the ones of every scope (guard_contract.hpp), shared with global_guard.
//
// Thread-safety: every member may be called from any thread concurrently.
// Progress: begin, query and the ticket's members are lock-free: no lock, no allocation, no system
// call (in async or memory mode; a durable guard's refusal, backpressure, yields the processor
// once before it answers, so callers that retry at once leave the flusher its CPU time).
// maintain(), compensate() and collect() scan the table and may call the resolver; they are meant
// for the background thread (options.maintenance_interval).
#pragma once

#include <algorithm>
#include <array>
#include <condition_variable>
#include <functional>
#include <span>
#include <mutex>
#include <thread>
#include <string>
#include <type_traits>

#include "idem/detail/table/record_table.hpp"
#include "idem/guard_contract.hpp"
#include "idem/ticket.hpp"

namespace idem {

/// The answer of guard::begin(): the result shape of every scope (guard_contract.hpp).
template <template <class> class Atomic = std::atomic, class Clock = steady_clock_source>
using basic_begin_result = begin_result_of<basic_ticket<Atomic, Clock>>;

/// A request fingerprint from payload bytes (XXH3-64; never 0, which means "none").
inline std::uint64_t fingerprint_of(std::string_view payload) noexcept {
    const std::uint64_t h = XXH3_64bits(payload.data(), payload.size());
    return h == 0 ? 1 : h;
}

namespace detail {
struct guard_access;
}

template <template <class> class Atomic = std::atomic, class Clock = steady_clock_source>
class basic_guard : public detail::guard_contract<basic_guard<Atomic, Clock>> {
public:
    using ticket_type = basic_ticket<Atomic, Clock>;
    using result_type = basic_begin_result<Atomic, Clock>;

    /// Allocates both generations (2 x next_pow2(2 x capacity) slots) up front. Throws idem::error
    /// (errc::invalid_argument) naming the bad option. `sink` receives every transition (durable
    /// stores); it must outlive the guard. With defer_maintenance the background thread starts
    /// only when the owner that recovers the guard (durable.hpp) says so.
    explicit basic_guard(options opts = {}, Clock clock = {}, transition_sink* sink = nullptr,
                         bool defer_maintenance = false)
        : table_(std::move(opts), clock, sink) {
        if (!defer_maintenance) start_maintenance();
    }
    ~basic_guard() { stop_maintenance(); }
    basic_guard(const basic_guard&) = delete;
    basic_guard& operator=(const basic_guard&) = delete;

    /// Claims `k`, or says what its record is. One call, one answer. Progress: lock-free.
    result_type begin(const key& k, std::uint64_t fingerprint = 0) noexcept {
        // The table copies a duplicate's payload straight into the result (no string is moved).
        result_type r{begin_status::invalid_key, ticket_type(), 0, 0};
        fill(r, table_.begin(k, fingerprint, &r.payload), k);
        return r;
    }

    /// Claims a batch: out[i] = begin(keys[i], fingerprints[i]) for every i, in order, with the
    /// same answers as those calls one after another (a key repeated in the batch is claimed by its
    /// first occurrence; the later ones see that claim, as begin() would: in_progress). What it
    /// saves is memory latency: each run of up to batch_prefetch keys is hashed and its index lines
    /// asked for before the first of them is claimed, so their cache misses overlap. fingerprints
    /// may be empty (no payload check) or shorter than keys (0 for the rest). Answers
    /// min(keys.size(), out.size()) keys and returns that count; out's elements are assigned, so
    /// pass results without a ticket (a valid ticket there is dropped: failed per on_failure).
    /// Progress: lock-free, as begin(); a durable guard in sync mode still waits for each claim's
    /// commit in turn (it batches the lookups, not the commits).
    std::size_t begin_many(std::span<const key> keys, std::span<result_type> out,
                           std::span<const std::uint64_t> fingerprints = {}) noexcept {
        const std::size_t n = std::min(keys.size(), out.size());
        std::array<detail::table::hash128, batch_prefetch> h;
        for (std::size_t base = 0; base < n; base += batch_prefetch) {
            const std::size_t m = std::min(batch_prefetch, n - base);
            for (std::size_t j = 0; j < m; ++j) h[j] = table_.prepare(keys[base + j]);
            for (std::size_t j = 0; j < m; ++j) {
                const std::size_t i = base + j;
                const std::uint64_t fp = i < fingerprints.size() ? fingerprints[i] : 0;
                result_type r{begin_status::invalid_key, ticket_type(), 0, 0};
                fill(r, table_.claim(keys[i], h[j], fp, &r.payload), keys[i]);
                out[i] = std::move(r);
            }
        }
        return n;
    }

    /// How many keys begin_many() hashes and prefetches ahead of their claims: a 1 KiB array of
    /// hashes on the stack, and about as many index lines as L1 holds in flight several times over.
    static constexpr std::size_t batch_prefetch = 32;

    // begin_wait(key, fingerprint, timeout) and run(key, fn, run_options) come from
    // detail::guard_contract (guard_contract.hpp): the same in every scope. begin_wait stops at
    // the guard clock's deadline too (a manual clock in tests).

    /// The key's record as this process knows it (absent when unknown), with its response payload
    /// (record_view::payload) when it is terminal and has one. Progress: lock-free.
    [[nodiscard]] record_view query(const key& k) const noexcept { return table_.query(k); }

    /// Sends expired claims to the resolver. Returns how many were resolved.
    std::size_t compensate() { return table_.compensate(); }

    /// Recycles the previous generation if it is due (detail/table/rotation.hpp). Returns true on rotation.
    bool collect() {
        struct marks {
            const basic_guard& g;
            [[nodiscard]] std::uint64_t issued() const { return g.issued_ ? g.issued_() : 1; }
            [[nodiscard]] bool decided(std::uint64_t seq) const { return !g.decided_ || g.decided_(seq); }
        };
        return table_.rotate_if_due(marks{*this});
    }

    /// Recomputes the adaptive leases (options.adaptive), then compensate() and collect(); what the
    /// background thread runs every maintenance_interval.
    void maintain() {
        table_.refresh_leases();
        compensate();
        collect();
    }

    /// Counters. Progress: wait-free (sums per-thread stripes).
    [[nodiscard]] stats snapshot() const noexcept { return table_.snapshot_stats(); }

    /// With options.adaptive: each operation's claim-to-completion p50/p99 in this process and the
    /// lease its next claim gets (stats.hpp, operation_latency; to_prometheus(snapshot(), this)).
    /// Empty when options.adaptive is off. Allocates; not for the hot path. Thread-safe.
    [[nodiscard]] std::vector<operation_latency> operation_latencies() const { return table_.operation_latencies(); }

    /// The cold window of a durable guard (detail/table/window_filter.hpp), null when it has none.
    [[nodiscard]] const detail::table::window_filter* cold_window() const noexcept { return table_.cold_window(); }

    /// Calls fn(std::string key, record_view) for every record in memory.
    template <class Fn>
    void for_each(Fn&& fn) const {
        table_.for_each(std::forward<Fn>(fn));
    }

    [[nodiscard]] const options& opts() const noexcept { return table_.opts(); }
    [[nodiscard]] std::chrono::nanoseconds now() const noexcept { return table_.now(); }

private:
    friend class detail::guard_contract<basic_guard>;
    friend struct detail::guard_access;

    /// The table's answer into the public result r (built empty; its payload already filled by
    /// the table): a ticket for an acquired claim. r is returned by NRVO, so no std::string is
    /// moved (a move copies the small buffer with a memcpy call, which no answer should pay).
    void fill(result_type& r, const typename detail::table::record_table<Atomic, Clock>::begin_answer& a,
              const key& k) noexcept {
        r.status = a.status;
        r.fence = a.fence;
        if (a.status == begin_status::acquired) r.ticket.adopt(&table_, a.claim, k);
        else r.outcome = a.outcome;
    }

    /// run()'s words for the answers only this scope gives its reasons for.
    [[nodiscard]] std::string refusal_message(begin_status st, const key& k) const {
        const std::string name = "key '" + key::printable(k.view()) + "'";
        switch (st) {
            case begin_status::capacity_exhausted:
                return name + " found no free slot within options.max_probe = " + std::to_string(table_.opts().max_probe);
            case begin_status::backpressure: return name + ": flush queue full";
            case begin_status::store_unavailable: return name + ": the claim could not be made durable; not executed";
            case begin_status::invalid_key: return k.empty() ? table_.key_refusal(k) : name + ": " + table_.key_refusal(k);
            default: return name + ": " + to_string(st);
        }
    }

    begin_status restore_record(const key& k, const detail::table::record_image& image) noexcept {
        return table_.restore(k, image);
    }

    /// Starts the maintenance thread if options.maintenance_interval > 0 and it is not running.
    void start_maintenance() {
        if (table_.opts().maintenance_interval > std::chrono::nanoseconds::zero() && !maintenance_.joinable())
            maintenance_ = std::thread([this] { maintenance_loop(); });
    }

    void maintenance_loop() {
        std::unique_lock lock(mutex_);
        while (!stopping_) {
            cv_.wait_for(lock, table_.opts().maintenance_interval, [this] { return stopping_; });
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

    detail::table::record_table<Atomic, Clock> table_;
    std::function<std::uint64_t()> issued_;       ///< the sink's last sequence number taken (none: 1)
    std::function<bool(std::uint64_t)> decided_;  ///< every row up to seq is committed or set aside (none: true)
    std::mutex mutex_;
    std::condition_variable cv_;
    bool stopping_ = false;
    std::thread maintenance_;
};

namespace detail {

/// The recovery plumbing of basic_guard, kept off its public surface: the owner that recovers a
/// guard from a store (durable.hpp) restores records, sets the fence floor and the cold window,
/// says when records are durably flushed, and starts or stops the maintenance thread around its
/// own start and shutdown. All of it happens before the guard is shared, or from its owner.
struct guard_access {
    /// Restores one record during recovery, before the guard is shared: `image` is the stored
    /// record, {state, fence, outcome, fingerprint, lease_until, updated, payload} (times on the
    /// guard's clock; detail/table/record_image.hpp). Its payload (a succeeded or failed record's
    /// response bytes; ignored for other states) is copied into the guard's payload arena:
    /// capacity_exhausted when it is over options.max_payload or the budget is spent;
    /// payload_mismatch when the slot cannot hold it (state absent, fence 0 or past 2^52-1).
    template <class G>
    static begin_status restore(G& g, const key& k, const table::record_image& image) noexcept {
        return g.restore_record(k, image);
    }
    /// New fences start above `max_seen` (the store's largest fence).
    template <class G>
    static void set_fence_floor(G& g, std::uint64_t max_seen) noexcept {
        g.table_.set_fence_floor(max_seen);
    }
    /// collect() evicts a generation only once its rows are in the store: `issued()` is the last
    /// sequence number the sink handed out, `decided(seq)` whether every row up to seq is
    /// committed or set aside (detail/table/rotation.hpp, rotate_if_due).
    template <class G>
    static void set_flush_marks(G& g, std::function<std::uint64_t()> issued, std::function<bool(std::uint64_t)> decided) {
        g.issued_ = std::move(issued);
        g.decided_ = std::move(decided);
    }
    /// For a sink without sequence numbers (tests): records are durable when `flushed()` says
    /// everything offered so far is.
    template <class G>
    static void set_all_flushed(G& g, std::function<bool()> flushed) {
        set_flush_marks(
            g, [] { return std::uint64_t{1}; }, [f = std::move(flushed)](std::uint64_t) { return f(); });
    }
    /// The cold window (detail/table/window_filter.hpp): keys evicted from memory that the store
    /// remembers. Enabled before the guard is shared; remember_cold() at recovery.
    template <class G>
    static void enable_cold_window(G& g, std::chrono::nanoseconds window) {
        g.table_.enable_cold_window(window);
    }
    template <class G>
    [[nodiscard]] static table::window_filter::entry cold_entry(const G& g, const key& k,
                                                                std::chrono::nanoseconds updated) noexcept {
        return g.table_.cold_entry(k.view(), updated);
    }
    template <class G>
    [[nodiscard]] static table::window_filter::entry cold_entry(const G& g, std::string_view key_text,
                                                                std::chrono::nanoseconds updated) noexcept {
        return g.table_.cold_entry(key_text, updated);
    }
    template <class G>
    [[nodiscard]] static bool remember_cold(G& g, std::span<const table::window_filter::entry> keys,
                                            bool completes = false) {
        return g.table_.remember_cold(keys, completes);
    }
    /// A partial cold window (recovery_start::claims_first): every key memory does not hold is
    /// read from the store until remember_cold(..., completes = true).
    template <class G>
    static void begin_partial_cold(G& g) {
        g.table_.begin_partial_cold();
    }
    /// Starts the maintenance thread of a guard built with defer_maintenance (after recovery).
    template <class G>
    static void start_maintenance(G& g) {
        g.start_maintenance();
    }
    /// Stops it before the owner stops what maintenance uses (the durable guard's flusher).
    template <class G>
    static void stop_maintenance(G& g) {
        g.stop_maintenance();
    }
};

}  // namespace detail

using guard = basic_guard<>;
using begin_result = basic_begin_result<>;

}  // namespace idem
