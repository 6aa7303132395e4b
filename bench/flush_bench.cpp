// flush_bench: what the durable pipeline sustains, per store (docs/benchmarks.md, "Durability").
//
//   flush_bench --store sqlite:/tmp/f.db|postgresql://...|rocksdb:DIR|mysql://... --mode async|sync --threads T --ops N
//   flush_bench --store ... --recovery N      # write N records, reopen, time the recovery
//   flush_bench --store sqlite:... --latency N  # begin() latency with and without a busy flusher
//   flush_bench --store ... --mode storm --threads T --ops N [--first plain|storm]
//   flush_bench --store ... --mode retry --threads T --ops N   # callers retry backpressure, yielding
//
// Common flags: --keys random|sequential (default random), --seed S (default 1), --preload N,
// --max-batch N and --queue N (store_options.max_batch / queue_capacity; defaults: the library's).
//
// Keys. random: UUID-v4-formatted text (36 bytes, lower-case hex) from a seeded PRNG
// (std::mt19937_64, --seed), in the order drawn: what clients send, and what a store sees, scattered
// over its whole index. sequential: FB<i>_PAY_v1 in order (the figures published before issue 14),
// which keeps every store write at the right edge of the B-tree and in its page cache.
// Preload: before the run (untimed) the store already holds N records (claim + succeed audit rows
// each) with random keys from another stream of the same seed (so distinct from the run's, barring a
// 122-bit collision), written straight through store::apply in batches of 65536 rows sorted by key.
// SQLite: built once into PATH.preload-N-seedS-vV (V: sqlite_store::schema_version) and copied to
// PATH for each run (delete the template to rebuild it); PostgreSQL: written again for every run. The guard recovers the preloaded records
// at open (capacity ops + N), as a restarted service would; preload_s and recovery_s say what each
// took.
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
// retry: the issue-14 measurement: async, offer_wait = 0, and a caller whose begin() or succeed()
// is refused (backpressure) calls std::this_thread::yield() and tries again; reports pairs/s
// (claim + succeed, committed: transitions / 2 over first offer to last commit).
// Every throughput line (async, sync, retry, storm) carries flusher_cpu_ns_per_transition:
// stats::flusher_cpu_ns / flushed_transitions, the flusher thread's CPU time per committed row.
// latency: one thread runs begin+succeed on N fresh keys, timing each begin() alone, first on a
// plain in-memory guard, then on a durable_guard (async) whose flusher is writing the same stream to
// the store while it is measured; reports p50/p99/p99.9/max in nanoseconds for both. The hot path
// must not feel the flusher.
// Prints one JSON object per run. Not a test: no assertion on time.
#include <idem/durable.hpp>
#include <idem/stores/postgres_store.hpp>
#include <idem/stores/sqlite_store.hpp>
#if IDEM_BENCH_HAVE_ROCKSDB
#include <idem/stores/rocksdb_store.hpp>
#endif
#if IDEM_BENCH_HAVE_MYSQL
#include <idem/stores/mysql_store.hpp>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "uuid_keys.hpp"

