// bench/global_bench.cpp: scope::global (idem::global_guard) beside process scope and beside a plain
// per-request INSERT ... ON CONFLICT, against one PostgreSQL, side by side in one binary.
//
// Needs IDEM_BENCH_PG_URI (a server; the binary creates a database idem_bench_<random> on it and
// drops it at the end). Scenarios, every one "begin + succeed on a fresh key" unless it says
// duplicate:
//
//   global_claim/processes:P   P processes (copies of this binary, "global_bench child ...") x
//                              `threads` threads each (16), each sharing one database in global
//                              scope, for `seconds` (5) after a common start. items_per_second =
//                              claims completed by all processes / seconds: the store's throughput.
//   global_claim_mysql/processes:P
//                              the same with MariaDB as the arbiter, when IDEM_BENCH_MY_URI names a
//                              server (a database idem_bench_<random> is created on it and dropped).
//   global_duplicate           begin on keys this process already completed: answered by the local
//                              table, no round trip (2^16 keys, random order).
//   process_duplicate          the same on an idem::guard (process scope, memory).
//   process_claim_memory       process scope, memory only: the floor.
//   process_claim_pg_sync      process scope over postgres_store in sync mode (group commit): what
//                              one process pays for a durable claim when it alone is the arbiter.
//   plain_insert               one autocommit INSERT ... ON CONFLICT DO NOTHING per request on the
//                              thread's own connection (a Redis-SET-NX-style guard in SQL).
//   plain_claim/processes:P    the article's guard without idem, as global_claim runs (P processes x
//                              16 threads, 5 s): per request an autocommit INSERT of the key as
//                              PROCESSING (ON CONFLICT DO NOTHING; one row inserted = acquired), then
//                              an autocommit UPDATE to SUCCESS with the outcome, each thread on its
//                              own connection. The peer global_claim is measured against (ratio at
//                              4 processes in docs/benchmarks.md's targets).
//
// The tables start with a window in use: 100,000 decided keys in idempotent_record and in
// plain_claim, analyzed (bench_database), so the plans are a live service's, not an empty table's
// (IDEM_BENCH_WINDOW_RECORDS=N: N keys instead; 0 measures a database created for the run).
//
// Both multi-process PostgreSQL runs also say what they cost the server, per claim (per request for
// plain_claim), read from the server around the run (server_cost): wal_bytes_per_claim,
// commits_per_claim, rows_written_per_claim (pg_stat_database: inserted + updated + deleted) and
// server_cpu_us_per_claim (the server's processes, from /proc; absent when the server is elsewhere).
//
// Keys are generated before timing. Threads in one process: ->Threads(T)->UseRealTime(); the
// multi-process runs use manual time (the children's common window). Figures and the command that
// made them: docs/benchmarks.md, section "Global scope".
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <latch>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <pqxx/pqxx>

#include "idem/durable.hpp"
#include "idem/global_guard.hpp"
#include "idem/stores/postgres_store.hpp"
#ifdef IDEM_HAVE_MYSQL  // defined by the idem::mysql target
#include "idem/stores/mysql_store.hpp"
#endif

#if __has_include("idem_bench_build.hpp")
#include "idem_bench_build.hpp"
#endif

extern char** environ;

