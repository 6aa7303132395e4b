// begin_many_test: guard::begin_many answers as N calls of begin() in order.
//
//   (1) random batches with repeats (sizes 1..200) against a twin guard driven by single begin()
//       calls with the same input and the same ticket completions: every answer equal (status,
//       outcome, fence);
//   (2) threads started on one latch claim overlapping key sets with begin_many: exactly one
//       acquired per key;
//   (3) capacity exhaustion and backpressure inside a batch, answered per key as begin() would;
//   (4) a durable guard (SQLite): begin_many, succeed, restart: the recovered answers are those of
//       the same work done with single begins.
#include <gtest/gtest.h>

#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "support/manual_guard.hpp"
#include "support/store_fixtures.hpp"
#include "support/threads.hpp"

namespace {

using idem::begin_status;
using idem_test::key_n;
using idem_test::test_options;

void expect_same(const idem::begin_result& many, const idem::begin_result& one, const std::string& where) {
    EXPECT_EQ(many.status, one.status) << where;
    EXPECT_EQ(many.outcome, one.outcome) << where;
    EXPECT_EQ(many.fence, one.fence) << where;
    EXPECT_EQ(static_cast<bool>(many.ticket), static_cast<bool>(one.ticket)) << where;
}

// ---- (1) the same answers as single begins ----------------------------------------------------------

/// Random batches against single begins on a twin guard. Both guards share one manual clock, which
/// moves between batches past the lease now and then; with `reclaim` an expired claim is taken over,
/// and the old ticket's completion is refused as stale in both guards alike.
void random_batches(bool reclaim) {
    using idem_test::manual_guard;
    using idem_test::manual_ticket;
    const std::uint64_t seed = idem_test::test_seed();
    std::mt19937_64 rng(seed);
    idem::options o = test_options(4096);
    o.on_failure = idem::failure_policy::retryable;  // a dropped ticket releases: the key is claimed again
    o.lease = std::chrono::milliseconds(10);
    o.reclaim_expired = reclaim;
    idem::manual_clock clock;  // copies share one time
    manual_guard many(o, clock);
    manual_guard one(o, clock);
    const std::size_t universe = 300;  // small enough that batches repeat keys within and across
    // Tickets still open, in both guards, completed later in the same order.
    std::vector<manual_ticket> open_many, open_one;
    std::vector<idem::key> keys;
    std::vector<std::uint64_t> fps;
    for (int round = 0; round < 200; ++round) {
        const std::size_t n = 1 + rng() % 200;
        keys.clear();
        fps.clear();
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t k = rng() % universe;
            keys.push_back(key_n("K", k));
            // Mostly the key's own fingerprint; now and then another payload, or none.
            const std::uint64_t r = rng() % 16;
            fps.push_back(r == 0 ? 0 : r == 1 ? 7777 : 100 + k);
        }
        std::vector<manual_guard::result_type> out(n);
        // A batch without fingerprints now and then: the empty span means none.
        const bool with_fps = rng() % 4 != 0;
        ASSERT_EQ(many.begin_many(keys, out,
                                  with_fps ? std::span<const std::uint64_t>(fps) : std::span<const std::uint64_t>()),
                  n);
        for (std::size_t i = 0; i < n; ++i) {
            auto r = one.begin(keys[i], with_fps ? fps[i] : 0);
            const std::string where = "round " + std::to_string(round) + " item " + std::to_string(i) + " key " +
                                      std::string(keys[i].view());
            EXPECT_EQ(out[i].status, r.status) << where;
            EXPECT_EQ(out[i].outcome, r.outcome) << where;
            EXPECT_EQ(out[i].fence, r.fence) << where;
            if (out[i].ticket && r.ticket) {
                open_many.push_back(std::move(out[i].ticket));
                open_one.push_back(std::move(r.ticket));
            } else {
                EXPECT_EQ(static_cast<bool>(out[i].ticket), static_cast<bool>(r.ticket)) << where;
            }
        }
        if (::testing::Test::HasFailure()) return;
        // Complete some open tickets identically in both guards: succeed, fail terminally, release.
        std::size_t j = 0;
        for (std::size_t i = 0; i < open_many.size(); ++i) {
            const std::uint64_t what = rng() % 5;
            const std::uint64_t outcome = rng() % 1000;
            std::error_code a, b;
            if (what == 0) {
                a = open_many[i].succeed(outcome);
                b = open_one[i].succeed(outcome);
            } else if (what == 1) {
                a = open_many[i].fail(outcome, idem::failure_policy::terminal);
                b = open_one[i].fail(outcome, idem::failure_policy::terminal);
            } else if (what == 2) {
                a = open_many[i].fail(outcome, idem::failure_policy::retryable);
                b = open_one[i].fail(outcome, idem::failure_policy::retryable);
            } else {  // still running
                open_many[j] = std::move(open_many[i]);
                open_one[j] = std::move(open_one[i]);
                ++j;
                continue;
            }
            EXPECT_EQ(a, b) << "completion in round " << round;
        }
        open_many.resize(j);
        open_one.resize(j);
        if (rng() % 3 == 0) clock.advance(std::chrono::milliseconds(11));  // past every open lease
    }
    const auto sm = many.snapshot();
    const auto so = one.snapshot();
    EXPECT_EQ(sm.acquired, so.acquired);
    EXPECT_EQ(sm.succeeded, so.succeeded);
    EXPECT_EQ(sm.reclaimed, so.reclaimed);
    EXPECT_EQ(sm.stale_tickets, so.stale_tickets);
    // The input reached every kind of answer it is meant to compare.
    EXPECT_GT(sm.acquired, 0u);
    EXPECT_GT(sm.duplicates, 0u);
    EXPECT_GT(sm.in_progress_hits, 0u);
    EXPECT_GT(sm.payload_mismatches, 0u);
    EXPECT_GT(sm.released, 0u);
    if (reclaim) {
        EXPECT_GT(sm.reclaimed, 0u);
    }
}

