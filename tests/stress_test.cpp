// stress_test: seeded stress over many keys with duplicates. An independent per-key counter, kept
// outside the guard, proves each operation ran exactly once; every duplicate must see the outcome
// its executor recorded (a function of the key, so the checker can recompute it).
//
// Environment: IDEM_SEED (replay), IDEM_THREADS, IDEM_KEYS, IDEM_OPS (per thread).
#include <idem/idem.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/manual_guard.hpp"
#include "support/threads.hpp"
#include "support/yielding_atomic.hpp"

namespace {

using idem::begin_status;
using idem_test::mix;

std::uint64_t outcome_of(std::size_t idx) { return mix(idx ^ 0xfeedull); }
std::uint64_t fingerprint_of(std::size_t idx) { return mix(idx) | 1; }
idem::key key_of(std::size_t idx) { return idem::key("stress/" + std::to_string(idx)); }

struct sizes {
    std::size_t threads, keys, ops;
};

sizes stress_sizes() {
    return {idem_test::env_size("IDEM_THREADS", 8, 4), idem_test::env_size("IDEM_KEYS", 4096, 1024),
            idem_test::env_size("IDEM_OPS", 16384, 8192)};
}

// Each thread's sequence of key indices. The key space is cut into windows of 32 keys; every
// thread visits the same windows in the same order (drawn from the seed, half of them from the
// hottest 1/16 of the windows, so keys repeat), each in its own shuffled order. Threads therefore
// hit the same keys at nearly the same time: claims race, and duplicates arrive while the owner is
// still executing as well as after it completed.
std::vector<std::size_t> draw_keys(std::uint64_t seed, std::size_t thread, std::size_t keys, std::size_t ops) {
    constexpr std::size_t window = 32;
    const std::size_t windows = std::max<std::size_t>(keys / window, 1);
    std::mt19937_64 shared(seed), own(seed ^ mix(thread + 1));
    std::uniform_int_distribution<std::size_t> any(0, windows - 1), hot(0, std::max<std::size_t>(windows / 16, 1) - 1);
    std::vector<std::size_t> out;
    out.reserve(ops + window);
    std::vector<std::size_t> w(std::min(window, keys));
    while (out.size() < ops) {
        const std::size_t first = ((shared() & 1) ? hot(shared) : any(shared)) * window;
        for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::min(first + i, keys - 1);
        std::shuffle(w.begin(), w.end(), own);
        out.insert(out.end(), w.begin(), w.end());
    }
    out.resize(ops);
    return out;
}

/// The operation's "work": some executions yield the CPU before completing, so that duplicates
/// find the key in progress. Not synchronization: the checks hold whether or not it yields.
void work(std::size_t idx) {
    if (idx % 4 == 0) std::this_thread::yield();
}

template <template <class> class Atomic>
void each_key_executes_exactly_once(std::uint32_t yield_period) {
    const std::uint64_t seed = idem_test::test_seed();
    SCOPED_TRACE("IDEM_SEED=" + std::to_string(seed));
    const auto [threads, keys, ops_full] = stress_sizes();
    const std::size_t ops = yield_period == 0 ? ops_full : std::max<std::size_t>(ops_full / 4, 1);
    idem::basic_guard<Atomic> g(idem_test::test_options(keys));
    std::vector<std::vector<std::size_t>> plan(threads);
    for (std::size_t t = 0; t < threads; ++t) plan[t] = draw_keys(seed, t, keys, ops);
    std::vector<idem::key> ks;
    for (std::size_t i = 0; i < keys; ++i) ks.push_back(key_of(i));

    auto executed = std::make_unique<std::atomic<std::uint32_t>[]>(keys);
    auto touched = std::make_unique<std::atomic<bool>[]>(keys);
    std::atomic<std::uint64_t> wrong_outcome{0}, unexpected{0}, duplicates{0}, in_progress{0};

    idem_test::yield_injector::period.store(yield_period);
    idem_test::run_on_latch(threads, [&](std::size_t t) {
        for (std::size_t idx : plan[t]) {
            touched[idx].store(true, std::memory_order_relaxed);
            auto r = g.begin(ks[idx], fingerprint_of(idx));
            switch (r.status) {
                case begin_status::acquired:
                    executed[idx].fetch_add(1);
                    work(idx);
                    if (r.ticket.succeed(outcome_of(idx))) unexpected.fetch_add(1);
                    break;
                case begin_status::succeeded:
                    duplicates.fetch_add(1, std::memory_order_relaxed);
                    if (r.outcome != outcome_of(idx)) wrong_outcome.fetch_add(1);
                    break;
                case begin_status::in_progress: in_progress.fetch_add(1, std::memory_order_relaxed); break;
                default: unexpected.fetch_add(1); break;
            }
        }
    });
    idem_test::yield_injector::period.store(0);

    std::size_t distinct = 0;
    for (std::size_t i = 0; i < keys; ++i) {
        SCOPED_TRACE(ks[i].str());
        if (!touched[i].load()) {
            ASSERT_EQ(executed[i].load(), 0u);
            ASSERT_EQ(g.query(ks[i]).state, idem::record_state::absent);
            continue;
        }
        ++distinct;
        ASSERT_EQ(executed[i].load(), 1u) << "executions of one key";
        const auto v = g.query(ks[i]);
        ASSERT_EQ(v.state, idem::record_state::succeeded);
        ASSERT_EQ(v.outcome, outcome_of(i));
        ASSERT_EQ(v.fingerprint, fingerprint_of(i));
    }
    EXPECT_EQ(wrong_outcome.load(), 0u) << "a duplicate saw an outcome its executor did not record";
    EXPECT_EQ(unexpected.load(), 0u);
    const auto s = g.snapshot();
    EXPECT_EQ(s.acquired, distinct);
    EXPECT_EQ(s.succeeded, distinct);
    EXPECT_EQ(s.duplicates, duplicates.load());
    EXPECT_EQ(s.in_progress_hits, in_progress.load());
    EXPECT_EQ(s.acquired + s.duplicates + s.in_progress_hits, threads * ops);
    std::cout << "[ idem    ] " << distinct << " keys executed once, " << duplicates.load() << " replays, "
              << in_progress.load() << " in-progress answers\n";
}

TEST(Stress, EachKeyExecutesExactlyOnce) { each_key_executes_exactly_once<std::atomic>(0); }

// The same with a yield injected before about one atomic access in eight, so that threads are
// descheduled between the steps of a claim (identity CAS, claim CAS, epoch check, publication).
TEST(Stress, EachKeyExecutesExactlyOnceWithInjectedYields) { each_key_executes_exactly_once<idem_test::yielding_atomic>(8); }

// Owners fail retryably a key-dependent number of times (by fail() or by dropping the ticket)
// before one succeeds. Threads keep at each key until they see it succeeded. Per key: executions
// equal the planned attempts, exactly one execution succeeded, each retry's fence is the previous
// one plus one, and duplicates replay the successful outcome.
template <template <class> class Atomic>
void retryable_failures_reexecute(std::uint32_t yield_period) {
    const std::uint64_t seed = idem_test::test_seed();
    SCOPED_TRACE("IDEM_SEED=" + std::to_string(seed));
    const auto [threads, keys_full, ops_full] = stress_sizes();
    const std::size_t keys = std::max<std::size_t>(keys_full / 4, 1);
    const std::size_t ops = std::max<std::size_t>(ops_full / (yield_period == 0 ? 4 : 16), 1);
    constexpr std::size_t max_attempts = 4;
    auto planned = [&](std::size_t idx) { return 1 + mix(seed ^ (idx * 31 + 7)) % max_attempts; };

    idem::options opts = idem_test::test_options(keys);
    opts.on_failure = idem::failure_policy::retryable;
    idem::basic_guard<Atomic> g(opts);
    std::vector<std::vector<std::size_t>> plan(threads);
    for (std::size_t t = 0; t < threads; ++t) plan[t] = draw_keys(seed, t, keys, ops);

    struct per_key {
        std::atomic<std::uint32_t> executed{0}, succeeded{0};
        std::array<std::atomic<std::uint64_t>, max_attempts + 1> fence{};
        std::atomic<bool> touched{false};
    };
    auto pk = std::make_unique<per_key[]>(keys);
    std::atomic<std::uint64_t> wrong_outcome{0}, unexpected{0}, waits{0};

    idem_test::yield_injector::period.store(yield_period);
    idem_test::run_on_latch(threads, [&](std::size_t t) {
        for (std::size_t idx : plan[t]) {
            per_key& p = pk[idx];
            p.touched.store(true, std::memory_order_relaxed);
            const idem::key k = key_of(idx);
            for (;;) {
                auto r = g.begin(k);
                if (r.status == begin_status::acquired) {
                    const std::uint32_t attempt = p.executed.fetch_add(1) + 1;  // independent of the guard
                    if (attempt <= max_attempts) p.fence[attempt].store(r.ticket.fence());
                    work(idx);
                    if (attempt < planned(idx)) {
                        if (attempt % 2 == 1) {
                            if (r.ticket.fail(attempt)) unexpected.fetch_add(1);
                        } else {
                            r.ticket = {};  // dropped without completion: released per policy
                        }
                        continue;
                    }
                    p.succeeded.fetch_add(1);
                    if (r.ticket.succeed(outcome_of(idx))) unexpected.fetch_add(1);
                    break;
                }
                if (r.status == begin_status::succeeded) {
                    if (r.outcome != outcome_of(idx)) wrong_outcome.fetch_add(1);
                    break;
                }
                if (r.status != begin_status::in_progress) {
                    unexpected.fetch_add(1);
                    break;
                }
                waits.fetch_add(1, std::memory_order_relaxed);
                std::this_thread::yield();  // the owner completes or releases; then we retry
            }
        }
    });
    idem_test::yield_injector::period.store(0);

    std::size_t distinct = 0, executions = 0;
    for (std::size_t i = 0; i < keys; ++i) {
        const per_key& p = pk[i];
        SCOPED_TRACE(key_of(i).str() + " planned attempts " + std::to_string(planned(i)));
        if (!p.touched.load()) continue;
        ++distinct;
        executions += p.executed.load();
        ASSERT_EQ(p.succeeded.load(), 1u) << "executions that succeeded";
        ASSERT_EQ(p.executed.load(), planned(i)) << "one execution per claim, none lost, none doubled";
        for (std::size_t a = 2; a <= planned(i); ++a)
            ASSERT_EQ(p.fence[a].load(), p.fence[a - 1].load() + 1) << "attempt " << a;
        const auto v = g.query(key_of(i));
        ASSERT_EQ(v.state, idem::record_state::succeeded);
        ASSERT_EQ(v.outcome, outcome_of(i));
        ASSERT_EQ(v.fence, p.fence[planned(i)].load());
    }
    EXPECT_EQ(wrong_outcome.load(), 0u);
    EXPECT_EQ(unexpected.load(), 0u);
    const auto s = g.snapshot();
    EXPECT_EQ(s.acquired, executions);
    EXPECT_EQ(s.succeeded, distinct);
    EXPECT_EQ(s.released, executions - distinct);
    std::cout << "[ idem    ] " << distinct << " keys, " << executions << " executions, " << waits.load()
              << " in-progress waits\n";
}

TEST(Stress, RetryableFailuresReexecuteUntilExactlyOneSuccess) { retryable_failures_reexecute<std::atomic>(0); }

TEST(Stress, RetryableFailuresReexecuteWithInjectedYields) { retryable_failures_reexecute<idem_test::yielding_atomic>(8); }

// Rotation under load: a maintenance thread keeps recycling generations (retention 0, small table)
// while workers claim, complete and replay a key space larger than the table. Records may be
// evicted and re-executed here, so the invariants are: never two owners of one key at once, a
// replay always carries its own key's outcome (never the outcome of another key that reused a
// recycled slot), and each new claim of a key has a fence above every fence the key had before.
template <template <class> class Atomic>
void rotation_under_load(std::uint32_t yield_period) {
    const std::uint64_t seed = idem_test::test_seed();
    SCOPED_TRACE("IDEM_SEED=" + std::to_string(seed));
    const auto [threads_full, keys_full, ops_full] = stress_sizes();
    (void)keys_full;
    const std::size_t threads = std::max<std::size_t>(threads_full / 2, 2);
    const std::size_t capacity = 64, keys = 4 * capacity;
    const std::size_t ops = yield_period == 0 ? ops_full : std::max<std::size_t>(ops_full / 4, 1);
    idem::manual_clock clock;
    auto opts = idem_test::test_options(capacity);
    opts.retention = std::chrono::nanoseconds(0);
    idem::basic_guard<Atomic, idem::manual_clock> g(opts, clock);

    struct per_key {
        std::atomic<int> owners{0};
        std::atomic<std::uint64_t> last_fence{0};
    };
    auto pk = std::make_unique<per_key[]>(keys);
    std::atomic<std::uint64_t> double_owner{0}, wrong_outcome{0}, fence_regress{0}, unexpected{0}, gave_up{0}, executions{0};
    std::atomic<bool> done{false};
    std::atomic<std::size_t> workers_left{threads};

    idem_test::yield_injector::period.store(yield_period);
    idem_test::run_on_latch(threads + 1, [&](std::size_t t) {
        if (t == threads) {  // the maintenance thread
            while (!done.load()) (void)g.collect();
            return;
        }
        std::mt19937_64 rng(seed ^ mix(t + 100));
        std::uniform_int_distribution<std::size_t> any(0, keys - 1);
        for (std::size_t op = 0; op < ops; ++op) {
            const std::size_t idx = any(rng);
            per_key& p = pk[idx];
            const idem::key k = key_of(idx);
            for (std::size_t tries = 0;; ++tries) {
                if (tries == 100000) {
                    gave_up.fetch_add(1);
                    break;
                }
                auto r = g.begin(k);
                if (r.status == begin_status::acquired) {
                    if (p.owners.fetch_add(1) != 0) double_owner.fetch_add(1);
                    executions.fetch_add(1, std::memory_order_relaxed);
                    if (r.ticket.fence() <= p.last_fence.load()) fence_regress.fetch_add(1);
                    p.last_fence.store(r.ticket.fence());
                    p.owners.fetch_sub(1);
                    if (r.ticket.succeed(outcome_of(idx))) unexpected.fetch_add(1);
                    break;
                }
                if (r.status == begin_status::succeeded) {
                    if (r.outcome != outcome_of(idx)) wrong_outcome.fetch_add(1);
                    break;
                }
                if (r.status != begin_status::in_progress && r.status != begin_status::capacity_exhausted) {
                    unexpected.fetch_add(1);
                    break;
                }
                std::this_thread::yield();  // wait for the owner, or for the maintenance thread to make room
            }
        }
        if (workers_left.fetch_sub(1) == 1) done.store(true);
    });
    idem_test::yield_injector::period.store(0);

    const auto s = g.snapshot();
    std::cout << "[ idem    ] " << executions.load() << " executions, " << s.rotations << " rotations, " << s.evicted
              << " evicted, " << s.capacity_exhausted << " capacity refusals\n";
    EXPECT_EQ(double_owner.load(), 0u) << "two owners held one key at once";
    EXPECT_EQ(wrong_outcome.load(), 0u) << "a replay carried another key's outcome";
    EXPECT_EQ(fence_regress.load(), 0u) << "a new claim did not get a fence above the key's earlier fences";
    EXPECT_EQ(unexpected.load(), 0u);
    EXPECT_EQ(gave_up.load(), 0u) << "a key stayed refused for 100000 tries: the table stopped making room";
    EXPECT_GT(s.rotations, 0u) << "the test did not exercise rotation";
    EXPECT_EQ(s.acquired, executions.load());
}

TEST(Stress, RotationUnderLoadKeepsOwnersExclusiveAndReplaysExact) { rotation_under_load<std::atomic>(0); }

// The same with a yield injected before about one atomic access in eight, so that a thread is
// often descheduled between two steps of a lookup while others rotate and reuse slots.
TEST(Stress, RotationUnderLoadWithInjectedYields) { rotation_under_load<idem_test::yielding_atomic>(8); }

}  // namespace