namespace {

namespace pg = idem::detail::pg;
using namespace std::chrono_literals;

constexpr unsigned threads_per_process = 16;
constexpr int seconds_per_run = 5;
constexpr std::size_t dup_keys = std::size_t{1} << 16;
/// Decided keys in the tables before any run: 100,000, or IDEM_BENCH_WINDOW_RECORDS (0: empty tables).
std::size_t window_records() {
    const char* v = std::getenv("IDEM_BENCH_WINDOW_RECORDS");
    return v ? std::stoul(v) : 100'000;
}

std::string server_uri() {
    const char* u = std::getenv("IDEM_BENCH_PG_URI");
    return u ? u : "";
}

/// The benchmark database: created on first use, dropped at exit.
class bench_database {
public:
    static bench_database& get() {
        static bench_database d;
        return d;
    }
    const std::string& uri() const { return uri_; }
    void drop() {
        if (db_.empty()) return;
        try {
            pqxx::connection c(server_);
            pqxx::nontransaction n(c);
            n.exec("DROP DATABASE IF EXISTS " + db_ + " WITH (FORCE)");
        } catch (const std::exception& e) {
            std::fprintf(stderr, "global_bench: cannot drop %s: %s\n", db_.c_str(), e.what());
        }
        db_.clear();
    }

private:
    bench_database() : server_(server_uri()) {
        if (server_.empty()) {
            std::fprintf(stderr, "global_bench: IDEM_BENCH_PG_URI is unset (postgresql://USER@HOST:PORT/DB)\n");
            std::exit(2);
        }
        std::random_device rd;
        char name[40];
        std::snprintf(name, sizeof name, "idem_bench_%08x", rd());
        db_ = name;
        pqxx::connection c(server_);
        pqxx::nontransaction n(c);
        n.exec("CREATE DATABASE " + db_);
        uri_ = pg::with_database(server_, db_);
        idem::postgres_store schema(uri_);  // creates the schema once
        pqxx::connection d(uri_);
        pqxx::nontransaction m(d);
        m.exec("CREATE TABLE IF NOT EXISTS plain_guard (k text PRIMARY KEY, outcome bigint NOT NULL)");
        m.exec("CREATE TABLE IF NOT EXISTS plain_claim (k text PRIMARY KEY, status text NOT NULL, outcome bigint NOT NULL)");
        // A window in use, not an empty table: both guards' tables already hold `window_records`
        // decided keys, and the planner's statistics say so (ANALYZE), as a live service's do. On
        // a table created a moment before, the first plans PostgreSQL caches for the batch
        // statements read the whole (tiny) table, and stay cached until autovacuum's first ANALYZE
        // of it (up to a minute later): a fresh database's first minute, not the service's
        // ceiling (docs/operations.md, "A new database's first minute").
        const std::string w = std::to_string(window_records());
        m.exec(
            "INSERT INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
            "request_fingerprint, created_time, updated_time) SELECT 'W-' || g || '_PAY_v1', 'PAY', 'SUCCESS', 1, 0, "
            "g, 0, now_ms, now_ms FROM generate_series(1, " +
            w +
            ") AS g, "
            "(SELECT (extract(epoch FROM now()) * 1000)::bigint AS now_ms) AS t");  // inside the window: none pruned
        m.exec("INSERT INTO plain_claim SELECT 'W-' || g || '_PAY_v1', 'SUCCESS', g FROM generate_series(1, " + w +
               ") AS g");
        m.exec("ANALYZE idempotent_record");
        m.exec("ANALYZE plain_claim");
    }
    std::string server_, db_, uri_;
};

#ifdef IDEM_HAVE_MYSQL
/// The MariaDB benchmark database (IDEM_BENCH_MY_URI): created on first use, dropped at exit.
class my_bench_database {
public:
    static my_bench_database& get() {
        static my_bench_database d;
        return d;
    }
    const std::string& uri() const { return uri_; }
    void drop() {
        if (db_.empty()) return;
        try {
            idem::detail::my::session s;
            s.open(idem::detail::my::parse_uri(server_), 10s);
            s.run("DROP DATABASE IF EXISTS " + db_);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "global_bench: cannot drop %s: %s\n", db_.c_str(), e.what());
        }
        db_.clear();
    }

private:
    my_bench_database() {
        const char* u = std::getenv("IDEM_BENCH_MY_URI");
        server_ = u ? u : "";
        std::random_device rd;
        char name[40];
        std::snprintf(name, sizeof name, "idem_bench_%08x", rd());
        db_ = name;  // hex digits only
        idem::detail::my::session s;
        s.open(idem::detail::my::parse_uri(server_), 10s);
        s.run("CREATE DATABASE " + db_);
        uri_ = server_.substr(0, server_.rfind('/') + 1) + db_;
        idem::mysql_store schema(uri_);  // creates the schema once
    }
    std::string server_, db_, uri_;
};
#endif

