// adaptive_lease_test: options.adaptive (issue 18 part 4) on a manual clock (no sleeps).
//
// The histogram answers quantiles within its documented bound (computed from the bucket layout),
// never below the true value; concurrent recording loses no count (also under TSan); a guard fed
// completions of known claim-to-completion times gives the next claim clamp(k x p99, min, max);
// min_samples, the bounds, independent operations, keys that do not split, the table's overflow and
// the policy off each behave as documented; `idem stats` reports the store's percentiles.
#include <idem/idem.hpp>
#include <idem/detail/table/lease_histogram.hpp>
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "support/manual_guard.hpp"
#include "support/store_fixtures.hpp"

#ifdef IDEM_TEST_CLI
#include <nlohmann/json.hpp>
#endif

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::detail::table::latency_histogram;
using idem::detail::table::operation_leases;
using idem_test::manual_guard;
using ns = std::chrono::nanoseconds;

/// The exact nearest-rank quantile of sorted samples.
ns exact_quantile(std::vector<ns> v, double q) {
    std::sort(v.begin(), v.end());
    const auto rank = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size()))));
    return v[rank - 1];
}

/// The documented bound: never below the true quantile, at most relative_error above it.
void expect_within_bound(ns reported, ns truth) {
    EXPECT_GE(reported, truth);
    EXPECT_LE(static_cast<double>(reported.count()),
              static_cast<double>(truth.count()) * (1.0 + latency_histogram::relative_error))
        << "reported " << reported.count() << " ns for a true " << truth.count() << " ns";
}

// ---- the histogram -------------------------------------------------------------------------------

TEST(LatencyHistogram, BucketsTileTheRangeAndEachIsAtMostAnEighthOfItsLowerEdgeWide) {
    for (std::size_t b = 1; b + 1 < latency_histogram::buckets; ++b) {
        const ns lo = latency_histogram::lower_edge(b), hi = latency_histogram::upper_edge(b);
        ASSERT_EQ(latency_histogram::bucket_of(lo), b);
        ASSERT_EQ(latency_histogram::bucket_of(hi - 1ns), b);
        ASSERT_EQ(latency_histogram::bucket_of(hi), b + 1);
        ASSERT_LE(static_cast<double>((hi - lo).count()),
                  static_cast<double>(lo.count()) * latency_histogram::relative_error);
    }
    EXPECT_EQ(latency_histogram::bucket_of(0ns), 0u);
    EXPECT_EQ(latency_histogram::bucket_of(ns(std::int64_t{1} << 42)), latency_histogram::buckets - 1);
    EXPECT_EQ(latency_histogram::bucket_of(10h), latency_histogram::buckets - 1);
}

TEST(LatencyHistogram, QuantilesOfKnownLatenciesAreWithinTheBucketBound) {
    // 1000 latencies spread over five orders of magnitude, 3 us to 300 ms.
    std::vector<ns> samples;
    latency_histogram h;
    for (int i = 0; i < 1000; ++i) {
        const ns d = ns(static_cast<std::int64_t>(3000.0 * std::pow(10.0, 5.0 * i / 999.0)));
        samples.push_back(d);
        h.record(d);
    }
    EXPECT_EQ(h.count(), 1000u);
    for (double q : {0.5, 0.9, 0.99, 0.999, 1.0}) expect_within_bound(*h.quantile(q), exact_quantile(samples, q));
}

TEST(LatencyHistogram, AllTheSameLatencyGivesThatBucketsUpperEdge) {
    latency_histogram h;
    for (int i = 0; i < 100; ++i) h.record(12ms);
    const ns edge = latency_histogram::upper_edge(latency_histogram::bucket_of(12ms));
    EXPECT_EQ(*h.quantile(0.5), edge);
    EXPECT_EQ(*h.quantile(0.99), edge);
    expect_within_bound(edge, 12ms);
}

TEST(LatencyHistogram, EmptyHasNoQuantile) {
    latency_histogram h;
    EXPECT_EQ(h.count(), 0u);
    EXPECT_FALSE(h.quantile(0.99).has_value());
    EXPECT_FALSE(h.quantile(0.5).has_value());
}

