// bench/metrics_bench.cpp: what one scrape costs: to_prometheus(g.snapshot(), g.operation_latencies())
// on an idem::guard holding 1,000 and 1,000,000 succeeded records (Google Benchmark). The exposition
// reads counters and the per-operation histograms, never the table, so both sizes must cost the
// same. Results and the command: docs/api.md, "Metrics".
//
//   idem-metrics-bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <idem/guard.hpp>
#include <idem/key.hpp>
#include <idem/stats.hpp>

#include <benchmark/benchmark.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

namespace {

// Eight operations, so the exposition carries eight latency/lease rows as well as the counters.
constexpr std::array<const char*, 8> operations{"PAY",  "REFUND", "TRANSFER", "CAPTURE",
                                                "VOID", "PAYOUT", "TOPUP",    "CHARGEBACK"};

/// A guard filled with `records` succeeded records (built once per size, kept for the process).
idem::guard& filled_guard(std::size_t records) {
    static std::map<std::size_t, std::unique_ptr<idem::guard>> guards;
    auto& g = guards[records];
    if (g) return *g;
    idem::options o;
    o.capacity = records + records / 2 + 1024;
    o.maintenance_interval = {};  // no background thread: only the benchmark runs
    o.adaptive.enabled = true;    // per-operation latency rows in the exposition
    g = std::make_unique<idem::guard>(o);
    for (std::size_t i = 0; i < records; ++i) {
        const idem::key k("TX" + std::to_string(i) + "_" + operations[i % operations.size()] + "_v1");
        auto r = g->begin(k);
        if (!r || r.ticket.succeed(1)) {
            std::fprintf(stderr, "metrics_bench: record %zu was not stored\n", i);
            std::exit(1);
        }
    }
    if (g->snapshot().succeeded != records) {
        std::fprintf(stderr, "metrics_bench: %llu records succeeded, %zu expected\n",
                     static_cast<unsigned long long>(g->snapshot().succeeded), records);
        std::exit(1);
    }
    return *g;
}

void BM_to_prometheus(benchmark::State& state) {
    const auto records = static_cast<std::size_t>(state.range(0));
    idem::guard& g = filled_guard(records);
    std::size_t bytes = 0;
    for (auto _ : state) {
        const std::string text = idem::to_prometheus(g.snapshot(), g.operation_latencies());
        bytes = text.size();
        benchmark::DoNotOptimize(text.data());
    }
    state.counters["records"] = static_cast<double>(g.snapshot().succeeded);
    state.counters["bytes"] = static_cast<double>(bytes);
    state.counters["operations"] = static_cast<double>(g.operation_latencies().size());
}
BENCHMARK(BM_to_prometheus)->Arg(1'000)->Arg(1'000'000)->ArgName("records")->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