/// Fresh key text: "<prefix>-<n>_PAY_v1", unique per (prefix, n).
std::string key_text(const std::string& prefix, std::size_t n) { return prefix + "-" + std::to_string(n) + "_PAY_v1"; }

std::string run_prefix(const char* what) {
    static std::atomic<unsigned> runs{0};
    std::random_device rd;
    char buf[48];
    std::snprintf(buf, sizeof buf, "%s%u%06x", what, runs.fetch_add(1), rd() & 0xffffff);
    return buf;
}

// ---- global scope, P processes -------------------------------------------------------------------

/// A worker process: stdin for "go", stdout for its report.
class child {
public:
    explicit child(const std::vector<std::string>& args) {
        int in[2], out[2];
        if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) std::abort();
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
        posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
        std::vector<std::string> a{"/proc/self/exe", "child"};
        a.insert(a.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (auto& s : a) argv.push_back(s.data());
        argv.push_back(nullptr);
        if (::posix_spawn(&pid_, "/proc/self/exe", &fa, nullptr, argv.data(), environ) != 0) std::abort();
        posix_spawn_file_actions_destroy(&fa);
        ::close(in[0]);
        ::close(out[1]);
        to_ = in[1];
        from_ = out[0];
    }
    ~child() {
        ::close(to_);
        ::close(from_);
        int st;
        if (::waitpid(pid_, &st, WNOHANG) == 0) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, &st, 0);
        }
    }
    void send(const std::string& l) { (void)!::write(to_, (l + "\n").data(), l.size() + 1); }
    std::string line(std::chrono::seconds timeout) {
        const auto until = std::chrono::steady_clock::now() + timeout;
        for (;;) {
            if (const auto nl = buf_.find('\n'); nl != std::string::npos) {
                std::string l = buf_.substr(0, nl);
                buf_.erase(0, nl + 1);
                return l;
            }
            if (std::chrono::steady_clock::now() > until) return "";
            pollfd p{from_, POLLIN, 0};
            if (::poll(&p, 1, 1000) <= 0) continue;
            char b[1024];
            const ssize_t n = ::read(from_, b, sizeof b);
            if (n <= 0) return "";
            buf_.append(b, static_cast<std::size_t>(n));
        }
    }

private:
    pid_t pid_ = -1;
    int to_ = -1, from_ = -1;
    std::string buf_;
};

/// What a child does once it is ready: prints "ready", waits for "go", then runs `one(t, i)` (true:
/// the i-th request of thread t went as it should) on `threads` threads for `seconds`, and prints
/// its report ("done claims=... bad=... secs=... batches=..."; `batches()` after the run).
constexpr std::size_t per_thread = 20'000;  // far more than a thread claims in `seconds` over a network

template <class One, class Batches>
int serve_run(unsigned threads, int seconds, const One& one, const Batches& batches) {
    std::printf("ready\n");
    std::fflush(stdout);
    std::string go;
    if (!std::getline(std::cin, go)) return 3;
    std::atomic<bool> stop{false};
    std::vector<std::uint64_t> done(threads, 0), bad(threads, 0);
    std::vector<std::thread> ts;
    const auto t0 = std::chrono::steady_clock::now();
    for (unsigned t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            for (std::size_t i = 0; i < per_thread && !stop.load(std::memory_order_relaxed); ++i)  // relaxed: a flag
                ++(one(t, i) ? done : bad)[t];
        });
    std::this_thread::sleep_for(std::chrono::seconds(seconds));
    stop = true;
    for (auto& t : ts) t.join();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("done claims=%llu bad=%llu secs=%.6f batches=%llu\n",
                (unsigned long long)std::accumulate(done.begin(), done.end(), std::uint64_t{0}),
                (unsigned long long)std::accumulate(bad.begin(), bad.end(), std::uint64_t{0}), secs,
                (unsigned long long)batches());
    std::fflush(stdout);
    return 0;
}