TEST(LatencyHistogram, HalvingAgesEveryBucket) {
    latency_histogram h;
    for (int i = 0; i < 100; ++i) h.record(1ms);
    for (int i = 0; i < 10; ++i) h.record(1s);
    h.halve();
    EXPECT_EQ(h.count(), 55u);
    EXPECT_EQ(*h.quantile(0.5), latency_histogram::upper_edge(latency_histogram::bucket_of(1ms)));
}

TEST(LatencyHistogram, ConcurrentRecordingLosesNoCount) {
    constexpr int threads = 4, per_thread = 50000;
    latency_histogram h;
    std::latch start(threads);
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            start.arrive_and_wait();
            // Some buckets shared by every thread, some by one: both kinds of contention.
            for (int i = 0; i < per_thread; ++i) h.record(ns(1000 + (i % 64) * 1000 + t * 7));
        });
    for (auto& t : ts) t.join();
    EXPECT_EQ(h.count(), std::uint64_t{threads} * per_thread);
}

TEST(OperationLeases, ConcurrentFirstCompletionsOfOneOperationShareOneSlot) {
    idem::adaptive_lease p;
    p.enabled = true;
    p.min_samples = 1;
    p.window = 0;
    operation_leases t(p);
    constexpr int threads = 4, per_thread = 20000;
    std::latch start(threads);
    std::vector<std::thread> ts;
    for (int i = 0; i < threads; ++i)
        ts.emplace_back([&, i] {
            start.arrive_and_wait();
            for (int j = 0; j < per_thread; ++j) t.record(j % 2 ? "PAY" : ("OP" + std::to_string(i)).c_str(), 2ms);
        });
    for (auto& th : ts) th.join();
    const auto rows = t.snapshot(30s);
    ASSERT_EQ(rows.size(), 1u + threads);  // PAY once, and OP0..OP3
    std::uint64_t total = 0;
    for (const auto& r : rows) {
        total += r.samples;
        if (r.operation == "PAY") {
            EXPECT_EQ(r.samples, std::uint64_t{threads} * per_thread / 2);
        }
    }
    EXPECT_EQ(total, std::uint64_t{threads} * per_thread);
}

// ---- the policy on a guard -----------------------------------------------------------------------

class AdaptiveLease : public ::testing::Test {
protected:
    idem::options opts(bool on = true) {
        auto o = idem_test::test_options(4096);
        o.lease = 30s;
        o.adaptive.enabled = on;
        o.adaptive.k = 3.0;
        o.adaptive.min = 5ms;
        o.adaptive.max = 2s;
        o.adaptive.min_samples = 100;
        o.adaptive.window = 0;
        return o;
    }
    /// Claims `k`, lets `took` pass on the clock, succeeds. Returns the lease the claim got.
    ns complete_after(manual_guard& g, const idem::key& k, ns took) {
        auto r = g.begin(k);
        EXPECT_EQ(r.status, begin_status::acquired) << k.view();
        const ns lease = g.query(k).lease_until - clock.now();
        clock.advance(took);
        EXPECT_FALSE(r.ticket.succeed(1));
        return lease;
    }
    /// n completions of `op` (fresh txids from *next), the i-th taking took(i).
    template <class F>
    std::vector<ns> feed(manual_guard& g, const std::string& op, int n, F took, int* next) {
        std::vector<ns> v;
        for (int i = 0; i < n; ++i) {
            const ns d = took(i);
            v.push_back(d);
            (void)complete_after(g, idem::key::compose("T" + std::to_string((*next)++), op, 1), d);
        }
        return v;
    }
    /// The lease a fresh claim of `op` gets now.
    ns next_lease(manual_guard& g, const std::string& op, int* next) {
        const idem::key k = idem::key::compose("T" + std::to_string((*next)++), op, 1);
        auto r = g.begin(k);
        EXPECT_EQ(r.status, begin_status::acquired);
        const ns lease = g.query(k).lease_until - clock.now();
        EXPECT_FALSE(r.ticket.succeed(0));  // took 0 ns: one more sample below every bound
        return lease;
    }
    static ns expected(ns p99, const idem::adaptive_lease& p) {
        return std::clamp(ns(static_cast<std::int64_t>(p.k * static_cast<double>(p99.count()))), p.min, p.max);
    }
    idem::manual_clock clock;
    int next = 0;
};

