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
//   cold_window_fresh    begin + succeed on 2^20 fresh random UUID keys (1 and 2 threads), on a
//                        guard with a cold window of 10M keys (IDEM_BENCH_COLD_KEYS) beside the
//                        same guard without one (bench/guards.hpp, basic_idem_window_guard): what
//                        the idempotency window's filter costs a fresh key. Counters: recalls_per_op
//                        (the filter's false positives, each a store read in a durable guard),
//                        cold_keys, cold_bytes_per_key, cold_slices.
//
//   batch_begin          begin + succeed on fresh keys in batches of 8, 32 and 128 (one thread):
//                        guard::begin_many against a loop of begin() (see register_batch).
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
#include <cmath>
#include <cstdlib>
#include <atomic>
#include <cstdio>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include "guards.hpp"
#include "idem_bench_build.hpp"
#include "net_guards.hpp"
#include "uuid_keys.hpp"

namespace idem_bench {
namespace {

/// Keys per run and every in-process guard's capacity: 2^20, or IDEM_BENCH_KEYS (a power of two;
/// scripts/bench --quick uses 2^18). Set once in main() before anything else reads it.
std::size_t key_count = std::size_t{1} << 20;

/// Keys per run for the networked peers, whose every claim is a round trip (and on PostgreSQL a
/// commit): IDEM_BENCH_REDIS_KEYS (default 2^15) and IDEM_BENCH_PG_KEYS (default 2^12).
std::size_t redis_keys = std::size_t{1} << 15;
std::size_t pg_keys = std::size_t{1} << 12;

template <class G>
std::size_t keys_for() {
    if constexpr (std::is_same_v<G, redis_guard>) return std::min(redis_keys, key_count);
    else if constexpr (std::is_same_v<G, postgres_guard>) return std::min(pg_keys, key_count);
    else return key_count;
}

/// A networked peer opens one connection per benchmark thread before the timed loop (thread 0,
/// before the start barrier) and each thread picks its own at its first iteration.
template <class G>
void connect_threads(G* g, const benchmark::State& state) {
    if constexpr (requires { g->connect(std::size_t{1}); })
        if (g != nullptr) g->connect(static_cast<std::size_t>(state.threads()));
}
template <class G>
void bind_thread(G* g, const benchmark::State& state) {
    if constexpr (requires { g->use(std::size_t{0}); }) g->use(static_cast<std::size_t>(state.thread_index()));
}

/// The guard under test, or a skipped run that names what is missing (a peer's server).
template <class G>
std::unique_ptr<G> make_guard(benchmark::State& state, std::size_t capacity) {
    try {
        return std::make_unique<G>(capacity);
    } catch (const std::exception& e) {
        state.SkipWithError(e.what());
        return nullptr;
    }
}

std::string key_text(std::size_t i) {
    // "TX20230615000042_PAY_v1": the composed TXID_OPERATION_vN shape, 23 bytes.
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

/// The overhead scenario's keys: UUID-v4 text (36 bytes) in the random order a PRNG draws them
/// (bench/uuid_keys.hpp), as clients send them; overhead_keys of them, at most key_count.
constexpr std::size_t overhead_keys = 16384;

template <class K>
const std::vector<K>& uuid_keys() {
    static const std::vector<K> all = [] {
        std::vector<K> v;
        const std::size_t n = std::min(key_count, overhead_keys);
        v.reserve(n);
        std::mt19937_64 rng(14);
        for (std::size_t i = 0; i < n; ++i) v.emplace_back(format_uuid(draw_uuid(rng)));
        return v;
    }();
    return all;
}

/// The cold-window scenario's keys: key_count UUID-v4 keys in the order drawn (another seed than
/// uuid_keys() and than the cold window's own keys).
const std::vector<idem::key>& fresh_uuid_keys() {
    static const std::vector<idem::key> all = [] {
        std::vector<idem::key> v;
        v.reserve(key_count);
        std::mt19937_64 rng(15);
        for (std::size_t i = 0; i < key_count; ++i) v.emplace_back(format_uuid(draw_uuid(rng)));
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

/// A thread's first iteration: the guard thread 0 made, this thread's connection (networked peers),
/// and the start of the run's wall-clock. Null (the run is skipped) when there is no guard.
template <class Shared>
auto attach(benchmark::State& state) -> decltype(Shared::guard.get()) {
    auto* g = Shared::guard.get();
    if (g == nullptr) {
        state.SkipWithError("no guard");
        return nullptr;
    }
    bind_thread(g, state);
    note_start(Shared::start_ns);
    return g;
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
    const std::size_t n = keys_for<G>();
    const std::size_t slice = n / static_cast<std::size_t>(state.threads());
    const std::size_t first = slice * static_cast<std::size_t>(state.thread_index());
    const std::size_t last = first + slice;
    if (state.thread_index() == 0) {
        sh::guard.reset();
        sh::guard = make_guard<G>(state, n);
        connect_threads(sh::guard.get(), state);
        sh::start_ns.store(std::numeric_limits<std::int64_t>::max(), std::memory_order_relaxed);
    }
    G* g = nullptr;
    std::size_t i = first;
    std::uint64_t unexpected = 0;
    for (auto _ : state) {
        if (g == nullptr) [[unlikely]] {
            if ((g = attach<sh>(state)) == nullptr) break;
        }
        if (i == last) [[unlikely]]
            i = first;  // only if run with more iterations than keys: counted below
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
    const std::size_t n = keys_for<G>();
    if (state.thread_index() == 0) {
        if (!sh::guard) {  // filled once, kept for every run of this guard
            auto g = make_guard<G>(state, n);
            for (std::size_t i = 0; g && i < n; ++i) {
                auto c = g->begin(ks[i], fps[i]);
                if (c.status() != verdict::acquired || !g->succeed(c, i)) {
                    state.SkipWithError("could not fill the guard");
                    break;
                }
            }
            sh::guard = std::move(g);
        }
        connect_threads(sh::guard.get(), state);
        sh::start_ns.store(std::numeric_limits<std::int64_t>::max(), std::memory_order_relaxed);
    }
    G* g = nullptr;
    std::size_t j = (n / static_cast<std::size_t>(state.threads())) * static_cast<std::size_t>(state.thread_index());
    std::uint64_t unexpected = 0;
    std::uint64_t sum = 0;
    for (auto _ : state) {
        if (g == nullptr) [[unlikely]] {
            if ((g = attach<sh>(state)) == nullptr) break;
        }
        // In-process guards read the keys in the pre-shuffled order; a networked peer holds the
        // first n keys and visits them in a fixed odd-stride order (a permutation, n a power of two).
        const std::size_t k = n == key_count ? (j & (key_count - 1)) : ((j * 2654435761u) & (n - 1));
        auto c = n == key_count ? g->begin(lookup_keys[k], lookup_fps[k]) : g->begin(ks[k], fps[k]);
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

// ---- fresh keys beside a cold window ---------------------------------------------------------------
// As fresh_begin_succeed, on random UUID keys, for the two window guards (guards.hpp): the one with
// 10M keys in its cold window and the same guard without. The guard (and its filter) is built
// before each run, untimed.

struct cold_tag {};

template <bench_guard G>
void cold_window_fresh(benchmark::State& state) {
    using sh = shared<G, cold_tag>;
    const auto& ks = fresh_uuid_keys();
    const auto& fps = fingerprints();
    const std::size_t slice = key_count / static_cast<std::size_t>(state.threads());
    const std::size_t first = slice * static_cast<std::size_t>(state.thread_index());
    const std::size_t last = first + slice;
    if (state.thread_index() == 0) {
        sh::guard.reset();
        sh::guard = make_guard<G>(state, key_count);
        sh::start_ns.store(std::numeric_limits<std::int64_t>::max(), std::memory_order_relaxed);
    }
    G* g = nullptr;
    std::size_t i = first;
    std::uint64_t unexpected = 0;
    for (auto _ : state) {
        if (g == nullptr) [[unlikely]] {
            if ((g = attach<sh>(state)) == nullptr) break;
        }
        if (i == last) [[unlikely]]
            i = first;
        auto c = g->begin(ks[i], fps[i]);
        if (c.status() == verdict::acquired) {
            if (!g->succeed(c, i)) ++unexpected;
        } else {
            ++unexpected;
        }
        ++i;
    }
    report(state, sh::start_ns, unexpected);
    if (state.thread_index() == 0 && sh::guard) {
        const auto s = sh::guard->snapshot();
        const double ops = static_cast<double>(state.iterations()) * state.threads();
        state.counters["recalls_per_op"] = static_cast<double>(s.recalls) / ops;
        state.counters["cold_keys"] = static_cast<double>(s.cold_keys);
        state.counters["cold_bytes_per_key"] = s.cold_keys != 0
                                                   ? static_cast<double>(s.cold_bytes) / static_cast<double>(s.cold_keys)
                                                   : 0.0;
        state.counters["cold_slices"] = static_cast<double>(sh::guard->cold_slices());
        sh::guard.reset();
    }
}

// ---- skewed keys: Zipf(0.99) ---------------------------------------------------------------------
// A stream of key_count requests whose keys follow Zipf's law with exponent 0.99 over key_count keys
// (rank r drawn with weight 1 / r^0.99; ranks are spread over the keys by lookup_order()): a few
// hot keys are retried again and again, as clients retry a payment. Each request is begin(); an
// acquired claim is completed at once; a duplicate reads the outcome.

const std::vector<std::uint32_t>& zipf_stream() {
    static const std::vector<std::uint32_t> all = [] {
        std::vector<double> cdf(key_count);
        double sum = 0;
        for (std::size_t r = 0; r < key_count; ++r) cdf[r] = sum += 1.0 / std::pow(static_cast<double>(r + 1), 0.99);
        std::mt19937_64 rng(99);
        std::uniform_real_distribution<double> u(0, sum);
        std::vector<std::uint32_t> v(key_count);
        for (auto& x : v) {
            const auto r = static_cast<std::size_t>(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin());
            x = lookup_order()[std::min(r, key_count - 1)];
        }
        return v;
    }();
    return all;
}

struct zipf_tag {};

template <bench_guard G>
void zipf_begin(benchmark::State& state) {
    using sh = shared<G, zipf_tag>;
    const auto& ks = keys<typename G::key_type>();
    const auto& fps = fingerprints();
    const auto& stream = zipf_stream();
    const std::size_t slice = key_count / static_cast<std::size_t>(state.threads());
    const std::size_t first = slice * static_cast<std::size_t>(state.thread_index());
    if (state.thread_index() == 0) {
        sh::guard.reset();
        sh::guard = make_guard<G>(state, key_count);
        sh::start_ns.store(std::numeric_limits<std::int64_t>::max(), std::memory_order_relaxed);
    }
    G* g = nullptr;
    std::size_t i = first;
    std::uint64_t unexpected = 0, acquired = 0, sum = 0;
    for (auto _ : state) {
        if (g == nullptr) [[unlikely]] {
            if ((g = attach<sh>(state)) == nullptr) break;
        }
        const std::uint32_t k = stream[i++];
        auto c = g->begin(ks[k], fps[k]);
        switch (c.status()) {
            case verdict::acquired:
                ++acquired;
                if (!g->succeed(c, k)) ++unexpected;
                break;
            case verdict::duplicate: sum += c.outcome(); break;
            case verdict::busy: break;  // another thread holds the hot key's claim right now
            case verdict::rejected: ++unexpected; break;
        }
    }
    benchmark::DoNotOptimize(sum);
    state.counters["acquired"] = benchmark::Counter(static_cast<double>(acquired), benchmark::Counter::kAvgThreads);
    report(state, sh::start_ns, unexpected);
    if (state.thread_index() == 0) sh::guard.reset();
}

// ---- guard overhead on a 10 microsecond operation -------------------------------------------------
// The payment the guard protects, simulated as 10 us of work (a spin on steady_clock: a sleep would
// measure the scheduler), run unguarded and inside begin()/succeed() of each guard, on fresh keys.
// The throughput lost to the guard, in percent, is in results.json (bench/report.py).
// Keys: random-order UUIDs (uuid_keys()) for every guard; the durable guard runs a second time on
// the sequential TX... keys, as "idem_durable_sqlite_sequential", the figure published before
// (sequential keys append at the right edge of SQLite's B-tree).

void simulated_payment() noexcept {
    const std::int64_t until = now_ns() + 10'000;
    while (now_ns() < until) {
    }
}

struct unguarded {
    using key_type = std::string;
    static constexpr std::string_view name = "unguarded";
};

template <bool Sequential>
struct overhead_tag {};

/// The durable guard's flusher counters at the start of an overhead run (thread 0 takes them).
struct flusher_mark {
    std::uint64_t cpu_ns = 0, transitions = 0;
};

template <class G, bool Sequential = false>
void overhead_10us(benchmark::State& state) {
    using sh = shared<G, overhead_tag<Sequential>>;
    constexpr bool guarded = !std::is_same_v<G, unguarded>;
    const std::size_t n = std::min<std::size_t>(keys_for<G>(), overhead_keys);
    const std::size_t slice = n / static_cast<std::size_t>(state.threads());
    const std::size_t first = slice * static_cast<std::size_t>(state.thread_index());
    const auto& ks = Sequential ? keys<typename G::key_type>() : uuid_keys<typename G::key_type>();
    const auto& fps = fingerprints();
    if (state.thread_index() == 0) {
        if constexpr (guarded) {
            // Sized for the keys of the run, as a service sizes its table for its live set: a table
            // for a million keys would charge the first touch of a fresh (huge) page to most claims.
            sh::guard.reset();
            sh::guard = make_guard<G>(state, n);
            connect_threads(sh::guard.get(), state);
        }
        sh::start_ns.store(std::numeric_limits<std::int64_t>::max(), std::memory_order_relaxed);
    }
    static flusher_mark mark;  // thread 0 only
    if constexpr (requires(G & d) { d.snapshot().flusher_cpu_ns; })
        if (state.thread_index() == 0 && sh::guard) {
            const auto s = sh::guard->snapshot();
            mark = {s.flusher_cpu_ns, s.flushed_transitions};
        }
    G* g = nullptr;
    std::size_t i = first;
    std::uint64_t unexpected = 0;
    bool started = false;
    for (auto _ : state) {
        if (!started) [[unlikely]] {
            started = true;
            if constexpr (guarded) {
                g = sh::guard.get();
                if (g == nullptr) {
                    state.SkipWithError("no guard");
                    break;
                }
                bind_thread(g, state);
            }
            note_start(sh::start_ns);
        }
        if constexpr (guarded) {
            auto c = g->begin(ks[i], fps[i]);
            if (c.status() == verdict::acquired) {
                simulated_payment();
                if (!g->succeed(c, i)) ++unexpected;
            } else {
                ++unexpected;
            }
        } else {
            benchmark::DoNotOptimize(ks[i]);
            simulated_payment();
        }
        ++i;
    }
    report(state, sh::start_ns, unexpected);
    // The durable guard: what its flusher did while the operations ran (after the stop barrier;
    // rows still queued are flushed after timing, by the guard's destructor). flusher_cpu_ns_per_op:
    // the flusher's CPU time per guarded operation (two transitions), the core it takes from the
    // callers on a machine with as many cores as callers; flushed_share: transitions committed
    // during the run / transitions made.
    if constexpr (requires(G & d) { d.snapshot().flusher_cpu_ns; })
        if (state.thread_index() == 0 && sh::guard) {
            const auto s = sh::guard->snapshot();
            const double ops = static_cast<double>(state.iterations()) * state.threads();
            state.counters["flusher_cpu_ns_per_op"] = static_cast<double>(s.flusher_cpu_ns - mark.cpu_ns) / ops;
            state.counters["flushed_share"] = static_cast<double>(s.flushed_transitions - mark.transitions) / (2 * ops);
        }
    if constexpr (guarded)
        if (state.thread_index() == 0) sh::guard.reset();
}

// ---- memory per live record -------------------------------------------------------------------------
// Resident memory added by a guard holding key_count completed records, divided by key_count. Run
// each guard in its own process (scripts/bench does: --benchmark_filter=memory/<guard>), or memory
// freed by an earlier benchmark and reused by the allocator hides part of a peer's cost.

std::size_t resident_bytes() {
    long pages = 0, resident = 0;
    if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        std::fclose(f);
    }
    return static_cast<std::size_t>(resident) * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

template <bench_guard G>
void memory(benchmark::State& state) {
    const auto& ks = keys<typename G::key_type>();
    const auto& fps = fingerprints();
    double per_record = 0;
    for (auto _ : state) {
        const std::size_t before = resident_bytes();
        auto g = make_guard<G>(state, key_count);
        if (!g) break;
        for (std::size_t i = 0; i < key_count; ++i) {
            auto c = g->begin(ks[i], fps[i]);
            if (c.status() != verdict::acquired || !g->succeed(c, i)) {
                state.SkipWithError("could not fill the guard");
                break;
            }
        }
        per_record = static_cast<double>(resident_bytes() - before) / static_cast<double>(key_count);
    }
    state.counters["bytes_per_record"] = per_record;
}

template <bench_guard G>
void register_guard() {
    const std::string name(G::name);
    for (int threads : {1, 2, 100}) {
        benchmark::RegisterBenchmark(("fresh_begin_succeed/" + name).c_str(), fresh_begin_succeed<G>)
            ->Threads(threads)
            ->Iterations(static_cast<benchmark::IterationCount>(keys_for<G>() / static_cast<std::size_t>(threads)))
            ->UseRealTime();
    }
}

template <bench_guard G>
void register_cold_window() {
    const std::string name(G::name);
    for (int threads : {1, 2})
        benchmark::RegisterBenchmark(("cold_window_fresh/" + name).c_str(), cold_window_fresh<G>)
            ->Threads(threads)
            ->Iterations(static_cast<benchmark::IterationCount>(key_count / static_cast<std::size_t>(threads)))
            ->UseRealTime();
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

template <bench_guard G>
void register_in_process() {
    const std::string name(G::name);
    for (int threads : {1, 2, 100})
        benchmark::RegisterBenchmark(("zipf_begin/" + name).c_str(), zipf_begin<G>)
            ->Threads(threads)
            ->Iterations(static_cast<benchmark::IterationCount>(key_count / static_cast<std::size_t>(threads)))
            ->UseRealTime();
    benchmark::RegisterBenchmark(("memory/" + name).c_str(), memory<G>)->Iterations(1)->Unit(benchmark::kMillisecond);
}

template <class G, bool Sequential = false>
void register_overhead() {
    const std::string name = std::string(G::name) + (Sequential ? "_sequential" : "");
    for (int threads : {1, 2}) {
        const std::size_t n = std::min<std::size_t>(keys_for<G>(), overhead_keys);
        benchmark::RegisterBenchmark(("overhead_10us/" + name).c_str(), overhead_10us<G, Sequential>)
            ->Threads(threads)
            ->Iterations(static_cast<benchmark::IterationCount>(n / static_cast<std::size_t>(threads)))
            ->UseRealTime();
    }
}

// ---- batched claims: begin_many against a loop of begin ---------------------------------------------
// batch_begin/loop/B and batch_begin/many/B: begin + succeed on the 2^20 fresh keys, one thread, a
// fresh idem::guard (default options, capacity 2^20) built before every run; one iteration is one
// batch of B keys, claimed by B calls of begin() (loop) or one call of begin_many() (many), then
// each ticket succeeds. items_per_second counts keys. `unexpected` counts answers other than acquired.

template <bool Many>
void batch_begin(benchmark::State& state) {
    const auto& ks = keys<idem::key>();
    const auto& fps = fingerprints();
    const std::size_t b = static_cast<std::size_t>(state.range(0));
    idem::options o;
    o.capacity = key_count;
    o.maintenance_interval = {};
    auto g = std::make_unique<idem::guard>(o);
    std::vector<idem::begin_result> out(b);
    std::size_t i = 0;
    std::uint64_t unexpected = 0;
    for (auto _ : state) {
        if (i + b > key_count) [[unlikely]]
            i = 0;  // only if run with more iterations than keys
        const std::span<const idem::key> batch(ks.data() + i, b);
        const std::span<const std::uint64_t> batch_fps(fps.data() + i, b);
        if constexpr (Many) {
            g->begin_many(batch, out, batch_fps);
        } else {
            for (std::size_t j = 0; j < b; ++j) out[j] = g->begin(batch[j], batch_fps[j]);
        }
        for (std::size_t j = 0; j < b; ++j) {
            if (out[j].status != idem::begin_status::acquired || out[j].ticket.succeed(i + j)) ++unexpected;
        }
        i += b;
    }
    state.SetItemsProcessed(state.iterations() * static_cast<benchmark::IterationCount>(b));
    state.counters["unexpected"] = static_cast<double>(unexpected);
    g.reset();  // after the loop: not timed
}

void register_batch() {
    for (int b : {8, 32, 128}) {
        const auto iterations = static_cast<benchmark::IterationCount>(key_count / static_cast<std::size_t>(b));
        benchmark::RegisterBenchmark("batch_begin/loop", batch_begin<false>)->Arg(b)->Iterations(iterations)->UseRealTime();
        benchmark::RegisterBenchmark("batch_begin/many", batch_begin<true>)->Arg(b)->Iterations(iterations)->UseRealTime();
    }
}

std::size_t env_keys(const char* var, std::size_t fallback) {
    const char* v = std::getenv(var);
    if (v == nullptr || *v == 0) return fallback;
    const auto n = static_cast<std::size_t>(std::strtoull(v, nullptr, 10));
    if (n < 1024 || (n & (n - 1)) != 0) {
        std::fprintf(stderr, "idem-bench: %s=%s must be a power of two, at least 1024\n", var, v);
        std::exit(2);
    }
    return n;
}

}  // namespace
}  // namespace idem_bench

int main(int argc, char** argv) {
    using namespace idem_bench;
    key_count = env_keys("IDEM_BENCH_KEYS", key_count);
    redis_keys = env_keys("IDEM_BENCH_REDIS_KEYS", redis_keys);
    pg_keys = env_keys("IDEM_BENCH_PG_KEYS", pg_keys);
    if (const char* c = std::getenv("IDEM_BENCH_COLD_KEYS"); c != nullptr && *c != 0)
        cold_window_keys = static_cast<std::size_t>(std::strtoull(c, nullptr, 10));
    register_guard<idem_guard>();
    register_guard<idem_prefault_guard>();
    register_guard<idem_payload_guard>();
    register_guard<idem_scraped_guard>();
    register_batch();
    register_guard<mutex_guard>();
    register_guard<tbb_guard>();
#if IDEM_BENCH_HAVE_LIBCUCKOO
    register_guard<cuckoo_guard>();
#endif
    register_guard<redis_guard>();
    register_guard<postgres_guard>();
    register_lookup<idem_guard>();
    register_lookup<idem_prefault_guard>();
    register_lookup<idem_payload_guard>();
    register_lookup<mutex_guard>();
    register_lookup<tbb_guard>();
#if IDEM_BENCH_HAVE_LIBCUCKOO
    register_lookup<cuckoo_guard>();
#endif
    register_lookup<redis_guard>();
    register_lookup<postgres_guard>();
    register_in_process<idem_guard>();
    register_in_process<idem_prefault_guard>();
    register_in_process<mutex_guard>();
    register_in_process<tbb_guard>();
#if IDEM_BENCH_HAVE_LIBCUCKOO
    register_in_process<cuckoo_guard>();
#endif
    register_cold_window<idem_no_cold_window_guard>();
    register_cold_window<idem_cold_window_guard>();
    register_overhead<unguarded>();
    register_overhead<idem_guard>();
    register_overhead<idem_durable_guard>();
    register_overhead<idem_durable_guard, true>();
#ifdef IDEM_BENCH_HAVE_ROCKSDB
    register_overhead<idem_durable_rocksdb_guard>();
#endif
    register_overhead<redis_guard>();
    register_overhead<postgres_guard>();

    benchmark::AddCustomContext("compiler", IDEM_BENCH_COMPILER);
    benchmark::AddCustomContext("cxx_flags", IDEM_BENCH_CXX_FLAGS);
    benchmark::AddCustomContext("keys_per_run", std::to_string(key_count));
    benchmark::AddCustomContext("redis_keys_per_run", std::to_string(redis_keys));
    benchmark::AddCustomContext("pg_keys_per_run", std::to_string(pg_keys));
    benchmark::AddCustomContext("cold_window_keys", std::to_string(cold_window_keys));
    benchmark::AddCustomContext("key_example", key_text(0));
    benchmark::AddCustomContext("overhead_key_example", uuid_keys<std::string>().front());
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    // Keys before any timing (and before the first run's setup).
    (void)keys<idem::key>();
    (void)keys<std::string>();
    (void)uuid_keys<idem::key>();
    (void)uuid_keys<std::string>();
    (void)fresh_uuid_keys();
    (void)shuffled_keys<idem::key>();
    (void)shuffled_keys<std::string>();
    (void)shuffled_fingerprints();
    (void)zipf_stream();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
