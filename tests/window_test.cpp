// The store as the idempotency window: a key memory evicted (options.retention, the hot window) is
// still answered from the store while it is inside store_options::window, on every store; a
// restart loads only the hot window and puts the rest in the cold window's filter; past the window
// a key runs again and its trail shows the reuse.
//
//   EvictedKeyGetsTheStoredOutcome        a duplicate after two rotations: succeeded, its outcome
//   FreshKeyIsGrantedWithoutAStoreRead    a key the filter does not hold never reads the store
//   RacersOnAnEvictedKeyGetOneAnswer      threads on a latch, the store read held open: no grant
//   StoreOutageDuringARecallDecidesNothing  store_unavailable while down, the outcome once back
//   AStoreReadThatHangsTimesOutAndDecidesNothing  recall_timeout bounds a hung read; then the outcome
//   RestartWithTenTimesCapacity           40 keys, capacity 4: the restart serves every duplicate
//   KeysPastTheWindowRunAgain             granted again; the trail shows the reuse; verify passes
//   RecoveryLeavesExpiredRecordsOut       past the window: not loaded, counted as expired
//   RetentionLongerThanTheWindowIsRefused the hot window must fit in the idempotency window
//   FilterFalsePositiveRate               1M keys: measured rate within 2x of the design rate
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <random>
#include <thread>

#include "support/store_fixtures.hpp"
#include "support/store_kinds.hpp"

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::record_state;
using guard_t = idem::basic_durable_guard<std::atomic, idem::manual_clock>;

/// One kind of store; open() gives a new connection to the same data each time.
struct store_kind {
    std::string name;
    std::function<std::unique_ptr<idem::store>()> open;
};

class Window : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override { kind_.prepare(GetParam(), "idem-window"); }

    static idem::options hot_window(std::size_t capacity = 8) {
        idem::options o;
        o.capacity = capacity;
        o.retention = 1ms;
        o.maintenance_interval = {};
        return o;
    }

    std::unique_ptr<guard_t> open(idem::options o = hot_window(), idem::store_options so = {}) {
        so.prune_interval = {};  // the tests prune by hand where they prune
        return std::make_unique<guard_t>(kind_.open(), std::move(o), so, clock_);
    }

    /// Succeeds `n` new keys "<prefix><i>_PAY_v1" with outcome i + 1000.
    static void succeed_keys(guard_t& g, const std::string& prefix, int n) {
        for (int i = 0; i < n; ++i) {
            auto r = g->begin(idem::key(prefix + std::to_string(i) + "_PAY_v1"));
            ASSERT_EQ(r.status, begin_status::acquired) << prefix << i;
            ASSERT_FALSE(r.ticket.succeed(static_cast<std::uint64_t>(i) + 1000));
        }
    }

    /// Fills and rotates until `k` is no longer in memory (idem_test::evict), 10 ms a round.
    void evict(guard_t& g, const std::string& k) { idem_test::evict(g, k, clock_, filler_); }

    idem::manual_clock clock_;
    idem_test::store_kind kind_;
    int filler_ = 0;
};

TEST_P(Window, EvictedKeyGetsTheStoredOutcome) {
    auto g = open();
    auto a = (*g)->begin(idem::key("PAYA_PAY_v1"), 77);
    ASSERT_EQ(a.status, begin_status::acquired);
    ASSERT_FALSE(a.ticket.succeed(4242));
    evict(*g, "PAYA_PAY_v1");
    ASSERT_GT(g->snapshot().evicted, 0u);
    ASSERT_GT(g->snapshot().cold_keys, 0u);

    const auto dup = (*g)->begin(idem::key("PAYA_PAY_v1"), 77);
    EXPECT_EQ(dup.status, begin_status::succeeded);
    EXPECT_EQ(dup.outcome, 4242u);
    EXPECT_EQ(g->snapshot().recalled, 1u);
    // Now it is in memory again: the next duplicate reads no store.
    const auto again = (*g)->begin(idem::key("PAYA_PAY_v1"), 77);
    EXPECT_EQ(again.status, begin_status::succeeded);
    EXPECT_EQ(again.outcome, 4242u);
    EXPECT_EQ(g->snapshot().recalls, 1u);
    // A different request under the same key is still a mismatch.
    EXPECT_EQ((*g)->begin(idem::key("PAYA_PAY_v1"), 78).status, begin_status::payload_mismatch);
    ASSERT_TRUE(g->flush());
    g.reset();  // one store open at a time (RocksDB has one opener)
    auto st = kind_.open();
    EXPECT_TRUE(idem_test::verify_clean(*st));
}

