// stripe_dso_test: one guard shared by two copies of idem's code (two shared objects built with
// hidden visibility, tests/stripe_dso_worker.cpp). Each copy hands out its own "owned" counter
// stripes, so the first thread of each copy owns stripe 0 in its own eyes. Unless an engine lets
// only one copy use its owned stripes, both threads advance the same arena cursor and counters with
// plain stores: two keys get one slot (lookups then find the other key's identity) and counts are
// lost. Checked: every key's own outcome is recorded, and the counters are exact.
#include <idem/idem.hpp>

#include <gtest/gtest.h>

#include <cstddef>
#include <latch>
#include <string>
#include <thread>

extern "C" std::size_t idem_dso_worker_a(idem::guard* g, const char* prefix, std::size_t n);
extern "C" std::size_t idem_dso_worker_b(idem::guard* g, const char* prefix, std::size_t n);

TEST(StripeOwnership, TwoCopiesOfTheCodeNeverShareAnOwnedStripe) {
    constexpr std::size_t n = 200000;
    idem::options o;
    o.capacity = 2 * n;
    o.maintenance_interval = {};
    idem::guard g(o);
    std::latch start(2);
    std::size_t done_a = 0, done_b = 0;
    std::thread a([&] {
        start.arrive_and_wait();
        done_a = idem_dso_worker_a(&g, "A", n);
    });
    std::thread b([&] {
        start.arrive_and_wait();
        done_b = idem_dso_worker_b(&g, "B", n);
    });
    a.join();
    b.join();
    EXPECT_EQ(done_a, n);
    EXPECT_EQ(done_b, n);
    std::size_t wrong = 0;
    for (const char* prefix : {"A", "B"})
        for (std::size_t i = 0; i < n; ++i) {
            const auto v = g.query(idem::key(prefix + std::to_string(i)));
            wrong += v.state != idem::record_state::succeeded || v.outcome != i + 1;
        }
    EXPECT_EQ(wrong, 0u) << "keys lost their record: two copies handed out the same slots";
    const auto s = g.snapshot();
    EXPECT_EQ(s.acquired, 2 * n) << "counts were lost: two plain writers on one stripe";
    EXPECT_EQ(s.succeeded, 2 * n);
}