TEST_F(AdaptiveLease, NextClaimGetsKTimesTheP99AfterMaintain) {
    manual_guard g(opts(), clock);
    // 200 completions of 1..200 ms (step 1 ms, shifted by 0.5 ms so none sits on a bucket edge).
    const auto samples = feed(
        g, "PAY", 200, [](int i) { return ns(1ms) * (i + 1) - ns(500us); }, &next);
    EXPECT_EQ(next_lease(g, "PAY", &next), 30s) << "before maintain() the static lease applies";
    g.maintain();
    const auto rows = g.operation_latencies();
    ASSERT_EQ(rows.size(), 1u);
    ASSERT_EQ(rows[0].operation, "PAY");
    EXPECT_EQ(rows[0].samples, 201u);
    EXPECT_TRUE(rows[0].adaptive);
    // The p99 the table reports is a bucket edge within the documented bound of the true p99 of what
    // it holds (the 200 samples and the 0 ns one next_lease added).
    std::vector<ns> held = samples;
    held.push_back(0ns);
    expect_within_bound(rows[0].p99, exact_quantile(held, 0.99));
    expect_within_bound(rows[0].p50, exact_quantile(held, 0.5));
    const ns want = expected(rows[0].p99, g.opts().adaptive);
    EXPECT_GT(want, g.opts().adaptive.min);
    EXPECT_LT(want, g.opts().adaptive.max);
    EXPECT_EQ(rows[0].lease, want);
    EXPECT_EQ(next_lease(g, "PAY", &next), want);
    // And that lease is what compensation works with: the claim expires exactly then.
    const idem::key k = idem::key::compose("LAST", "PAY", 1);
    auto r = g.begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    clock.advance(want - 1ns);
    g.maintain();
    EXPECT_FALSE(g.query(k).in_doubt);
    clock.advance(1ns);
    (void)g.compensate();
    EXPECT_TRUE(g.query(k).in_doubt) << "no resolver: an expired claim stays in doubt";
}

TEST_F(AdaptiveLease, BoundsHoldForVeryFastAndVerySlowOperations) {
    manual_guard g(opts(), clock);
    (void)feed(
        g, "FAST", 100, [](int) { return 3us; }, &next);
    (void)feed(
        g, "SLOW", 100, [](int) { return 40min; }, &next);
    g.maintain();
    EXPECT_EQ(next_lease(g, "FAST", &next), g.opts().adaptive.min);
    EXPECT_EQ(next_lease(g, "SLOW", &next), g.opts().adaptive.max);
}

TEST_F(AdaptiveLease, BeforeMinSamplesTheStaticLeaseApplies) {
    manual_guard g(opts(), clock);
    (void)feed(
        g, "PAY", 99, [](int) { return 50ms; }, &next);
    g.maintain();
    EXPECT_EQ(next_lease(g, "PAY", &next), 30s) << "99 samples < min_samples 100";  // this claim's completion is the 100th
    const auto rows = g.operation_latencies();
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_FALSE(rows[0].adaptive);
    EXPECT_EQ(rows[0].lease, 30s);
    g.maintain();
    EXPECT_EQ(next_lease(g, "PAY", &next), expected(g.operation_latencies()[0].p99, g.opts().adaptive));
}

TEST_F(AdaptiveLease, TwoOperationsGetIndependentLeases) {
    manual_guard g(opts(), clock);
    (void)feed(
        g, "PAY", 100, [](int) { return 10ms; }, &next);
    (void)feed(
        g, "REFUND", 100, [](int) { return 200ms; }, &next);
    g.maintain();
    const ns pay = next_lease(g, "PAY", &next), refund = next_lease(g, "REFUND", &next);
    EXPECT_EQ(pay, expected(ns(latency_histogram::upper_edge(latency_histogram::bucket_of(10ms))), g.opts().adaptive));
    EXPECT_EQ(refund, expected(ns(latency_histogram::upper_edge(latency_histogram::bucket_of(200ms))), g.opts().adaptive));
    EXPECT_LT(pay, refund);
    EXPECT_EQ(next_lease(g, "OTHER", &next), 30s) << "an operation never completed keeps the static lease";
}