namespace {

using idem_bench::draw_uuid;
using idem_bench::format_uuid;
using idem_bench::uuid;

using clk = std::chrono::steady_clock;

struct args {
    std::string store = "sqlite:/tmp/idem-flush-bench.db";
    std::string mode = "async";
    int threads = 2;
    long ops = 200000;
    long recovery = 0;
    long latency = 0;
    std::string first = "plain";  // storm: which half runs first
    std::string keys = "random";  // random (UUID v4 text, PRNG order) | sequential (FB<i>_PAY_v1)
    std::uint64_t seed = 1;
    long preload = 0;
    std::size_t max_batch = idem::store_options{}.max_batch;
    std::size_t queue = idem::store_options{}.queue_capacity;
};

std::string store_kind(const std::string& uri) { return uri.substr(0, uri.find(':')); }
bool is_sqlite(const std::string& uri) { return uri.rfind("sqlite:", 0) == 0; }
bool is_postgres(const std::string& uri) { return uri.rfind("postgresql:", 0) == 0 || uri.rfind("postgres:", 0) == 0; }
bool is_mysql(const std::string& uri) { return uri.rfind("mysql:", 0) == 0 || uri.rfind("mariadb:", 0) == 0; }

// ---- keys -----------------------------------------------------------------------------------------

/// The run's keys, generated before timing. `prefix` names the sequential keys ("FB", "RC", "LT").
std::vector<idem::key> make_keys(const args& a, std::size_t n, const char* prefix) {
    std::vector<idem::key> keys;
    keys.reserve(n);
    if (a.keys == "sequential") {
        for (std::size_t i = 0; i < n; ++i) keys.emplace_back(prefix + std::to_string(i) + "_PAY_v1");
    } else {
        std::mt19937_64 rng(a.seed);
        for (std::size_t i = 0; i < n; ++i) keys.emplace_back(format_uuid(draw_uuid(rng)));
    }
    return keys;
}

/// The preloaded records' keys: another stream of the same seed, sorted, duplicates dropped.
std::vector<uuid> preload_keys(const args& a) {
    std::mt19937_64 rng(a.seed ^ 0x9e3779b97f4a7c15ull);
    std::vector<uuid> v(static_cast<std::size_t>(a.preload));
    for (auto& u : v) u = draw_uuid(rng);
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
}

// ---- stores ---------------------------------------------------------------------------------------

void remove_sqlite(const std::string& path) {
    for (const char* suffix : {"", "-wal", "-shm", ".lock"}) std::remove((path + suffix).c_str());
}

std::unique_ptr<idem::store> open_store(const std::string& uri, bool sync, bool fresh) {
    if (is_sqlite(uri)) {
        const std::string path = uri.substr(7);
        if (fresh) remove_sqlite(path);
        return std::make_unique<idem::sqlite_store>(path, sync);
    }
#if IDEM_BENCH_HAVE_ROCKSDB
    // rocksdb_store(path, sync): sync asks for a synced WAL write per batch, as full_sync does for SQLite.
    if (uri.rfind("rocksdb:", 0) == 0) {
        const std::string dir = uri.substr(8);
        if (fresh) std::filesystem::remove_all(dir);
        return std::make_unique<idem::rocksdb_store>(dir, sync);
    }
#else
    if (uri.rfind("rocksdb:", 0) == 0)
        throw std::runtime_error("built without idem::rocksdb (include/idem/rocksdb_store.hpp); no rocksdb: store");
#endif
#if IDEM_BENCH_HAVE_MYSQL
    if (is_mysql(uri)) {
        (void)sync;  // InnoDB's durability is the server's (innodb_flush_log_at_trx_commit); sync mode checks it
        return std::make_unique<idem::mysql_store>(uri);
    }
#else
    if (is_mysql(uri)) throw std::runtime_error("built without idem::mysql; no mysql: store");
#endif
    return std::make_unique<idem::postgres_store>(uri);
}

#if IDEM_BENCH_HAVE_MYSQL
void reset_mysql(const std::string& uri) {
    namespace my = idem::detail::my;
    my::session s;
    s.open(my::parse_uri(uri), std::chrono::seconds(30));
    s.run("DROP TABLE IF EXISTS idempotent_record, idempotent_audit, idempotent_batch, idem_schema");
}
#else
void reset_mysql(const std::string&) {}
#endif

void reset_postgres(const std::string& uri) {
    pqxx::connection c(uri);
    pqxx::work w(c);
    w.exec("DROP TABLE IF EXISTS idempotent_record, idempotent_audit, idempotent_batch, idem_schema");
    w.commit();
}

double seconds(clk::duration d) { return std::chrono::duration<double>(d).count(); }

/// Writes the preloaded records straight through st.apply: per key a claim row and a succeed row
/// (so each record has its two audit rows), 65536 rows per transaction, sorted by key.
void write_preload(idem::store& st, const std::vector<uuid>& keys) {
    const std::int64_t now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    constexpr std::size_t keys_per_batch = 32768;
    std::vector<idem::store_row> rows;
    rows.reserve(2 * keys_per_batch);
    std::uint64_t seq = 0, batch = 0;
    for (std::size_t base = 0; base < keys.size(); base += keys_per_batch) {
        rows.clear();
        for (std::size_t i = base; i < std::min(keys.size(), base + keys_per_batch); ++i) {
            idem::store_row claim;
            claim.t.k = idem::key(format_uuid(keys[i]));
            claim.t.from = idem::record_state::absent;
            claim.t.to = idem::record_state::processing;
            claim.t.cause = idem::transition_cause::claim;
            claim.t.fence = 1;
            claim.seq = ++seq;
            claim.at_ms = now_ms;
            claim.lease_until_ms = now_ms + 30000;
            idem::store_row done = claim;
            done.t.from = idem::record_state::processing;
            done.t.to = idem::record_state::succeeded;
            done.t.cause = idem::transition_cause::succeed;
            done.t.outcome = i;
            done.seq = ++seq;
            done.lease_until_ms = 0;
            rows.push_back(std::move(claim));
            rows.push_back(std::move(done));
        }
        st.apply(rows, ++batch);
    }
}

/// What preparing the store for one run cost (untimed).
struct preload_figures {
    double seconds = 0;
    bool cached = false;  // SQLite: copied from the template built by an earlier run
};

/// A fresh store for one run, holding a.preload records when asked.
std::unique_ptr<idem::store> prepare_store(const args& a, bool sync, preload_figures& pf) {
    if (is_postgres(a.store)) reset_postgres(a.store);
    if (is_mysql(a.store)) reset_mysql(a.store);
    if (a.preload <= 0) return open_store(a.store, sync, true);
    const auto t0 = clk::now();
    if (is_sqlite(a.store)) {
        namespace fs = std::filesystem;
        const std::string path = a.store.substr(7);
        // Named by the schema version too: a template of an older layout would be upgraded in place
        // at every open instead of measuring the current one.
        const std::string tmpl = path + ".preload-" + std::to_string(a.preload) + "-seed" + std::to_string(a.seed) + "-v" +
                                 std::to_string(idem::sqlite_store::schema_version);
        if (fs::exists(tmpl)) {
            pf.cached = true;
        } else {
            const std::string building = tmpl + ".building";
            remove_sqlite(building);
            {
                idem::sqlite_store st(building, false);
                write_preload(st, preload_keys(a));
            }  // the last connection closes: the WAL is checkpointed into the file
            for (const char* suffix : {"-wal", "-shm"})
                if (fs::exists(building + suffix))
                    throw std::runtime_error(building + suffix + " left after close; the template is not one file");
            std::remove((building + ".lock").c_str());
            fs::rename(building, tmpl);
        }
        remove_sqlite(path);
        fs::copy_file(tmpl, path);
        pf.seconds = seconds(clk::now() - t0);
        return open_store(a.store, sync, false);
    }
    {
        auto st = open_store(a.store, false, true);
        write_preload(*st, preload_keys(a));
    }
    pf.seconds = seconds(clk::now() - t0);
    return open_store(a.store, sync, false);
}

// ---- throughput -----------------------------------------------------------------------------------

/// How callers treat a refused call (offer_wait 0 in both retrying kinds).
enum class retry_kind { none, spin, yield };

/// What one throughput run measured.
struct run_figures {
    long failures = 0;
    std::uint64_t transitions = 0, batches = 0, backpressure = 0, flusher_cpu_ns = 0;
    long begin_refusals = 0, succeed_refusals = 0;  // counted by the callers (storm, retry)
    double transitions_per_sec = 0, acks_per_sec = 0, hot_s = 0, total_s = 0;
    double preload_s = 0, recovery_s = 0;
    bool preload_cached = false;
    std::size_t recovered = 0;
    std::vector<double> begin_ms;  // sync: latency of each begin