TEST_P(Window, FreshKeyIsGrantedWithoutAStoreRead) {
    auto g = open();
    succeed_keys(*g, "OLD", 1);
    evict(*g, "OLD0_PAY_v1");
    ASSERT_GT(g->snapshot().cold_keys, 0u);
    const auto before = g->snapshot();
    // The filter's false-positive rate is about 1 %: of 200 fresh keys, nearly all skip the store.
    int granted = 0;
    for (int i = 0; i < 200; ++i) {
        auto r = (*g)->begin(idem::key("NEW" + std::to_string(i) + "_PAY_v1"));
        if (r.status == begin_status::acquired) {
            ++granted;
            ASSERT_FALSE(r.ticket.succeed(1));
        }
        if (i % 4 == 3) {
            ASSERT_TRUE(g->flush());
            clock_.advance(10ms);
            (void)(*g)->collect();
        }
    }
    EXPECT_EQ(granted, 200);
    const auto after = g->snapshot();
    EXPECT_LE(after.recalls - before.recalls, 12u) << "fresh keys read the store";
    EXPECT_EQ(after.recalled - before.recalled, 0u);
}

using idem_test::held_reads;
using idem_test::read_control;

TEST_P(Window, RacersOnAnEvictedKeyGetOneAnswer) {
    auto inner = kind_.open();
    read_control ctl;
    idem::store_options so;
    so.prune_interval = {};
    guard_t g(std::make_unique<held_reads>(*inner, ctl), hot_window(), so, clock_);
    idem_test::gate_opener opener(ctl.gate);
    read_control* held = &ctl;
    {
        auto a = g->begin(idem::key("RACE_PAY_v1"));
        ASSERT_EQ(a.status, begin_status::acquired);
        ASSERT_FALSE(a.ticket.succeed(99));
    }
    evict(g, "RACE_PAY_v1");
    held->gate.close();
    constexpr int racers = 8;
    std::latch go(racers);
    std::vector<begin_status> answers(racers);
    std::vector<std::uint64_t> outcomes(racers);
    std::atomic<int> returned{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < racers; ++t)
        threads.emplace_back([&, t] {
            go.arrive_and_wait();
            auto r = g->begin(idem::key("RACE_PAY_v1"));
            answers[t] = r.status;
            outcomes[t] = r.outcome;
            ++returned;
        });
    // One racer holds the key while the store read is held; every other one is answered meanwhile.
    ASSERT_TRUE(idem_test::wait_for([&] { return held->gate.waiting() == 1 && returned.load() == racers - 1; }))
        << "waiting reads " << held->gate.waiting() << ", answered " << returned.load();
    held->gate.open();
    for (auto& t : threads) t.join();
    int in_progress = 0, succeeded = 0;
    for (int t = 0; t < racers; ++t) {
        EXPECT_NE(answers[t], begin_status::acquired) << "racer " << t << " was granted an evicted key";
        if (answers[t] == begin_status::in_progress) ++in_progress;
        if (answers[t] == begin_status::succeeded) {
            ++succeeded;
            EXPECT_EQ(outcomes[t], 99u);
        }
    }
    EXPECT_EQ(succeeded, 1);
    EXPECT_EQ(in_progress, racers - 1);
    EXPECT_EQ(held->reads.load(), 1) << "one store read for the racing callers";
    EXPECT_EQ(g->begin(idem::key("RACE_PAY_v1")).status, begin_status::succeeded);
}

