// window_clock_test: which clock the idempotency window is judged on (docs/stores.md, "Which clock
// judges the window"). A durable guard writes every stored time (at_ms, updated_time) on its own
// clock, mapped to Unix time once at start; its cold window judges records on that clock. The
// flusher's prune must use the same one, or, after a suspend or a wall-clock step, it disagrees
// with the records it compares against by the step:
//
//   ForwardWallStepPrunesNothingInsideTheWindow  the wall clock runs ahead of the guard's (a suspend,
//       a step forward): a record the guard holds inside the window is neither pruned nor run again
//   BackwardWallStepStillPrunesPastTheWindow     the guard's clock runs ahead of the wall clock (a
//       step back): a record past the window on the guard's clock is pruned at once, and the cold
//       window agrees (its key runs again), while a record inside it stays
//
// The guard's clock is the test's manual clock. The wall clock cannot be stepped by a test, so each
// case moves one clock and not the other: real time passing while the manual clock stands still is
// the wall clock stepping forward relative to the guard's (exactly a suspend: CLOCK_MONOTONIC stops,
// the wall clock does not); the manual clock advancing an hour in no real time is the wall clock
// stepping back by an hour relative to it. Every store runs each case.
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "support/store_fixtures.hpp"
#include "support/store_kinds.hpp"

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::record_state;
using guard_t = idem::basic_durable_guard<std::atomic, idem::manual_clock>;

std::int64_t wall_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

/// Forwards to a store it owns and notes when (wall clock) the flusher called prune() and with
/// which records bound, so a test can wait for a prune that ran after a given moment instead of
/// sleeping and hoping one did.
class prune_log final : public idem_test::forwarding_store {
public:
    explicit prune_log(std::unique_ptr<idem::store> inner) : forwarding_store(*inner), owned_(std::move(inner)) {}

    idem::prune_result prune(const idem::prune_limits& l) override {
        const std::int64_t at = wall_ms();
        const idem::prune_result r = inner_.prune(l);
        std::lock_guard lock(mutex_);
        calls_.push_back({at, l.records_before_ms});
        return r;
    }
    std::string name() const override { return "prune_log(" + inner_.name() + ")"; }

    /// Prune calls that started at or after `wall` (Unix ms). Thread-safe.
    std::size_t calls_since(std::int64_t wall) const {
        std::lock_guard lock(mutex_);
        std::size_t n = 0;
        for (const auto& c : calls_) n += c.at_ms >= wall ? 1 : 0;
        return n;
    }
    /// The largest records bound any call used (keep_all: none). Thread-safe.
    std::int64_t largest_bound() const {
        std::lock_guard lock(mutex_);
        std::int64_t b = idem::prune_limits::keep_all;
        for (const auto& c : calls_) b = std::max(b, c.records_before_ms);
        return b;
    }

private:
    struct call {
        std::int64_t at_ms;
        std::int64_t records_before_ms;
    };
    std::unique_ptr<idem::store> owned_;
    mutable std::mutex mutex_;
    std::vector<call> calls_;
};

class WindowClock : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override { kind_.prepare(GetParam(), "idem-wclock"); }

    /// A durable guard on the manual clock whose flusher prunes every millisecond, over a
    /// prune_log (kept in log_ while the guard lives).
    std::unique_ptr<guard_t> open(std::chrono::milliseconds window) {
        idem::options o;
        o.capacity = 8;
        o.retention = 1ms;
        o.maintenance_interval = {};
        idem::store_options so;
        so.window = window;
        so.prune_interval = 1ms;
        auto st = std::make_unique<prune_log>(kind_.open());
        log_ = st.get();
        return std::make_unique<guard_t>(std::move(st), std::move(o), so, clock_);
    }

    static void succeed(guard_t& g, const std::string& k, std::uint64_t outcome) {
        auto r = g->begin(idem::key(k));
        ASSERT_EQ(r.status, begin_status::acquired) << k;
        ASSERT_FALSE(r.ticket.succeed(outcome));
    }

    /// Fills and rotates until `k` is no longer in memory (idem_test::evict), 10 ms a round.
    void evict(guard_t& g, const std::string& k) { idem_test::evict(g, k, clock_, filler_); }

    idem::manual_clock clock_;
    idem_test::store_kind kind_;
    prune_log* log_ = nullptr;
    int filler_ = 0;
};