    [[nodiscard]] double cpu_ns_per_transition() const {
        return transitions == 0 ? 0.0 : static_cast<double>(flusher_cpu_ns) / static_cast<double>(transitions);
    }
};

/// One throughput run: --mode async|sync (retry none), storm (spin) or retry (yield).
run_figures measure(const args& a, const std::vector<idem::key>& keys, bool sync, retry_kind retry) {
    idem::options o;
    o.capacity = static_cast<std::size_t>(a.ops + std::max(0L, a.preload)) + 16;
    o.maintenance_interval = {};
    idem::store_options so;
    so.mode = sync ? idem::durability::sync : idem::durability::async;
    so.offer_wait = retry != retry_kind::none ? std::chrono::nanoseconds(0)
                                              : std::chrono::nanoseconds(std::chrono::seconds(30));
    so.max_batch = a.max_batch;
    so.queue_capacity = a.queue;
    preload_figures pf;
    auto st = prepare_store(a, sync, pf);
    idem::durable_guard g(std::move(st), o, so);

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
                if (retry != retry_kind::none)
                    while (r.status == idem::begin_status::backpressure) {
                        ++br;
                        if (retry == retry_kind::yield) std::this_thread::yield();
                        r = g->begin(k);
                    }
                if (sync) mine.push_back(seconds(clk::now() - t0) * 1e3);
                if (!r) {
                    failed.fetch_add(1, std::memory_order_relaxed);
                    continue;
                }
                std::error_code ec = r.ticket.succeed(static_cast<std::uint64_t>(i));
                if (retry != retry_kind::none)
                    while (ec == idem::errc::backpressure) {
                        ++sr;
                        if (retry == retry_kind::yield) std::this_thread::yield();
                        ec = r.ticket.succeed(static_cast<std::uint64_t>(i));
                    }
                if (ec) failed.fetch_add(1, std::memory_order_relaxed);
            }
            begin_refused.fetch_add(br, std::memory_order_relaxed);
            succeed_refused.fetch_add(sr, std::memory_order_relaxed);
        });
    }
    const std::uint64_t cpu_before = g.snapshot().flusher_cpu_ns;  // recovery ran before the flusher
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
    f.flusher_cpu_ns = s.flusher_cpu_ns - cpu_before;
    f.begin_refusals = begin_refused.load();
    f.succeed_refusals = succeed_refused.load();
    f.transitions_per_sec = static_cast<double>(s.flushed_transitions) / seconds(all);
    f.acks_per_sec = static_cast<double>(a.ops - f.failures) / seconds(hot);
    f.hot_s = seconds(hot);
    f.total_s = seconds(all);
    f.preload_s = pf.seconds;
    f.preload_cached = pf.cached;
    f.recovered = g.recovery().records;
    f.recovery_s = std::chrono::duration<double>(g.recovery().elapsed).count();
    for (auto& v : lat) f.begin_ms.insert(f.begin_ms.end(), v.begin(), v.end());
    std::sort(f.begin_ms.begin(), f.begin_ms.end());
    return f;
}

