// window_bench: the idempotency window (durable.hpp, detail/table/window_filter.hpp) on a real store.
// See docs/internals/durable-benchmarks.md, "The idempotency window".
//
//   window_bench --mode recall --store sqlite:PATH|postgresql://... [--records N] [--ops M]
//   window_bench --mode recovery --store sqlite:PATH [--window-records N] [--hot H]
//   window_bench --mode fresh --store sqlite:PATH|postgresql://... [--cold K] [--ops M]
//
// recall: the duplicate of an evicted key. The store is written with N records (default 200000,
// one succeed row each, straight through store::apply) last updated two hours ago: older than the
// guard's hot window (options.retention = 1 h) and inside its idempotency window
// (store_options::window, 7 days by default). A durable_guard (async) opens it, so recovery puts
// every record in the cold window only; then one thread calls begin() on M of those keys (default
// 20000, in a random order), each answered from the store (a recall: memory misses, the filter
// hits, the flusher thread reads the record, the guard installs it and answers succeeded with its
// outcome), timing each begin() alone. Reports p50/p99/p99.9/max in microseconds, the answers that
// were not the record's outcome (`unexpected`, must be 0) and stats::recalls / recalled.
//
// recovery: time to serve. The store holds N records in the idempotency window (default 10M), H of
// them (default 1M) in the hot window: H last updated 1 to 12 hours ago (options.retention is 24 h),
// N - H between 2 and 6 days ago (store_options::window is 7 days). Reports the durable_guard's
// construction time (open_s), recovery().elapsed, cold_elapsed, records, cold, expired, the
// process's resident memory before and after the open and its peak (VmHWM), and the cold window's
// stats::cold_keys / cold_bytes (bytes per key: the filter's memory per key of the window). With
// --start claims_first (recovery_start::claims_first) the guard serves once its claims in flight are
// in memory (none here) and streams the window's keys after: open_s is then the time to serve, and
// cold_complete_s the time until the cold window is complete; meanwhile 2,000 duplicates of hot keys
// and 2,000 fresh keys are timed one by one (dup_p50_us ..., sampled_during_stream of them before
// the stream completed; unexpected: a duplicate not answered succeeded or a fresh key not granted).
// SQLite: the store is built once (in a child process, so its memory is not counted) into
// PATH.window-N-H-vV and copied to PATH for each run; a template older than 6 hours is rebuilt (the
// records' ages are set when it is built). Building 10M records takes a few minutes and about 3 GB.
//
// fresh: what the cold window's false positives cost a durable guard. Two runs in one process, each
// on a fresh store: a durable_guard (async) with an empty cold window, then one whose cold window
// holds K keys (default 10M; other UUIDs, remembered as recovery does, last updates spread over
// the window: 8 slices); one thread runs begin + succeed on M fresh keys (default 200000). Every
// false positive of the filter is a store read on the flusher thread before the claim is granted.
// Reports the begin+succeed rate of each run (the callers' time; rows still queued are flushed
// after), their ratio, and stats::recalls per key.
//
// Keys: UUID-v4 text (bench/uuid_keys.hpp) from a seeded PRNG (--seed, default 1).
// Prints one JSON object per run. Not a test: no assertion on time.
#include <idem/durable.hpp>
#include <idem/stores/postgres_store.hpp>
#include <idem/stores/sqlite_store.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include "uuid_keys.hpp"

