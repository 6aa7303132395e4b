// flush_bench: what the durable pipeline sustains, per store (docs/benchmarks.md, "Durability").
//
//   flush_bench --store sqlite:/tmp/f.db|postgresql://... --mode async|sync --threads T --ops N
//   flush_bench --store ... --recovery N      # write N records, reopen, time the recovery
//   flush_bench --store sqlite:... --latency N  # begin() latency with and without a busy flusher
//   flush_bench --store ... --mode storm --threads T --ops N [--first plain|storm]
//
// async: T threads run begin+succeed on fresh keys as fast as the queue accepts them (offer_wait
// lets a full queue wait, so the figure is the store's sustained rate); reports transitions/s
// committed (from the first offer to the last commit).
// sync: T threads run begin+succeed; each call returns after its group commit; reports
// acknowledged operations/s and the p50/p99/max latency of begin (claim made durable).
// storm: a retry storm beside the plain async figure, in one process, one after the other (the
// order given by --first, so a script can alternate it): first (or second) the async run above with
// the same T and N (callers wait for room: offer_wait 30 s), then the same with offer_wait = 0 and
// callers that retry a refused begin() or succeed() (backpressure) at once, in a tight loop with no
// sleep and no yield. Both rates are transitions committed from the first offer to the last commit;
// reports both, storm / plain, and the refusals of the storm run (stats.backpressure, and the
// refusals the callers counted, split into begin and succeed).
// latency: one thread runs begin+succeed on N fresh keys, timing each begin() alone, first on a
// plain in-memory guard, then on a durable_guard (async) whose flusher is writing the same stream to
// the store while it is measured; reports p50/p99/p99.9/max in nanoseconds for both. The hot path
// must not feel the flusher.
// Prints one JSON object per run. Not a test: no assertion on time.
#include <idem/durable.hpp>
#include <idem/postgres_store.hpp>
#include <idem/sqlite_store.hpp>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