/// Child: `threads` threads run begin + succeed on fresh keys for `seconds` after "go" in global
/// scope, or, with a 7th argument "plain", the plain guard of plain_claim: each thread on its own
/// connection, an INSERT (PROCESSING) then an UPDATE (SUCCESS) per fresh key.
int child_main(int argc, char** argv) {
    if (argc < 6) return 2;
    const std::string uri = argv[2], prefix = argv[3];
    const unsigned threads = static_cast<unsigned>(std::stoul(argv[4]));
    const int seconds = std::stoi(argv[5]);
    std::vector<std::vector<std::string>> keys(threads);  // generated before timing
    for (unsigned t = 0; t < threads; ++t) {
        keys[t].reserve(per_thread);
        for (std::size_t i = 0; i < per_thread; ++i) keys[t].push_back(key_text(prefix + "t" + std::to_string(t), i));
    }
    if (argc >= 7 && std::string(argv[6]) == "plain") {
        std::vector<std::unique_ptr<pqxx::connection>> cs;
        for (unsigned t = 0; t < threads; ++t) {
            cs.push_back(std::make_unique<pqxx::connection>(uri));
            cs.back()->prepare("claim",
                               "INSERT INTO plain_claim (k, status, outcome) VALUES ($1, 'PROCESSING', 0) "
                               "ON CONFLICT (k) DO NOTHING");
            cs.back()->prepare("done",
                               "UPDATE plain_claim SET status = 'SUCCESS', outcome = $2 WHERE k = $1 AND "
                               "status = 'PROCESSING'");
        }
        return serve_run(
            threads, seconds,
            [&](unsigned t, std::size_t i) {
                const std::string& k = keys[t][i];
                {
                    pqxx::nontransaction claim(*cs[t]);  // one autocommit statement: the claim
                    if (claim.exec_prepared("claim", k).affected_rows() != 1) return false;
                }
                pqxx::nontransaction done(*cs[t]);  // and one for the completion
                return done.exec_prepared("done", k, static_cast<std::int64_t>(i)).affected_rows() == 1;
            },
            [] { return std::uint64_t{0}; });
    }
    std::vector<std::vector<idem::key>> ks(threads);
    for (unsigned t = 0; t < threads; ++t)
        for (const std::string& k : keys[t]) ks[t].emplace_back(k);
    idem::options o;
    o.capacity = threads * per_thread;
    idem::global_options gopt;  // IDEM_BENCH_CLAIM_CONNECTIONS / _COMPLETION_CONNECTIONS / _BATCH_BESIDE: other settings
    if (const char* v = std::getenv("IDEM_BENCH_CLAIM_CONNECTIONS")) gopt.claim_connections = std::stoul(v);
    if (const char* v = std::getenv("IDEM_BENCH_COMPLETION_CONNECTIONS")) gopt.completion_connections = std::stoul(v);
    if (const char* v = std::getenv("IDEM_BENCH_BATCH_BESIDE")) gopt.batch_beside = std::stoul(v);
    idem::global_guard g(uri, o, gopt);
    return serve_run(
        threads, seconds,
        [&](unsigned t, std::size_t i) {
            auto r = g.begin(ks[t][i]);
            return r.status == idem::begin_status::acquired && !r.ticket.succeed(i);
        },
        [&] { return g.snapshot().claim_batches; });
}

