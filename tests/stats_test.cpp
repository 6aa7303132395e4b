// stats_test: the counters after a scripted sequence, and their Prometheus exposition.
#include <idem/idem.hpp>

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "support/manual_guard.hpp"

namespace {

using idem::begin_status;
using idem::resolution;

TEST(Stats, CountersFollowAScriptedSequence) {
    idem::manual_clock clock;
    auto opts = idem_test::test_options(64);
    opts.lease = std::chrono::seconds(10);
    opts.on_failure = idem::failure_policy::retryable;
    int asked = 0;
    opts.resolve = [&](const idem::expired_claim& c) {
        ++asked;
        return c.key == "E1" ? idem::resolver_answer{resolution::succeeded, 1} : idem::resolver_answer{};
    };
    idem_test::manual_guard g(opts, clock);
    EXPECT_EQ(g.snapshot().acquired, 0u);

    auto a = g.begin(idem::key("A"), 11);                         // acquired 1
    EXPECT_EQ(g.begin(idem::key("A"), 11).status, begin_status::in_progress);       // in_progress_hits 1
    EXPECT_EQ(g.begin(idem::key("A"), 12).status, begin_status::payload_mismatch);  // payload_mismatches 1
    ASSERT_FALSE(a.ticket.succeed(7));                            // succeeded 1
    EXPECT_EQ(g.begin(idem::key("A")).status, begin_status::succeeded);  // duplicates 1
    EXPECT_EQ(g.begin(idem::key("A")).status, begin_status::succeeded);  // duplicates 2

    auto b = g.begin(idem::key("B"));                             // acquired 2
    ASSERT_FALSE(b.ticket.fail(3, idem::failure_policy::terminal));  // failed 1
    EXPECT_EQ(g.begin(idem::key("B")).status, begin_status::failed);  // duplicates 3

    { auto c = g.begin(idem::key("C")); }                         // acquired 3, released 1 (dropped)
    auto c = g.begin(idem::key("C"));                             // acquired 4
    ASSERT_FALSE(c.ticket.fail(1));                               // released 2 (retryable policy)

    auto e1 = g.begin(idem::key("E1"));                           // acquired 5
    auto e2 = g.begin(idem::key("E2"));                           // acquired 6
    clock.advance(std::chrono::seconds(10));
    EXPECT_EQ(g.compensate(), 1u);                                // compensated 1 (E1), in_doubt 1 (E2)
    EXPECT_EQ(asked, 2);
    EXPECT_EQ(e1.ticket.succeed(), idem::errc::stale_ticket);     // stale_tickets 1
    EXPECT_EQ(g.begin(idem::key("E2")).status, begin_status::in_doubt);  // in_progress_hits 2

    const auto s = g.snapshot();
    EXPECT_EQ(s.acquired, 6u);
    EXPECT_EQ(s.in_progress_hits, 2u);
    EXPECT_EQ(s.payload_mismatches, 1u);
    EXPECT_EQ(s.succeeded, 2u) << "A by its owner, E1 by compensation";
    EXPECT_EQ(s.duplicates, 3u);
    EXPECT_EQ(s.failed, 1u);
    EXPECT_EQ(s.released, 2u);
    EXPECT_EQ(s.compensated, 1u);
    EXPECT_EQ(s.in_doubt, 1u);
    EXPECT_EQ(s.stale_tickets, 1u);
    EXPECT_EQ(s.reclaimed, 0u);
    EXPECT_EQ(s.capacity_exhausted, 0u);
    EXPECT_EQ(s.backpressure, 0u);
    EXPECT_EQ(s.evicted, 0u);
    EXPECT_EQ(s.rotations, 0u);
    EXPECT_GE(s.max_probe, 1u);
    EXPECT_EQ(s.flush_batches, 0u) << "memory-only guard";
    EXPECT_EQ(s.store_errors, 0u);

    const std::string text = idem::to_prometheus(s);
    EXPECT_NE(text.find("# TYPE idem_acquired_total counter\nidem_acquired_total 6\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nidem_duplicates_total 3\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nidem_in_doubt_total 1\n"), std::string::npos) << text;
    EXPECT_NE(text.find("# TYPE idem_max_probe gauge\n"), std::string::npos) << text;
    EXPECT_NE(text.find("# TYPE idem_queue_depth gauge\n"), std::string::npos) << text;
}

TEST(Stats, PrometheusTextIsWellFormed) {
    idem::stats s;
    s.acquired = 12345678901234ull;
    s.evicted = 2;
    s.flush_lag_ns = 1'500'000'042;   // durations are exported in seconds, Prometheus's base unit
    s.flusher_cpu_ns = 7;
    const std::string text = idem::to_prometheus(s);
    EXPECT_NE(text.find("\nidem_acquired_total 12345678901234\n"), std::string::npos) << text;
    EXPECT_NE(text.find("# TYPE idem_flush_lag_seconds gauge\nidem_flush_lag_seconds 1.500000042\n"),
              std::string::npos) << text;
    EXPECT_NE(text.find("# TYPE idem_flusher_cpu_seconds_total counter\nidem_flusher_cpu_seconds_total 0.000000007\n"),
              std::string::npos) << text;
    EXPECT_EQ(text.find("x1e9"), std::string::npos) << "a metric named in seconds must hold seconds";
    EXPECT_NE(text.find("\nidem_evicted_total 2\n"), std::string::npos) << text;
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.back(), '\n');
    // Every sample line follows its own "# TYPE" line, and every metric name is unique.
    std::size_t pos = 0, samples = 0;
    std::string last_type;
    std::set<std::string> names;
    while (pos < text.size()) {
        const auto end = text.find('\n', pos);
        ASSERT_NE(end, std::string::npos);
        const std::string line = text.substr(pos, end - pos);
        pos = end + 1;
        if (line.rfind("# TYPE ", 0) == 0) {
            last_type = line.substr(7, line.find(' ', 7) - 7);
            const std::string kind = line.substr(line.rfind(' ') + 1);
            EXPECT_TRUE(kind == "counter" || kind == "gauge") << line;
            EXPECT_TRUE(names.insert(last_type).second) << "duplicate metric " << last_type;
            continue;
        }
        ++samples;
        const std::string name = line.substr(0, line.find(' '));
        EXPECT_EQ(name, last_type) << line;
        EXPECT_EQ(name.rfind("idem_", 0), 0u) << line;
        const std::string value = line.substr(line.find(' ') + 1);
        // An integer, or seconds with nine decimals: digits, at most one '.', digits on both sides.
        const auto dot = value.find('.');
        EXPECT_EQ(value.find_first_not_of("0123456789."), std::string::npos) << line;
        EXPECT_EQ(value.find('.', dot == std::string::npos ? value.size() : dot + 1), std::string::npos) << line;
        EXPECT_TRUE(dot != 0 && (dot == std::string::npos || dot + 10 == value.size())) << line;
    }
    EXPECT_EQ(samples, names.size());
    EXPECT_GE(samples, 20u);
}

}  // namespace
