// flush_bench: what the durable pipeline sustains, per store (docs/benchmarks.md, "Durability").
//
//   flush_bench --store sqlite:/tmp/f.db|postgresql://... --mode async|sync --threads T --ops N
//   flush_bench --store ... --recovery N      # write N records, reopen, time the recovery
//   flush_bench --store sqlite:... --latency N  # begin() latency with and without a busy flusher
//
// async: T threads run begin+succeed on fresh keys as fast as the queue accepts them (offer_wait
// lets a full queue wait, so the figure is the store's sustained rate); reports transitions/s
// committed (from the first offer to the last commit).
// sync: T threads run begin+succeed; each call returns after its group commit; reports
// acknowledged operations/s and the p50/p99/max latency of begin (claim made durable).
// latency: one thread runs begin+succeed on N fresh keys, timing each begin() alone, first on a
// plain in-memory guard, then on a durable_guard (async) whose flusher is writing the same stream to
// the store while it is measured; reports p50/p99/p99.9/max in nanoseconds for both. The hot path
// must not feel the flusher.
// Prints one JSON object per run. Not a test: no assertion on time.
#include <idem/durable.hpp>
#include <idem/postgres_store.hpp>
#include <idem/sqlite_store.hpp>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
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
};

std::unique_ptr<idem::store> open_store(const std::string& uri, bool sync, bool fresh) {
    if (uri.rfind("sqlite:", 0) == 0) {
        const std::string path = uri.substr(7);
        if (fresh)
            for (const char* suffix : {"", "-wal", "-shm"}) std::remove((path + suffix).c_str());
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

int run_throughput(const args& a) {
    const bool sync = a.mode == "sync";
    if (a.store.rfind("postgresql:", 0) == 0) reset_postgres(a.store);
    idem::options o;
    o.capacity = static_cast<std::size_t>(a.ops) + 16;
    o.maintenance_interval = {};
    idem::store_options so;
    so.mode = sync ? idem::durability::sync : idem::durability::async;
    so.offer_wait = std::chrono::seconds(30);
    idem::durable_guard g(open_store(a.store, sync, true), o, so);

    std::vector<idem::key> keys;
    keys.reserve(static_cast<std::size_t>(a.ops));
    for (long i = 0; i < a.ops; ++i) keys.emplace_back("FB" + std::to_string(i) + "_PAY_v1");
    std::vector<std::vector<double>> lat(static_cast<std::size_t>(a.threads));
    std::barrier start(a.threads + 1);
    std::vector<std::thread> ts;
    long failures = 0;
    std::atomic<long> failed{0};
    for (int t = 0; t < a.threads; ++t) {
        ts.emplace_back([&, t] {
            auto& mine = lat[static_cast<std::size_t>(t)];
            start.arrive_and_wait();
            for (long i = t; i < a.ops; i += a.threads) {
                const auto t0 = clk::now();
                auto r = g->begin(keys[static_cast<std::size_t>(i)]);
                if (sync) mine.push_back(seconds(clk::now() - t0) * 1e3);
                if (!r) {
                    failed.fetch_add(1, std::memory_order_relaxed);
                    continue;
                }
                if (r.ticket.succeed(static_cast<std::uint64_t>(i))) failed.fetch_add(1, std::memory_order_relaxed);
            }
        });
    }
    start.arrive_and_wait();
    const auto t0 = clk::now();
    for (auto& t : ts) t.join();
    const auto hot = clk::now() - t0;
    g.flush(std::chrono::minutes(5));
    const auto all = clk::now() - t0;
    failures = failed.load();
    const auto s = g.snapshot();
    std::vector<double> l;
    for (auto& v : lat) l.insert(l.end(), v.begin(), v.end());
    std::sort(l.begin(), l.end());
    auto pct = [&](double p) { return l.empty() ? 0.0 : l[std::min(l.size() - 1, static_cast<std::size_t>(p * l.size()))]; };
    std::printf(
        "{\"store\":\"%s\",\"mode\":\"%s\",\"threads\":%d,\"ops\":%ld,\"failures\":%ld,\"transitions\":%llu,"
        "\"batches\":%llu,\"transitions_per_sec\":%.0f,\"acks_per_sec\":%.0f,\"begin_ms_p50\":%.3f,"
        "\"begin_ms_p99\":%.3f,\"begin_ms_max\":%.3f,\"hot_s\":%.3f,\"total_s\":%.3f}\n",
        a.store.substr(0, a.store.find(':')).c_str(), a.mode.c_str(), a.threads, a.ops, failures,
        static_cast<unsigned long long>(s.flushed_transitions), static_cast<unsigned long long>(s.flush_batches),
        static_cast<double>(s.flushed_transitions) / seconds(all), static_cast<double>(a.ops - failures) / seconds(hot),
        pct(0.50), pct(0.99), l.empty() ? 0.0 : l.back(), seconds(hot), seconds(all));
    return failures == 0 ? 0 : 1;
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
        else {
            std::fprintf(stderr, "flush_bench: unknown flag %s\n", f.c_str());
            return 2;
        }
    }
    try {
        if (a.latency > 0) return run_latency(a);
        return a.recovery > 0 ? run_recovery(a) : run_throughput(a);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "flush_bench: %s\n", e.what());
        return 3;
    }
}