TEST_F(AdaptiveLease, FailuresCountReleasesDoNot) {
    manual_guard g(opts(), clock);
    for (int i = 0; i < 10; ++i) {
        auto r = g.begin(idem::key::compose("F" + std::to_string(i), "PAY", 1));
        ASSERT_EQ(r.status, begin_status::acquired);
        clock.advance(10ms);
        ASSERT_FALSE(r.ticket.fail(7, idem::failure_policy::terminal));
    }
    for (int i = 0; i < 10; ++i) {
        auto r = g.begin(idem::key::compose("R" + std::to_string(i), "PAY", 1));
        ASSERT_EQ(r.status, begin_status::acquired);
        clock.advance(10ms);
        ASSERT_FALSE(r.ticket.fail(7, idem::failure_policy::retryable));
    }
    { auto dropped = g.begin(idem::key::compose("D", "PAY", 1)); }
    const auto rows = g.operation_latencies();
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].samples, 10u);
}

TEST_F(AdaptiveLease, KeysThatDoNotSplitKeepTheStaticLeaseAndAreNotMeasured) {
    manual_guard g(opts(), clock);
    for (int i = 0; i < 200; ++i) (void)complete_after(g, idem::key("plain-" + std::to_string(i)), 1ms);
    g.maintain();
    EXPECT_TRUE(g.operation_latencies().empty());
    EXPECT_EQ(complete_after(g, idem::key("plain-x"), 1ms), 30s);
}

TEST_F(AdaptiveLease, OperationsBeyondTheTableShareOtherAndKeepTheStaticLease) {
    auto o = opts();
    o.adaptive.min_samples = 1;
    o.adaptive.window = 0;
    manual_guard g(o, clock);
    constexpr std::size_t extra = 6;
    for (std::size_t i = 0; i < operation_leases::capacity + extra; ++i)
        (void)feed(
            g, "OP" + std::to_string(i), 2, [](int) { return 1ms; }, &next);
    g.maintain();
    const auto rows = g.operation_latencies();
    ASSERT_EQ(rows.size(), operation_leases::capacity + 1);
    std::size_t named = 0;
    for (const auto& r : rows) {
        if (r.operation.empty()) {
            EXPECT_EQ(r.samples, 2 * extra) << "the overflow operations share one histogram";
            EXPECT_FALSE(r.adaptive);
            EXPECT_EQ(r.lease, 30s);
        } else {
            ++named;
            EXPECT_EQ(r.samples, 2u);
            EXPECT_TRUE(r.adaptive);
        }
    }
    EXPECT_EQ(named, operation_leases::capacity);
    // The first `capacity` operations (in completion order) have slots; the later ones do not.
    EXPECT_EQ(next_lease(g, "OP0", &next), o.adaptive.min);
    EXPECT_EQ(next_lease(g, "OP" + std::to_string(operation_leases::capacity + extra - 1), &next), 30s);
}

TEST_F(AdaptiveLease, AgeingFollowsAShiftedLatency) {
    auto o = opts();
    o.adaptive.min_samples = 100;
    o.adaptive.window = 200;
    manual_guard g(o, clock);
    (void)feed(
        g, "PAY", 201, [](int) { return 500ms; }, &next);
    g.maintain();  // 201 > window: halved to about 100
    const auto aged = g.operation_latencies();
    ASSERT_EQ(aged.size(), 1u);
    EXPECT_LE(aged[0].samples, 101u);
    // The work got faster: after a few windows the p99 (and the lease) follows.
    for (int round = 0; round < 8; ++round) {
        (void)feed(
            g, "PAY", 200, [](int) { return 20ms; }, &next);
        g.maintain();
    }
    EXPECT_EQ(g.operation_latencies()[0].p99, latency_histogram::upper_edge(latency_histogram::bucket_of(20ms)));
}

TEST_F(AdaptiveLease, TheTimeRunsFromTheClaimThroughExtendAndDoubt) {
    auto o = opts();
    o.adaptive.min_samples = 1;
    manual_guard g(o, clock);
    // A claim extended twice and marked in doubt by compensation meanwhile (no resolver): its
    // sample is the whole 45 s from the claim, not the time since the last extend or the mark.
    const idem::key k = idem::key::compose("LONG", "SETTLE", 1);
    auto r = g.begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    clock.advance(10s);
    ASSERT_FALSE(r.ticket.extend(30s));
    clock.advance(20s);
    ASSERT_FALSE(r.ticket.extend(1s));
    clock.advance(15s);
    (void)g.compensate();
    ASSERT_TRUE(g.query(k).in_doubt);
    ASSERT_FALSE(r.ticket.succeed(1)) << "the owner is back: its claim is still its own";
    const auto rows = g.operation_latencies();
    ASSERT_EQ(rows.size(), 1u);
    EXPECT_EQ(rows[0].samples, 1u);
    EXPECT_EQ(rows[0].p99, latency_histogram::upper_edge(latency_histogram::bucket_of(45s)));
}

