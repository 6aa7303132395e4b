// idem/durable.hpp: a guard whose every transition is flushed to a durable store, recovered at start.
//
//   #include <idem/stores/sqlite_store.hpp>
//   idem::store_options so;
//   so.mode = idem::durability::sync;                // begin() and succeed() return after the commit
//   idem::durable_guard g(std::make_unique<idem::sqlite_store>("idem.db"), idem::options{}, so);
//   auto r = g->begin(idem::key("TX1_TRANSFER_v1"));  // the same guard API (guard.hpp)
//   if (r) (void)r.ticket.succeed(42);
//
// Two windows (docs/stores.md, "Two windows"). options.retention is the hot window: how long memory
// holds a terminal record. store_options::window is the idempotency window: how long a decision is
// remembered at all. A key memory evicted (or recovery left out of memory) but still in the window
// is in the cold window, a filter of about 1.5 bytes per key; a claim of a key the filter may hold
// first reads the store, and a record in the window is answered from there (a duplicate with its
// outcome, or in_progress), never granted again. A fresh key misses the filter and is granted
// without a store read. Past the window the key is new, and the flusher prunes its record. The
// window is judged on one clock, the guard's, mapped to Unix time once at construction: the clock
// every stored time is written with (window_now_ms; docs/stores.md, "Which clock judges the window").
//
// Construction: (1) sync mode asks the store whether it can make commits durable (PostgreSQL with
// fsync=off or synchronous_commit=off is refused); (2) recovery (detail/recovery/recover.hpp)
// streams every record: claims in flight, released records and terminal ones inside the hot window
// go into the table, the rest of the idempotency window into the cold window only, older ones
// nowhere; new fences start above the store's largest; (3) the flusher starts; (4) claims whose
// lease already expired are sent to the resolver (compensation, audited); (5) the periodic
// maintenance thread starts.
//
// With store_options::start = recovery_start::claims_first, (2) reads only the claims in flight and
// the largest fence, and a thread of the guard (cold_loader_) streams the window's keys into the
// cold window after the constructor returns; until it is done, every key memory does not hold is
// read from the store before it is granted (recovery_report::cold_complete says when it is done;
// wait_for_cold_window waits for it). A stream the store interrupts (store_unavailable) starts
// again after a pause; any other failure leaves the filter partial, which is correct and slower,
// and is reported in recovery_report::cold_error.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "idem/detail/pipeline/flush_pipeline.hpp"
#include "idem/detail/recovery/clock_map.hpp"
#include "idem/detail/recovery/recover.hpp"
#include "idem/guard.hpp"
#include "idem/store.hpp"
#include "idem/store_options.hpp"

namespace idem {

/// What recovery found and how long it took.
struct recovery_report {
    std::size_t records = 0;                   ///< records loaded into memory (the hot window and every claim)
    std::size_t processing = 0;                ///< claims that were in flight at the crash
    std::size_t compensated = 0;               ///< of those, resolved at start
    std::size_t refused = 0;                   ///< records the table had no room for (capacity)
    std::size_t cold = 0;                      ///< records of the idempotency window left in the store, in the cold window
    std::size_t expired = 0;                   ///< records past the idempotency window: forgotten (prune removes them)
    std::chrono::nanoseconds elapsed{0};       ///< from the first read to serving
    std::chrono::nanoseconds cold_elapsed{0};  ///< building the cold window's filter
    /// recovery_start::claims_first ran: memory held only the claims in flight at start, and the
    /// window's keys were streamed into the cold window after the guard served (`cold`, `expired`
    /// and `cold_elapsed` are that stream's, once it is complete).
    bool claims_first = false;
    /// The cold window holds every key of the window. Always true after load_window; with
    /// claims_first, false until the stream completes (meanwhile every key memory does not hold is
    /// read from the store), and for good if it failed (cold_error).
    bool cold_complete = true;
    std::chrono::nanoseconds cold_complete_after{0};  ///< claims_first: from the first read to cold_complete
    std::size_t cold_attempts = 0;                    ///< claims_first: streams started (more than 1: the store was down)
    std::string cold_error;                           ///< claims_first: why the last stream failed (empty: none did)
};

template <template <class> class Atomic = std::atomic, class Clock = steady_clock_source>
class basic_durable_guard {
public:
    using guard_type = basic_guard<Atomic, Clock>;