/// What one run cost the PostgreSQL server, read from the server itself from the start signal to
/// the end of the run: WAL bytes
/// (pg_current_wal_lsn, exact and cluster-wide), commits and rows written in the benchmark database
/// (pg_stat_database, read after every backend of the run has exited, which is when a backend's
/// counters are certainly flushed), and the server's CPU time (from /proc: the postmaster's own and
/// its exited children's, plus its live children's, backends included; absent when the server is not
/// on this machine). Divided by the claims, these say what a claim costs the server beside a plain request.
class server_cost {
public:
    explicit server_cost(const std::string& uri) : uri_(uri) {
        pqxx::connection c(uri_);
        pqxx::nontransaction n(c);
        const auto pid = n.exec1("SELECT pg_backend_pid()")[0].as<long>();
        postmaster_ = parent_of(pid);
        await_idle(n);  // the set-up's backends (the preload) report their counters as they exit
    }
    /// The first sample: taken when every process is ready, so their setup (connections, schema
    /// checks, prepared statements) is not counted.
    void start() {
        pqxx::connection c(uri_);
        pqxx::nontransaction n(c);
        sample_ = read(n);
    }
    /// Sets state's per-claim counters from the difference since construction.
    void report(benchmark::State& state, std::uint64_t claims) {
        pqxx::connection c(uri_);
        pqxx::nontransaction n(c);
        await_idle(n);  // the run's backends report their counters as they exit
        const sample now = read(n);
        const double k = claims ? 1.0 / static_cast<double>(claims) : 0;
        state.counters["wal_bytes_per_claim"] = static_cast<double>(
                                                    n.exec_params1("SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint",
                                                                   now.lsn, sample_.lsn)[0]
                                                        .as<long long>()) *
                                                k;
        state.counters["commits_per_claim"] = static_cast<double>(now.commits - sample_.commits) * k;
        state.counters["rows_written_per_claim"] = static_cast<double>(now.rows - sample_.rows) * k;
        if (postmaster_ > 0 && now.cpu_ticks >= sample_.cpu_ticks)
            state.counters["server_cpu_us_per_claim"] = static_cast<double>(now.cpu_ticks - sample_.cpu_ticks) * 1e6 /
                                                        static_cast<double>(::sysconf(_SC_CLK_TCK)) * k;
    }

private:
    struct sample {
        std::string lsn;
        long long commits = 0, rows = 0;
        unsigned long long cpu_ticks = 0;
    };
    /// Waits (bounded: 10 s) until no other backend is connected to the database.
    static void await_idle(pqxx::nontransaction& n) {
        for (int i = 0; i < 1000; ++i) {
            if (n.exec1("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> "
                        "pg_backend_pid()")[0]
                    .as<long>() == 0)
                return;
            std::this_thread::sleep_for(10ms);  // polling a condition the server reports, bounded
        }
    }
    sample read(pqxx::nontransaction& n) const {
        n.exec("SELECT pg_stat_clear_snapshot()");
        sample s;
        s.lsn = n.exec1("SELECT pg_current_wal_lsn()::text")[0].as<std::string>();
        const auto r = n.exec1(
            "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted FROM pg_stat_database WHERE datname = "
            "current_database()");
        s.commits = r[0].as<long long>();
        s.rows = r[1].as<long long>();
        s.cpu_ticks = server_ticks();
        return s;
    }
    /// Field `i` (1-based, as proc(5) numbers them) of /proc/PID/stat; empty when unreadable.
    static std::vector<std::string> stat_fields(long pid) {
        std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
        std::string line;
        if (!std::getline(f, line)) return {};
        const auto close = line.rfind(')');  // the command name may hold spaces
        if (close == std::string::npos) return {};
        std::vector<std::string> v{std::to_string(pid), line.substr(0, close + 1)};
        std::istringstream rest(line.substr(close + 1));
        for (std::string w; rest >> w;) v.push_back(w);
        return v;
    }
    static long parent_of(long pid) {
        const auto v = stat_fields(pid);
        return v.size() > 3 ? std::stol(v[3]) : -1;
    }
    /// utime + stime of the postmaster and its live children, + cutime + cstime of the postmaster (its
    /// exited children): a backend that exits between two samples moves from one sum to the other.
    unsigned long long server_ticks() const {
        if (postmaster_ <= 0) return 0;
        const auto cpu = [](const std::vector<std::string>& v, bool children) {
            unsigned long long t = std::stoull(v[13]) + std::stoull(v[14]);
            if (children) t += std::stoull(v[15]) + std::stoull(v[16]);
            return t;
        };
        const auto pm = stat_fields(postmaster_);
        if (pm.size() < 17) return 0;
        unsigned long long t = cpu(pm, true);
        for (const auto& e : std::filesystem::directory_iterator("/proc")) {
            const std::string name = e.path().filename();
            if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
            const auto v = stat_fields(std::stol(name));
            if (v.size() > 16 && std::stol(v[3]) == postmaster_) t += cpu(v, false);
        }
        return t;
    }
    std::string uri_;
    long postmaster_ = -1;
    sample sample_;
};

