// tests/support/threads.hpp: thread runners, seeds and sizing for the concurrency tests.
//
// * run_on_latch(n, fn): n threads, all released together by one std::latch, so the race starts
//   when the last thread is ready rather than when the first one happens to be scheduled.
// * test_seed(): IDEM_SEED from the environment, else a fresh random seed; printed so that a
//   failing run can be replayed with IDEM_SEED=<seed>.
// * env_size(name, normal, under_tsan): a size overridable from the environment (IDEM_THREADS,
//   IDEM_ROUNDS, ...), scaled down automatically under ThreadSanitizer, which runs ~10x slower.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <latch>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_THREAD__)
#define IDEM_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define IDEM_TEST_TSAN 1
#endif
#endif
#ifndef IDEM_TEST_TSAN
#define IDEM_TEST_TSAN 0
#endif

namespace idem_test {

inline constexpr bool under_tsan = IDEM_TEST_TSAN != 0;

/// The unsigned value of environment variable `name`, or `fallback` when unset or not a number.
inline std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') return fallback;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(text, &end, 0);
    if (end == text || *end != '\0') {
        std::cerr << "[ idem    ] ignoring " << name << "='" << text << "': not a number\n";
        return fallback;
    }
    return v;
}

/// A size for a stress loop: `name` from the environment if set, else `normal`, or `tsan` under
/// ThreadSanitizer. Printed, so the log says how much work a run did.
inline std::size_t env_size(const char* name, std::size_t normal, std::size_t tsan) {
    const std::size_t v = static_cast<std::size_t>(env_u64(name, under_tsan ? tsan : normal));
    std::cout << "[ idem    ] " << name << "=" << v << (under_tsan ? " (ThreadSanitizer sizing)" : "") << '\n';
    return v;
}

/// The seed of this test: IDEM_SEED if set, else random. Printed and recorded in the XML report.
inline std::uint64_t test_seed() {
    const std::uint64_t seed = env_u64("IDEM_SEED", std::random_device{}() * 0x100000001ull ^ std::random_device{}());
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::cout << "[ idem    ] " << (info ? std::string(info->test_suite_name()) + "." + info->name() : "?") << ": seed "
              << seed << " (replay with IDEM_SEED=" << seed << ")\n";
    ::testing::Test::RecordProperty("seed", std::to_string(seed));
    return seed;
}

/// Runs fn(i) on n threads that all start together on one latch; returns when every thread ended.
template <class Fn>
void run_on_latch(std::size_t n, Fn fn) {
    std::latch start(static_cast<std::ptrdiff_t>(n));
    std::vector<std::jthread> threads;
    threads.reserve(n);
    try {
        for (std::size_t i = 0; i < n; ++i)
            threads.emplace_back([&start, &fn, i] {
                start.arrive_and_wait();
                fn(i);
            });
    } catch (...) {
        start.count_down(static_cast<std::ptrdiff_t>(n - threads.size()));  // release those that started
        throw;
    }
}  // the jthreads join here, before the latch goes

/// A deterministic 64-bit mix (splitmix64 finaliser): outcomes and decisions that are functions of
/// the key, so a checker can recompute them independently of the guard.
constexpr std::uint64_t mix(std::uint64_t x) noexcept {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

}  // namespace idem_test
