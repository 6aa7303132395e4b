// idem/durable.hpp: a guard whose every transition is flushed to a durable store, recovered at start.
//
//   auto g = idem::durable_guard(std::make_unique<idem::sqlite_store>("idem.db"), opts,
//                                {.mode = idem::durability::sync});
//   auto r = g->begin(key);          // the same guard API; sync mode returns after the commit
//
// Construction: (1) sync mode asks the store whether it can make commits durable (PostgreSQL with
// fsync=off or synchronous_commit=off is refused); (2) recovery loads every record in bulk into the
// table, with new fences starting above the store's largest; (3) the flusher starts; (4) claims
// whose lease already expired are sent to the resolver (compensation, audited); (5) the periodic
// maintenance thread starts.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>

#include "idem/detail/flush_pipeline.hpp"
#include "idem/guard.hpp"
#include "idem/store.hpp"

namespace idem {

/// What recovery found and how long it took.
struct recovery_report {
    std::size_t records = 0;
    std::size_t processing = 0;       ///< claims that were in flight at the crash
    std::size_t compensated = 0;      ///< of those, resolved at start
    std::size_t refused = 0;          ///< records the table had no room for (capacity)
    std::chrono::nanoseconds elapsed{0};
};

template <template <class> class Atomic = std::atomic, class Clock = steady_clock_source>
class basic_durable_guard {
public:
    using guard_type = basic_guard<Atomic, Clock>;

    /// Throws idem::error: invalid_argument (options, or sync mode on a store that cannot be durable),
    /// store_unavailable / store_error (the store), corrupt_record (a bad row during recovery),
    /// capacity_exhausted (the store holds more records than options.capacity allows).
    basic_durable_guard(std::unique_ptr<store> st, options opts = {}, store_options so = {}, Clock clock = {})
        : store_(std::move(st)),
          so_(prepare(*store_, so)),
          clock_base_(clock.now()),
          wall_base_ms_(std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count()),
          pipeline_(*store_, so_, [this](std::chrono::nanoseconds t) { return to_wall_ms(t); }),
          guard_(std::move(opts), clock, &pipeline_, /*defer_maintenance=*/true) {
        recover();
        pipeline_.start();
        guard_.set_all_flushed([this] { return pipeline_.drained(); });
        report_.compensated = guard_.compensate();
        guard_.start_maintenance();
    }

    ~basic_durable_guard() {
        guard_.stop_maintenance_for_shutdown();
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
        return s;
    }
    [[nodiscard]] std::string last_store_error() { return pipeline_.snapshot().last_error; }

private:
    static store_options prepare(store& st, store_options so) {
        if (!so.node.empty()) st.set_node(so.node);
        if (so.mode == durability::sync) st.check_sync_durability();
        return so;
    }

    [[nodiscard]] std::int64_t to_wall_ms(std::chrono::nanoseconds t) const noexcept {
        return wall_base_ms_ + std::chrono::duration_cast<std::chrono::milliseconds>(t - clock_base_).count();
    }
    /// A stored Unix time (ms) on the guard's clock. The store's times are data read from disk: one
    /// more than 100 years from now (either way) is a damaged row, and would overflow the
    /// nanosecond arithmetic, so it is refused as corrupt_record naming the key and the column.
    [[nodiscard]] std::chrono::nanoseconds from_wall_ms(std::int64_t ms, std::string_view k, const char* column) const {
        constexpr std::int64_t century_ms = 100LL * 366 * 24 * 3600 * 1000;
        if (ms < wall_base_ms_ - century_ms || ms > wall_base_ms_ + century_ms)
            throw error(errc::corrupt_record, store_->name() + ": record '" + key::printable(k) + "' has " + column +
                                                  " = " + std::to_string(ms) +
                                                  " ms, more than 100 years from now: a damaged row");
        return clock_base_ + std::chrono::milliseconds(ms - wall_base_ms_);
    }

    void recover() {
        const auto started = std::chrono::steady_clock::now();
        std::uint64_t max_fence = 0;
        store_->load([&](const stored_record& r) {
            // The store validated the key (corrupt_record otherwise); parse() cannot fail here.
            const auto k = key::parse(r.key);
            if (!k) return;
            max_fence = std::max(max_fence, r.fence);
            const begin_status st = guard_.restore(*k, r.state, r.fence, r.outcome, r.fingerprint,
                                                   from_wall_ms(r.lease_until_ms, r.key, "lease_until"),
                                                   from_wall_ms(r.updated_ms, r.key, "updated_time"));
            if (st == begin_status::capacity_exhausted) {
                ++report_.refused;
                throw error(errc::capacity_exhausted, store_->name() + ": recovery found more records than "
                                                                       "options.capacity allows (at key '" +
                                                          key::printable(r.key) + "'); raise options.capacity");
            }
            ++report_.records;
            if (r.state == record_state::processing) ++report_.processing;
        });
        // Restored records keep their fences; only claims made from now on need the floor.
        guard_.set_fence_floor(max_fence);
        report_.elapsed = std::chrono::steady_clock::now() - started;
    }

    std::unique_ptr<store> store_;
    store_options so_;
    std::chrono::nanoseconds clock_base_;
    std::int64_t wall_base_ms_;
    detail::flush_pipeline pipeline_;
    guard_type guard_;
    recovery_report report_;
};

using durable_guard = basic_durable_guard<>;

}  // namespace idem