/// The fields every throughput line starts with: what was run, on which keys and store contents.
std::string common_fields(const args& a, const char* mode) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "\"store\":\"%s\",\"mode\":\"%s\",\"threads\":%d,\"ops\":%ld,\"keys\":\"%s\",\"seed\":%llu,"
                  "\"preload\":%ld,\"max_batch\":%zu,\"queue\":%zu",
                  store_kind(a.store).c_str(), mode, a.threads, a.ops, a.keys.c_str(),
                  static_cast<unsigned long long>(a.seed), a.preload, a.max_batch, a.queue);
    return buf;
}

std::string preload_fields(const run_figures& f) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "\"preload_s\":%.3f,\"preload_cached\":%s,\"recovered\":%zu,\"recovery_s\":%.3f",
                  f.preload_s, f.preload_cached ? "true" : "false", f.recovered, f.recovery_s);
    return buf;
}

int run_throughput(const args& a) {
    const bool sync = a.mode == "sync";
    const retry_kind retry = a.mode == "retry" ? retry_kind::yield : retry_kind::none;
    const auto keys = make_keys(a, static_cast<std::size_t>(a.ops), "FB");
    const run_figures f = measure(a, keys, sync, retry);
    const auto& l = f.begin_ms;
    auto pct = [&](double p) { return l.empty() ? 0.0 : l[std::min(l.size() - 1, static_cast<std::size_t>(p * l.size()))]; };
    std::printf(
        "{%s,\"failures\":%ld,\"transitions\":%llu,\"batches\":%llu,\"transitions_per_sec\":%.0f,"
        "\"pairs_per_sec\":%.0f,\"acks_per_sec\":%.0f,\"begin_ms_p50\":%.3f,\"begin_ms_p99\":%.3f,"
        "\"begin_ms_max\":%.3f,\"hot_s\":%.3f,\"total_s\":%.3f,\"backpressure\":%llu,\"begin_refusals\":%ld,"
        "\"succeed_refusals\":%ld,\"flusher_cpu_ns_per_transition\":%.0f,%s}\n",
        common_fields(a, a.mode.c_str()).c_str(), f.failures, static_cast<unsigned long long>(f.transitions),
        static_cast<unsigned long long>(f.batches), f.transitions_per_sec, f.transitions_per_sec / 2, f.acks_per_sec,
        pct(0.50), pct(0.99), l.empty() ? 0.0 : l.back(), f.hot_s, f.total_s,
        static_cast<unsigned long long>(f.backpressure), f.begin_refusals, f.succeed_refusals, f.cpu_ns_per_transition(),
        preload_fields(f).c_str());
    return f.failures == 0 ? 0 : 1;
}

