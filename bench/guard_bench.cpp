// bench/guard_bench.cpp: idem::guard against its peers, side by side in one binary.
//
// Scenarios (each for every guard, 1, 2 and 100 threads, real time):
//   fresh_begin_succeed  begin + succeed on keys never seen. Each thread owns a disjoint slice of
//                        the 2^20 pre-generated keys; a fresh guard sized for 2^20 live keys is built
//                        before every run, and the iteration count is fixed (2^20 / threads) so the
//                        table never overflows and calibration never reuses a key.
//   duplicate_begin      begin on keys that already succeeded (the duplicate check). The guard is
//                        filled once with the 2^20 keys; threads look keys up in a random order
//                        (the keys are stored in that order, so reading the input is sequential).
//
// Keys and fingerprints are generated before timing. items_per_second counts begin() calls (one
// item per iteration). Google Benchmark's real time is the mean of the threads' own run times; the
// counter wall_items_per_second divides all items by the elapsed time from the first thread's first
// iteration to the end of the run, which is the honest figure when 100 threads share 2 cores.
// The counter `unexpected` must be 0: it counts begin() answers other than the one the scenario
// expects (acquired for fresh keys, duplicate for existing ones).
//
// Results and the command that made them: docs/benchmarks.md. Ratios: bench/ratios.py.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "guards.hpp"
#include "idem_bench_build.hpp"