TEST_F(AdaptiveLease, BatchedClaimsGetTheAdaptiveLeaseToo) {
    manual_guard g(opts(), clock);
    (void)feed(
        g, "PAY", 100, [](int) { return 10ms; }, &next);
    g.maintain();
    const ns want = expected(latency_histogram::upper_edge(latency_histogram::bucket_of(10ms)), g.opts().adaptive);
    const std::vector<idem::key> burst{idem::key::compose("B1", "PAY", 1), idem::key::compose("B2", "PAY", 1),
                                       idem::key("not-composed")};
    std::vector<idem_test::manual_guard::result_type> out(burst.size());
    ASSERT_EQ(g.begin_many(burst, out), burst.size());
    for (const auto& r : out) ASSERT_EQ(r.status, begin_status::acquired);
    EXPECT_EQ(g.query(burst[0]).lease_until - clock.now(), want);
    EXPECT_EQ(g.query(burst[1]).lease_until - clock.now(), want);
    EXPECT_EQ(g.query(burst[2]).lease_until - clock.now(), 30s);
}

TEST_F(AdaptiveLease, RacingClaimsCompletionsAndMaintenanceLoseNoSample) {
    auto o = opts();
    constexpr int threads = 4, per_thread = 2000;
    o.capacity = 2 * threads * per_thread;  // every key stays in memory: no claim is refused
    o.adaptive.min_samples = 10;
    o.adaptive.window = 0;
    manual_guard g(o, clock);
    const char* ops[] = {"PAY", "REFUND", "TRANSFER"};
    std::latch start(threads + 1);
    std::atomic<bool> done{false};
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            start.arrive_and_wait();
            for (int i = 0; i < per_thread; ++i) {
                auto r = g.begin(idem::key::compose("T" + std::to_string(t) + "x" + std::to_string(i), ops[i % 3], 1));
                if (r.status != begin_status::acquired || r.ticket.succeed(1))
                    ADD_FAILURE() << "claim " << t << "/" << i << ": " << r.status;
            }
        });
    std::thread maint([&] {  // refreshes and reads while the workers claim and complete
        start.arrive_and_wait();
        while (!done.load(std::memory_order_acquire)) {
            g.maintain();
            (void)g.operation_latencies();
        }
    });
    for (auto& t : ts) t.join();
    done.store(true, std::memory_order_release);
    maint.join();
    std::uint64_t total = 0;
    for (const auto& r : g.operation_latencies()) total += r.samples;
    EXPECT_EQ(total, std::uint64_t{threads} * per_thread);
}

TEST_F(AdaptiveLease, PolicyOffIsTheStaticLeaseExactly) {
    manual_guard g(opts(/*on=*/false), clock);
    (void)feed(
        g, "PAY", 200, [](int) { return 1ms; }, &next);
    g.maintain();
    EXPECT_EQ(next_lease(g, "PAY", &next), 30s);
    EXPECT_TRUE(g.operation_latencies().empty());
    EXPECT_EQ(idem::to_prometheus(g.snapshot(), g.operation_latencies()), idem::to_prometheus(g.snapshot()));
}

TEST_F(AdaptiveLease, BadPolicyIsRefusedNamingTheOption) {
    auto expect_refused = [&](idem::options o, const char* name) {
        try {
            manual_guard g(std::move(o), clock);
            ADD_FAILURE() << "accepted a bad " << name;
        } catch (const idem::error& e) {
            EXPECT_EQ(e.code(), idem::errc::invalid_argument);
            EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
        }
    };
    auto o = opts();
    o.adaptive.k = 0.5;
    expect_refused(o, "options.adaptive.k");
    o = opts();
    o.adaptive.max = 1ms;
    expect_refused(o, "options.adaptive.max");
    o = opts();
    o.adaptive.min = 0ns;
    expect_refused(o, "options.adaptive.min");
    o = opts();
    o.adaptive.min_samples = 0;
    expect_refused(o, "options.adaptive.min_samples");
    o = opts();
    o.adaptive.window = 150;
    expect_refused(o, "options.adaptive.window");
    o = opts(/*on=*/false);
    o.adaptive.k = 0.5;  // off: not looked at
    EXPECT_NO_THROW(manual_guard(o, clock));
}