TEST_P(Window, StoreOutageDuringARecallDecidesNothing) {
    auto inner = kind_.open();
    read_control ctl;
    read_control* held = &ctl;
    idem::store_options so;
    so.prune_interval = {};
    guard_t g(std::make_unique<held_reads>(*inner, ctl), hot_window(), so, clock_);
    {
        auto a = g->begin(idem::key("OUT_PAY_v1"));
        ASSERT_EQ(a.status, begin_status::acquired);
        ASSERT_FALSE(a.ticket.succeed(5));
    }
    evict(g, "OUT_PAY_v1");
    held->down = true;
    for (int i = 0; i < 3; ++i) EXPECT_EQ(g->begin(idem::key("OUT_PAY_v1")).status, begin_status::store_unavailable);
    EXPECT_EQ(g.snapshot().recall_failures, 3u);
    EXPECT_EQ(g->query(idem::key("OUT_PAY_v1")).state, record_state::absent) << "a failed recall left a trace";
    held->down = false;  // the outage ends
    const auto r = g->begin(idem::key("OUT_PAY_v1"));
    EXPECT_EQ(r.status, begin_status::succeeded);
    EXPECT_EQ(r.outcome, 5u);
}

// A store read that does not answer (a hung connection) is bounded by recall_timeout: the caller
// is told store_unavailable and nothing is decided; once the store answers again the key gets its
// recorded outcome, and it is never granted meanwhile.
TEST_P(Window, AStoreReadThatHangsTimesOutAndDecidesNothing) {
    auto inner = kind_.open();
    read_control ctl;
    idem::store_options so;
    so.prune_interval = {};
    so.recall_timeout = 200ms;
    guard_t g(std::make_unique<held_reads>(*inner, ctl), hot_window(), so, clock_);
    idem_test::gate_opener opener(ctl.gate);
    {
        auto a = g->begin(idem::key("HANG_PAY_v1"));
        ASSERT_EQ(a.status, begin_status::acquired);
        ASSERT_FALSE(a.ticket.succeed(8));
    }
    evict(g, "HANG_PAY_v1");
    ctl.gate.close();
    EXPECT_EQ(g->begin(idem::key("HANG_PAY_v1")).status, begin_status::store_unavailable);
    EXPECT_EQ(g.snapshot().recall_failures, 1u);
    EXPECT_EQ(g->query(idem::key("HANG_PAY_v1")).state, record_state::absent) << "a timed-out recall left a trace";
    ctl.gate.open();  // the store answers again
    begin_status last = begin_status::store_unavailable;
    std::uint64_t outcome = 0;
    ASSERT_TRUE(idem_test::wait_for([&] {
        const auto r = g->begin(idem::key("HANG_PAY_v1"));
        EXPECT_NE(r.status, begin_status::acquired) << "granted while the store holds its success";
        last = r.status;
        outcome = r.outcome;
        return r.status != begin_status::store_unavailable;
    })) << "still "
        << idem::to_string(last);
    EXPECT_EQ(last, begin_status::succeeded);
    EXPECT_EQ(outcome, 8u);
}