void global_claim_on(benchmark::State& state, const std::string& uri, bool plain = false, bool measure_server = true) {
    const int procs = static_cast<int>(state.range(0));
    for (auto _ : state) {
        const std::string prefix = run_prefix(plain ? "P" : "G");
        std::optional<server_cost> cost;
        if (measure_server) cost.emplace(uri);
        std::vector<std::unique_ptr<child>> cs;
        for (int p = 0; p < procs; ++p) {
            std::vector<std::string> args{uri, prefix + "p" + std::to_string(p), std::to_string(threads_per_process),
                                          std::to_string(seconds_per_run)};
            if (plain) args.emplace_back("plain");
            cs.push_back(std::make_unique<child>(args));
        }
        for (auto& c : cs)
            if (c->line(120s) != "ready") state.SkipWithError("a child did not start");
        if (cost) cost->start();
        for (auto& c : cs) c->send("go");
        std::uint64_t claims = 0, bad = 0, batches = 0;
        double secs = 0;
        for (auto& c : cs) {
            std::istringstream in(c->line(std::chrono::seconds(seconds_per_run + 120)));
            std::string w;
            in >> w;
            while (in >> w) {
                const auto eq = w.find('=');
                const std::string k = w.substr(0, eq), v = w.substr(eq + 1);
                if (k == "claims") claims += std::stoull(v);
                if (k == "bad") bad += std::stoull(v);
                if (k == "batches") batches += std::stoull(v);
                if (k == "secs") secs = std::max(secs, std::stod(v));
            }
        }
        state.SetIterationTime(secs);
        state.SetItemsProcessed(static_cast<std::int64_t>(claims));
        state.counters["processes"] = procs;
        state.counters["threads_per_process"] = threads_per_process;
        state.counters["claims_per_batch"] = batches ? static_cast<double>(claims) / static_cast<double>(batches) : 0;
        state.counters["unexpected"] = static_cast<double>(bad);
        cs.clear();  // the children exit, and with them their connections
        if (cost) cost->report(state, claims);
    }
}
void global_claim(benchmark::State& state) { global_claim_on(state, bench_database::get().uri()); }
void plain_claim(benchmark::State& state) { global_claim_on(state, bench_database::get().uri(), /*plain=*/true); }
#ifdef IDEM_HAVE_MYSQL
void global_claim_mysql(benchmark::State& state) {
    global_claim_on(state, my_bench_database::get().uri(), false, /*measure_server=*/false);
}
#endif

/// 1, 2 and 4 processes, one run each, timed by the children's common window.
void per_processes(benchmark::internal::Benchmark* b) {
    b->ArgName("processes")->Arg(1)->Arg(2)->Arg(4)->Iterations(1)->UseManualTime()->Unit(benchmark::kSecond);
}
BENCHMARK(global_claim)->Apply(per_processes);
BENCHMARK(plain_claim)->Apply(per_processes);

// ---- duplicates of keys known locally ---------------------------------------------------------------

std::vector<idem::key> dup_key_set(const std::string& prefix) {
    std::vector<idem::key> v;
    v.reserve(dup_keys);
    for (std::size_t i = 0; i < dup_keys; ++i) v.emplace_back(key_text(prefix, i));
    return v;
}
std::vector<std::uint32_t> random_order() {
    std::vector<std::uint32_t> v(dup_keys);
    std::iota(v.begin(), v.end(), 0u);
    std::shuffle(v.begin(), v.end(), std::mt19937_64(7));
    return v;
}