namespace {

using idem_bench::draw_uuid;
using idem_bench::format_uuid;
using clk = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct args {
    std::string mode;
    std::string store = "sqlite:/tmp/idem-window-bench.db";
    long records = 200000;
    long ops = 0;  // recall: 20000, fresh: 200000
    long window_records = 10000000;
    long hot = 1000000;
    long cold = 10000000;
    std::uint64_t seed = 1;
    idem::recovery_start start = idem::recovery_start::load_window;
};

bool is_sqlite(const std::string& uri) { return uri.rfind("sqlite:", 0) == 0; }
std::string store_kind(const std::string& uri) { return uri.substr(0, uri.find(':')); }
double seconds(clk::duration d) { return std::chrono::duration<double>(d).count(); }

std::int64_t wall_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

void remove_sqlite(const std::string& path) {
    for (const char* suffix : {"", "-wal", "-shm", ".lock"}) std::remove((path + suffix).c_str());
}

void reset_postgres(const std::string& uri) {
    pqxx::connection c(uri);
    pqxx::work w(c);
    w.exec("DROP TABLE IF EXISTS idempotent_record, idempotent_audit, idempotent_batch, idem_schema");
    w.commit();
}

std::unique_ptr<idem::store> open_store(const std::string& uri, bool fresh) {
    if (is_sqlite(uri)) {
        const std::string path = uri.substr(7);
        if (fresh) remove_sqlite(path);
        return std::make_unique<idem::sqlite_store>(path, false);
    }
    if (fresh) reset_postgres(uri);
    return std::make_unique<idem::postgres_store>(uri);
}

/// Writes one succeed row per key through st.apply, `batch` keys per call, sorted by key;
/// key i was last updated at updated_ms(i).
template <class UpdatedMs>
void write_records(idem::store& st, std::vector<std::string> keys, UpdatedMs updated_ms, std::size_t batch = 65536) {
    std::vector<std::size_t> order(keys.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::vector<idem::store_row> rows;
    std::uint64_t seq = 0, n = 0;
    for (std::size_t base = 0; base < keys.size(); base += batch) {
        const std::size_t end = std::min(keys.size(), base + batch);
        std::sort(order.begin() + static_cast<std::ptrdiff_t>(base), order.begin() + static_cast<std::ptrdiff_t>(end),
                  [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
        rows.clear();
        for (std::size_t j = base; j < end; ++j) {
            const std::size_t i = order[j];
            idem::store_row r;
            r.t.k = idem::key(keys[i]);
            r.t.from = idem::record_state::processing;
            r.t.to = idem::record_state::succeeded;
            r.t.cause = idem::transition_cause::succeed;
            r.t.fence = 1;
            r.t.outcome = i + 1;
            r.seq = ++seq;
            r.at_ms = updated_ms(i);
            rows.push_back(std::move(r));
        }
        st.apply(rows, ++n);
    }
}

std::vector<std::string> make_keys(std::uint64_t seed, std::size_t n) {
    std::mt19937_64 rng(seed);
    std::vector<std::string> v;
    v.reserve(n);
    for (std::size_t i = 0; i < n; ++i) v.push_back(format_uuid(draw_uuid(rng)));
    return v;
}

struct memory {
    long rss_kb = 0, hwm_kb = 0;
};
memory read_memory() {
    memory m;
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("VmRSS:", 0) == 0) m.rss_kb = std::stol(line.substr(6));
        if (line.rfind("VmHWM:", 0) == 0) m.hwm_kb = std::stol(line.substr(6));
    }
    return m;
}

// ---- recall -----------------------------------------------------------------------------------------

int run_recall(const args& a) {
    const auto n = static_cast<std::size_t>(a.records);
    const auto m = std::min(n, static_cast<std::size_t>(a.ops));
    const auto keys = make_keys(a.seed, n);
    const std::int64_t two_hours_ago = wall_ms() - 2 * 3600 * 1000;
    const auto t0 = clk::now();
    {
        auto st = open_store(a.store, true);
        write_records(
            *st, keys, [&](std::size_t) { return two_hours_ago; }, 8192);
    }
    const double build_s = seconds(clk::now() - t0);
    idem::options o;
    o.capacity = m + 1024;
    o.retention = 1h;  // the records (2 h old) are past the hot window, inside the idempotency window
    o.maintenance_interval = {};
    idem::store_options so;
    so.mode = idem::durability::async;
    idem::durable_guard g(open_store(a.store, false), o, so);
    // A random order over the keys, m of them.
    std::vector<std::size_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937_64(a.seed + 7));
    order.resize(m);
    std::vector<idem::key> probe;
    probe.reserve(m);
    for (std::size_t i : order) probe.emplace_back(keys[i]);
    std::vector<double> us;
    us.reserve(m);
    std::uint64_t unexpected = 0;
    for (std::size_t j = 0; j < m; ++j) {
        const auto b = clk::now();
        auto r = g->begin(probe[j]);
        const auto e = clk::now();
        us.push_back(std::chrono::duration<double, std::micro>(e - b).count());
        if (r.status != idem::begin_status::succeeded || r.outcome != order[j] + 1) ++unexpected;
    }
    std::sort(us.begin(), us.end());
    auto pct = [&](double p) {
        return us[std::min(us.size() - 1, static_cast<std::size_t>(p * static_cast<double>(us.size())))];
    };
    const auto s = g.snapshot();
    std::printf(
        "{\"mode\":\"recall\",\"store\":\"%s\",\"records\":%zu,\"cold\":%zu,\"ops\":%zu,\"build_s\":%.1f,"
        "\"begin_us\":{\"p50\":%.1f,\"p99\":%.1f,\"p999\":%.1f,\"max\":%.1f},\"recalls\":%llu,\"recalled\":%llu,"
        "\"unexpected\":%llu}\n",
        store_kind(a.store).c_str(), n, g.recovery().cold, m, build_s, pct(0.5), pct(0.99), pct(0.999), us.back(),
        static_cast<unsigned long long>(s.recalls), static_cast<unsigned long long>(s.recalled),
        static_cast<unsigned long long>(unexpected));
    return unexpected == 0 ? 0 : 1;
}

// ---- fresh keys on a durable guard ---------------------------------------------------------------

struct fresh_figures {
    double ops_per_sec = 0;
    std::uint64_t recalls = 0, unexpected = 0, cold_keys = 0;
};

fresh_figures fresh_run(const args& a, const std::vector<idem::key>& keys, std::size_t cold) {
    idem::options o;
    o.capacity = keys.size() + 1024;
    o.maintenance_interval = {};
    idem::store_options so;
    so.mode = idem::durability::async;
    so.offer_wait = std::chrono::seconds(30);  // a full queue waits: the figure includes the store's pace
    idem::durable_guard g(open_store(a.store, true), o, so);
    if (cold > 0) {
        const auto window = std::chrono::nanoseconds(so.window);
        const auto now = g->now();
        const auto oldest = now - window + std::chrono::minutes(10);
        const auto newest = now - o.retention;
        std::vector<idem::detail::table::window_filter::entry> entries;
        entries.reserve(cold);
        std::mt19937_64 rng(0xC01D);
        for (std::size_t i = 0; i < cold; ++i) {
            const auto at = oldest + std::chrono::nanoseconds(
                                         static_cast<std::int64_t>(static_cast<double>((newest - oldest).count()) *
                                                                   static_cast<double>(i) / static_cast<double>(cold)));
            entries.push_back(idem::detail::guard_access::cold_entry(g.guard(), idem::key(format_uuid(draw_uuid(rng))), at));
        }
        if (!idem::detail::guard_access::remember_cold(g.guard(), entries))
            throw std::runtime_error("no memory for the cold window");
    }
    fresh_figures f;
    const auto t0 = clk::now();
    for (std::size_t i = 0; i < keys.size(); ++i) {
        auto r = g->begin(keys[i]);
        if (!r || r.ticket.succeed(i)) ++f.unexpected;
    }
    f.ops_per_sec = static_cast<double>(keys.size()) / seconds(clk::now() - t0);
    const auto s = g.snapshot();
    f.recalls = s.recalls;
    f.cold_keys = s.cold_keys;
    g.flush(std::chrono::minutes(5));
    return f;
}

int run_fresh(const args& a) {
    std::vector<idem::key> keys;
    for (const auto& k : make_keys(a.seed, static_cast<std::size_t>(a.ops))) keys.emplace_back(k);
    const fresh_figures plain = fresh_run(a, keys, 0);
    const fresh_figures cold = fresh_run(a, keys, static_cast<std::size_t>(a.cold));
    std::printf(
        "{\"mode\":\"fresh\",\"store\":\"%s\",\"ops\":%zu,\"cold_keys\":%llu,\"no_cold_ops_per_sec\":%.0f,"
        "\"cold_ops_per_sec\":%.0f,\"ratio\":%.3f,\"recalls_per_op\":%.4f,\"unexpected\":%llu}\n",
        store_kind(a.store).c_str(), keys.size(), static_cast<unsigned long long>(cold.cold_keys), plain.ops_per_sec,
        cold.ops_per_sec, cold.ops_per_sec / plain.ops_per_sec,
        static_cast<double>(cold.recalls) / static_cast<double>(keys.size()),
        static_cast<unsigned long long>(plain.unexpected + cold.unexpected));
    return plain.unexpected + cold.unexpected == 0 ? 0 : 1;
}

// ---- recovery ---------------------------------------------------------------------------------------

/// The records' last updates: the first H keys 1 to 12 hours ago, the others 2 to 6 days ago.
void build_window_store(const args& a, const std::string& path) {
    const auto n = static_cast<std::size_t>(a.window_records);
    const auto hot = static_cast<std::size_t>(a.hot);
    const std::int64_t now = wall_ms();
    constexpr std::int64_t hour = 3600 * 1000, day = 24 * hour;
    idem::sqlite_store st(path, false);
    write_records(st, make_keys(a.seed, n), [&](std::size_t i) {
        if (i < hot) return now - hour - static_cast<std::int64_t>(i) * (11 * hour) / static_cast<std::int64_t>(hot);
        return now - 2 * day - static_cast<std::int64_t>(i - hot) * (4 * day) / static_cast<std::int64_t>(n - hot);
    });
}

int run_recovery(const args& a) {
    namespace fs = std::filesystem;
    if (!is_sqlite(a.store)) {
        std::fprintf(stderr, "window_bench: --mode recovery takes a sqlite: store\n");
        return 2;
    }
    const std::string path = a.store.substr(7);
    const std::string tmpl = path + ".window-" + std::to_string(a.window_records) + "-" + std::to_string(a.hot) + "-seed" +
                             std::to_string(a.seed) + "-v" + std::to_string(idem::sqlite_store::schema_version);
    bool cached = fs::exists(tmpl) && fs::last_write_time(tmpl) > fs::file_time_type::clock::now() - std::chrono::hours(6);
    double build_s = 0;
    if (!cached) {
        const auto t0 = clk::now();
        const std::string building = tmpl + ".building";
        remove_sqlite(building);
        remove_sqlite(tmpl);
        const pid_t pid = ::fork();  // built in a child: its memory is not this process's
        if (pid == 0) {
            try {
                build_window_store(a, building);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "window_bench: building %s: %s\n", building.c_str(), e.what());
                ::_exit(1);
            }
            ::_exit(0);
        }
        int status = 0;
        if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return 3;
        for (const char* suffix : {"-wal", "-shm"})
            if (fs::exists(building + suffix)) {
                std::fprintf(stderr, "window_bench: %s%s left after close\n", building.c_str(), suffix);
                return 3;
            }
        std::remove((building + ".lock").c_str());
        fs::rename(building, tmpl);
        build_s = seconds(clk::now() - t0);
    }
    remove_sqlite(path);
    fs::copy_file(tmpl, path);
    idem::options o;
    o.capacity = static_cast<std::size_t>(a.hot) + 1024;
    o.maintenance_interval = {};
    idem::store_options so;
    so.mode = idem::durability::async;
    so.prune_interval = {};  // nothing is past the window; no background prune beside the measurement
    so.start = a.start;
    const bool claims_first = a.start == idem::recovery_start::claims_first;
    // claims_first: requests while the window's keys stream in, each timed alone: duplicates of hot
    // keys (the first keys of the store) and fresh keys, alternating; every duplicate must be
    // answered succeeded (unexpected counts the others).
    const std::size_t sample = claims_first ? std::min<std::size_t>(2000, static_cast<std::size_t>(a.hot)) : 0;
    const auto hot_keys = make_keys(a.seed, sample);
    std::mt19937_64 fresh_rng(a.seed ^ 0x5eed);
    const memory before = read_memory();
    const auto t0 = clk::now();
    idem::durable_guard g(std::make_unique<idem::sqlite_store>(path, false), o, so);
    const double open_s = seconds(clk::now() - t0);
    const memory after = read_memory();
    std::vector<double> dup_us, fresh_us;
    std::size_t unexpected = 0, during_stream = 0;
    for (std::size_t i = 0; i < sample; ++i) {
        const bool streaming = !g.recovery().cold_complete;
        auto t = clk::now();
        const auto d = g->begin(idem::key(hot_keys[i]));
        dup_us.push_back(std::chrono::duration<double, std::micro>(clk::now() - t).count());
        if (d.status != idem::begin_status::succeeded) ++unexpected;
        const std::string fresh = format_uuid(draw_uuid(fresh_rng));
        t = clk::now();
        auto f = g->begin(idem::key(fresh));
        fresh_us.push_back(std::chrono::duration<double, std::micro>(clk::now() - t).count());
        if (f.status != idem::begin_status::acquired) ++unexpected;
        else (void)f.ticket.succeed(1);
        if (streaming) ++during_stream;
    }
    const bool complete = g.wait_for_cold_window(std::chrono::minutes(10));
    const memory done = read_memory();
    const auto r = g.recovery();
    const auto s = g.snapshot();
    const auto* w = g.guard().cold_window();
    auto pct = [](std::vector<double> v, double q) {
        if (v.empty()) return 0.0;
        std::sort(v.begin(), v.end());
        return v[std::min(v.size() - 1, static_cast<std::size_t>(q * static_cast<double>(v.size())))];
    };
    std::printf(
        "{\"mode\":\"recovery\",\"start\":\"%s\",\"store\":\"%s\",\"window_records\":%ld,\"hot\":%ld,"
        "\"template_cached\":%s,\"build_s\":%.1f,\"open_s\":%.3f,\"elapsed_s\":%.3f,\"cold_elapsed_s\":%.3f,"
        "\"cold_complete_s\":%.3f,\"records\":%zu,\"cold\":%zu,\"expired\":%zu,\"rss_before_mb\":%.1f,"
        "\"rss_after_mb\":%.1f,\"rss_complete_mb\":%.1f,\"peak_rss_mb\":%.1f,\"cold_keys\":%llu,\"cold_bytes\":%llu,"
        "\"cold_bytes_per_key\":%.3f,\"cold_slices\":%llu,\"sampled\":%zu,\"sampled_during_stream\":%zu,"
        "\"dup_p50_us\":%.1f,\"dup_p99_us\":%.1f,\"fresh_p50_us\":%.1f,\"fresh_p99_us\":%.1f,\"unexpected\":%zu}\n",
        claims_first ? "claims_first" : "load_window", store_kind(a.store).c_str(), a.window_records, a.hot,
        cached ? "true" : "false", build_s, open_s, seconds(r.elapsed), seconds(r.cold_elapsed),
        claims_first ? seconds(r.cold_complete_after) : seconds(r.elapsed), r.records, r.cold, r.expired,
        before.rss_kb / 1024.0, after.rss_kb / 1024.0, done.rss_kb / 1024.0, done.hwm_kb / 1024.0,
        static_cast<unsigned long long>(s.cold_keys), static_cast<unsigned long long>(s.cold_bytes),
        s.cold_keys != 0 ? static_cast<double>(s.cold_bytes) / static_cast<double>(s.cold_keys) : 0.0,
        static_cast<unsigned long long>(w != nullptr ? w->use().slices : 0), sample, during_stream, pct(dup_us, 0.5),
        pct(dup_us, 0.99), pct(fresh_us, 0.5), pct(fresh_us, 0.99), unexpected);
    const auto window = static_cast<std::size_t>(a.window_records), hot = static_cast<std::size_t>(a.hot);
    // claims_first: nothing was in flight, every record of the window is in the filter (and the
    // sampled fresh keys the stream may have met already flushed).
    const bool ok = claims_first ? complete && r.records == 0 && r.cold >= window && r.cold <= window + sample &&
                                       r.expired == 0 && unexpected == 0
                                 : r.records == hot && r.cold == window - hot && r.expired == 0;
    return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    args a;
    for (int i = 1; i < argc; i += 2) {
        const std::string f = argv[i];
        if (i + 1 >= argc) {
            std::fprintf(stderr, "window_bench: %s needs a value\n", f.c_str());
            return 2;
        }
        const std::string v = argv[i + 1];
        if (f == "--mode" && (v == "recall" || v == "recovery" || v == "fresh")) a.mode = v;
        else if (f == "--cold") a.cold = std::stol(v);
        else if (f == "--store") a.store = v;
        else if (f == "--records") a.records = std::stol(v);
        else if (f == "--ops") a.ops = std::stol(v);
        else if (f == "--window-records") a.window_records = std::stol(v);
        else if (f == "--hot") a.hot = std::stol(v);
        else if (f == "--seed") a.seed = std::stoull(v);
        else if (f == "--start" && (v == "load_window" || v == "claims_first"))
            a.start = v == "claims_first" ? idem::recovery_start::claims_first : idem::recovery_start::load_window;
        else {
            std::fprintf(stderr, "window_bench: unknown flag or value: %s %s\n", f.c_str(), v.c_str());
            return 2;
        }
    }
    if (a.mode.empty() || a.records <= 0 || a.ops < 0 || a.hot < 0 || a.window_records <= a.hot) {
        std::fprintf(stderr,
                     "usage: window_bench --mode recall --store URI [--records N] [--ops M]\n"
                     "       window_bench --mode recovery --store sqlite:PATH [--window-records N] [--hot H]\n"
                     "                    [--start load_window|claims_first]\n"
                     "       window_bench --mode fresh --store URI [--cold K] [--ops M]\n");
        return 2;
    }
    if (a.ops == 0) a.ops = a.mode == "fresh" ? 200000 : 20000;
    try {
        if (a.mode == "fresh") return run_fresh(a);
        return a.mode == "recall" ? run_recall(a) : run_recovery(a);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "window_bench: %s\n", e.what());
        return 3;
    }
}