TEST_P(Window, RestartWithTenTimesCapacity) {
    {
        auto g = open(hot_window(4));
        for (int i = 0; i < 40; ++i) {
            succeed_keys(*g, "R" + std::to_string(i) + "Y", 1);
            ASSERT_TRUE(g->flush());
            clock_.advance(10ms);
            (void)(*g)->collect();
        }
        ASSERT_GT(g->snapshot().evicted, 30u);
    }
    clock_.advance(1s);  // past the retention of every record written above
    auto g = open(hot_window(4));
    const auto& rep = g->recovery();
    EXPECT_EQ(rep.records + rep.cold, 40u);
    EXPECT_GE(rep.cold, 32u);
    EXPECT_EQ(rep.expired, 0u);
    // No rotation below: the recalled records fill the table, and the later duplicates are answered
    // from the store without a slot (a retry storm of old keys never looks like a full table).
    for (int i = 0; i < 40; ++i) {
        const auto r = (*g)->begin(idem::key("R" + std::to_string(i) + "Y0_PAY_v1"));
        EXPECT_EQ(r.status, begin_status::succeeded) << "key " << i;
        EXPECT_EQ(r.outcome, 1000u) << "key " << i;
    }
    EXPECT_EQ((*g)->begin(idem::key("FRESH_PAY_v1")).status, begin_status::capacity_exhausted)
        << "the table is full: only keys the store answers for get an answer";
}

TEST_P(Window, KeysPastTheWindowRunAgain) {
    idem::store_options so;
    so.window = 1h;
    auto g = open(hot_window(), so);
    auto a = (*g)->begin(idem::key("LATE_PAY_v1"));
    ASSERT_EQ(a.status, begin_status::acquired);
    const std::uint64_t first_fence = a.fence;
    ASSERT_FALSE(a.ticket.succeed(1));
    evict(*g, "LATE_PAY_v1");
    clock_.advance(61min);
    (void)(*g)->collect();  // the filter forgets slices older than the window
    auto again = (*g)->begin(idem::key("LATE_PAY_v1"));
    ASSERT_EQ(again.status, begin_status::acquired) << "a key past the window is new again";
    EXPECT_GT(again.fence, first_fence);
    ASSERT_FALSE(again.ticket.succeed(2));
    ASSERT_TRUE(g->flush());
    g.reset();
    auto st = kind_.open();
    const auto trail = st->audit("LATE_PAY_v1");
    ASSERT_EQ(trail.size(), 4u);
    EXPECT_EQ(trail[2].from, record_state::absent);
    EXPECT_EQ(trail[2].to, record_state::processing);
    EXPECT_GT(trail[2].fence, trail[1].fence);
    const auto rep = idem::verify(*st);
    EXPECT_TRUE(rep.violations.empty()) << rep.violations.front();
    EXPECT_EQ(rep.reopened, 1u);
}

TEST_P(Window, RecoveryLeavesExpiredRecordsOut) {
    // Recovery judges stored times by the wall clock (they are Unix times), so this test uses a
    // window of 20 ms of real time and waits for the wall clock to pass it.
    idem::store_options so;
    so.window = 20ms;
    std::int64_t written_ms = 0;
    {
        auto g = open(hot_window(), so);
        succeed_keys(*g, "EXP", 3);
        ASSERT_TRUE(g->flush());
        written_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    }
    ASSERT_TRUE(idem_test::wait_wall_past(written_ms + 40));
    auto g = open(hot_window(), so);
    EXPECT_EQ(g->recovery().expired, 3u);
    EXPECT_EQ(g->recovery().records, 0u);
    EXPECT_EQ(g->recovery().cold, 0u);
    EXPECT_EQ((*g)->begin(idem::key("EXP0_PAY_v1")).status, begin_status::acquired);
}

