// tests/support/hooked_atomic.hpp: std::atomic that runs a test's callback at the Nth atomic access
// of the calling thread.
//
// This turns "what if another thread ran X right between these two steps?" into a deterministic,
// single-threaded test: arm the hook with N and a callback, call the operation under test, and the
// callback runs (on the same thread, with the hook disarmed) just before that operation's Nth
// atomic access. Sweeping N from 1 until the hook no longer fires visits every preemption point of
// the operation once. The library's hot path takes no locks, so running other operations from
// inside one is legal: it is exactly what another thread may do at that point.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>

namespace idem_test {

struct access_hook {
    /// Arms the calling thread's hook: `fn` runs before its `n`th atomic access (n >= 1).
    static void arm(std::size_t n, std::function<void()> fn) {
        state().remaining = n;
        state().fn = std::move(fn);
        state().fired = false;
    }
    /// Disarms; returns whether the callback ran.
    static bool disarm() {
        state().remaining = 0;
        state().fn = nullptr;
        return state().fired;
    }
    static void on_access() {
        auto& s = state();
        if (s.remaining == 0 || --s.remaining != 0) return;
        auto fn = std::move(s.fn);
        s.fn = nullptr;
        s.fired = true;
        fn();
    }

private:
    struct per_thread {
        std::size_t remaining = 0;
        std::function<void()> fn;
        bool fired = false;
    };
    static per_thread& state() {
        thread_local per_thread s;
        return s;
    }
};

template <class T>
struct hooked_atomic : std::atomic<T> {
    using base = std::atomic<T>;
    using base::base;

    T load(std::memory_order o = std::memory_order_seq_cst) const noexcept {
        access_hook::on_access();
        return base::load(o);
    }
    void store(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
        access_hook::on_access();
        base::store(v, o);
    }
    bool compare_exchange_strong(T& e, T d, std::memory_order o = std::memory_order_seq_cst) noexcept {
        access_hook::on_access();
        return base::compare_exchange_strong(e, d, o);
    }
    bool compare_exchange_strong(T& e, T d, std::memory_order s, std::memory_order f) noexcept {
        access_hook::on_access();
        return base::compare_exchange_strong(e, d, s, f);
    }
    bool compare_exchange_weak(T& e, T d, std::memory_order o = std::memory_order_seq_cst) noexcept {
        access_hook::on_access();
        return base::compare_exchange_weak(e, d, o);
    }
    bool compare_exchange_weak(T& e, T d, std::memory_order s, std::memory_order f) noexcept {
        access_hook::on_access();
        return base::compare_exchange_weak(e, d, s, f);
    }
    T fetch_add(T v, std::memory_order o = std::memory_order_seq_cst) noexcept {
        access_hook::on_access();
        return base::fetch_add(v, o);
    }
};

}  // namespace idem_test