namespace idem_bench {
namespace {

constexpr std::size_t key_count = std::size_t{1} << 20;  // keys per run, and every guard's capacity

std::string key_text(std::size_t i) {
    // "TX20230615000042_PAY_v1": the composed shape of DESIGN.md's example, 23 bytes.
    char buf[48];
    std::snprintf(buf, sizeof buf, "TX%014llu_PAY_v1", 20230615000000ull + static_cast<unsigned long long>(i));
    return buf;
}

template <class K>
const std::vector<K>& keys() {
    static const std::vector<K> all = [] {
        std::vector<K> v;
        v.reserve(key_count);
        for (std::size_t i = 0; i < key_count; ++i) v.emplace_back(key_text(i));
        return v;
    }();
    return all;
}

/// One request fingerprint per key (never 0, which means "none").
const std::vector<std::uint64_t>& fingerprints() {
    static const std::vector<std::uint64_t> all = [] {
        std::vector<std::uint64_t> v(key_count);
        std::mt19937_64 rng(42);
        for (auto& f : v) f = rng() | 1;
        return v;
    }();
    return all;
}

/// A random order over the keys, for the lookups.
const std::vector<std::uint32_t>& lookup_order() {
    static const std::vector<std::uint32_t> all = [] {
        std::vector<std::uint32_t> v(key_count);
        std::iota(v.begin(), v.end(), 0u);
        std::shuffle(v.begin(), v.end(), std::mt19937_64(7));
        return v;
    }();
    return all;
}

/// The keys and fingerprints again, stored in lookup_order(): the lookups read their input
/// sequentially (as a request's key is in cache when it is checked) while the table sees random keys.
template <class K>
const std::vector<K>& shuffled_keys() {
    static const std::vector<K> all = [] {
        std::vector<K> v;
        v.reserve(key_count);
        for (std::uint32_t i : lookup_order()) v.push_back(keys<K>()[i]);
        return v;
    }();
    return all;
}

const std::vector<std::uint64_t>& shuffled_fingerprints() {
    static const std::vector<std::uint64_t> all = [] {
        std::vector<std::uint64_t> v;
        v.reserve(key_count);
        for (std::uint32_t i : lookup_order()) v.push_back(fingerprints()[i]);
        return v;
    }();
    return all;
}

/// State shared by the threads of one run. Thread 0 sets it up before the loop; the other threads
/// read it only inside the loop, after Google Benchmark's start barrier.
template <class G, class Scenario>
struct shared {
    static inline std::unique_ptr<G> guard;
    static inline std::atomic<std::int64_t> start_ns{0};
};

void note_start(std::atomic<std::int64_t>& start) noexcept {
    const std::int64_t t = now_ns();
    std::int64_t seen = start.load(std::memory_order_relaxed);
    while (t < seen && !start.compare_exchange_weak(seen, t, std::memory_order_relaxed)) {
    }
}

void report(benchmark::State& state, std::atomic<std::int64_t>& start, std::uint64_t unexpected) {
    state.SetItemsProcessed(state.iterations());
    state.counters["unexpected"] = static_cast<double>(unexpected);
    if (state.thread_index() == 0) {
        // After the loop: every thread has passed the stop barrier, so this is the end of the run.
        const double seconds = static_cast<double>(now_ns() - start.load(std::memory_order_relaxed)) * 1e-9;
        const double items = static_cast<double>(state.iterations()) * state.threads();
        state.counters["wall_items_per_second"] = items / seconds;
    }
}

struct fresh_tag {};
struct duplicate_tag {};

template <bench_guard G>
void fresh_begin_succeed(benchmark::State& state) {
    using sh = shared<G, fresh_tag>;
    const auto& ks = keys<typename G::key_type>();
    const auto& fps = fingerprints();
    const std::size_t slice = key_count / static_cast<std::size_t>(state.threads());
    const std::size_t first = slice * static_cast<std::size_t>(state.thread_index());
    const std::size_t last = first + slice;
    if (state.thread_index() == 0) {
        sh::guard.reset();
        sh::guard = std::make_unique<G>(key_count);
        sh::start_ns.store(std::numeric_limits<std::int64_t>::max(), std::memory_order_relaxed);
    }
    G* g = nullptr;
    std::size_t i = first;
    std::uint64_t unexpected = 0;
    for (auto _ : state) {
        if (g == nullptr) [[unlikely]] {
            g = sh::guard.get();
            if (g == nullptr) {
                state.SkipWithError("no guard");
                break;
            }
            note_start(sh::start_ns);
        }
        if (i == last) [[unlikely]] i = first;  // only if run with more iterations than keys: counted below
        auto c = g->begin(ks[i], fps[i]);
        if (c.status() == verdict::acquired) {
            if (!g->succeed(c, i)) ++unexpected;
        } else {
            ++unexpected;
        }
        ++i;
    }
    report(state, sh::start_ns, unexpected);
    if (state.thread_index() == 0) sh::guard.reset();
}

template <bench_guard G>
void duplicate_begin(benchmark::State& state) {
    using sh = shared<G, duplicate_tag>;
    const auto& ks = keys<typename G::key_type>();
    const auto& fps = fingerprints();
    const auto& lookup_keys = shuffled_keys<typename G::key_type>();
    const auto& lookup_fps = shuffled_fingerprints();
    if (state.thread_index() == 0) {
        if (!sh::guard) {  // filled once, kept for every run of this guard
            auto g = std::make_unique<G>(key_count);
            for (std::size_t i = 0; i < key_count; ++i) {
                auto c = g->begin(ks[i], fps[i]);
                if (c.status() != verdict::acquired || !g->succeed(c, i)) {
                    state.SkipWithError("could not fill the guard");
                    break;
                }
            }
            sh::guard = std::move(g);
        }
        sh::start_ns.store(std::numeric_limits<std::int64_t>::max(), std::memory_order_relaxed);
    }
    G* g = nullptr;
    std::size_t j = (key_count / static_cast<std::size_t>(state.threads())) * static_cast<std::size_t>(state.thread_index());
    std::uint64_t unexpected = 0;
    std::uint64_t sum = 0;
    for (auto _ : state) {
        if (g == nullptr) [[unlikely]] {
            g = sh::guard.get();
            if (g == nullptr) {
                state.SkipWithError("no guard");
                break;
            }
            note_start(sh::start_ns);
        }
        const std::size_t k = j & (key_count - 1);
        auto c = g->begin(lookup_keys[k], lookup_fps[k]);
        if (c.status() == verdict::duplicate) {
            sum += c.outcome();
        } else {
            ++unexpected;
        }
        ++j;
    }
    benchmark::DoNotOptimize(sum);
    report(state, sh::start_ns, unexpected);
}

template <bench_guard G>
void register_guard() {
    const std::string name(G::name);
    for (int threads : {1, 2, 100}) {
        benchmark::RegisterBenchmark(("fresh_begin_succeed/" + name).c_str(), fresh_begin_succeed<G>)
            ->Threads(threads)
            ->Iterations(static_cast<benchmark::IterationCount>(key_count / static_cast<std::size_t>(threads)))
            ->UseRealTime();
    }
}

template <bench_guard G>
void register_lookup() {
    const std::string name(G::name);
    benchmark::RegisterBenchmark(("duplicate_begin/" + name).c_str(), duplicate_begin<G>)
        ->Threads(1)
        ->Threads(2)
        ->Threads(100)
        ->UseRealTime();
}

}  // namespace
}  // namespace idem_bench

int main(int argc, char** argv) {
    using namespace idem_bench;
    register_guard<idem_guard>();
    register_guard<idem_prefault_guard>();
    register_guard<mutex_guard>();
    register_guard<tbb_guard>();
#if IDEM_BENCH_HAVE_LIBCUCKOO
    register_guard<cuckoo_guard>();
#endif
    register_lookup<idem_guard>();
    register_lookup<idem_prefault_guard>();
    register_lookup<mutex_guard>();
    register_lookup<tbb_guard>();
#if IDEM_BENCH_HAVE_LIBCUCKOO
    register_lookup<cuckoo_guard>();
#endif

    benchmark::AddCustomContext("compiler", IDEM_BENCH_COMPILER);
    benchmark::AddCustomContext("cxx_flags", IDEM_BENCH_CXX_FLAGS);
    benchmark::AddCustomContext("keys_per_run", std::to_string(key_count));
    benchmark::AddCustomContext("key_example", key_text(0));
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    // Keys before any timing (and before the first run's setup).
    (void)keys<idem::key>();
    (void)keys<std::string>();
    (void)shuffled_keys<idem::key>();
    (void)shuffled_keys<std::string>();
    (void)shuffled_fingerprints();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