// The flusher prunes by itself every prune_interval, between batches: records past the window go,
// claims in flight and young records stay, and the guard keeps committing meanwhile.
TEST_P(Window, TheFlusherPrunesRecordsPastTheWindow) {
    // A window of 2 s of real time (stored times are Unix times): the GONE records are waited past
    // it; the KEEP records, written after, must survive the background prune for the few
    // milliseconds the test takes to read them back (2 s of margin on a loaded machine).
    idem::store_options so;
    so.window = 2s;
    std::int64_t written_ms = 0;
    {
        auto g = open(hot_window(), so);
        succeed_keys(*g, "GONE", 5);
        auto held = (*g)->begin(idem::key("HELD_PAY_v1"));
        ASSERT_EQ(held.status, begin_status::acquired);
        ASSERT_TRUE(g->flush());
        written_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
        idem_test::abandon(std::move(held.ticket));  // a claim in flight when the process stops
    }
    ASSERT_TRUE(idem_test::wait_wall_past(written_ms + 2100));
    so.prune_interval = 1ms;
    auto g = std::make_unique<guard_t>(kind_.open(), hot_window(), so, clock_);
    ASSERT_TRUE(idem_test::wait_for([&] { return g->snapshot().pruned_records >= 5; }))
        << "pruned " << g->snapshot().pruned_records << ": " << g->last_store_error();
    succeed_keys(*g, "KEEP", 3);
    ASSERT_TRUE(g->flush());
    EXPECT_EQ(g->snapshot().pruned_records, 5u);
    g.reset();
    auto st = kind_.open();
    const auto all = idem_test::load_all(*st);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(all.count("GONE" + std::to_string(i) + "_PAY_v1"), 0u);
    EXPECT_EQ(all.count("HELD_PAY_v1"), 1u) << "a PROCESSING record is never pruned";
    for (int i = 0; i < 3; ++i) EXPECT_EQ(all.count("KEEP" + std::to_string(i) + "_PAY_v1"), 1u);
    const auto rep = idem::verify(*st);
    EXPECT_TRUE(rep.violations.empty()) << rep.violations.front();
}

// A restart after a prune removed the records with the largest fences: new claims still take
// fences above every fence the store ever held (its max_fence() remembers pruned records).
TEST_P(Window, FencesStayAboveAPrunedStoreAfterARestart) {
    std::uint64_t old_fence = 0;
    {
        auto g = open();
        auto a = (*g)->begin(idem::key("FENCE_PAY_v1"));
        ASSERT_EQ(a.status, begin_status::acquired);
        old_fence = a.fence;
        ASSERT_FALSE(a.ticket.succeed(1));
        ASSERT_TRUE(g->flush());
    }
    {
        auto st = kind_.open();
        idem::prune_limits all;
        all.records_before_ms = INT64_MAX;  // every decided record
        while (st->prune(all).more) {
        }
        ASSERT_TRUE(idem_test::load_all(*st).empty());
    }
    auto g = open();
    auto again = (*g)->begin(idem::key("FENCE_PAY_v1"));
    ASSERT_EQ(again.status, begin_status::acquired);
    EXPECT_GT(again.fence, old_fence) << "a fence the key already had";
    ASSERT_FALSE(again.ticket.succeed(2));
    ASSERT_TRUE(g->flush());
    g.reset();
    auto st = kind_.open();
    const auto rep = idem::verify(*st);
    EXPECT_TRUE(rep.violations.empty()) << rep.violations.front();
}

// Recovery restores claims in flight before decided records, so recent decided records never fill
// the table ahead of a claim that must be in memory (the store loads in key order: the claim's key
// sorts last here).
TEST_P(Window, ClaimsInFlightAreRestoredBeforeDecidedRecords) {
    {
        auto g = open(hot_window(64));
        succeed_keys(*g, "A", 12);
        auto held = (*g)->begin(idem::key("ZCLAIM_PAY_v1"));
        ASSERT_EQ(held.status, begin_status::acquired);
        ASSERT_TRUE(g->flush());
        idem_test::abandon(std::move(held.ticket));
    }
    idem::options small = hot_window(3);
    small.retention = 1h;  // every record is inside the hot window
    auto g = open(small);
    EXPECT_EQ(g->recovery().processing, 1u);
    EXPECT_EQ(g->recovery().records + g->recovery().cold, 13u);
    EXPECT_GT(g->recovery().cold, 0u) << "12 decided records cannot all fit in a table of capacity 3";
    EXPECT_EQ((*g)->begin(idem::key("ZCLAIM_PAY_v1")).status, begin_status::in_progress);
    for (int i = 0; i < 12; ++i) {
        const auto r = (*g)->begin(idem::key("A" + std::to_string(i) + "_PAY_v1"));
        EXPECT_EQ(r.status, begin_status::succeeded) << i;
        EXPECT_EQ(r.outcome, static_cast<std::uint64_t>(i) + 1000) << i;
    }
}

