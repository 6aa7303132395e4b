// failover_bench: what a PostgreSQL failover pair costs (docs/benchmarks.md, "Failover"). Each run
// starts pairs of its own with scripts/lib/postgres.sh (pg_start, pg_standby_start, pg_kill,
// pg_promote; as the postgres user when run as root), on loopback.
//
//   idem-failover-bench --mode failover --guard durable|global [--threads T] [--reps R]
//   idem-failover-bench --mode commit-cost [--threads T] [--ops N] [--reps R]
//
// failover: per repetition a fresh pair (primary + synchronous standby); T threads (default 16) run
// begin + succeed on fresh keys through a sync durable_guard on postgres_store, or a global_guard,
// over the pair's multi-host URI (target_session_attrs=read-write). After 1 s of load the primary is
// killed (SIGKILL to its postmaster and every backend) and the standby promoted at once (what a
// failover manager does after it decided). Reports, per repetition and as p50 / max: promote_ms
// (the kill to the promoted standby accepting writes: pg_kill + pg_ctl promote -w) and
// first_ack_ms (the kill to the first succeed() acknowledged after the promotion returned: every
// such acknowledgement is a commit on the new primary). A real failover manager adds its detection
// time (pg_auto_failover, Patroni: seconds, configurable) before the promotion.
//
// commit-cost: one pair; T threads (default 64) run begin + succeed on N fresh keys (default 20000)
// through a sync durable_guard, alternately with the standby synchronous (synchronous_standby_names
// names it: every commit waits for its flush) and asynchronous (the setting emptied and reloaded:
// the standby still streams), R times each (default 3); reports acknowledged operations/s and the
// p50 / p99 of succeed() per mode (medians over the repetitions) and sync / async.
//
// Prints one JSON object per run on stdout. Not a test: no assertion on time.
#include <idem/durable.hpp>
#include <idem/global_guard.hpp>
#include <idem/stores/postgres_store.hpp>

#include "support/private_pg.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

/// A primary and a synchronous standby (tests/support/private_pg.hpp), removed by the destructor.
struct pair_servers : idem_test::private_pair {
    pair_servers() {
        if (uri().empty()) {
            std::fprintf(stderr, "failover_bench: could not start a pair with scripts/lib/postgres.sh\n");
            std::exit(3);
        }
    }
    bool set_sync(bool on) {
        const std::string names = on ? "idem_standby" : "";
        return psql(primary_uri(), "ALTER SYSTEM SET synchronous_standby_names = '" + names + "'").empty() &&
               psql(primary_uri(), "SELECT pg_reload_conf()") == "t\n";
    }
};

double ms_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return -1;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

/// begin + succeed through either guard; true when succeed() was acknowledged.
struct any_guard {
    std::unique_ptr<idem::durable_guard> durable;
    std::unique_ptr<idem::global_guard> global;
    bool pay(const idem::key& k) {
        if (durable) {
            auto r = durable->guard().begin(k);
            return r.status == idem::begin_status::acquired && !r.ticket.succeed(1);
        }
        auto r = global->begin(k);
        return r.status == idem::begin_status::acquired && !r.ticket.succeed(1);
    }
};

any_guard open_guard(const std::string& kind, const std::string& uri) {
    any_guard g;
    idem::options o;
    o.capacity = 1u << 20;
    o.maintenance_interval = {};
    if (kind == "durable") {
        idem::store_options so;
        so.mode = idem::durability::sync;
        so.sync_timeout = 2s;
        so.max_backoff = 20ms;
        g.durable = std::make_unique<idem::durable_guard>(std::make_unique<idem::postgres_store>(uri, 2s), o, so);
    } else {
        idem::global_options go;
        go.call_deadline = 2s;
        go.wait_timeout = 3s;
        go.max_backoff = 20ms;
        g.global = std::make_unique<idem::global_guard>(uri, o, go);
    }
    return g;
}

int run_failover(const std::string& kind, int threads, int reps) {
    std::vector<double> promote_ms, first_ack_ms;
    for (int rep = 0; rep < reps; ++rep) {
        pair_servers pair;
        any_guard g = open_guard(kind, pair.uri());
        std::atomic<bool> stop{false};
        std::atomic<std::uint64_t> acks{0};
        std::atomic<std::int64_t> first_after_ns{-1};  // first ack after `promoted`, since clock epoch
        std::atomic<std::int64_t> promoted_ns{-1};
        std::latch go(threads + 1);
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t)
            pool.emplace_back([&, t] {
                go.arrive_and_wait();
                for (std::uint64_t i = 0; !stop.load(); ++i) {
                    const idem::key k("FO" + std::to_string(rep) + "-" + std::to_string(t) + "-" + std::to_string(i));
                    if (!g.pay(k)) continue;
                    acks.fetch_add(1);
                    const auto now = clock_type::now().time_since_epoch().count();
                    const auto p = promoted_ns.load();
                    std::int64_t none = -1;
                    if (p >= 0 && now >= p) first_after_ns.compare_exchange_strong(none, now);
                }
            });
        go.arrive_and_wait();
        std::this_thread::sleep_for(1s);  // load before the kill (a measurement's warm-up, not synchronization)
        const std::uint64_t acks_before = acks.load();
        const auto killed = clock_type::now();
        const bool killed_ok = pair.crash();
        const auto dead = clock_type::now();
        const bool ok = killed_ok && pair.resume();
        const auto promoted = clock_type::now();
        promoted_ns = promoted.time_since_epoch().count();
        const auto give_up = promoted + 60s;
        while (ok && first_after_ns.load() < 0 && clock_type::now() < give_up) std::this_thread::sleep_for(1ms);
        stop = true;
        for (auto& th : pool) th.join();
        const auto first = first_after_ns.load();
        const double pm = ms_between(killed, promoted);
        const double fa = first < 0 ? -1 : ms_between(killed, clock_type::time_point(clock_type::duration(first)));
        promote_ms.push_back(pm);
        if (fa >= 0) first_ack_ms.push_back(fa);
        std::printf(
            "{\"bench\":\"failover\",\"guard\":\"%s\",\"rep\":%d,\"threads\":%d,\"acks_before_kill\":%llu,"
            "\"kill_ms\":%.1f,\"promote_ms\":%.1f,\"first_ack_ms\":%.1f,\"ok\":%s}\n",
            kind.c_str(), rep, threads, static_cast<unsigned long long>(acks_before), ms_between(killed, dead), pm, fa,
            ok && fa >= 0 ? "true" : "false");
        std::fflush(stdout);
    }
    std::printf(
        "{\"bench\":\"failover_summary\",\"guard\":\"%s\",\"reps\":%d,\"threads\":%d,\"promote_ms_p50\":%.1f,"
        "\"promote_ms_max\":%.1f,\"first_ack_ms_p50\":%.1f,\"first_ack_ms_max\":%.1f,\"failed_reps\":%zu}\n",
        kind.c_str(), reps, threads, percentile(promote_ms, 0.5), percentile(promote_ms, 1.0), percentile(first_ack_ms, 0.5),
        percentile(first_ack_ms, 1.0), promote_ms.size() - first_ack_ms.size());
    return first_ack_ms.size() == promote_ms.size() ? 0 : 1;
}

