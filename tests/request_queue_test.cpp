// The request queue of scope::global's batchers (include/idem/detail/global/request_queue.hpp):
// a batch starts beside one already in flight only when `beside` requests wait, a batch that ends
// (however it ends) lets the next one start with fewer, and no request is lost or taken twice when
// batchers and callers race.
//
//   FewRequestsWaitForTheBatchInFlight   the rule, step by step, in one thread
//   ABatchThatThrowsStillEnds            in_flight_batch lowers the count when its batch throws
//   TheEndOfABatchWakesAWaitingBatcher   a batcher asleep on fewer than `beside` requests is woken
//                                        by the end of the batch in flight (no lost wake-up)
//   AStuckBatchHoldsTheOthersBack...    after `patience`, one request starts a batch beside a batch
//                                        in flight that does not end
//   RacingBatchersAndCallers             4 batchers and 4 callers start on a latch; every request
//                                        is taken exactly once, and every batch that started beside
//                                        another had at least `beside` requests waiting
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/detail/global/request_queue.hpp"
#include "idem/key.hpp"

namespace {

using namespace std::chrono_literals;

struct request {
    idem::key k;
    int id = 0;
};
using queue = idem::detail::global::request_queue<request>;
using batch = std::vector<std::shared_ptr<request>>;

std::chrono::steady_clock::time_point now() { return std::chrono::steady_clock::now(); }

std::shared_ptr<request> make(int id) {
    return std::make_shared<request>(request{idem::key("R" + std::to_string(id) + "_PAY_v1"), id});
}

/// Takes what the queue holds into a new batch (the batchers' take(), with nothing skipped).
batch take_all(queue& q) {
    batch b;
    q.take(
        b, 1024, [](const auto&) { return false; }, [](auto&) {});
    return b;
}

TEST(RequestQueue, FewRequestsWaitForTheBatchInFlight) {
    queue q(/*drains=*/false);
    q.beside = 3;
    q.patience = std::chrono::hours(1);  // the threshold alone
    ASSERT_TRUE(q.submit(make(1)));
    std::unique_lock lk(q.m);
    ASSERT_TRUE(q.ready(now())) << "nothing in flight: one request is enough";
    batch first = take_all(q);
    ASSERT_EQ(first.size(), 1u);
    EXPECT_EQ(q.in_flight, 1u);
    lk.unlock();
    {
        const queue::in_flight_batch over(q, true);
        ASSERT_TRUE(q.submit(make(2)));
        ASSERT_TRUE(q.submit(make(3)));
        lk.lock();
        EXPECT_FALSE(q.ready(now())) << "2 requests wait beside a batch in flight; 3 are needed";
        lk.unlock();
        ASSERT_TRUE(q.submit(make(4)));
        lk.lock();
        EXPECT_TRUE(q.ready(now())) << "3 requests wait: a batch starts beside the one in flight";
        batch second = take_all(q);
        EXPECT_EQ(second.size(), 3u);
        EXPECT_EQ(q.in_flight, 2u);
        lk.unlock();
        const queue::in_flight_batch over2(q, true);
    }  // both batches end
    lk.lock();
    EXPECT_EQ(q.in_flight, 0u);
    lk.unlock();
    ASSERT_TRUE(q.submit(make(5)));
    lk.lock();
    EXPECT_TRUE(q.ready(now())) << "nothing in flight again: one request is enough";
    lk.unlock();
    const queue::in_flight_batch none(q, false);  // a take that filled nothing counts nothing
}

TEST(RequestQueue, ABatchThatThrowsStillEnds) {
    queue q(/*drains=*/true);
    q.beside = 100;
    ASSERT_TRUE(q.submit(make(1)));
    {
        std::lock_guard lk(q.m);
        ASSERT_EQ(take_all(q).size(), 1u);
    }
    EXPECT_THROW(
        {
            const queue::in_flight_batch over(q, true);
            throw std::runtime_error("the batch failed");
        },
        std::runtime_error);
    ASSERT_TRUE(q.submit(make(2)));
    std::lock_guard lk(q.m);
    EXPECT_EQ(q.in_flight, 0u);
    EXPECT_TRUE(q.ready(now())) << "a failed batch left the queue waiting for 100 requests";
}

TEST(RequestQueue, TheEndOfABatchWakesAWaitingBatcher) {
    queue q(/*drains=*/false);
    q.beside = 5;
    q.patience = std::chrono::hours(1);  // only the end of the batch can wake the batcher
    ASSERT_TRUE(q.submit(make(1)));
    {
        std::lock_guard lk(q.m);
        ASSERT_EQ(take_all(q).size(), 1u);
    }
    auto in_flight = std::make_unique<queue::in_flight_batch>(q, true);
    std::atomic<int> looks{0};  // evaluations of the batcher's wait predicate, each under m
    auto taken = std::async(std::launch::async, [&] {
        std::unique_lock lk(q.m);
        q.work.wait(lk, [&] {
            ++looks;
            return q.stopping || q.ready(now());
        });  // the predicate of await_work, counted
        return take_all(q).size();
    });
    const auto until = std::chrono::steady_clock::now() + 10s;  // bounds for the waits below
    while (looks.load() < 1 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    // The batcher is asleep (submit takes m, which it holds until it sleeps); submit wakes it and it
    // looks again: 1 < 5 requests beside the batch in flight, so it goes back to sleep.
    ASSERT_TRUE(q.submit(make(2)));
    while (looks.load() < 2 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    ASSERT_GE(looks.load(), 2) << "the batcher never looked at the queue after the submit";
    in_flight.reset();  // the batch in flight ends: only this can wake the batcher now
    const bool woken = taken.wait_for(10s) == std::future_status::ready;
    if (!woken) q.stop();  // let the batcher go, so the test ends
    ASSERT_TRUE(woken) << "the end of the batch in flight woke no batcher";
    EXPECT_EQ(taken.get(), 1u);
}

// A batch that is stuck (a row lock held by another client, retries) holds the others back only
// for `patience`: then one request is enough to start a batch beside it.
TEST(RequestQueue, AStuckBatchHoldsTheOthersBackOnlyForThePatience) {
    queue q(/*drains=*/false);
    q.beside = 100;
    q.patience = 50ms;
    ASSERT_TRUE(q.submit(make(1)));
    {
        std::lock_guard lk(q.m);
        ASSERT_EQ(take_all(q).size(), 1u);
    }
    const queue::in_flight_batch stuck(q, true);  // never ends during the test
    ASSERT_TRUE(q.submit(make(2)));
    {
        std::lock_guard lk(q.m);
        EXPECT_FALSE(q.ready(q.last_take + 49ms)) << "1 of 100 requests, 49 ms into the batch in flight";
        EXPECT_TRUE(q.ready(q.last_take + 50ms)) << "1 of 100 requests, the batch in flight 50 ms old";
    }
    auto taken = std::async(std::launch::async, [&] {
        std::unique_lock lk(q.m);
        q.await_work(lk);  // nothing wakes it but its own deadline
        return take_all(q).size();
    });
    const bool done = taken.wait_for(10s) == std::future_status::ready;
    if (!done) q.stop();
    ASSERT_TRUE(done) << "a batcher waited past the patience behind a stuck batch";
    EXPECT_EQ(taken.get(), 1u);
}

TEST(RequestQueue, RacingBatchersAndCallers) {
    constexpr int callers = 4, per_caller = 2000, batchers = 4;
    queue q(/*drains=*/false);
    q.beside = 4;
    q.patience = std::chrono::hours(1);  // the threshold alone decides (checked by `early`)
    std::vector<std::atomic<int>> seen(callers * per_caller);
    std::atomic<int> taken{0}, early{0};
    std::latch start(callers + batchers);
    std::vector<std::thread> ts;
    for (int b = 0; b < batchers; ++b)
        ts.emplace_back([&] {
            start.arrive_and_wait();
            for (;;) {
                batch got;
                {
                    std::unique_lock lk(q.m);
                    q.await_work(lk);
                    if (q.stopping && q.q.empty()) return;
                    if (q.in_flight > 0 && q.q.size() < q.beside) ++early;  // started beside another with too few
                    got = take_all(q);
                }
                const queue::in_flight_batch over(q, !got.empty());
                for (const auto& r : got) seen[static_cast<std::size_t>(r->id)].fetch_add(1);
                taken += static_cast<int>(got.size());
                std::this_thread::yield();  // the batch "runs"
            }
        });
    for (int c = 0; c < callers; ++c)
        ts.emplace_back([&, c] {
            start.arrive_and_wait();
            for (int i = 0; i < per_caller; ++i) ASSERT_TRUE(q.submit(make(c * per_caller + i)));
        });
    for (int c = batchers; c < batchers + callers; ++c) ts[static_cast<std::size_t>(c)].join();
    // Every request submitted: wait (bounded) until the batchers took them all, then stop them.
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (taken.load() < callers * per_caller && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    q.stop();
    for (int b = 0; b < batchers; ++b) ts[static_cast<std::size_t>(b)].join();
    EXPECT_EQ(taken.load(), callers * per_caller);
    for (std::size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i].load(), 1) << "request " << i;
    EXPECT_EQ(early.load(), 0);
    std::lock_guard lk(q.m);
    EXPECT_EQ(q.in_flight, 0u);
}

}  // namespace
