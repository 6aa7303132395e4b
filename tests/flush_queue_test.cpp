// tests/flush_queue_test.cpp: the bounded ring between the hot path and the flusher
// (detail/pipeline/flush_queue.hpp), on its own: rows come out exactly once, each producer's rows in the
// order it pushed them, through many wrap-arounds of a small ring, with producers and consumers
// racing from a latch. Under ThreadSanitizer (label concurrency) it must report nothing: every
// access to a row is ordered by its cell's sequence number.
#include <idem/detail/pipeline/flush_queue.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "support/threads.hpp"

namespace {

struct row {
    std::uint32_t producer = 0;
    std::uint32_t n = 0;
    std::uint64_t check = 0;  // mix(producer, n): a torn copy would not match
};

std::uint64_t check_of(std::uint32_t producer, std::uint32_t n) {
    return idem_test::mix((std::uint64_t{producer} << 32) | n);
}

// The caller's bound, as pipeline_core keeps it: a producer pushes only under a reservation, and a
// consumer gives the room back after its pop completed.
class room {
public:
    explicit room(std::int64_t n) : free_(n) {}
    void reserve() {
        std::int64_t r = free_.load(std::memory_order_relaxed);
        for (;;) {
            if (r > 0 && free_.compare_exchange_weak(r, r - 1, std::memory_order_acquire)) return;
            if (r <= 0) {
                std::this_thread::yield();
                r = free_.load(std::memory_order_relaxed);
            }
        }
    }
    void give_back() { free_.fetch_add(1, std::memory_order_release); }

private:
    std::atomic<std::int64_t> free_;
};

// Producer p pushes its rows 0..per-1, each under a reservation.
void produce(idem::detail::pipeline::flush_queue<row>& q, room& r, std::uint32_t p, std::uint32_t per) {
    for (std::uint32_t n = 0; n < per; ++n) {
        r.reserve();
        q.push({p, n, check_of(p, n)});
    }
}

TEST(FlushQueue, EmptyRingAnswersNothingAndOneThreadGetsItsRowsInOrderThroughWrapArounds) {
    idem::detail::pipeline::flush_queue<row> q(4);
    row out;
    EXPECT_FALSE(q.try_pop(out));
    for (std::uint32_t n = 0; n < 1000; ++n) {  // 250 laps of a 4-cell ring, 1 to 4 rows deep
        const std::uint32_t burst = 1 + n % 4;
        for (std::uint32_t i = 0; i < burst; ++i) q.push({0, n * 4 + i, check_of(0, n * 4 + i)});
        for (std::uint32_t i = 0; i < burst; ++i) {
            ASSERT_TRUE(q.try_pop(out)) << "row " << n * 4 + i << " was pushed";
            EXPECT_EQ(out.n, n * 4 + i);
            EXPECT_EQ(out.check, check_of(0, n * 4 + i));
        }
        EXPECT_FALSE(q.try_pop(out)) << "the ring holds only what was pushed";
    }
}

// Producers race one consumer: each producer's rows come out in its order, each exactly once.
TEST(FlushQueue, RacingProducersOneConsumerKeepEachProducersOrder) {
    const std::size_t producers = idem_test::env_size("IDEM_THREADS", 4, 3);
    const std::uint32_t per = static_cast<std::uint32_t>(idem_test::env_size("IDEM_ROUNDS", 50000, 10000));
    constexpr std::size_t capacity = 8;  // small: thousands of laps, producers wait on room
    idem::detail::pipeline::flush_queue<row> q(capacity);
    room r(capacity);
    std::vector<std::uint32_t> next(producers, 0);
    std::size_t popped = 0, out_of_order = 0, torn = 0;
    idem_test::run_on_latch(producers + 1, [&](std::size_t t) {
        if (t < producers) return produce(q, r, static_cast<std::uint32_t>(t), per);
        row out;
        while (popped < producers * per) {
            if (!q.try_pop(out)) {
                std::this_thread::yield();
                continue;
            }
            r.give_back();
            ++popped;
            if (out.producer >= producers || out.check != check_of(out.producer, out.n)) {
                ++torn;
                continue;
            }
            if (out.n != next[out.producer]) ++out_of_order;
            next[out.producer] = out.n + 1;
        }
    });
    EXPECT_EQ(torn, 0u);
    EXPECT_EQ(out_of_order, 0u);
    for (std::size_t p = 0; p < producers; ++p) EXPECT_EQ(next[p], per) << "producer " << p;
    row out;
    EXPECT_FALSE(q.try_pop(out));
}

// Two consumers (PostgreSQL's lanes pop from one ring): every row comes out exactly once.
TEST(FlushQueue, RacingProducersAndTwoConsumersDeliverEveryRowExactlyOnce) {
    const std::size_t producers = idem_test::env_size("IDEM_THREADS", 4, 3);
    const std::uint32_t per = static_cast<std::uint32_t>(idem_test::env_size("IDEM_ROUNDS", 50000, 10000));
    constexpr std::size_t capacity = 16;
    idem::detail::pipeline::flush_queue<row> q(capacity);
    room r(capacity);
    std::vector<std::atomic<std::uint32_t>> seen(producers * per);
    std::atomic<std::size_t> popped{0}, torn{0};
    idem_test::run_on_latch(producers + 2, [&](std::size_t t) {
        if (t < producers) return produce(q, r, static_cast<std::uint32_t>(t), per);
        row out;
        while (popped.load(std::memory_order_relaxed) < producers * per) {
            if (!q.try_pop(out)) {
                std::this_thread::yield();
                continue;
            }
            r.give_back();
            popped.fetch_add(1, std::memory_order_relaxed);
            if (out.producer >= producers || out.n >= per || out.check != check_of(out.producer, out.n)) {
                torn.fetch_add(1, std::memory_order_relaxed);
                continue;
            }
            seen[out.producer * per + out.n].fetch_add(1, std::memory_order_relaxed);
        }
    });
    EXPECT_EQ(torn.load(), 0u);
    std::size_t missing = 0, twice = 0;
    for (auto& s : seen) {
        const auto v = s.load();
        missing += v == 0;
        twice += v > 1;
    }
    EXPECT_EQ(missing, 0u);
    EXPECT_EQ(twice, 0u);
}

}  // namespace