    /// Throws idem::error: invalid_argument (options, or sync mode on a store that cannot be durable),
    /// store_unavailable / store_error (the store), corrupt_record (a bad row during recovery),
    /// capacity_exhausted (the store holds more claims in flight than options.capacity allows;
    /// terminal records that do not fit go to the cold window instead).
    basic_durable_guard(std::unique_ptr<store> st, options opts = {}, store_options so = {}, Clock clock = {})
        : store_(std::move(st)),
          so_(prepare(*store_, so)),
          wall_(detail::recovery::clock_map::at_start(clock.now())),
          pipeline_(*store_, so_, [this](std::chrono::nanoseconds t) { return wall_.to_wall_ms(t); }),
          guard_(std::move(opts), clock, &pipeline_, /*defer_maintenance=*/true) {
        check_windows();
        detail::guard_access::enable_cold_window(guard_, window().on_clock());
        pipeline_.set_recall([this](const stored_record& r) { return to_recalled(r); });
        pipeline_.set_window_clock([this] { return window_now_ms(); });  // the prune bound's now
        const auto started = std::chrono::steady_clock::now();
        std::unique_ptr<store> reader;
        if (so_.start == recovery_start::claims_first && !guard_.opts().ordered_versions) reader = store_->open_reader();
        if (reader != nullptr) recover_claims_first();
        else recover();
        pipeline_.start();
        detail::guard_access::set_flush_marks(
            guard_, [this] { return pipeline_.issued(); },
            [this](std::uint64_t seq) { return pipeline_.decided_through(seq); });
        report_.compensated = guard_.compensate();
        detail::guard_access::start_maintenance(guard_);
        if (reader != nullptr)
            cold_loader_ = std::jthread(
                [this, r = std::move(reader), started](std::stop_token stop) mutable { stream_cold(*r, started, stop); });
    }

    ~basic_durable_guard() {
        stop_cold_loader();
        detail::guard_access::stop_maintenance(guard_);
        pipeline_.stop();
    }
    basic_durable_guard(const basic_durable_guard&) = delete;
    basic_durable_guard& operator=(const basic_durable_guard&) = delete;

    guard_type& guard() noexcept { return guard_; }
    guard_type* operator->() noexcept { return &guard_; }
    store& backing_store() noexcept { return *store_; }
    /// What recovery found. A copy: with recovery_start::claims_first its cold-window fields change
    /// when the stream after start completes.
    [[nodiscard]] recovery_report recovery() const {
        std::lock_guard lock(report_mutex_);
        return report_;
    }
    /// Blocks until the cold window is complete (recovery_start::claims_first: the window's keys
    /// streamed in), its stream failed for good, or the timeout passes. True when it is complete.
    bool wait_for_cold_window(std::chrono::nanoseconds timeout = std::chrono::seconds(60)) {
        std::unique_lock lock(report_mutex_);
        cold_done_.wait_for(lock, timeout, [this] { return report_.cold_complete || !cold_streaming_; });
        return report_.cold_complete;
    }
    [[nodiscard]] durability mode() const noexcept { return so_.mode; }

    /// Blocks until every transition offered so far is committed, or the timeout passes.
    bool flush(std::chrono::nanoseconds timeout = std::chrono::seconds(30)) { return pipeline_.flush(timeout); }

    /// Guard counters plus the flusher's.
    [[nodiscard]] stats snapshot() {
        stats s = guard_.snapshot();
        const auto c = pipeline_.snapshot();
        s.flush_batches = c.batches;
        s.flushed_transitions = c.rows;
        s.queue_depth = c.queue_depth;
        s.flush_lag_ns = static_cast<std::uint64_t>(c.lag_ns);
        s.store_errors = c.errors;
        s.rejected_rows = c.rejected;
        s.flusher_cpu_ns = c.cpu_ns;
        s.pruned_records = c.pruned_records;
        s.pruned_audit_rows = c.pruned_audit_rows;
        return s;
    }
    [[nodiscard]] std::string last_store_error() { return pipeline_.snapshot().last_error; }

private:
    static store_options prepare(store& st, store_options so) {
        if (!so.node.empty()) st.set_node(so.node);
        if (so.mode == durability::sync) st.check_sync_durability();
        return so;
    }