TEST(BeginMany, RandomBatchesEqualSingleBegins) { random_batches(false); }
TEST(BeginMany, RandomBatchesEqualSingleBeginsWithReclaim) { random_batches(true); }

TEST(BeginMany, RepeatInsideBatchSeesFirstClaim) {
    idem::guard g(test_options());
    const std::vector<idem::key> keys{idem::key("A"), idem::key("B"), idem::key("A"), idem::key(), idem::key("A")};
    const std::vector<std::uint64_t> fps{1, 2, 1, 0, 9};
    std::vector<idem::begin_result> out(keys.size());
    ASSERT_EQ(g.begin_many(keys, out, fps), keys.size());
    EXPECT_EQ(out[0].status, begin_status::acquired);
    EXPECT_EQ(out[1].status, begin_status::acquired);
    EXPECT_EQ(out[2].status, begin_status::in_progress);
    EXPECT_EQ(out[2].fence, out[0].fence);
    EXPECT_EQ(out[3].status, begin_status::invalid_key);
    EXPECT_EQ(out[4].status, begin_status::payload_mismatch);
    // A shorter out answers only what fits.
    std::vector<idem::begin_result> two(2);
    EXPECT_EQ(g.begin_many(keys, two), 2u);
    EXPECT_EQ(two[0].status, begin_status::in_progress);
}

// ---- (2) racing batches ------------------------------------------------------------------------------