TEST_P(Window, RetentionLongerThanTheWindowIsRefused) {
    idem::options o = hot_window();
    o.retention = 2h;
    idem::store_options so;
    so.window = 1h;
    try {
        auto g = open(o, so);
        FAIL() << "accepted a hot window longer than the idempotency window";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), idem::errc::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("options.retention"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("store_options.window"), std::string::npos) << e.what();
    }
    so.window = idem::store_options::forever;
    EXPECT_NO_THROW(open(o, so));
}

INSTANTIATE_TEST_SUITE_P(Stores, Window, ::testing::ValuesIn(idem_test::store_kinds()),
                         [](const auto& info) { return info.param; });

TEST(WindowFilter, FalsePositiveRateIsWithinTwiceTheDesignRate) {
    idem::detail::table::window_filter f(std::chrono::hours(24 * 7));
    std::mt19937_64 rng(20261204);
    std::vector<idem::detail::table::window_filter::entry> keys(1'000'000);
    for (auto& e : keys) e = {rng(), rng(), 0};
    ASSERT_TRUE(f.add(keys));
    for (const auto& e : keys) ASSERT_TRUE(f.may_contain(e.lo, e.hi)) << "a false negative";
    std::size_t hits = 0;
    constexpr std::size_t probes = 1'000'000;
    for (std::size_t i = 0; i < probes; ++i) hits += f.may_contain(rng(), rng()) ? 1 : 0;
    const double measured = static_cast<double>(hits) / probes;
    const double design = idem::detail::table::window_filter::design_fpr();
    EXPECT_GT(design, 0.001);
    EXPECT_LT(design, 0.02);
    EXPECT_LE(measured, 2 * design) << "measured " << measured << ", design " << design;
    const auto u = f.use();
    EXPECT_EQ(u.keys, keys.size());
    EXPECT_LE(static_cast<double>(u.bytes) / u.keys, 2.0) << "bytes per key";
}

TEST(WindowFilter, SlicesExpireWithTheWindowAndNoSooner) {
    using std::chrono::hours;
    idem::detail::table::window_filter f(hours(8));
    const std::int64_t h = std::chrono::nanoseconds(hours(1)).count();
    std::vector<idem::detail::table::window_filter::entry> early{{1, 11, 0}}, late{{2, 22, 5 * h}};
    ASSERT_TRUE(f.add(early));
    ASSERT_TRUE(f.add(late));
    EXPECT_EQ(f.expire(hours(8)), 0u);  // exactly the window: still remembered
    EXPECT_TRUE(f.may_contain(1, 11));
    EXPECT_EQ(f.expire(hours(9)), 1u);
    EXPECT_FALSE(f.may_contain(1, 11));
    EXPECT_TRUE(f.may_contain(2, 22));
    EXPECT_EQ(f.expire(hours(14)), 1u);
    EXPECT_FALSE(f.may_contain(2, 22));
    EXPECT_EQ(f.use().slices, 0u);
    // Memory of dropped slices is reused, and a new slice starts empty.
    ASSERT_TRUE(f.add(early));
    EXPECT_TRUE(f.may_contain(1, 11));
    EXPECT_FALSE(f.may_contain(2, 22));
}

TEST(WindowFilter, ForeverNeverExpires) {
    idem::detail::table::window_filter f(std::chrono::nanoseconds::max());
    std::vector<idem::detail::table::window_filter::entry> e{{3, 33, 0}};
    ASSERT_TRUE(f.add(e));
    EXPECT_EQ(f.expire(std::chrono::hours(24 * 365 * 50)), 0u);
    EXPECT_TRUE(f.may_contain(3, 33));
}

}  // namespace