namespace {

using clk = std::chrono::steady_clock;

struct args {
    std::string store = "sqlite:/tmp/idem-flush-bench.db";
    std::string mode = "async";
    int threads = 2;
    long ops = 200000;
    long recovery = 0;
    long latency = 0;
    std::string first = "plain";  // storm: which half runs first
};

std::unique_ptr<idem::store> open_store(const std::string& uri, bool sync, bool fresh) {
    if (uri.rfind("sqlite:", 0) == 0) {
        const std::string path = uri.substr(7);
        if (fresh)
            for (const char* suffix : {"", "-wal", "-shm", ".lock"}) std::remove((path + suffix).c_str());
        return std::make_unique<idem::sqlite_store>(path, sync);
    }
    auto st = std::make_unique<idem::postgres_store>(uri);
    return st;
}

void reset_postgres(const std::string& uri) {
    pqxx::connection c(uri);
    pqxx::work w(c);
    w.exec("DROP TABLE IF EXISTS idempotent_record, idempotent_audit, idempotent_batch, idem_schema");
    w.commit();
}

double seconds(clk::duration d) { return std::chrono::duration<double>(d).count(); }

/// What one throughput run measured.
struct run_figures {
    long failures = 0;
    std::uint64_t transitions = 0, batches = 0, backpressure = 0;
    long begin_refusals = 0, succeed_refusals = 0;  // counted by the callers (storm)
    double transitions_per_sec = 0, acks_per_sec = 0, hot_s = 0, total_s = 0;
    std::vector<double> begin_ms;  // sync: latency of each begin
};

/// One throughput run. `storm`: async, offer_wait = 0, and a refused begin() or succeed() is
/// retried at once (no sleep, no yield); otherwise the plain run of --mode async|sync.
run_figures measure(const args& a, bool sync, bool storm) {
    if (a.store.rfind("postgresql:", 0) == 0) reset_postgres(a.store);
    idem::options o;
    o.capacity = static_cast<std::size_t>(a.ops) + 16;
    o.maintenance_interval = {};
    idem::store_options so;
    so.mode = sync ? idem::durability::sync : idem::durability::async;
    so.offer_wait = storm ? std::chrono::nanoseconds(0) : std::chrono::nanoseconds(std::chrono::seconds(30));
    idem::durable_guard g(open_store(a.store, sync, true), o, so);

    std::vector<idem::key> keys;
    keys.reserve(static_cast<std::size_t>(a.ops));
    for (long i = 0; i < a.ops; ++i) keys.emplace_back("FB" + std::to_string(i) + "_PAY_v1");
    std::vector<std::vector<double>> lat(static_cast<std::size_t>(a.threads));
    std::barrier start(a.threads + 1);
    std::vector<std::thread> ts;
    std::atomic<long> failed{0}, begin_refused{0}, succeed_refused{0};
    for (int t = 0; t < a.threads; ++t) {
        ts.emplace_back([&, t] {
            auto& mine = lat[static_cast<std::size_t>(t)];
            long br = 0, sr = 0;
            start.arrive_and_wait();
            for (long i = t; i < a.ops; i += a.threads) {
                const auto& k = keys[static_cast<std::size_t>(i)];
                const auto t0 = clk::now();
                auto r = g->begin(k);
                if (storm)
                    while (r.status == idem::begin_status::backpressure) {  // the storm: retry at once
                        ++br;
                        r = g->begin(k);
                    }
                if (sync) mine.push_back(seconds(clk::now() - t0) * 1e3);
                if (!r) {
                    failed.fetch_add(1, std::memory_order_relaxed);
                    continue;
                }
                std::error_code ec = r.ticket.succeed(static_cast<std::uint64_t>(i));
                if (storm)
                    while (ec == idem::errc::backpressure) {
                        ++sr;
                        ec = r.ticket.succeed(static_cast<std::uint64_t>(i));
                    }
                if (ec) failed.fetch_add(1, std::memory_order_relaxed);
            }
            begin_refused.fetch_add(br, std::memory_order_relaxed);
            succeed_refused.fetch_add(sr, std::memory_order_relaxed);
        });
    }
    start.arrive_and_wait();
    const auto t0 = clk::now();
    for (auto& t : ts) t.join();
    const auto hot = clk::now() - t0;
    g.flush(std::chrono::minutes(5));
    const auto all = clk::now() - t0;
    const auto s = g.snapshot();
    run_figures f;
    f.failures = failed.load();
    f.transitions = s.flushed_transitions;
    f.batches = s.flush_batches;
    f.backpressure = s.backpressure;
    f.begin_refusals = begin_refused.load();
    f.succeed_refusals = succeed_refused.load();
    f.transitions_per_sec = static_cast<double>(s.flushed_transitions) / seconds(all);
    f.acks_per_sec = static_cast<double>(a.ops - f.failures) / seconds(hot);
    f.hot_s = seconds(hot);
    f.total_s = seconds(all);
    for (auto& v : lat) f.begin_ms.insert(f.begin_ms.end(), v.begin(), v.end());
    std::sort(f.begin_ms.begin(), f.begin_ms.end());
    return f;
}

int run_throughput(const args& a) {
    const bool sync = a.mode == "sync";
    const run_figures f = measure(a, sync, false);
    const auto& l = f.begin_ms;
    auto pct = [&](double p) { return l.empty() ? 0.0 : l[std::min(l.size() - 1, static_cast<std::size_t>(p * l.size()))]; };
    std::printf(
        "{\"store\":\"%s\",\"mode\":\"%s\",\"threads\":%d,\"ops\":%ld,\"failures\":%ld,\"transitions\":%llu,"
        "\"batches\":%llu,\"transitions_per_sec\":%.0f,\"acks_per_sec\":%.0f,\"begin_ms_p50\":%.3f,"
        "\"begin_ms_p99\":%.3f,\"begin_ms_max\":%.3f,\"hot_s\":%.3f,\"total_s\":%.3f}\n",
        a.store.substr(0, a.store.find(':')).c_str(), a.mode.c_str(), a.threads, a.ops, f.failures,
        static_cast<unsigned long long>(f.transitions), static_cast<unsigned long long>(f.batches),
        f.transitions_per_sec, f.acks_per_sec, pct(0.50), pct(0.99), l.empty() ? 0.0 : l.back(), f.hot_s, f.total_s);
    return f.failures == 0 ? 0 : 1;
}

/// The plain async run and the retry storm, same store, threads and operations, one after the other.
int run_storm(const args& a) {
    run_figures plain, storm;
    if (a.first == "storm") {
        storm = measure(a, false, true);
        plain = measure(a, false, false);
    } else {
        plain = measure(a, false, false);
        storm = measure(a, false, true);
    }
    std::printf(
        "{\"store\":\"%s\",\"mode\":\"storm\",\"threads\":%d,\"ops\":%ld,\"first\":\"%s\",\"failures\":%ld,"
        "\"transitions\":%llu,\"batches\":%llu,\"transitions_per_sec\":%.0f,\"hot_s\":%.3f,\"total_s\":%.3f,"
        "\"backpressure\":%llu,\"begin_refusals\":%ld,\"succeed_refusals\":%ld,"
        "\"plain_failures\":%ld,\"plain_transitions\":%llu,\"plain_batches\":%llu,\"plain_transitions_per_sec\":%.0f,"
        "\"plain_hot_s\":%.3f,\"plain_total_s\":%.3f,\"plain_backpressure\":%llu,\"ratio\":%.4f}\n",
        a.store.substr(0, a.store.find(':')).c_str(), a.threads, a.ops, a.first == "storm" ? "storm" : "plain",
        storm.failures, static_cast<unsigned long long>(storm.transitions),
        static_cast<unsigned long long>(storm.batches), storm.transitions_per_sec, storm.hot_s, storm.total_s,
        static_cast<unsigned long long>(storm.backpressure), storm.begin_refusals, storm.succeed_refusals,
        plain.failures, static_cast<unsigned long long>(plain.transitions),
        static_cast<unsigned long long>(plain.batches), plain.transitions_per_sec, plain.hot_s, plain.total_s,
        static_cast<unsigned long long>(plain.backpressure),
        plain.transitions_per_sec > 0 ? storm.transitions_per_sec / plain.transitions_per_sec : 0.0);
    return storm.failures == 0 && plain.failures == 0 ? 0 : 1;
}

int run_recovery(const args& a) {
    if (a.store.rfind("postgresql:", 0) == 0) reset_postgres(a.store);
    idem::options o;
    o.capacity = static_cast<std::size_t>(a.recovery) + 16;
    o.maintenance_interval = {};
    {
        // Write the records straight through the store in large batches (the pipeline's own
        // throughput is measured above).
        auto st = open_store(a.store, false, true);
        std::vector<idem::store_row> rows;
        const long batch = 8192;
        std::uint64_t seq = 0;
        for (long base = 0; base < a.recovery; base += batch) {
            rows.clear();
            for (long i = base; i < std::min(a.recovery, base + batch); ++i) {
                idem::store_row r;
                r.t.k = idem::key("RC" + std::to_string(i) + "_PAY_v1");
                r.t.from = idem::record_state::processing;
                r.t.to = idem::record_state::succeeded;
                r.t.cause = idem::transition_cause::succeed;
                r.t.fence = 1;
                r.t.outcome = static_cast<std::uint64_t>(i);
                r.seq = ++seq;
                r.at_ms = 1;
                rows.push_back(r);
            }
            std::sort(rows.begin(), rows.end(), [](auto& x, auto& y) { return x.t.k.view() < y.t.k.view(); });
            st->apply(rows, static_cast<std::uint64_t>(base / batch + 1));
        }
    }
    const auto t0 = clk::now();
    idem::durable_guard g(open_store(a.store, false, false), o, {});
    const auto total = clk::now() - t0;
    std::printf("{\"store\":\"%s\",\"recovered\":%zu,\"recovery_s\":%.3f,\"open_total_s\":%.3f}\n",
                a.store.substr(0, a.store.find(':')).c_str(), g.recovery().records,
                std::chrono::duration<double>(g.recovery().elapsed).count(), seconds(total));
    return g.recovery().records == static_cast<std::size_t>(a.recovery) ? 0 : 1;
}

template <class Guard>
std::vector<double> begin_latencies(Guard& g, const std::vector<idem::key>& keys) {
    std::vector<double> ns;
    ns.reserve(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
        const auto t0 = clk::now();
        auto r = g.begin(keys[i]);
        const auto t1 = clk::now();
        ns.push_back(static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
        if (r) (void)r.ticket.succeed(i);
    }
    std::sort(ns.begin(), ns.end());
    return ns;
}

int run_latency(const args& a) {
    const auto n = static_cast<std::size_t>(a.latency);
    std::vector<idem::key> keys;
    keys.reserve(n);
    for (std::size_t i = 0; i < n; ++i) keys.emplace_back("LT" + std::to_string(i) + "_PAY_v1");
    idem::options o;
    o.capacity = n + 16;
    o.maintenance_interval = {};
    o.prefault = true;  // page faults are not the flusher's doing: fault the table in up front
    auto pct = [](const std::vector<double>& v, double p) {
        return v.empty() ? 0.0 : v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
    };
    std::vector<double> plain, busy;
    {
        idem::guard g(o);
        plain = begin_latencies(g, keys);
    }
    std::uint64_t flushed = 0;
    {
        idem::store_options so;
        so.mode = idem::durability::async;
        so.offer_wait = std::chrono::seconds(30);
        idem::durable_guard g(open_store(a.store, false, true), o, so);
        busy = begin_latencies(g.guard(), keys);
        flushed = g.snapshot().flushed_transitions;  // written while begin() was being timed
        g.flush(std::chrono::minutes(5));
    }
    std::printf("{\"store\":\"%s\",\"latency_ops\":%zu,\"flushed_during\":%llu,"
                "\"plain_ns\":{\"p50\":%.0f,\"p99\":%.0f,\"p999\":%.0f,\"max\":%.0f},"
                "\"flusher_busy_ns\":{\"p50\":%.0f,\"p99\":%.0f,\"p999\":%.0f,\"max\":%.0f}}\n",
                a.store.substr(0, a.store.find(':')).c_str(), n, static_cast<unsigned long long>(flushed),
                pct(plain, 0.5), pct(plain, 0.99), pct(plain, 0.999), plain.empty() ? 0.0 : plain.back(),
                pct(busy, 0.5), pct(busy, 0.99), pct(busy, 0.999), busy.empty() ? 0.0 : busy.back());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    args a;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string f = argv[i], v = argv[i + 1];
        if (f == "--store") a.store = v;
        else if (f == "--mode") a.mode = v;
        else if (f == "--threads") a.threads = std::stoi(v);
        else if (f == "--ops") a.ops = std::stol(v);
        else if (f == "--recovery") a.recovery = std::stol(v);
        else if (f == "--latency") a.latency = std::stol(v);
        else if (f == "--first" && (v == "plain" || v == "storm")) a.first = v;
        else {
            std::fprintf(stderr, "flush_bench: unknown flag %s\n", f.c_str());
            return 2;
        }
    }
    try {
        if (a.latency > 0) return run_latency(a);
        if (a.mode == "storm") return run_storm(a);
        return a.recovery > 0 ? run_recovery(a) : run_throughput(a);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "flush_bench: %s\n", e.what());
        return 3;
    }
}