TEST(BeginMany, RacingBatchesAcquireEachKeyOnce) {
    const std::uint64_t seed = idem_test::test_seed();
    const std::size_t threads = 4;
    const std::size_t n_keys = idem_test::env_size("IDEM_KEYS", 20000, 2000);
    idem::guard g(test_options(n_keys * 2));
    std::vector<idem::key> all;
    for (std::size_t i = 0; i < n_keys; ++i) all.push_back(key_n("R", i));
    std::vector<std::atomic<std::uint32_t>> acquired(n_keys);
    std::vector<std::vector<idem::ticket>> held(threads);
    idem_test::run_on_latch(threads, [&](std::size_t t) {
        std::mt19937_64 rng(seed + t);
        // Each thread covers every key (so every key is contended), in its own order and batches.
        std::vector<std::uint32_t> order(n_keys);
        for (std::size_t i = 0; i < n_keys; ++i) order[i] = static_cast<std::uint32_t>(i);
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<idem::key> batch;
        std::vector<idem::begin_result> out;
        for (std::size_t i = 0; i < n_keys;) {
            const std::size_t n = std::min<std::size_t>(1 + rng() % 128, n_keys - i);
            batch.clear();
            for (std::size_t j = 0; j < n; ++j) batch.push_back(all[order[i + j]]);
            out.clear();
            out.resize(n);
            (void)g.begin_many(batch, out);
            for (std::size_t j = 0; j < n; ++j) {
                if (out[j].status == begin_status::acquired) {
                    acquired[order[i + j]].fetch_add(1, std::memory_order_relaxed);
                    held[t].push_back(std::move(out[j].ticket));
                } else if (out[j].status != begin_status::in_progress) {
                    ADD_FAILURE() << "unexpected " << idem::to_string(out[j].status);
                }
            }
            i += n;
        }
    });
    for (std::size_t i = 0; i < n_keys; ++i) ASSERT_EQ(acquired[i].load(), 1u) << "key " << i;
    for (auto& h : held)
        for (auto& t : h) EXPECT_FALSE(t.succeed(1));
    EXPECT_EQ(g.snapshot().acquired, n_keys);
}

// ---- (3) refusals inside a batch ---------------------------------------------------------------------

TEST(BeginMany, CapacityExhaustedPerKey) {
    // max_probe covers the whole index, so the table is full after a count of claims that does not
    // depend on the hash: the twin guard (another secret) fills at the same key.
    idem::options o = test_options(16);
    o.max_probe = 1024;
    idem::guard many(o);
    idem::guard one(o);
    std::vector<idem::key> keys;
    for (std::size_t i = 0; i < 100; ++i) keys.push_back(key_n("C", i));
    for (std::size_t i = 0; i < 10; ++i) keys.push_back(key_n("C", i));  // repeats after the table is full
    std::vector<idem::begin_result> out(keys.size());
    (void)many.begin_many(keys, out);
    std::size_t exhausted = 0;
    std::vector<idem::begin_result> singles;  // held: a dropped ticket would release its claim
    for (std::size_t i = 0; i < keys.size(); ++i) {
        singles.push_back(one.begin(keys[i]));
        expect_same(out[i], singles.back(), "item " + std::to_string(i));
        if (out[i].status == begin_status::capacity_exhausted) ++exhausted;
    }
    EXPECT_GT(exhausted, 0u) << "the table never filled";
    for (std::size_t i = 100; i < keys.size(); ++i) EXPECT_EQ(out[i].status, begin_status::in_progress);
    EXPECT_EQ(many.snapshot().capacity_exhausted, one.snapshot().capacity_exhausted);
}

TEST(BeginMany, BackpressurePerKey) {
    using namespace std::chrono_literals;
    idem::memory_store mem;
    idem_test::faulty_store* f = nullptr;
    idem::store_options so;
    so.queue_capacity = 8;
    so.max_batch = 1;  // the flusher holds at most one row while the store is down
    so.max_backoff = 2ms;
    auto g = idem_test::open_wrapped(&f, idem::durability::async, idem_test::durable_options(), so, mem);
    f->down = true;
    std::vector<idem::ticket> held;
    {  // as in durable_test: once the flusher holds its one-row batch, the queue's room is fixed
        auto r = g->guard().begin(key_n("P", 0));
        ASSERT_EQ(r.status, begin_status::acquired);
        held.push_back(std::move(r.ticket));
    }
    ASSERT_TRUE(idem_test::wait_for([&] { return g->snapshot().store_errors > 0; }));
    // 40 new keys, then a repeat of the batch's first key: begin() would acquire until the queue is
    // full, refuse every later new key with backpressure, and answer the repeat in_progress (a
    // duplicate needs no room in the queue).
    std::vector<idem::key> keys;
    for (std::size_t i = 1; i <= 40; ++i) keys.push_back(key_n("P", i));
    keys.push_back(key_n("P", 1));
    std::vector<idem::begin_result> out(keys.size());
    ASSERT_EQ((*g)->begin_many(keys, out), keys.size());  // durable_guard forwards to its guard
    std::size_t acquired = 0;
    std::size_t i = 0;
    for (; i < 40 && out[i].status == begin_status::acquired; ++i) {
        ++acquired;
        held.push_back(std::move(out[i].ticket));
    }
    for (; i < 40; ++i) {
        EXPECT_EQ(out[i].status, begin_status::backpressure) << "item " << i;
        EXPECT_EQ(g->guard().query(keys[i]).state, idem::record_state::absent) << "a refused claim changed memory";
    }
    EXPECT_EQ(out[40].status, begin_status::in_progress);
    EXPECT_GE(held.size(), so.queue_capacity);
    EXPECT_LE(held.size(), so.queue_capacity + so.max_batch);
    EXPECT_EQ(g->snapshot().backpressure, 40 - acquired);
    EXPECT_EQ(g->guard().begin(keys[39]).status, begin_status::backpressure);  // as a single begin answers now

    f->down = false;
    ASSERT_TRUE(g->flush(10s));
    for (std::size_t j = 0; j < held.size(); ++j) {
        std::error_code ec;
        ASSERT_TRUE(idem_test::wait_for([&] { return (ec = held[j].succeed(j + 1)) != idem::errc::backpressure; }));
        ASSERT_FALSE(ec) << "ticket " << j << ": " << ec.message();
    }
    ASSERT_TRUE(g->flush(10s));
}

