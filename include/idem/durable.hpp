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
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
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
    std::chrono::nanoseconds cold_elapsed{0};  ///< of that, building the cold window's filter
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
        recover();
        pipeline_.start();
        detail::guard_access::set_flush_marks(
            guard_, [this] { return pipeline_.issued(); },
            [this](std::uint64_t seq) { return pipeline_.decided_through(seq); });
        report_.compensated = guard_.compensate();
        detail::guard_access::start_maintenance(guard_);
    }

    ~basic_durable_guard() {
        detail::guard_access::stop_maintenance(guard_);
        pipeline_.stop();
    }
    basic_durable_guard(const basic_durable_guard&) = delete;
    basic_durable_guard& operator=(const basic_durable_guard&) = delete;

    guard_type& guard() noexcept { return guard_; }
    guard_type* operator->() noexcept { return &guard_; }
    store& backing_store() noexcept { return *store_; }
    [[nodiscard]] const recovery_report& recovery() const noexcept { return report_; }
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

    std::unique_ptr<store> store_;
    store_options so_;
    const detail::recovery::clock_map wall_;  // the guard's clock <-> Unix ms, taken once (clock_map.hpp)
    detail::pipeline::flush_pipeline pipeline_;
    guard_type guard_;
    recovery_report report_;
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