TEST_F(AdaptiveLease, PrometheusLinesNameTheOperation) {
    manual_guard g(opts(), clock);
    (void)feed(
        g, "PAY", 100, [](int) { return 10ms; }, &next);
    g.maintain();
    const auto rows = g.operation_latencies();
    const std::string text = idem::to_prometheus(g.snapshot(), rows);
    EXPECT_NE(text.find("idem_operation_latency_seconds{operation=\"PAY\",quantile=\"0.99\"} "), std::string::npos) << text;
    EXPECT_NE(text.find("idem_operation_latency_seconds_count{operation=\"PAY\"} 100\n"), std::string::npos) << text;
    EXPECT_NE(text.find("idem_operation_lease_seconds{operation=\"PAY\"} "), std::string::npos) << text;
}

// ---- durable guards and `idem stats` --------------------------------------------------------------

using manual_durable = idem::basic_durable_guard<std::atomic, idem::manual_clock>;

TEST(AdaptiveLeaseDurable, DurableGuardMeasuresAndTheStoreKeepsTheTimes) {
    idem_test::temp_dir dir("idem-adaptive");
    const std::string db = dir.file("idem.db");
    idem::manual_clock clock;
    {
        auto o = idem_test::test_options(4096);
        o.adaptive.enabled = true;
        o.adaptive.min = 1ms;
        o.adaptive.min_samples = 10;
        o.adaptive.window = 0;
        manual_durable g(std::make_unique<idem::sqlite_store>(db), o, {}, clock);
        // PAY: 100 completions of 1..100 ms; REFUND: 20 of 300 ms. Times are whole milliseconds, as
        // the audit trail stores them.
        for (int i = 0; i < 100; ++i) {
            auto r = g->begin(idem::key::compose("P" + std::to_string(i), "PAY", 1));
            ASSERT_EQ(r.status, begin_status::acquired);
            clock.advance(std::chrono::milliseconds(i + 1));
            ASSERT_FALSE(r.ticket.succeed(1));
        }
        for (int i = 0; i < 20; ++i) {
            auto r = g->begin(idem::key::compose("R" + std::to_string(i), "REFUND", 1));
            ASSERT_EQ(r.status, begin_status::acquired);
            clock.advance(300ms);
            ASSERT_FALSE(r.ticket.fail(3, idem::failure_policy::terminal));
        }
        g->maintain();
        const auto rows = g->operation_latencies();
        ASSERT_EQ(rows.size(), 2u);
        for (const auto& r : rows) {
            if (r.operation == "PAY") {
                expect_within_bound(r.p99, 99ms);
            } else {
                expect_within_bound(r.p99, 300ms);
            }
        }
        ASSERT_TRUE(g.flush());
    }
#ifdef IDEM_TEST_CLI
    const std::string cmd = std::string(IDEM_TEST_CLI) + " stats --json --lease-min 10ms --store sqlite:" + db;
    std::FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    std::array<char, 4096> buf;
    while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
    ASSERT_EQ(::pclose(p), 0) << cmd << "\n" << out;
    const auto j = nlohmann::json::parse(out);
    const auto& lat = j.at("latency_by_biz_type");
    // Exact nearest-rank percentiles of the audit trail: PAY took 1..100 ms.
    EXPECT_EQ(lat.at("PAY").at("completions"), 100);
    EXPECT_EQ(lat.at("PAY").at("p50_ms"), 50);
    EXPECT_EQ(lat.at("PAY").at("p99_ms"), 99);
    EXPECT_EQ(lat.at("PAY").at("lease_ms"), 297) << "3 x 99 ms, inside [10 ms, 10 min]";
    EXPECT_EQ(lat.at("REFUND").at("completions"), 20);
    EXPECT_EQ(lat.at("REFUND").at("p99_ms"), 300);
    EXPECT_EQ(lat.at("REFUND").at("lease_ms"), 900);
    EXPECT_EQ(j.at("lease_policy").at("k"), 3.0);
    EXPECT_EQ(j.at("lease_policy").at("min_samples"), 1000);
    EXPECT_EQ(lat.at("PAY").at("lease_in_force"), "static") << "100 completions < min_samples 1000";
#endif
}

}  // namespace