    void check_windows() const {
        auto text = [](std::chrono::milliseconds w) {
            return w == store_options::forever ? std::string("forever") : std::to_string(w.count()) + " ms";
        };
        if (so_.window.count() <= 0)
            throw error(errc::invalid_argument, "store_options.window is " + text(so_.window) +
                                                    "; it must be positive (store_options::forever: never forget)");
        if (so_.audit_window.count() <= 0)
            throw error(errc::invalid_argument, "store_options.audit_window is " + text(so_.audit_window) +
                                                    "; it must be positive (store_options::forever: keep every row)");
        const auto retention = guard_.opts().retention;
        if (so_.window != store_options::forever && retention > so_.window)
            throw error(errc::invalid_argument,
                        "options.retention (" +
                            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(retention).count()) +
                            " ms) is longer than store_options.window (" + text(so_.window) +
                            "): memory would remember keys the store forgets; the hot window must fit in the "
                            "idempotency window");
    }

    /// The idempotency window, judged on the clock of wall_ (detail/recovery/clock_map.hpp).
    [[nodiscard]] detail::recovery::window window() const noexcept { return {so_.window}; }

    /// Now (Unix ms) on the clock the idempotency window is judged on: the guard's clock mapped to
    /// wall time once, at construction (wall_), the mapping every stored time is written with.
    /// Recovery, recalls and the flusher's prune all take "now" from here (clock_map.hpp says why
    /// system_clock is not read again).
    [[nodiscard]] std::int64_t window_now_ms() const noexcept { return wall_.to_wall_ms(guard_.now()); }

    /// A record the store returned for a key of the cold window, as the table takes it.
    recalled to_recalled(const stored_record& r) const {
        return detail::recovery::to_recalled(&r, wall_, window(), window_now_ms(), *store_);
    }

    /// Streams every record once into the table or the cold window, and sets the fence floor
    /// (detail/recovery/recover.hpp: what goes where, and why claims go first).
    void recover() {
        const detail::recovery::tally t = detail::recovery::recover(guard_, *store_, wall_, window());
        report_.records = t.records;
        report_.processing = t.processing;
        report_.refused = t.refused;
        report_.cold = t.cold;
        report_.expired = t.expired;
        report_.elapsed = t.elapsed;
        report_.cold_elapsed = t.cold_elapsed;
    }

    /// recovery_start::claims_first, before the guard serves: the claims in flight and the fence
    /// floor; the cold window stays partial until stream_cold completes it.
    void recover_claims_first() {
        const detail::recovery::tally t = detail::recovery::load_claims(guard_, *store_, wall_);
        report_.claims_first = true;
        report_.cold_complete = false;
        cold_streaming_ = true;
        report_.records = t.records;
        report_.processing = t.processing;
        report_.refused = t.refused;
        report_.elapsed = t.elapsed;
    }

    /// The cold loader's thread: streams the window's keys on `reader` into the cold window. A
    /// store that cannot be reached (store_unavailable) is asked again after a pause that doubles
    /// up to store_options::max_backoff; any other error is final (the filter stays partial).
    void stream_cold(store& reader, std::chrono::steady_clock::time_point started, std::stop_token stop) {
        std::chrono::nanoseconds pause = std::chrono::milliseconds(10);
        for (;;) {
            {
                std::lock_guard lock(report_mutex_);
                ++report_.cold_attempts;
            }
            bool again = false;
            try {
                const auto t = detail::recovery::stream_window_keys(guard_, reader, wall_, window(), window_now_ms(),
                                                                    [&] { return stop.stop_requested(); });
                std::lock_guard lock(report_mutex_);
                report_.cold = t.cold;
                report_.expired = t.expired;
                report_.cold_elapsed = t.cold_elapsed;
                report_.cold_complete = true;
                report_.cold_complete_after = std::chrono::steady_clock::now() - started;
                report_.cold_error.clear();
            } catch (const detail::recovery::stream_stopped&) {
                std::lock_guard lock(report_mutex_);
                report_.cold_error = "the cold window's stream was stopped: the guard was destroyed first";
            } catch (const error& e) {
                std::lock_guard lock(report_mutex_);
                report_.cold_error = e.what();
                again = e.kind() == errc::store_unavailable;
            } catch (const std::exception& e) {
                std::lock_guard lock(report_mutex_);
                report_.cold_error = e.what();
            }
            if (!again) break;
            {
                std::unique_lock lock(report_mutex_);
                (void)pause_.wait_for(lock, stop, pause, [] { return false; });  // ended early only by a stop
            }
            if (stop.stop_requested()) break;
            pause = std::min<std::chrono::nanoseconds>(2 * pause, std::max(so_.max_backoff, pause));
            try {
                reader.reconnect();
            } catch (const std::exception& e) {
                std::lock_guard lock(report_mutex_);
                report_.cold_error = e.what();
            }
        }
        std::lock_guard lock(report_mutex_);
        cold_streaming_ = false;
        cold_done_.notify_all();
    }