template <class Guard>
void duplicates(benchmark::State& state, Guard& g, const std::vector<idem::key>& keys,
                const std::vector<std::uint32_t>& order, std::atomic<std::uint64_t>& unexpected) {
    std::size_t i = static_cast<std::size_t>(state.thread_index()) * 4099;
    std::uint64_t bad = 0;
    for (auto _ : state) {
        auto r = g.begin(keys[order[i & (dup_keys - 1)]]);
        bad += r.status != idem::begin_status::succeeded;
        benchmark::DoNotOptimize(r.outcome);
        ++i;
    }
    unexpected += bad;
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}

std::unique_ptr<idem::global_guard> g_dup_guard;
std::vector<idem::key> g_dup_keys;
std::unique_ptr<idem::guard> p_dup_guard;
std::atomic<std::uint64_t> dup_unexpected{0};

void global_duplicate(benchmark::State& state) {
    if (state.thread_index() == 0 && !g_dup_guard) {  // filled once, through the store
        idem::options o;
        o.capacity = dup_keys * 2;
        g_dup_guard = std::make_unique<idem::global_guard>(bench_database::get().uri(), o);
        g_dup_keys = dup_key_set(run_prefix("D"));
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < 16; ++t)
            ts.emplace_back([t] {
                for (std::size_t i = t; i < dup_keys; i += 16) {
                    auto r = g_dup_guard->begin(g_dup_keys[i]);
                    if (r.status == idem::begin_status::acquired) (void)r.ticket.succeed(i);
                }
            });
        for (auto& t : ts) t.join();
    }
    static const std::vector<std::uint32_t> order = random_order();
    duplicates(state, *g_dup_guard, g_dup_keys, order, dup_unexpected);
    if (state.thread_index() == 0) state.counters["unexpected"] = static_cast<double>(dup_unexpected.exchange(0));
}
BENCHMARK(global_duplicate)->Threads(1)->Threads(2)->UseRealTime();

void process_duplicate(benchmark::State& state) {
    static const std::vector<idem::key> keys = dup_key_set("P");
    if (state.thread_index() == 0 && !p_dup_guard) {
        idem::options o;
        o.capacity = dup_keys * 2;
        p_dup_guard = std::make_unique<idem::guard>(o);
        for (std::size_t i = 0; i < dup_keys; ++i) (void)p_dup_guard->begin(keys[i]).ticket.succeed(i);
    }
    static const std::vector<std::uint32_t> order = random_order();
    duplicates(state, *p_dup_guard, keys, order, dup_unexpected);
    if (state.thread_index() == 0) state.counters["unexpected"] = static_cast<double>(dup_unexpected.exchange(0));
}
BENCHMARK(process_duplicate)->Threads(1)->Threads(2)->UseRealTime();

// ---- process scope claims, and the plain INSERT -----------------------------------------------------