struct cost_run {
    double ops_per_s = 0, p50_us = 0, p99_us = 0;
};

cost_run run_cost_once(const std::string& uri, int threads, int ops, int tag) {
    any_guard g = open_guard("durable", uri);
    std::vector<std::vector<double>> lat(threads);
    std::atomic<int> next{0};
    std::latch go(threads + 1);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            go.arrive_and_wait();
            for (int i; (i = next.fetch_add(1)) < ops;) {
                const idem::key k("CC" + std::to_string(tag) + "-" + std::to_string(i));
                auto r = g.durable->guard().begin(k);
                if (r.status != idem::begin_status::acquired) continue;
                const auto t0 = clock_type::now();
                if (!r.ticket.succeed(1))
                    lat[t].push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
            }
        });
    const auto t0 = clock_type::now();
    go.arrive_and_wait();
    for (auto& th : pool) th.join();
    const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    std::vector<double> all;
    for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
    return {static_cast<double>(all.size()) / secs, percentile(all, 0.5), percentile(all, 0.99)};
}

int run_cost(int threads, int ops, int reps) {
    pair_servers pair;
    std::vector<double> rate[2], p50[2], p99[2];
    int tag = 0;
    for (int rep = 0; rep < reps; ++rep)
        for (int sync = 0; sync < 2; ++sync) {
            const int mode = rep % 2 == 0 ? sync : 1 - sync;  // alternate which runs first
            if (!pair.set_sync(mode == 1)) {
                std::fprintf(stderr, "failover_bench: could not set synchronous_standby_names\n");
                return 3;
            }
            const cost_run r = run_cost_once(pair.uri(), threads, ops, tag++);
            rate[mode].push_back(r.ops_per_s);
            p50[mode].push_back(r.p50_us);
            p99[mode].push_back(r.p99_us);
            std::printf(
                "{\"bench\":\"commit_cost\",\"standby\":\"%s\",\"rep\":%d,\"threads\":%d,\"ops\":%d,"
                "\"acks_per_s\":%.0f,\"p50_us\":%.0f,\"p99_us\":%.0f}\n",
                mode ? "sync" : "async", rep, threads, ops, r.ops_per_s, r.p50_us, r.p99_us);
            std::fflush(stdout);
        }
    const double a = percentile(rate[0], 0.5), s = percentile(rate[1], 0.5);
    std::printf(
        "{\"bench\":\"commit_cost_summary\",\"threads\":%d,\"ops\":%d,\"reps\":%d,\"async_acks_per_s\":%.0f,"
        "\"sync_acks_per_s\":%.0f,\"sync_over_async\":%.3f,\"async_p50_us\":%.0f,\"async_p99_us\":%.0f,"
        "\"sync_p50_us\":%.0f,\"sync_p99_us\":%.0f}\n",
        threads, ops, reps, a, s, a > 0 ? s / a : 0.0, percentile(p50[0], 0.5), percentile(p99[0], 0.5),
        percentile(p50[1], 0.5), percentile(p99[1], 0.5));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string mode, guard = "durable";
    int threads = -1, reps = -1, ops = 20000;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--mode") mode = v;
        else if (a == "--guard") guard = v;
        else if (a == "--threads") threads = std::atoi(v.c_str());
        else if (a == "--reps") reps = std::atoi(v.c_str());
        else if (a == "--ops") ops = std::atoi(v.c_str());
        else {
            std::fprintf(stderr, "failover_bench: unknown option %s\n", a.c_str());
            return 2;
        }
    }
    if (mode == "failover" && (guard == "durable" || guard == "global"))
        return run_failover(guard, threads > 0 ? threads : 16, reps > 0 ? reps : 5);
    if (mode == "commit-cost") return run_cost(threads > 0 ? threads : 64, ops, reps > 0 ? reps : 3);
    std::fprintf(stderr,
                 "usage: idem-failover-bench --mode failover --guard durable|global [--threads T] [--reps R]\n"
                 "       idem-failover-bench --mode commit-cost [--threads T] [--ops N] [--reps R]\n");
    return 2;
}