    void stop_cold_loader() {
        if (!cold_loader_.joinable()) return;
        cold_loader_.request_stop();
        cold_loader_.join();
    }

    std::unique_ptr<store> store_;
    store_options so_;
    const detail::recovery::clock_map wall_;  // the guard's clock <-> Unix ms, taken once (clock_map.hpp)
    detail::pipeline::flush_pipeline pipeline_;
    guard_type guard_;
    mutable std::mutex report_mutex_;  // report_ and cold_streaming_, which the cold loader changes
    std::condition_variable cold_done_;
    std::condition_variable_any pause_;  // the cold loader's pause between attempts, ended by a stop
    recovery_report report_;
    bool cold_streaming_ = false;
    std::jthread cold_loader_;  // last: stopped and joined before anything it uses is destroyed
};

using durable_guard = basic_durable_guard<>;

/// The figures of a durable guard's start as Prometheus gauges (they are fixed for the process's
/// life): how long recovery took before the guard served, what it loaded, and what it left.
///   idem_recovery_seconds, idem_recovery_cold_seconds, idem_recovery_records,
///   idem_recovery_claims_in_flight, idem_recovery_claims_compensated, idem_recovery_cold_records,
///   idem_recovery_expired_records, idem_recovery_refused_records
inline std::string to_prometheus(const recovery_report& r) {
    std::string out;
    auto gauge = [&](const char* name, const char* help, const std::string& value) {
        out.append("# HELP idem_").append(name).append(" ").append(help).append("\n");
        out.append("# TYPE idem_").append(name).append(" gauge\n");
        out.append("idem_").append(name).append(" ").append(value).append("\n");
    };
    auto seconds = [](std::chrono::nanoseconds d) {
        return detail::prometheus_seconds(static_cast<std::uint64_t>(std::max<std::int64_t>(0, d.count())));
    };
    gauge("recovery_seconds", "Time from the first read of the store to serving, at this process's start.",
          seconds(r.elapsed));
    gauge("recovery_cold_seconds", "Of the recovery, time spent building the cold window's filter.",
          seconds(r.cold_elapsed));
    gauge("recovery_records", "Records loaded into memory at start (the hot window and every claim).",
          std::to_string(r.records));
    gauge("recovery_claims_in_flight", "Claims that were in flight when the previous process stopped.",
          std::to_string(r.processing));
    gauge("recovery_claims_compensated", "Of those claims, the ones the resolver decided at start.",
          std::to_string(r.compensated));
    gauge("recovery_cold_records", "Records of the idempotency window left in the store (the cold window).",
          std::to_string(r.cold));
    gauge("recovery_expired_records", "Records past the idempotency window found at start (forgotten).",
          std::to_string(r.expired));
    gauge("recovery_refused_records", "Records memory had no room for at start.", std::to_string(r.refused));
    gauge("recovery_cold_complete",
          "1 when the cold window holds every key of the idempotency window; 0 while recovery_start::claims_first "
          "still streams it in (every key memory does not hold is read from the store), or after that stream failed.",
          r.cold_complete ? "1" : "0");
    return out;
}

/// Every series of a durable guard in one call, for the application's own /metrics handler (the
/// library opens no port): the guard's and the pipeline's counters and gauges (stats), each
/// operation's latency and lease, and the recovery figures of its start. It reads counters only,
/// never the records: its cost does not grow with the table (bench/metrics_bench.cpp).
template <template <class> class Atomic, class Clock>
std::string to_prometheus(basic_durable_guard<Atomic, Clock>& g) {
    std::string out = to_prometheus(g.snapshot(), g.guard().operation_latencies());
    out += to_prometheus(g.recovery());
    return out;
}

}  // namespace idem