TEST_P(WindowClock, ForwardWallStepPrunesNothingInsideTheWindow) {
    constexpr auto window = 200ms;
    auto g = open(window);
    // The guard maps its clock to wall time at construction: guard time 0 is at most `started_ms`.
    const std::int64_t started_ms = wall_ms();
    const auto clock0 = clock_.now();
    auto on_guard_ms = [&] { return std::chrono::duration_cast<std::chrono::milliseconds>(clock_.now() - clock0).count(); };

    succeed(*g, "CTRL_PAY_v1", 1);  // guard time 0
    clock_.advance(window + 50ms);  // CTRL is past the window on the guard's clock
    succeed(*g, "IN_PAY_v1", 2);    // guard time 250 ms: inside the window
    ASSERT_TRUE(g->flush()) << g->last_store_error();
    evict(*g, "IN_PAY_v1");
    ASSERT_LT(on_guard_ms(), std::chrono::duration_cast<std::chrono::milliseconds>(window + 250ms).count())
        << "the eviction moved the guard's clock so far that IN left the window";

    // The wall clock runs on while the guard's does not: the step. Wait until a bound taken from
    // the wall clock (now - window) would be past every record written so far, then for a prune
    // the flusher started after that, so a wall-clock bound would have removed IN by now.
    const std::int64_t stepped_ms = started_ms + on_guard_ms() + window.count() + 50;
    ASSERT_TRUE(idem_test::wait_wall_past(stepped_ms));
    ASSERT_TRUE(idem_test::wait_for([&] { return log_->calls_since(stepped_ms + 1) >= 2; }))
        << "the flusher did not prune after the step";

    // Only CTRL was past the window (on the clock IN's stored time was written with).
    EXPECT_EQ(g->snapshot().pruned_records, 1u) << "pruned a record inside the window";
    EXPECT_LE(log_->largest_bound(), started_ms + on_guard_ms() - window.count())
        << "a prune bound was taken from the wall clock, not from the guard's";
    {
        auto dup = (*g)->begin(idem::key("IN_PAY_v1"));  // its ticket must go before the guard
        EXPECT_EQ(dup.status, begin_status::succeeded)
            << "a key inside the window ran again: got " << idem::to_string(dup.status);
        EXPECT_EQ(dup.outcome, 2u);
        EXPECT_EQ((*g)->begin(idem::key("CTRL_PAY_v1")).status, begin_status::acquired) << "past the window: new again";
    }

    g.reset();
    auto st = kind_.open();
    const auto all = idem_test::load_all(*st);
    EXPECT_EQ(all.count("IN_PAY_v1"), 1u);
    EXPECT_TRUE(idem_test::verify_clean(*st));
}

TEST_P(WindowClock, BackwardWallStepStillPrunesPastTheWindow) {
    constexpr auto window = std::chrono::milliseconds(1h);
    auto g = open(window);
    succeed(*g, "OLD_PAY_v1", 1);
    ASSERT_TRUE(g->flush()) << g->last_store_error();
    // The guard's clock runs an hour ahead of the wall clock: the step back. OLD is past the window
    // on the guard's clock; on the wall clock it is a few milliseconds old.
    clock_.advance(window + 1min);
    succeed(*g, "NEW_PAY_v1", 2);
    ASSERT_TRUE(g->flush()) << g->last_store_error();
    ASSERT_TRUE(idem_test::wait_for([&] { return g->snapshot().pruned_records >= 1; }, 10s))
        << "a record past the window (on the clock its time was written with) was not pruned; "
           "prune calls so far: "
        << log_->calls_since(0) << ", largest records bound " << log_->largest_bound();
    const std::int64_t after_ms = wall_ms();
    ASSERT_TRUE(idem_test::wait_for([&] { return log_->calls_since(after_ms + 1) >= 2; }));
    EXPECT_EQ(g->snapshot().pruned_records, 1u) << "NEW is inside the window";

    // The cold window agrees with the store: OLD is new again, NEW is a duplicate.
    evict(*g, "NEW_PAY_v1");
    EXPECT_EQ((*g)->begin(idem::key("OLD_PAY_v1")).status, begin_status::acquired);
    {
        auto dup = (*g)->begin(idem::key("NEW_PAY_v1"));  // its ticket must go before the guard
        EXPECT_EQ(dup.status, begin_status::succeeded) << idem::to_string(dup.status);
        EXPECT_EQ(dup.outcome, 2u);
    }

    g.reset();
    auto st = kind_.open();
    const auto all = idem_test::load_all(*st);
    EXPECT_EQ(all.count("NEW_PAY_v1"), 1u);
    EXPECT_TRUE(idem_test::verify_clean(*st));
}

INSTANTIATE_TEST_SUITE_P(Stores, WindowClock, ::testing::ValuesIn(idem_test::store_kinds()),
                         [](const auto& info) { return info.param; });

}  // namespace