/// The plain async run and the retry storm, same store, threads and operations, one after the other.
int run_storm(const args& a) {
    const auto keys = make_keys(a, static_cast<std::size_t>(a.ops), "FB");
    run_figures plain, storm;
    if (a.first == "storm") {
        storm = measure(a, keys, false, retry_kind::spin);
        plain = measure(a, keys, false, retry_kind::none);
    } else {
        plain = measure(a, keys, false, retry_kind::none);
        storm = measure(a, keys, false, retry_kind::spin);
    }
    std::printf(
        "{%s,\"first\":\"%s\",\"failures\":%ld,"
        "\"transitions\":%llu,\"batches\":%llu,\"transitions_per_sec\":%.0f,\"hot_s\":%.3f,\"total_s\":%.3f,"
        "\"backpressure\":%llu,\"begin_refusals\":%ld,\"succeed_refusals\":%ld,\"flusher_cpu_ns_per_transition\":%.0f,"
        "\"plain_failures\":%ld,\"plain_transitions\":%llu,\"plain_batches\":%llu,\"plain_transitions_per_sec\":%.0f,"
        "\"plain_hot_s\":%.3f,\"plain_total_s\":%.3f,\"plain_backpressure\":%llu,"
        "\"plain_flusher_cpu_ns_per_transition\":%.0f,\"ratio\":%.4f,%s}\n",
        common_fields(a, "storm").c_str(), a.first == "storm" ? "storm" : "plain", storm.failures,
        static_cast<unsigned long long>(storm.transitions), static_cast<unsigned long long>(storm.batches),
        storm.transitions_per_sec, storm.hot_s, storm.total_s, static_cast<unsigned long long>(storm.backpressure),
        storm.begin_refusals, storm.succeed_refusals, storm.cpu_ns_per_transition(), plain.failures,
        static_cast<unsigned long long>(plain.transitions), static_cast<unsigned long long>(plain.batches),
        plain.transitions_per_sec, plain.hot_s, plain.total_s, static_cast<unsigned long long>(plain.backpressure),
        plain.cpu_ns_per_transition(),
        plain.transitions_per_sec > 0 ? storm.transitions_per_sec / plain.transitions_per_sec : 0.0,
        preload_fields(storm).c_str());
    return storm.failures == 0 && plain.failures == 0 ? 0 : 1;
}