// ---- (4) durable: begin_many, succeed, restart -------------------------------------------------------

TEST(BeginMany, DurableRestartAnswersAsSingleBegins) {
    const std::uint64_t seed = idem_test::test_seed();
    idem_test::temp_dir dir("idem-begin-many");
    const std::string path_many = (dir.path() / "many.db").string();
    const std::string path_one = (dir.path() / "one.db").string();
    auto open = [](const std::string& p) {
        idem::store_options so;
        so.mode = idem::durability::async;
        return std::make_unique<idem::durable_guard>(std::make_unique<idem::sqlite_store>(p), idem_test::durable_options(),
                                                     so);
    };
    std::mt19937_64 rng(seed);
    std::vector<idem::key> keys;
    for (std::size_t i = 0; i < 500; ++i) keys.push_back(key_n("D", rng() % 400));  // with repeats
    {
        auto many = open(path_many);
        auto one = open(path_one);
        for (std::size_t base = 0; base < keys.size(); base += 100) {
            const std::span<const idem::key> batch(keys.data() + base, 100);
            std::vector<idem::begin_result> out(batch.size());
            ASSERT_EQ(many->guard().begin_many(batch, out), batch.size());
            std::vector<idem::begin_result> singles;
            for (std::size_t j = 0; j < batch.size(); ++j) {
                singles.push_back(one->guard().begin(batch[j]));
                expect_same(out[j], singles.back(), "item " + std::to_string(base + j));
            }
            // The batch's claims complete after it, in both guards alike: every third key fails
            // terminally, the rest succeed; the outcome is the key's.
            for (std::size_t j = 0; j < batch.size(); ++j) {
                const std::uint64_t k = std::stoull(std::string(batch[j].view().substr(1)));
                for (auto* t : {&out[j].ticket, &singles[j].ticket}) {
                    if (!*t) continue;
                    const auto ec = k % 3 == 0 ? t->fail(k, idem::failure_policy::terminal) : t->succeed(k * 10);
                    EXPECT_FALSE(ec) << ec.message();
                }
            }
        }
        ASSERT_TRUE(many->flush(std::chrono::seconds(10)));
        ASSERT_TRUE(one->flush(std::chrono::seconds(10)));
    }
    auto many = open(path_many);
    auto one = open(path_one);
    std::vector<idem::key> all;
    for (std::size_t i = 0; i < 400; ++i) all.push_back(key_n("D", i));
    std::vector<idem::begin_result> out(all.size());
    ASSERT_EQ(many->guard().begin_many(all, out), all.size());
    std::size_t replayed = 0;
    for (std::size_t i = 0; i < all.size(); ++i) {
        auto r = one->guard().begin(all[i]);
        expect_same(out[i], r, "after restart, key " + std::to_string(i));
        if (out[i].status == begin_status::succeeded) {
            EXPECT_EQ(out[i].outcome, i * 10);
            ++replayed;
        }
    }
    EXPECT_GT(replayed, 0u);
}

}  // namespace