void process_claim_memory(benchmark::State& state) {
    constexpr std::size_t n = std::size_t{1} << 20;
    static const std::vector<idem::key> keys = [] {
        std::vector<idem::key> v;
        for (std::size_t i = 0; i < n; ++i) v.emplace_back(key_text("M", i));
        return v;
    }();
    static std::unique_ptr<idem::guard> g;
    if (state.thread_index() == 0) {
        idem::options o;
        o.capacity = n;
        g = std::make_unique<idem::guard>(o);
    }
    std::size_t i = static_cast<std::size_t>(state.thread_index());
    for (auto _ : state) {
        auto r = g->begin(keys[i]);
        (void)r.ticket.succeed(i);
        i += static_cast<std::size_t>(state.threads());
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
}
BENCHMARK(process_claim_memory)->Threads(1)->Threads(2)->UseRealTime()->Iterations(1 << 18);

void process_claim_pg_sync(benchmark::State& state) {
    constexpr std::size_t n = 400'000;
    static std::vector<idem::key> keys;
    static std::unique_ptr<idem::durable_guard> g;
    static std::atomic<std::size_t> next{0};
    if (state.thread_index() == 0) {
        keys.clear();
        const std::string prefix = run_prefix("S");
        for (std::size_t i = 0; i < n; ++i) keys.emplace_back(key_text(prefix, i));
        // A database of its own: recovery loads every record of the store it opens.
        static const std::string uri = [] {
            const std::string db = "idem_bench_sync_" + std::to_string(::getpid());
            pqxx::connection c(server_uri());
            pqxx::nontransaction t(c);
            t.exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)");
            t.exec("CREATE DATABASE " + db);
            return pg::with_database(server_uri(), db);
        }();
        idem::options o;
        o.capacity = 2 * n;  // recovery loads the records of the earlier (calibration) runs too
        idem::store_options so;
        so.mode = idem::durability::sync;
        g = std::make_unique<idem::durable_guard>(std::make_unique<idem::postgres_store>(uri), o, so);
        next = 0;
    }
    std::uint64_t bad = 0;
    for (auto _ : state) {
        const std::size_t i = next.fetch_add(1, std::memory_order_relaxed) % n;  // relaxed: distinct indexes only
        auto r = g->guard().begin(keys[i]);
        bad += r.status != idem::begin_status::acquired || r.ticket.succeed(i);
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
    state.counters["unexpected"] = static_cast<double>(bad);
}
BENCHMARK(process_claim_pg_sync)->Threads(1)->Threads(16)->UseRealTime()->MinTime(3.0);

void plain_insert(benchmark::State& state) {
    const std::string prefix = run_prefix("I") + "t" + std::to_string(state.thread_index());
    std::vector<std::string> keys;
    keys.reserve(200'000);
    for (std::size_t i = 0; i < 200'000; ++i) keys.push_back(key_text(prefix, i));
    pqxx::connection c(bench_database::get().uri());
    c.prepare("ins", "INSERT INTO plain_guard (k, outcome) VALUES ($1, $2) ON CONFLICT (k) DO NOTHING");
    std::size_t i = 0;
    std::uint64_t bad = 0;
    for (auto _ : state) {
        pqxx::nontransaction n(c);
        const auto r = n.exec_prepared("ins", keys[i % keys.size()], static_cast<std::int64_t>(i));
        bad += r.affected_rows() != 1;
        ++i;
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()));
    state.counters["unexpected"] = static_cast<double>(bad);
}
BENCHMARK(plain_insert)->Threads(1)->Threads(16)->UseRealTime()->MinTime(3.0);

}  // namespace

int main(int argc, char** argv) {
    if (argc >= 2 && std::string(argv[1]) == "child") return child_main(argc, argv);
    benchmark::Initialize(&argc, argv);
#ifdef IDEM_BENCH_COMPILER
    benchmark::AddCustomContext("compiler", IDEM_BENCH_COMPILER);
    benchmark::AddCustomContext("cxx_flags", IDEM_BENCH_CXX_FLAGS);
#endif
    benchmark::AddCustomContext("postgres", pg::redact(server_uri()));
#ifdef IDEM_HAVE_MYSQL
    const char* my = std::getenv("IDEM_BENCH_MY_URI");
    if (my != nullptr && *my != '\0') {
        benchmark::AddCustomContext("mysql", idem::detail::my::redact(my));
        benchmark::RegisterBenchmark("global_claim_mysql", global_claim_mysql)->Apply(per_processes);
    }
#endif
    benchmark::RunSpecifiedBenchmarks();
    g_dup_guard.reset();
    bench_database::get().drop();
#ifdef IDEM_HAVE_MYSQL
    if (my != nullptr && *my != '\0') my_bench_database::get().drop();
#endif
    benchmark::Shutdown();
    return 0;
}
