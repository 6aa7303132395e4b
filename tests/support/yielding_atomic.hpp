// tests/support/yielding_atomic.hpp: std::atomic that sometimes yields the CPU before an access.
//
// The guard takes its atomic type as a template parameter (docs/design.md) so that a model
// checker can drive the real slot code. Tests use the same hook for a cheaper purpose: a thread
// that yields between two atomic steps of the protocol lets other threads run a whole operation in
// the gap (a rotation, a claim on a recycled slot), so windows that are a few instructions wide on
// a real run become likely. Every access still goes to a real std::atomic with the caller's
// memory order, so the semantics are unchanged and ThreadSanitizer still sees every access.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

namespace idem_test {

/// Per-thread yield decision: roughly one access in `period` yields (xorshift, seeded per thread).
struct yield_injector {
    static inline std::atomic<std::uint32_t> period{0};  // 0: never yield
    static void maybe_yield() noexcept {
        const std::uint32_t p = period.load(std::memory_order_relaxed);  // relaxed: a tuning knob
        if (p == 0) return;
        thread_local std::uint64_t x = 0x9e3779b97f4a7c15ull ^ std::hash<std::thread::id>{}(std::this_thread::get_id());
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if (x % p == 0) std::this_thread::yield();
    }
};

template <class T>
struct yielding_atomic : std::atomic<T> {
    using base = std::atomic<T>;
    using base::base;
    using base::operator=;

    T load(std::memory_order o = std::memory_order_seq_cst) const noexcept {
        yield_injector::maybe_yield();
        return base::load(o);
    }
    void store(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
        yield_injector::maybe_yield();
        base::store(v, o);
    }
    bool compare_exchange_strong(T& e, T d, std::memory_order o = std::memory_order_seq_cst) noexcept {
        yield_injector::maybe_yield();
        return base::compare_exchange_strong(e, d, o);
    }
    bool compare_exchange_strong(T& e, T d, std::memory_order s, std::memory_order f) noexcept {
        yield_injector::maybe_yield();
        return base::compare_exchange_strong(e, d, s, f);
    }
    bool compare_exchange_weak(T& e, T d, std::memory_order o = std::memory_order_seq_cst) noexcept {
        yield_injector::maybe_yield();
        return base::compare_exchange_weak(e, d, o);
    }
    bool compare_exchange_weak(T& e, T d, std::memory_order s, std::memory_order f) noexcept {
        yield_injector::maybe_yield();
        return base::compare_exchange_weak(e, d, s, f);
    }
    T fetch_add(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
        yield_injector::maybe_yield();
        return base::fetch_add(v, o);
    }
};

}  // namespace idem_test