int run_recovery(const args& a) {
    if (is_postgres(a.store)) reset_postgres(a.store);
    if (is_mysql(a.store)) reset_mysql(a.store);
    idem::options o;
    o.capacity = static_cast<std::size_t>(a.recovery) + 16;
    o.maintenance_interval = {};
    {
        // Write the records straight through the store in large batches (the pipeline's own
        // throughput is measured above).
        auto st = open_store(a.store, false, true);
        const auto keys = make_keys(a, static_cast<std::size_t>(a.recovery), "RC");
        std::vector<idem::store_row> rows;
        const long batch = 8192;
        std::uint64_t seq = 0;
        // Written now: inside the hot window (options.retention), so recovery loads every record
        // into memory, as this measures (a record from 1970 is past the idempotency window).
        const std::int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::system_clock::now().time_since_epoch())
                                        .count();
        for (long base = 0; base < a.recovery; base += batch) {
            rows.clear();
            for (long i = base; i < std::min(a.recovery, base + batch); ++i) {
                idem::store_row r;
                r.t.k = keys[static_cast<std::size_t>(i)];
                r.t.from = idem::record_state::processing;
                r.t.to = idem::record_state::succeeded;
                r.t.cause = idem::transition_cause::succeed;
                r.t.fence = 1;
                r.t.outcome = static_cast<std::uint64_t>(i);
                r.seq = ++seq;
                r.at_ms = now_ms;
                rows.push_back(r);
            }
            std::sort(rows.begin(), rows.end(), [](auto& x, auto& y) { return x.t.k.view() < y.t.k.view(); });
            st->apply(rows, static_cast<std::uint64_t>(base / batch + 1));
        }
    }
    const auto t0 = clk::now();
    idem::durable_guard g(open_store(a.store, false, false), o, {});
    const auto total = clk::now() - t0;
    std::printf(
        "{\"store\":\"%s\",\"keys\":\"%s\",\"recovered\":%zu,\"cold\":%zu,\"expired\":%zu,"
        "\"recovery_s\":%.3f,\"open_total_s\":%.3f}\n",
        store_kind(a.store).c_str(), a.keys.c_str(), g.recovery().records, g.recovery().cold, g.recovery().expired,
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
    const auto keys = make_keys(a, n, "LT");
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
        so.max_batch = a.max_batch;
        so.queue_capacity = a.queue;
        idem::durable_guard g(open_store(a.store, false, true), o, so);
        busy = begin_latencies(g.guard(), keys);
        flushed = g.snapshot().flushed_transitions;  // written while begin() was being timed
        g.flush(std::chrono::minutes(5));
    }
    std::printf(
        "{\"store\":\"%s\",\"keys\":\"%s\",\"latency_ops\":%zu,\"flushed_during\":%llu,"
        "\"plain_ns\":{\"p50\":%.0f,\"p99\":%.0f,\"p999\":%.0f,\"max\":%.0f},"
        "\"flusher_busy_ns\":{\"p50\":%.0f,\"p99\":%.0f,\"p999\":%.0f,\"max\":%.0f}}\n",
        store_kind(a.store).c_str(), a.keys.c_str(), n, static_cast<unsigned long long>(flushed), pct(plain, 0.5),
        pct(plain, 0.99), pct(plain, 0.999), plain.empty() ? 0.0 : plain.back(), pct(busy, 0.5), pct(busy, 0.99),
        pct(busy, 0.999), busy.empty() ? 0.0 : busy.back());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    args a;
    for (int i = 1; i < argc; i += 2) {
        const std::string f = argv[i];
        if (i + 1 >= argc) {
            std::fprintf(stderr, "flush_bench: %s needs a value\n", f.c_str());
            return 2;
        }
        const std::string v = argv[i + 1];
        if (f == "--store") a.store = v;
        else if (f == "--mode" && (v == "async" || v == "sync" || v == "storm" || v == "retry")) a.mode = v;
        else if (f == "--threads") a.threads = std::stoi(v);
        else if (f == "--ops") a.ops = std::stol(v);
        else if (f == "--recovery") a.recovery = std::stol(v);
        else if (f == "--latency") a.latency = std::stol(v);
        else if (f == "--first" && (v == "plain" || v == "storm")) a.first = v;
        else if (f == "--keys" && (v == "random" || v == "sequential")) a.keys = v;
        else if (f == "--seed") a.seed = std::stoull(v);
        else if (f == "--preload") a.preload = std::stol(v);
        else if (f == "--max-batch") a.max_batch = std::stoul(v);
        else if (f == "--queue") a.queue = std::stoul(v);
        else {
            std::fprintf(stderr, "flush_bench: unknown flag or value: %s %s\n", f.c_str(), v.c_str());
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
