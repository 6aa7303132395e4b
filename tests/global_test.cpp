// scope::global (idem::global_guard) against a real PostgreSQL 15.
//
// Needs IDEM_TEST_PG_URI (a server; scripts/test starts one). The restart tests start a server of
// their own with scripts/lib/postgres.sh (PG_BIN) and restart that one, so the tests sharing
// IDEM_TEST_PG_URI in parallel are not disturbed. The tests FAIL, never skip, when a server is
// missing, unreachable or cannot be started. Each test creates its own database idem_g_<random> and
// drops it afterwards.
//
// Several "nodes" are several processes: this binary starts copies of itself ("global_test child
// MODE key=value ..."), talks to them over stdin/stdout, and keeps the truth in an independent
// ledger: one line per executed effect, appended by the executing process to its own file. A key
// executed twice shows up as two lines, whichever processes wrote them.
//
//   ClaimReplay..., Release..., Compensation...
//                          one or two guards in this process: claim, replay, mismatch, release and
//                          re-claim, terminal failure, run(), extend, compensation fencing the owner
//   InDoubtProbe...        the probe that resolves an unanswered batch waits for a claim or
//                          completion batch that is still running (its batch row is written before
//                          it can block on a key)
//   Duplicates..., AnUnqueuedCompletion..., CompensationIsVisible...
//                          durable before visible: while a completion or compensation is held back
//                          (a row lock from another connection), or after it timed out or could not
//                          be queued, duplicates never see SUCCEEDED or FAILED
//   CompletionsAndRenewals...
//                          the completion and renewal statements reach their keys through the
//                          primary key under a live service's statistics, never by scanning the
//                          partial index of claims in flight (which grows with every claim)
//   AStuckCompletionBatch...
//                          a completion held back by a row lock does not hold back another key's
//                          completion (a second batch starts after the queue's patience)
//   InvalidKeys...         key{} and keys that are not UTF-8: invalid_key at once, nothing touched
//   GlobalOptions...       an option out of range: invalid_argument naming it, before any connection
//                          is attempted (an unreachable URI; needs no server)
//   Race4x25               4 processes x 25 threads (on a std::latch) race on the same 10k keys:
//                          every key executes exactly once, every thread of every process sees the
//                          winner's outcome, every acknowledged success is SUCCESS in the store
//   NodeDeath              a node holds claims and is paused (SIGSTOP) past its lease; two other
//                          nodes both read every expired claim, then race their fenced UPDATEs
//                          (each claim resolved once); node b claims the released keys again
//                          (fence 2); the paused node resumes (SIGCONT) and every fence it holds is
//                          rejected (stale_ticket), including on the keys node b holds now
//   ServerRestart*         3 processes race while their (private) PostgreSQL is restarted twice
//                          (immediate): no double execution, every acknowledged success is SUCCESS
// Every test ends with idem::verify over the store's audit trails: 0 violations.
#include <gtest/gtest.h>

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
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "idem/global_guard.hpp"
#include "idem/stores/mysql_store.hpp"
#include "idem/stores/postgres_store.hpp"
#include "idem/verify.hpp"

#include "drill/files.hpp"  // tools/drill: the one ledger appender
#include "support/my_database.hpp"
#include "support/private_mysql.hpp"
#include "support/private_pg.hpp"

extern char** environ;

// LeakSanitizer (ASan builds): libpqxx 6.4 leaks a PGresult per connection lost mid-transaction.
extern "C" const char* __lsan_default_suppressions() { return "leak:libpqxx\n"; }

// Allocation failure on demand: with fail_next_allocation set, the next operator new on that thread
// throws std::bad_alloc (the out-of-memory paths are reachable no other way). The whole non-aligned
// family is replaced, so that under a sanitizer every block is freed by the family that made it.
namespace {
thread_local bool fail_next_allocation = false;
void* allocate(std::size_t n) {
    if (fail_next_allocation) {
        fail_next_allocation = false;
        throw std::bad_alloc();
    }
    if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
    throw std::bad_alloc();
}
void* allocate(std::size_t n, const std::nothrow_t&) noexcept {
    try {
        return allocate(n);
    } catch (...) {
        return nullptr;
    }
}
}  // namespace
void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t& t) noexcept { return allocate(n, t); }
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return allocate(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

using namespace std::chrono_literals;
namespace pg = idem::detail::pg;

// ---- small helpers ----------------------------------------------------------------------------

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}

/// The arbiter these tests run on: IDEM_GLOBAL_TEST_ARBITER=mysql runs them on MariaDB
/// (IDEM_TEST_MY_URI; ctest's global_mysql_test), anything else on PostgreSQL (IDEM_TEST_PG_URI).
bool on_mysql() {
    static const bool m = env("IDEM_GLOBAL_TEST_ARBITER") == "mysql";
    return m;
}

/// The arbiter's store of `uri` (reads, verify).
std::unique_ptr<idem::store> open_store(const std::string& uri) {
    if (idem::detail::global::is_mysql_uri(uri)) return std::make_unique<idem::mysql_store>(uri, 10s);
    return std::make_unique<idem::postgres_store>(uri, 10s);
}

/// Appends whole lines with one write() each (O_APPEND: atomic against the other writers).

std::vector<std::vector<std::string>> read_fields(const std::string& path) {
    std::vector<std::vector<std::string>> out;
    std::ifstream in(path);
    std::string l;
    while (std::getline(in, l)) {
        std::istringstream s(l);
        std::vector<std::string> f;
        std::string w;
        while (s >> w) f.push_back(w);
        if (!f.empty()) out.push_back(std::move(f));
    }
    return out;
}

std::map<std::string, std::string> parse_args(int argc, char** argv, int from) {
    std::map<std::string, std::string> a;
    for (int i = from; i < argc; ++i) {
        const std::string s = argv[i];
        const auto eq = s.find('=');
        if (eq != std::string::npos) a[s.substr(0, eq)] = s.substr(eq + 1);
    }
    return a;
}

std::string race_key(std::uint64_t i) { return "RK" + std::to_string(i) + "_PAY_v1"; }
std::uint64_t fp_of(std::uint64_t i) { return idem::fingerprint_of("amount=" + std::to_string(i * 7)); }

// ---- a child process ----------------------------------------------------------------------------

class child {
public:
    explicit child(const std::vector<std::string>& args) {
        int in[2], out[2];
        if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe");
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
        posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
        std::vector<std::string> argv_s{"/proc/self/exe", "child"};
        argv_s.insert(argv_s.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (auto& s : argv_s) argv.push_back(s.data());
        argv.push_back(nullptr);
        const int rc = ::posix_spawn(&pid_, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        ::close(in[0]);
        ::close(out[1]);
        to_ = in[1];
        from_ = out[0];
        if (rc != 0) throw std::runtime_error(std::string("posix_spawn: ") + std::strerror(rc));
    }
    ~child() {
        if (to_ >= 0) ::close(to_);
        if (from_ >= 0) ::close(from_);
        if (!reaped_) {
            ::kill(pid_, SIGCONT);
            ::kill(pid_, SIGKILL);
            int st;
            ::waitpid(pid_, &st, 0);
        }
    }
    child(const child&) = delete;
    child& operator=(const child&) = delete;

    void send(const std::string& line) {
        const std::string l = line + "\n";
        (void)!::write(to_, l.data(), l.size());
    }
    /// The next line starting with `word`, or "" after `timeout` (or EOF).
    std::string expect(const std::string& word, std::chrono::milliseconds timeout) {
        const auto until = std::chrono::steady_clock::now() + timeout;
        for (;;) {
            std::size_t nl;
            while ((nl = buf_.find('\n')) != std::string::npos) {
                std::string l = buf_.substr(0, nl);
                buf_.erase(0, nl + 1);
                if (l.rfind(word, 0) == 0) return l;
                std::cerr << "[child " << pid_ << "] " << l << '\n';
            }
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until -
                                                                                    std::chrono::steady_clock::now());
            if (left.count() <= 0) return "";
            pollfd p{from_, POLLIN, 0};
            if (::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left.count(), 1000))) <= 0) continue;
            char b[4096];
            const ssize_t n = ::read(from_, b, sizeof b);
            if (n <= 0) return "";
            buf_.append(b, static_cast<std::size_t>(n));
        }
    }
    int wait() {
        int st = 0;
        ::waitpid(pid_, &st, 0);
        reaped_ = true;
        return st;
    }
    pid_t pid() const { return pid_; }

private:
    pid_t pid_ = -1;
    int to_ = -1, from_ = -1;
    bool reaped_ = false;
    std::string buf_;
};

std::map<std::string, std::int64_t> fields_of(const std::string& line) {
    std::map<std::string, std::int64_t> f;
    std::istringstream s(line);
    std::string w;
    while (s >> w)
        if (const auto eq = w.find('='); eq != std::string::npos) f[w.substr(0, eq)] = std::stoll(w.substr(eq + 1));
    return f;
}

// ---- child modes ----------------------------------------------------------------------------------

/// race: `threads` threads each walk all `keys` keys (own shuffled order) until every key has shown
/// its outcome. An acquired key is executed (ledger line "E i node"), then succeeded with outcome
/// node << 32 | i; a success is acknowledged (acks line "A i outcome") once succeed() returned {}.
/// Writes "S i outcome" for every key to `seen` (all threads of this process must agree).
int child_race(std::map<std::string, std::string> a) {
    const std::uint64_t keys = std::stoull(a["keys"]);
    const unsigned threads = static_cast<unsigned>(std::stoul(a["threads"]));
    const std::uint64_t node = std::stoull(a["node"]);
    idem::options o;
    o.capacity = keys * 2 + 64;
    o.lease = std::chrono::milliseconds(std::stoll(a["lease_ms"]));
    idem::global_options go;
    go.node = "node-" + std::to_string(node);
    go.call_deadline = 3s;
    go.wait_timeout = std::chrono::milliseconds(std::stoll(a["wait_ms"]));
    idem::global_guard g(a["uri"], o, go);
    idem::tool::drill::line_appender ledger(a["ledger"], false), acks(a["acks"], false);
    std::printf("ready\n");
    std::fflush(stdout);
    std::string go_line;
    if (!std::getline(std::cin, go_line)) return 3;

    std::vector<std::vector<std::uint64_t>> seen(threads, std::vector<std::uint64_t>(keys, ~0ull));
    std::atomic<std::uint64_t> executed{0}, acked{0}, unacked{0}, stale{0}, bad{0}, replays{0}, wrong{0}, unavailable{0};
    std::mutex em;
    std::string first_bad;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(std::stoll(a["seconds"]));
    std::latch start(threads);
    auto work = [&](unsigned t) {
        std::vector<std::uint64_t> pending(keys);
        for (std::uint64_t i = 0; i < keys; ++i) pending[i] = i;
        std::mt19937_64 rng(std::stoull(a["seed"]) * 1000 + node * 100 + t);
        std::shuffle(pending.begin(), pending.end(), rng);
        start.arrive_and_wait();
        while (!pending.empty() && std::chrono::steady_clock::now() < give_up) {
            std::vector<std::uint64_t> again;
            for (std::uint64_t i : pending) {
                const idem::key k(race_key(i));
                auto r = g.begin(k, fp_of(i));
                switch (r.status) {
                    case idem::begin_status::acquired: {
                        const std::uint64_t outcome = node << 32 | i;
                        ledger.append("E " + std::to_string(i) + " " + std::to_string(node) + "\n");
                        ++executed;
                        const std::error_code ec = r.ticket.succeed(outcome);
                        if (!ec) {
                            acks.append("A " + std::to_string(i) + " " + std::to_string(outcome) + "\n");
                            ++acked;
                            seen[t][i] = outcome;
                        } else {
                            if (ec == idem::errc::stale_ticket) ++stale;
                            ++unacked;
                            again.push_back(i);  // ask again: the store knows what became of it
                        }
                        break;
                    }
                    case idem::begin_status::succeeded:
                        ++replays;
                        if ((r.outcome & 0xffffffffu) != i) {
                            ++wrong;
                            std::lock_guard lk(em);
                            if (first_bad.empty())
                                first_bad = "key " + std::to_string(i) + " replayed outcome " + std::to_string(r.outcome);
                        }
                        seen[t][i] = r.outcome;
                        break;
                    case idem::begin_status::in_progress:
                    case idem::begin_status::in_doubt: again.push_back(i); break;
                    case idem::begin_status::store_unavailable:
                        ++unavailable;
                        again.push_back(i);
                        break;
                    default: {
                        ++bad;
                        std::lock_guard lk(em);
                        if (first_bad.empty()) first_bad = "key " + std::to_string(i) + ": " + idem::to_string(r.status);
                        break;
                    }
                }
            }
            pending.swap(again);
            if (!pending.empty()) std::this_thread::sleep_for(2ms);
        }
    };
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < threads; ++t) ts.emplace_back(work, t);
    for (auto& t : ts) t.join();

    std::uint64_t disagree = 0, unresolved = 0;
    {
        std::ofstream out(a["seen"]);
        for (std::uint64_t i = 0; i < keys; ++i) {
            const std::uint64_t v = seen[0][i];
            for (unsigned t = 0; t < threads; ++t) {
                if (seen[t][i] == ~0ull) ++unresolved;
                else if (seen[t][i] != v) ++disagree;
            }
            out << "S " << i << ' ' << v << '\n';
        }
    }
    const auto s = g.snapshot();
    std::printf(
        "done executed=%llu acked=%llu unacked=%llu stale=%llu replays=%llu wrong=%llu bad=%llu disagree=%llu "
        "unresolved=%llu unavailable=%llu local=%llu sent=%llu won=%llu lost=%llu batches=%llu "
        "completion_batches=%llu in_doubt=%llu errors=%llu timeouts=%llu withdrawn=%llu\n",
        (unsigned long long)executed.load(), (unsigned long long)acked.load(), (unsigned long long)unacked.load(),
        (unsigned long long)stale.load(), (unsigned long long)replays.load(), (unsigned long long)wrong.load(),
        (unsigned long long)bad.load(), (unsigned long long)disagree, (unsigned long long)unresolved,
        (unsigned long long)unavailable.load(), (unsigned long long)s.answered_locally, (unsigned long long)s.claims_sent,
        (unsigned long long)s.claims_won, (unsigned long long)s.claims_lost, (unsigned long long)s.claim_batches,
        (unsigned long long)s.completion_batches, (unsigned long long)s.commits_in_doubt, (unsigned long long)s.store_errors,
        (unsigned long long)s.timeouts, (unsigned long long)s.withdrawn);
    if (!first_bad.empty()) std::printf("note %s\n", first_bad.c_str());
    if (s.store_errors) std::printf("note last store error: %s\n", g.last_error().c_str());
    std::fflush(stdout);
    return 0;
}

/// holder: claims `n` fresh keys HK<i>, executes the even ones (ledger "E key outcome node"), says
/// "holding", waits for "finish" on stdin, then tries to succeed every claim and reports the answers.
int child_holder(std::map<std::string, std::string> a) {
    const int n = std::stoi(a["n"]);
    idem::options o;
    o.capacity = 1024;
    o.lease = std::chrono::milliseconds(std::stoll(a["lease_ms"]));
    idem::global_options go;
    go.node = "node-a";
    idem::global_guard g(a["uri"], o, go);
    idem::tool::drill::line_appender ledger(a["ledger"], false);
    std::vector<idem::global_ticket> held;
    for (int i = 0; i < n; ++i) {
        const std::string k = "HK" + std::to_string(i) + "_PAY_v1";
        auto r = g.begin(idem::key(k), 0);
        if (r.status != idem::begin_status::acquired) {
            std::printf("error %s: %s\n", k.c_str(), idem::to_string(r.status));
            std::fflush(stdout);
            return 1;
        }
        if (i % 2 == 0) ledger.append("E " + k + " " + std::to_string(1000 + i) + " node-a" + "\n");
        held.push_back(std::move(r.ticket));
    }
    std::printf("holding fence0=%llu\n", (unsigned long long)held[0].fence());
    std::fflush(stdout);
    std::string line;
    if (!std::getline(std::cin, line)) return 3;
    int ok = 0, stale = 0, other = 0;
    // The paused node wakes up: its lease renewal and its completions must all be refused.
    const std::error_code ext = held[1].extend(30s);
    for (int i = 0; i < n; ++i) {
        if (!held[i]) {
            ++stale;  // emptied by the refused renewal
            continue;
        }
        const std::error_code ec = held[i].succeed(1000 + i);
        if (!ec) ++ok;
        else if (ec == idem::errc::stale_ticket) ++stale;
        else ++other;
    }
    std::printf("done ok=%d stale=%d other=%d extend_stale=%d\n", ok, stale, other, ext == idem::errc::stale_ticket ? 1 : 0);
    std::fflush(stdout);
    return 0;
}

/// idem::verify over every audit trail of the store: no violation, and at least one key.
void expect_verified(const std::string& uri) {
    const auto st = open_store(uri);
    const idem::verify_report vr = idem::verify(*st);
    EXPECT_TRUE(vr.violations.empty()) << vr.violations.size() << " violations, first: " << vr.violations.front();
    EXPECT_GT(vr.keys, 0u);
}

/// Another client's transaction holding row locks until release() (or its end): on PostgreSQL a
/// pqxx::work, on MariaDB a session with a transaction open.
class row_holder {
public:
    explicit row_holder(const std::string& uri) {
        if (on_mysql()) {
            my_.open(idem::detail::my::parse_uri(uri), 60s);
            my_.run("START TRANSACTION");
        } else {
            pg_conn_ = std::make_unique<pqxx::connection>(uri);
            pg_work_ = std::make_unique<pqxx::work>(*pg_conn_);
        }
    }
    /// Locks k's row (SELECT ... FOR UPDATE), as any other client could.
    void lock(const std::string& k) {
        if (on_mysql())
            my_.run("SELECT 1 FROM idempotent_record WHERE idempotent_key = " + idem::detail::my::literal(k) +
                    " FOR UPDATE");
        else pg_work_->exec("SELECT 1 FROM idempotent_record WHERE idempotent_key = " + pg_work_->quote(k) + " FOR UPDATE");
    }
    /// Inserts k's record, PROCESSING at fence 1, uncommitted: a claim of k waits for it.
    void insert_uncommitted(const std::string& k) {
        const std::string sql =
            "INSERT INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
            "request_fingerprint, created_time, updated_time, payload) VALUES ('" +
            k + "', 'PAY', 'PROCESSING', 1, 0, 0, 0, 0, 0, '')";
        if (on_mysql()) my_.run(sql);
        else pg_work_->exec(sql);
    }
    /// Rolls the transaction back: the locks go, the inserted row too.
    void release() {
        if (on_mysql()) my_.run("ROLLBACK");
        else pg_work_->abort();
    }
    pqxx::work& pg() { return *pg_work_; }  // PostgreSQL only (the in-doubt probe tests)

private:
    idem::detail::my::session my_;
    std::unique_ptr<pqxx::connection> pg_conn_;
    std::unique_ptr<pqxx::work> pg_work_;
};

// ---- the fixture ----------------------------------------------------------------------------------

class Global : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/idem-global-XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        if (on_mysql()) {
            std::string why;
            ASSERT_TRUE(mydb_.create(&why)) << why;
            uri_ = mydb_.uri();
            return;
        }
        server_ = env("IDEM_TEST_PG_URI");
        ASSERT_FALSE(server_.empty()) << "IDEM_TEST_PG_URI is unset: these tests need a PostgreSQL server "
                                         "(scripts/test starts one; or source scripts/lib/postgres.sh && pg_start)";
        std::random_device rd;
        char name[32];
        std::snprintf(name, sizeof name, "idem_g_%08x%08x", rd(), rd());
        db_ = name;
        try {
            pqxx::connection c(server_ + (pg::is_uri(server_) ? (server_.find('?') == std::string::npos ? "?" : "&") : " ") +
                               "connect_timeout=10");
            pqxx::nontransaction n(c);
            n.exec("CREATE DATABASE " + db_);  // hex digits only
            created_ = true;
        } catch (const std::exception& e) {
            FAIL() << "cannot create a test database on " << pg::redact(server_) << ": " << e.what();
        }
        uri_ = pg::with_database(server_, db_);
    }
    void TearDown() override {
        if (!dir_.empty() && !HasFailure()) std::filesystem::remove_all(dir_);
        if (HasFailure() && !dir_.empty()) std::cerr << "files kept in " << dir_ << '\n';
        if (!created_) return;
        for (int attempt = 0; attempt < 30; ++attempt) {
            try {
                pqxx::connection c(server_);
                pqxx::nontransaction n(c);
                n.exec("DROP DATABASE IF EXISTS " + db_ + " WITH (FORCE)");
                return;
            } catch (const std::exception& e) {
                if (attempt == 29) ADD_FAILURE() << "cannot drop test database " << db_ << ": " << e.what();
                std::this_thread::sleep_for(500ms);  // the server may still be restarting
            }
        }
    }

    std::int64_t sql_int(const std::string& text) {
        if (on_mysql()) {
            std::string v;
            const std::string err = mydb_.exec(text, [&](int, idem::detail::my::row_view r) { v.assign(r[0]); });
            if (!err.empty()) throw std::runtime_error(err);
            return std::stoll(v);
        }
        pqxx::connection c(uri_);
        pqxx::nontransaction n(c);
        return n.exec(text)[0][0].as<std::int64_t>();
    }

    void sql_exec(const std::string& text) {
        if (on_mysql()) {
            const std::string err = mydb_.exec(text);
            if (!err.empty()) throw std::runtime_error(err);
            return;
        }
        pqxx::connection c(uri_);
        pqxx::nontransaction n(c);
        n.exec(text);
    }

    /// Polls `done` every 20 ms (a poll interval, not a synchronisation) for 10 s at most; false when
    /// it never held.
    static bool await(const std::function<bool()>& done) {
        const auto until = std::chrono::steady_clock::now() + 10s;
        for (;;) {
            if (done()) return true;
            if (std::chrono::steady_clock::now() >= until) return false;
            std::this_thread::sleep_for(20ms);
        }
    }

    /// Waits until `n` claims have expired on the SERVER's clock, which is the clock compensation
    /// reads; false when they did not within 10 s.
    bool await_expired(std::int64_t n) {
        const std::string now = on_mysql() ? "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"
                                           : "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";
        return await([&] {
            return sql_int("SELECT count(*) FROM idempotent_record WHERE status = 'PROCESSING' AND lease_until < " + now) >=
                   n;
        });
    }

    /// Whether a session of this test's database selected by `where` (a condition on pg_stat_activity,
    /// e.g. "pid = 42" or "application_name = 'idem-global-completions'") is waiting for a lock.
    bool waits_for_lock(const std::string& where) {
        return sql_int(
                   "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                   "wait_event_type = 'Lock' AND (" +
                   where + ")") > 0;
    }
    bool await_lock_wait(const std::string& where) {
        return await([&] { return waits_for_lock(where); });
    }
    /// Whether the guard's session named `application` (idem-global-claims, -completions,
    /// -compensation) waits for a row lock. MariaDB has no application name, and a statement
    /// that waits for a row while the optimizer reads it by its primary key is not in
    /// information_schema.innodb_trx yet: there, whether a session of this test's database has been
    /// in one statement for more than 300 ms (the tests that ask hold back one batcher only; every
    /// other statement of theirs takes milliseconds).
    bool batcher_waits(const std::string& application) {
        if (!on_mysql()) return waits_for_lock("application_name = '" + application + "'");
        return sql_int(
                   "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE() AND id <> "
                   "CONNECTION_ID() AND command = 'Query' AND time_ms > 300") > 0;
    }
    bool await_batcher_wait(const std::string& application) {
        return await([&] { return batcher_waits(application); });
    }

    /// Options of a guard whose batch a test holds back with a row lock: one claim and one completion
    /// batcher (so the held-back batch is the only one), a call deadline that never cuts the
    /// held-back statement, and callers that wait `wait` for their batch.
    idem::global_options one_batcher(const std::string& node, std::chrono::milliseconds wait) {
        idem::global_options g = gopts(node);
        g.claim_connections = 1;
        g.completion_connections = 1;
        g.call_deadline = 30s;
        g.wait_timeout = wait;
        return g;
    }
    /// Locks k's row in `hold`'s transaction (SELECT ... FOR UPDATE), as any other client could.
    static void lock_row(pqxx::work& hold, const std::string& k) {
        hold.exec("SELECT 1 FROM idempotent_record WHERE idempotent_key = " + hold.quote(k) + " FOR UPDATE");
    }
    /// g.begin(k) replays `outcome`.
    static void expect_replay(idem::global_guard& g, const idem::key& k, std::uint64_t outcome) {
        const auto d = g.begin(k);
        EXPECT_EQ(d.status, idem::begin_status::succeeded) << idem::to_string(d.status);
        EXPECT_EQ(d.outcome, outcome);
    }

    void completion_held_back(bool owner_gives_up);  // defined with the tests that use it
    int end_sessions();                              // defined with the test that uses it

    /// `threads` threads, released together by a latch, each ask g.begin(k) and then g.query(k)
    /// once. Returns the distinct answers: status names, and "query <state>" for what query() showed.
    static std::set<std::string> racing_duplicates(idem::global_guard& g, const idem::key& k, int threads = 8) {
        std::vector<std::string> seen(2 * static_cast<std::size_t>(threads));
        std::latch start(threads);
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([&, t] {
                start.arrive_and_wait();
                seen[2 * t] = idem::to_string(g.begin(k).status);
                seen[2 * t + 1] = std::string("query ") + idem::to_string(g.query(k).state);
            });
        for (auto& t : ts) t.join();
        return {seen.begin(), seen.end()};
    }
    /// Whether every element of `seen` is one of `allowed`.
    static bool only(const std::set<std::string>& seen, const std::set<std::string>& allowed) {
        return std::includes(allowed.begin(), allowed.end(), seen.begin(), seen.end());
    }

    /// The in-doubt probe (gsql::batch_committed) is exact only if a batch statement writes its batch
    /// row before it can block on a key: then a probe that runs while the old statement is still
    /// blocked waits for it instead of answering "not committed" (after which the old statement
    /// commits claims or completions nobody learns about). This runs the prepared statement `sql`
    /// (batch id `id`, its parameters bound by `run`) on a connection configured like a batcher's,
    /// until it is seen waiting for a row lock `hold` keeps; then probes `id` from a third
    /// connection until the probe is seen waiting too (or has answered); then lets both go by
    /// rolling `hold` back.
    struct probe_result {
        bool batch_blocked = false;
        std::string probe;  ///< "waited, then committed" is the only right answer
        std::string batch_error;
        std::vector<std::string> rows;  ///< the statement's first column, sorted
    };
    using bound_statement = std::function<pqxx::result(pqxx::nontransaction&, const std::string& name)>;
    probe_result probe_blocked_batch(pqxx::work& hold, std::string_view name, const std::string& sql, std::int64_t id,
                                     const bound_statement& run) {
        probe_result out;
        pqxx::connection batcher(uri_), prober(uri_);
        pqxx::nontransaction(batcher).exec("SET plan_cache_mode = force_generic_plan");  // as global_session
        batcher.prepare(std::string(name), sql);
        const std::string batcher_pid = std::to_string(batcher.backendpid());
        const std::string prober_pid = std::to_string(prober.backendpid());
        std::thread batch([&] {
            try {
                pqxx::nontransaction n(batcher);
                for (const auto& row : run(n, std::string(name))) out.rows.push_back(row[0].c_str());
            } catch (const std::exception& e) {
                out.batch_error = e.what();
            }
        });
        out.batch_blocked = await_lock_wait("pid = " + batcher_pid);
        std::atomic<bool> answered{false};
        std::string answer;
        std::thread probe([&] {
            try {
                pqxx::work w(prober);
                const bool none = w.exec_params(std::string(idem::detail::global::sql::batch_committed), id).empty();
                answer = none ? "committed" : "not committed";
                answered = true;
                w.abort();  // the speculative insert must not stay: the batch would wait for it
            } catch (const std::exception& e) {
                answer = std::string("error ") + e.what();
                answered = true;
            }
        });
        const bool probe_waits = await([&] { return answered.load() || waits_for_lock("pid = " + prober_pid); });
        const bool waited = probe_waits && !answered.load();
        hold.abort();  // the held row goes away (or is unlocked): the batch proceeds, then the probe
        batch.join();
        probe.join();
        out.probe = (waited ? "waited, then " : "answered while the batch ran: ") + answer;
        std::sort(out.rows.begin(), out.rows.end());
        return out;
    }

    void expect_verified() { ::expect_verified(uri_); }

    idem::options opts(std::chrono::milliseconds lease = 30s) {
        idem::options o;
        o.capacity = 1 << 14;
        o.lease = lease;
        o.maintenance_interval = 0s;
        return o;
    }
    idem::global_options gopts(const std::string& node) {
        idem::global_options g;
        g.node = node;
        return g;
    }

    std::string server_, db_, uri_, dir_;
    bool created_ = false;
    idem_test::my_database mydb_;  // on_mysql(): the test's database (dropped with the fixture)
};

// ---- one process ----------------------------------------------------------------------------------

TEST_F(Global, ClaimReplayAndMismatch) {
    idem::global_guard g(uri_, opts(), gopts("solo"));
    const idem::key k("TX1_PAY_v1");
    auto r = g.begin(k, 7);
    ASSERT_EQ(r.status, idem::begin_status::acquired);
    EXPECT_EQ(r.ticket.fence(), 1u);
    EXPECT_EQ(g.begin(k, 7).status, idem::begin_status::in_progress);  // local: no round trip
    EXPECT_FALSE(r.ticket.succeed(0));                                 // a falsy outcome is an outcome
    auto d = g.begin(k, 7);
    EXPECT_EQ(d.status, idem::begin_status::succeeded);
    EXPECT_EQ(d.outcome, 0u);
    EXPECT_EQ(g.begin(k, 8).status, idem::begin_status::payload_mismatch);

    // A second guard (another node) learns the outcome from the store, then caches it.
    idem::global_guard h(uri_, opts(), gopts("other"));
    auto e = h.begin(k, 7);
    EXPECT_EQ(e.status, idem::begin_status::succeeded);
    EXPECT_EQ(e.fence, 1u);
    EXPECT_EQ(h.begin(k, 8).status, idem::begin_status::payload_mismatch);
    const auto before = h.snapshot().claims_sent;
    EXPECT_EQ(h.begin(k, 7).status, idem::begin_status::succeeded);
    EXPECT_EQ(h.snapshot().claims_sent, before) << "a known key must be answered locally";

    const auto rec = g.lookup("TX1_PAY_v1");
    ASSERT_TRUE(rec);
    EXPECT_EQ(rec->state, idem::record_state::succeeded);
    EXPECT_EQ(rec->biz_type, "PAY");
    const auto trail = g.audit("TX1_PAY_v1");
    ASSERT_EQ(trail.size(), 2u);
    EXPECT_EQ(trail[0].node, "solo");
    EXPECT_EQ(trail[1].detail, "succeed outcome=0");
    expect_verified();
}

// The idempotency window in scope::global: prune removes a record past global_options::window, and
// the key is then new on every node, with a fence above its old one (the store remembers the
// largest pruned fence); the audit trail keeps both lives and verifies.
TEST_F(Global, PrunedKeyIsNewAgainWithAHigherFence) {
    idem::options o = opts();
    o.retention = 1ms;
    idem::global_options go = gopts("pruner");
    go.window = 1000ms;  // real time: long enough that "nothing yet" holds on a loaded machine
    go.prune_interval = 0ms;
    std::uint64_t old_fence = 0;
    {
        idem::global_guard g(uri_, o, go);
        auto r = g.begin(idem::key("OLD1_PAY_v1"));
        ASSERT_EQ(r.status, idem::begin_status::acquired);
        old_fence = r.ticket.fence();
        ASSERT_FALSE(r.ticket.succeed(1));
        auto young = g.begin(idem::key("NEW1_PAY_v1"));
        EXPECT_EQ(g.prune().records, 0u) << "nothing is past the window yet";
        const auto written = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count();
        // The window is measured on the wall clock: wait for it to pass (not a synchronisation).
        while (std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count() <= written + 1100)
            std::this_thread::sleep_for(5ms);
        const auto pr = g.prune();
        EXPECT_EQ(pr.records, 1u) << "the succeeded record past the window, never the PROCESSING one";
        EXPECT_FALSE(g.lookup("OLD1_PAY_v1").has_value());
        EXPECT_TRUE(g.lookup("NEW1_PAY_v1").has_value());
        EXPECT_EQ(g.snapshot().pruned_records, 1u);
        ASSERT_FALSE(young.ticket.succeed(2));
    }
    idem::global_guard other(uri_, o, gopts("other"));
    auto again = other.begin(idem::key("OLD1_PAY_v1"));
    ASSERT_EQ(again.status, idem::begin_status::acquired) << "a pruned key is new again";
    EXPECT_GT(again.ticket.fence(), old_fence);
    ASSERT_FALSE(again.ticket.succeed(3));
    expect_verified();
}

// Rows of scope::global carry the server's clock. A node whose clock runs an hour ahead of the
// server's must not prune a record the server wrote a minute ago with a 30-minute window: before
// the fix the prune bound came from the node's clock, the record went, and its key was granted
// again. The server's clock is set back an hour for this database only: a function named
// statement_timestamp in a schema searched before pg_catalog (PostgreSQL searches pg_catalog
// where search_path lists it).
TEST_F(Global, PruneJudgesTheWindowOnTheServersClock) {
    {
        pqxx::connection c(uri_);
        pqxx::nontransaction n(c);
        n.exec("CREATE SCHEMA skew");
        n.exec(
            "CREATE FUNCTION skew.statement_timestamp() RETURNS timestamptz LANGUAGE sql STABLE AS "
            "$$ SELECT pg_catalog.statement_timestamp() - interval '1 hour' $$");
        n.exec("ALTER DATABASE " + db_ + " SET search_path = skew, pg_catalog, public");
    }
    idem::options o = opts();
    o.retention = 1ms;
    idem::global_options go = gopts("ahead");
    go.window = 30min;
    go.prune_interval = 0ms;
    idem::global_guard g(uri_, o, go);
    {
        pqxx::connection c(uri_);
        pqxx::nontransaction n(c);
        const auto behind_ms = n.exec(
                                    "SELECT (extract(epoch FROM pg_catalog.statement_timestamp() - "
                                    "statement_timestamp()) * 1000)::bigint")[0][0]
                                   .as<std::int64_t>();
        ASSERT_EQ(behind_ms, 3'600'000) << "the test's server clock is not an hour behind";
    }
    auto r = g.begin(idem::key("SKEW1_PAY_v1"));
    ASSERT_EQ(r.status, idem::begin_status::acquired);
    ASSERT_FALSE(r.ticket.succeed(7));
    EXPECT_EQ(g.prune().records, 0u) << "a record written now was pruned on the node's clock";
    auto d = g.begin(idem::key("SKEW1_PAY_v1"));
    EXPECT_EQ(d.status, idem::begin_status::succeeded) << "the charge that ran was granted again";
    EXPECT_EQ(d.outcome, 7u);
    idem::global_guard other(uri_, o, gopts("other"));
    EXPECT_EQ(other.begin(idem::key("SKEW1_PAY_v1")).status, idem::begin_status::succeeded);
}

/// Every option out of range is refused (invalid_argument naming the option and its rule) before a
/// connection is attempted: against a loopback port nothing listens on, the answer is
/// invalid_argument, never store_unavailable. Needs no server.
TEST(GlobalOptions, RefusedBeforeAnyConnection) {
    const std::string nowhere = "postgresql://idem@127.0.0.1:1/idem?connect_timeout=2";  // port 1: refused at once
    struct refusal {
        idem::errc kind;
        std::string what;
    };
    const auto open = [&](const idem::options& o, const idem::global_options& go) -> std::optional<refusal> {
        try {
            idem::global_guard g(nowhere, o, go);
        } catch (const idem::error& e) {
            return refusal{e.kind(), e.what()};
        }
        return std::nullopt;
    };
    idem::global_options fine;
    fine.call_deadline = 2s;
    // The control: valid options do try to connect, and fail for it (what the cases below must not do).
    const auto control = open({}, fine);
    ASSERT_TRUE(control.has_value()) << "opened a guard on a port nothing listens on";
    ASSERT_EQ(control->kind, idem::errc::store_unavailable) << control->what;
    struct bad_option {
        const char* named;  // what the message must name
        std::function<void(idem::options&, idem::global_options&)> set;
    };
    const bad_option cases[] = {
        {"global_options.call_deadline", [](auto&, auto& g) { g.call_deadline = 0ms; }},
        {"global_options.wait_timeout", [](auto&, auto& g) { g.wait_timeout = -1ms; }},
        {"global_options.max_batch", [](auto&, auto& g) { g.max_batch = 0; }},
        {"global_options.claim_connections", [](auto&, auto& g) { g.claim_connections = 0; }},
        {"global_options.completion_connections", [](auto&, auto& g) { g.completion_connections = 0; }},
        {"global_options.batch_beside", [](auto&, auto& g) { g.batch_beside = 0; }},
        {"global_options.window", [](auto&, auto& g) { g.window = 0ms; }},
        {"global_options.audit_window", [](auto&, auto& g) { g.audit_window = -5ms; }},
        {"global_options.window",
         [](auto& o, auto& g) {
             o.retention = 2h;
             g.window = 1h;
         }},
        {"options.lease", [](auto& o, auto&) { o.lease = 500us; }},
        {"options.capacity", [](auto& o, auto&) { o.capacity = 0; }},  // the local table's own rule
    };
    for (const bad_option& c : cases) {
        idem::options o;
        idem::global_options go = fine;
        c.set(o, go);
        const auto r = open(o, go);
        ASSERT_TRUE(r.has_value()) << c.named << ": accepted";
        EXPECT_EQ(r->kind, idem::errc::invalid_argument) << c.named << ": " << r->what;
        EXPECT_NE(r->what.find(c.named), std::string::npos) << r->what;
    }
}

/// Ordered versions need PostgreSQL: on a MariaDB URI they are refused before a connection is
/// attempted (port 1 refuses at once; the control shows the same URI without the option connects).
TEST(GlobalOptions, OrderedVersionsAreRefusedOnMariaDbBeforeAnyConnection) {
    const std::string nowhere = "mysql://idem@127.0.0.1:1/idem";
    idem::global_options go;
    go.call_deadline = 2s;
    const auto open = [&](bool ordered) -> std::optional<idem::error> {
        idem::options o;
        o.ordered_versions = ordered;
        try {
            idem::global_guard g(nowhere, o, go);
        } catch (const idem::error& e) {
            return e;
        }
        return std::nullopt;
    };
    const auto control = open(false);
    ASSERT_TRUE(control.has_value()) << "opened a guard on a port nothing listens on";
    EXPECT_EQ(control->kind(), idem::errc::store_unavailable) << control->what();
    const auto refused = open(true);
    ASSERT_TRUE(refused.has_value()) << "ordered versions accepted on MariaDB";
    EXPECT_EQ(refused->kind(), idem::errc::invalid_argument) << refused->what();
    EXPECT_NE(std::string(refused->what()).find("options.ordered_versions"), std::string::npos) << refused->what();
}

TEST_F(Global, RetentionLongerThanTheWindowIsRefused) {
    idem::options o = opts();
    o.retention = 2h;
    idem::global_options go = gopts("refused");
    go.window = 1h;
    try {
        idem::global_guard g(uri_, o, go);
        FAIL() << "accepted a local retention longer than the idempotency window";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), idem::errc::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("global_options.window"), std::string::npos) << e.what();
    }
}

TEST_F(Global, ReleaseReclaimFailAndDrop) {
    idem::global_guard g(uri_, opts(), gopts("n1"));
    idem::global_guard h(uri_, opts(), gopts("n2"));
    const idem::key k("TX2_PAY_v1");
    {
        auto r = g.begin(k);
        ASSERT_EQ(r.status, idem::begin_status::acquired);
        EXPECT_EQ(h.begin(k).status, idem::begin_status::in_progress);  // held by another node
        EXPECT_FALSE(r.ticket.fail(5, idem::failure_policy::retryable));
    }
    auto r2 = h.begin(k);  // RELEASED rows are claimable again, fence + 1
    ASSERT_EQ(r2.status, idem::begin_status::acquired);
    EXPECT_EQ(r2.ticket.fence(), 2u);
    { auto moved = std::move(r2.ticket); }  // dropped: released (options.on_failure = retryable)
    auto r3 = g.begin(k);
    ASSERT_EQ(r3.status, idem::begin_status::acquired);
    EXPECT_EQ(r3.ticket.fence(), 3u);
    EXPECT_FALSE(r3.ticket.fail(9, idem::failure_policy::terminal));
    auto f = h.begin(k);
    EXPECT_EQ(f.status, idem::begin_status::failed);
    EXPECT_EQ(f.outcome, 9u);
    EXPECT_EQ(g.run(idem::key("TX3_PAY_v1"), [] { return 11; }), 11u);
    EXPECT_EQ(h.run(idem::key("TX3_PAY_v1"), [] { return 12; }), 11u);  // not run again: replayed
    expect_verified();
}

TEST_F(Global, CompensationFencesTheStaleOwner) {
    std::atomic<int> asked{0};
    idem::options ro = opts(30s);
    ro.resolve = [&](const idem::expired_claim& e) {
        ++asked;
        return e.key.starts_with("TXA") ? idem::resolver_answer{idem::resolution::succeeded, 77}
                                        : idem::resolver_answer{idem::resolution::not_executed, 0};
    };
    idem::global_guard owner(uri_, opts(1000ms), gopts("owner"));
    idem::global_guard other(uri_, ro, gopts("compensator"));
    auto a = owner.begin(idem::key("TXA_PAY_v1"));
    auto b = owner.begin(idem::key("TXB_PAY_v1"));
    ASSERT_EQ(a.status, idem::begin_status::acquired);
    ASSERT_EQ(b.status, idem::begin_status::acquired);
    EXPECT_EQ(other.compensate(), 0u);  // not expired yet
    ASSERT_TRUE(await_expired(2));
    EXPECT_EQ(other.begin(idem::key("TXA_PAY_v1")).status, idem::begin_status::in_doubt);
    EXPECT_EQ(other.compensate(), 2u);
    EXPECT_EQ(asked.load(), 2);
    EXPECT_EQ(other.compensate(), 0u);  // resolved once
    EXPECT_EQ(a.ticket.succeed(1), idem::errc::stale_ticket);
    EXPECT_EQ(b.ticket.extend(10s), idem::errc::stale_ticket);
    EXPECT_FALSE(b.ticket.valid());
    auto ra = owner.begin(idem::key("TXA_PAY_v1"));
    EXPECT_EQ(ra.status, idem::begin_status::succeeded);
    EXPECT_EQ(ra.outcome, 77u);
    auto rb = owner.begin(idem::key("TXB_PAY_v1"));
    ASSERT_EQ(rb.status, idem::begin_status::acquired);
    EXPECT_EQ(rb.ticket.fence(), 2u);
    EXPECT_FALSE(rb.ticket.extend(10s));
    EXPECT_FALSE(rb.ticket.succeed(3));
    expect_verified();
}

/// A claim batch blocks on a key another transaction inserted and holds uncommitted
/// (probe_blocked_batch says why the probe must wait).
TEST_F(Global, InDoubtProbeWaitsForABlockedBatch) {
    { idem::global_guard schema(uri_, opts(), gopts("schema")); }  // creates the tables
    namespace gsql = idem::detail::global::sql;
    pqxx::connection holder(uri_);
    pqxx::work hold(holder);
    hold.exec("INSERT INTO idempotent_record VALUES ('PK1_PAY_v1', 'PAY', 'PROCESSING', 1, 0, 0, 0, 0, 0)");
    const auto claim = [](auto& n, const std::string& name) {
        return n.exec_prepared(name, std::int64_t{4242}, std::string("{PK0_PAY_v1,PK1_PAY_v1}"), std::string("{PAY,PAY}"),
                               std::string("{0,0}"), std::int64_t{60000}, std::string("probe"));
    };
    const auto p = probe_blocked_batch(hold, gsql::claim_name, gsql::claim, 4242, claim);
    EXPECT_TRUE(p.batch_blocked) << "the claim batch never blocked on the held key";
    EXPECT_EQ(p.probe, "waited, then committed") << "the probe must wait for a batch that is still running";
    EXPECT_EQ(p.batch_error, "");
    EXPECT_EQ(p.rows, (std::vector<std::string>{"PK0_PAY_v1", "PK1_PAY_v1"}));  // the held key went away
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_batch WHERE batch_id = 4242"), 1);
}

/// The ordered-versions claim batch blocks on a pair's version row another transaction holds locked:
/// its version upsert must reach the keys through the batch row too (the probe rule of
/// global_sql.hpp), or the statement blocks there before its batch row exists.
TEST_F(Global, InDoubtProbeWaitsForABlockedOrderedBatch) {
    {
        idem::options o = opts();
        o.ordered_versions = true;
        idem::global_guard schema(uri_, o, gopts("schema"));  // creates the tables, idempotent_version too
    }
    namespace gsql = idem::detail::global::sql;
    sql_exec("INSERT INTO idempotent_version VALUES ('PK1_PAY', 1, 0)");
    pqxx::connection holder(uri_);
    pqxx::work hold(holder);
    hold.exec("SELECT 1 FROM idempotent_version WHERE txid_op = 'PK1_PAY' FOR UPDATE");
    const auto claim = [](auto& n, const std::string& name) {
        return n.exec_prepared(name, std::int64_t{4444}, std::string("{PK0_PAY_v1,PK1_PAY_v2}"), std::string("{PAY,PAY}"),
                               std::string("{0,0}"), std::int64_t{60000}, std::string("probe"),
                               std::string("{PK0_PAY,PK1_PAY}"), std::string("{1,2}"));
    };
    const auto p = probe_blocked_batch(hold, gsql::claim_ordered_name, gsql::claim_ordered, 4444, claim);
    EXPECT_TRUE(p.batch_blocked) << "the claim batch never blocked on the held version row";
    EXPECT_EQ(p.probe, "waited, then committed") << "the probe must wait for a batch that is still running";
    EXPECT_EQ(p.batch_error, "");
    EXPECT_EQ(p.rows, (std::vector<std::string>{"PK0_PAY_v1", "PK1_PAY_v2"}));
    EXPECT_EQ(sql_int("SELECT version FROM idempotent_version WHERE txid_op = 'PK1_PAY'"), 2);
}

/// A completion batch blocks on a row another transaction holds locked (SELECT ... FOR UPDATE): its
/// key-order lock CTE must reach the keys through the batch row too, or the statement blocks there
/// before its batch row exists.
TEST_F(Global, InDoubtProbeWaitsForABlockedCompletionBatch) {
    { idem::global_guard schema(uri_, opts(), gopts("schema")); }
    namespace gsql = idem::detail::global::sql;
    sql_exec(
        "INSERT INTO idempotent_record VALUES ('PK0_PAY_v1', 'PAY', 'PROCESSING', 1, 0, 0, 0, 0, 0), "
        "('PK1_PAY_v1', 'PAY', 'PROCESSING', 1, 0, 0, 0, 0, 0)");
    pqxx::connection holder(uri_);
    pqxx::work hold(holder);
    lock_row(hold, "PK1_PAY_v1");
    const auto complete = [](auto& n, const std::string& name) {
        return n.exec_prepared(name, std::int64_t{4343}, std::string("{PK0_PAY_v1,PK1_PAY_v1}"), std::string("{1,1}"),
                               std::string("{SUCCESS,SUCCESS}"), std::string("{7,7}"),
                               std::string("{\"succeed outcome=7\",\"succeed outcome=7\"}"), std::string("probe"), false,
                               std::string("{\"\",\"\"}"));  // $9: no payloads
    };
    const auto p = probe_blocked_batch(hold, gsql::complete_name, gsql::complete, 4343, complete);
    EXPECT_TRUE(p.batch_blocked) << "the completion batch never blocked on the locked row";
    EXPECT_EQ(p.probe, "waited, then committed") << "the probe must wait for a batch that is still running";
    EXPECT_EQ(p.batch_error, "");
    EXPECT_EQ(p.rows, (std::vector<std::string>{"PK0_PAY_v1", "PK1_PAY_v1"}));
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_record WHERE status = 'SUCCESS' AND outcome = 7"), 2);
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_batch WHERE batch_id = 4343"), 1);
}

// ---- durable before visible: nobody sees an outcome the store has not committed --------------------

/// The owner's completion batch is held back by a row lock on its key (another connection's
/// SELECT ... FOR UPDATE). While it waits, and also after the owner stopped waiting for it
/// (`owner_gives_up`: succeed() answers store_unavailable after 200 ms; the completion stays queued
/// and keeps the local claim), duplicates in the owner's process (the local table) and on another
/// node (the store) see in_progress. The outcome appears, locally too, only once the store has it.
void Global::completion_held_back(bool owner_gives_up) {
    idem::global_guard g(uri_, opts(), one_batcher("owner", owner_gives_up ? 200ms : 60s));
    idem::global_guard other(uri_, opts(), gopts("other"));
    const idem::key k("DV1_PAY_v1");
    auto r = g.begin(k);
    ASSERT_EQ(r.status, idem::begin_status::acquired);
    row_holder hold(uri_);
    hold.lock("DV1_PAY_v1");
    std::atomic<bool> owner_returned{false};
    std::error_code owner_ec;
    std::thread owner([&] {
        owner_ec = r.ticket.succeed(42);
        owner_returned = true;
    });
    const std::string completions = "idem-global-completions";
    EXPECT_TRUE(await_batcher_wait(completions)) << "the completion batch never blocked on the locked row";
    if (owner_gives_up) {
        owner.join();
        EXPECT_EQ(owner_ec, idem::errc::store_unavailable);
        EXPECT_TRUE(batcher_waits(completions)) << "the queued completion stopped waiting for the row";
    }
    const std::set<std::string> held{"in_progress", "query PROCESSING"};  // the owner's live local claim
    EXPECT_EQ(racing_duplicates(g, k), held);
    EXPECT_EQ(other.begin(k).status, idem::begin_status::in_progress);
    EXPECT_EQ(owner_returned.load(), owner_gives_up) << "succeed() returned while its completion was held back";
    hold.release();
    if (!owner_gives_up) {
        owner.join();
        EXPECT_FALSE(owner_ec) << owner_ec.message();
    }
    // The completion commits, then (not before) the local table shows it.
    EXPECT_TRUE(await([&] { return g.query(k).state != idem::record_state::processing; }));
    const auto rec = g.lookup("DV1_PAY_v1");
    ASSERT_TRUE(rec);
    EXPECT_EQ(rec->state, idem::record_state::succeeded);
    expect_replay(g, k, 42);
    expect_replay(other, k, 42);
    expect_verified();
}

// A completion and a lease renewal reach their keys through the primary key, never by scanning the
// partial index of claims in flight (idx_idempotent_record_processing): that index also holds an
// entry for every claim completed since the last vacuum, so scanning it per batch made each batch
// cost more than the one before. The planner is given what a live service's statistics say (many
// decided records, a few claims in flight) and a cached generic plan, which is what a batcher's
// prepared statement runs after its first executions; with the status tested as `status =
// 'PROCESSING'`, it picked that index for both statements.
TEST_F(Global, CompletionsAndRenewalsReachTheirKeysThroughThePrimaryKey) {
    { idem::global_guard schema(uri_, opts(), gopts("schema")); }
    namespace gsql = idem::detail::global::sql;
    sql_exec(
        "INSERT INTO idempotent_record SELECT 'D' || g || '_PAY_v1', 'PAY', 'SUCCESS', 1, 0, 0, 0, 0, 0 "
        "FROM generate_series(1, 20000) AS g");
    sql_exec(
        "INSERT INTO idempotent_record SELECT 'P' || g || '_PAY_v1', 'PAY', 'PROCESSING', 1, 0, 0, 0, 0, 0 "
        "FROM generate_series(1, 5) AS g");
    sql_exec("ANALYZE idempotent_record");
    pqxx::connection c(uri_);
    pqxx::nontransaction n(c);
    n.exec("SET plan_cache_mode = force_generic_plan");
    n.exec("PREPARE complete_batch AS " + gsql::complete);  // a server-side statement EXPLAIN can name
    n.exec("PREPARE renew_leases AS " + gsql::extend);
    const std::string complete_args =
        "(1, '{P1_PAY_v1,P2_PAY_v1}', '{1,1}', '{SUCCESS,SUCCESS}', '{7,7}', '{d,d}', 'n', false, '{\"\",\"\"}')";
    const std::string extend_args = "('{P1_PAY_v1,P2_PAY_v1}', '{1,1}', '{1000,1000}')";
    const auto plan = [&](const std::string& explain) {
        std::string text;
        for (const auto& row : n.exec(explain)) text += row[0].as<std::string>() + "\n";
        return text;
    };
    const std::string complete = plan("EXPLAIN EXECUTE complete_batch" + complete_args);
    const std::string extend = plan("EXPLAIN EXECUTE renew_leases" + extend_args);
    for (const auto& [name, text] : {std::pair{"completion", complete}, std::pair{"lease renewal", extend}}) {
        EXPECT_EQ(text.find("idx_idempotent_record_processing"), std::string::npos)
            << "the " << name << " scans the index of claims in flight:\n"
            << text;
        EXPECT_NE(text.find("idempotent_record_pkey"), std::string::npos)
            << "the " << name << " does not reach its keys through the primary key:\n"
            << text;
    }
    // And the statements still do what they say: both keys renewed, then both completed (fence 1),
    // the other claims untouched.
    EXPECT_EQ(n.exec("EXECUTE renew_leases" + extend_args).size(), 2u);
    EXPECT_EQ(n.exec("EXECUTE complete_batch" + complete_args).size(), 2u);
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_record WHERE status = 'PROCESSING'"), 3);
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_record WHERE status = 'SUCCESS' AND outcome = 7"), 2);
}

TEST_F(Global, DuplicatesSeeInProgressWhileTheCompletionIsHeldBack) { completion_held_back(false); }

TEST_F(Global, DuplicatesSeeInProgressAfterTheCompletionTimedOut) { completion_held_back(true); }

/// A completion that cannot even be queued (no memory for it) is not in the store. With
/// on_failure = terminal, the local claim it leaves behind must still not become FAILED in the
/// local table (dropping a local ticket applies on_failure): duplicates must ask the store, which
/// says PROCESSING.
// A completion batch held back by another client's row lock does not hold back the completions of
// other keys. global_options::batch_beside lets a second batch start beside one in flight only when
// 8 requests wait, or when no batch was taken for the queue's patience (20 ms): without the
// patience, the other key's completion waited for the stuck batch, past its wait_timeout (found by
// review). Two completion connections; the call deadline never cuts the held-back statement.
TEST_F(Global, AStuckCompletionBatchDoesNotHoldBackTheOthers) {
    idem::global_options go = gopts("stuck");
    go.completion_connections = 2;
    go.call_deadline = 30s;
    go.wait_timeout = 5s;
    idem::global_guard g(uri_, opts(), go);
    auto a = g.begin(idem::key("ST1_PAY_v1"));
    auto b = g.begin(idem::key("ST2_PAY_v1"));
    ASSERT_EQ(a.status, idem::begin_status::acquired);
    ASSERT_EQ(b.status, idem::begin_status::acquired);
    row_holder hold(uri_);
    hold.lock("ST1_PAY_v1");
    std::error_code a_ec;
    std::thread owner([&] { a_ec = a.ticket.succeed(1); });
    EXPECT_TRUE(await_batcher_wait("idem-global-completions")) << "the completion batch never blocked on the locked row";
    const std::error_code b_ec = b.ticket.succeed(2);
    EXPECT_FALSE(b_ec) << "the completion of another key waited behind the stuck batch: " << b_ec.message();
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_record WHERE idempotent_key = 'ST2_PAY_v1' AND status = 'SUCCESS' "
                      "AND outcome = 2"),
              1);
    hold.release();
    owner.join();
    EXPECT_FALSE(a_ec) << a_ec.message();
    expect_replay(g, idem::key("ST1_PAY_v1"), 1);
    expect_replay(g, idem::key("ST2_PAY_v1"), 2);
    expect_verified();
}

TEST_F(Global, AnUnqueuedCompletionLeavesNoLocalOutcome) {
    idem::options o = opts();
    o.on_failure = idem::failure_policy::terminal;
    idem::global_guard g(uri_, o, gopts("owner"));
    const idem::key k("DV3_PAY_v1");
    {
        auto r = g.begin(k);
        ASSERT_EQ(r.status, idem::begin_status::acquired);
        fail_next_allocation = true;  // the completion's request
        const std::error_code ec = r.ticket.succeed(42);
        fail_next_allocation = false;
        EXPECT_EQ(ec, idem::errc::store_unavailable);
        EXPECT_FALSE(r.ticket.valid());
    }  // the ticket (and whatever it still held) is gone
    // One duplicate takes the local claim and asks the store (PROCESSING: in_progress); the others
    // meet that local claim (in_progress) or the released local record it leaves (which query()
    // shows as released or absent). Never the FAILED that on_failure = terminal would write.
    const auto seen = racing_duplicates(g, k);
    EXPECT_TRUE(only(seen, {"in_progress", "query PROCESSING", "query RELEASED", "query ABSENT"}))
        << testing::PrintToString(seen);
    const auto rec = g.lookup("DV3_PAY_v1");
    ASSERT_TRUE(rec);
    EXPECT_EQ(rec->state, idem::record_state::processing);
    expect_verified();
}

/// A compensation batch held back by a row lock: the compensating node's duplicates see the claim
/// as the store has it (expired: in_doubt), never the resolver's answer before it is committed.
TEST_F(Global, CompensationIsVisibleOnlyOnceCommitted) {
    idem::options ro = opts();
    ro.resolve = [](const idem::expired_claim&) { return idem::resolver_answer{idem::resolution::succeeded, 77}; };
    idem::global_guard owner(uri_, opts(300ms), gopts("owner"));
    idem::global_guard comp(uri_, ro, one_batcher("compensator", 10s));
    const idem::key k("DV4_PAY_v1");
    auto a = owner.begin(k);
    ASSERT_EQ(a.status, idem::begin_status::acquired);
    ASSERT_TRUE(await_expired(1));
    row_holder hold(uri_);
    hold.lock("DV4_PAY_v1");
    std::size_t resolved = 0;
    std::thread pass([&] { resolved = comp.compensate(); });
    EXPECT_TRUE(await_batcher_wait("idem-global-compensation")) << "the compensation batch never blocked on the locked row";
    // One duplicate takes the local claim and asks the store (PROCESSING, expired: in_doubt); the
    // others meet that local claim (in_progress) or the released local record it leaves (which
    // query() shows as released or absent). Never the resolver's SUCCEEDED.
    const auto seen = racing_duplicates(comp, k);
    EXPECT_TRUE(only(seen, {"in_doubt", "in_progress", "query PROCESSING", "query RELEASED", "query ABSENT"}))
        << testing::PrintToString(seen);
    EXPECT_TRUE(seen.contains("in_doubt")) << testing::PrintToString(seen);
    hold.release();
    pass.join();
    EXPECT_EQ(resolved, 1u);
    expect_replay(comp, k, 77);
    EXPECT_EQ(a.ticket.succeed(1), idem::errc::stale_ticket);
    expect_verified();
}

// ---- keys the store cannot hold ---------------------------------------------------------------------

/// key{} and keys that are not valid UTF-8 are answered invalid_key at once, by begin, begin_wait
/// and run (which throws naming the key and the rule), without touching the local table, a batch
/// or the store: they are refused while the only claim batcher is blocked (on a key another
/// transaction inserted, uncommitted), and that batch, holding another key, goes on unaffected.
TEST_F(Global, InvalidKeysAreRefusedAtOnce) {
    idem::global_guard g(uri_, opts(), one_batcher("n1", 60s));
    row_holder hold(uri_);
    hold.insert_uncommitted("IK0_PAY_v1");
    std::optional<idem::global_begin_result> good;
    std::thread claimer([&] { good.emplace(g.begin(idem::key("IK0_PAY_v1"))); });
    EXPECT_TRUE(await_batcher_wait("idem-global-claims")) << "the claim batch never blocked";
    const auto before = g.snapshot();
    const std::string not_utf8[] = {"IK\xff\xfe_PAY_v1", "IK\xc0\xaf_PAY_v1" /* overlong '/' */,
                                    "IK\xed\xa0\x80_PAY_v1" /* a UTF-16 surrogate */, "IK\xe2\x82_PAY_v1" /* cut */};
    std::vector<idem::key> bad{idem::key{}};
    for (const auto& text : not_utf8) bad.emplace_back(text);
    for (const idem::key& k : bad) {
        const std::string shown = "'" + idem::key::printable(k.view()) + "'";
        EXPECT_EQ(g.begin(k, 5).status, idem::begin_status::invalid_key) << shown;
        EXPECT_EQ(g.begin_wait(k, 5, 10s).status, idem::begin_status::invalid_key) << shown;
        bool ran = false;
        try {
            (void)g.run(k, [&] { ran = true; });
            ADD_FAILURE() << shown << ": run() did not throw";
        } catch (const idem::error& e) {
            EXPECT_EQ(e.code(), idem::errc::invalid_key) << shown << ": " << e.what();
            EXPECT_NE(std::string(e.what()).find(shown), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(k.empty() ? "key{}" : "UTF-8"), std::string::npos) << e.what();
        }
        EXPECT_FALSE(ran) << shown;
        EXPECT_EQ(g.query(k).state, idem::record_state::absent) << shown;
    }
    const auto after = g.snapshot();
    EXPECT_EQ(after.local.acquired, before.local.acquired) << "the local table was touched";
    EXPECT_EQ(after.answered_locally, before.answered_locally) << "the local table was touched";
    EXPECT_EQ(after.claims_sent, before.claims_sent) << "a refused key reached a batch";
    EXPECT_EQ(after.store_errors, before.store_errors);
    EXPECT_TRUE(batcher_waits("idem-global-claims")) << "the blocked batch was disturbed";
    hold.release();  // the other transaction's row goes away: the batch claims IK0
    claimer.join();
    ASSERT_TRUE(good);
    ASSERT_EQ(good->status, idem::begin_status::acquired);
    EXPECT_EQ(good->ticket.fence(), 1u);
    EXPECT_FALSE(good->ticket.succeed(3));
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_record"), 1);
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_audit WHERE idempotent_key <> 'IK0_PAY_v1'"), 0);
    expect_verified();
}

// ---- several processes ------------------------------------------------------------------------------

struct race_result {
    std::map<std::string, std::int64_t> total;  ///< the children's counters, summed
};

/// Starts `procs` race children, lets them go together, optionally runs `during` while they race,
/// and checks the ledger, the acknowledgements, every process's view and the store.
race_result run_race(const std::string& uri, const std::string& dir, int procs, int threads, std::uint64_t keys, int seconds,
                     std::chrono::milliseconds wait, const std::function<void()>& during) {
    std::vector<std::unique_ptr<child>> cs;
    for (int p = 1; p <= procs; ++p)
        cs.push_back(std::make_unique<child>(std::vector<std::string>{
            "race", "uri=" + uri, "keys=" + std::to_string(keys), "threads=" + std::to_string(threads),
            "node=" + std::to_string(p), "seed=7", "lease_ms=60000", "seconds=" + std::to_string(seconds),
            "wait_ms=" + std::to_string(wait.count()), "ledger=" + dir + "/ledger." + std::to_string(p),
            "acks=" + dir + "/acks." + std::to_string(p), "seen=" + dir + "/seen." + std::to_string(p)}));
    for (auto& c : cs) {
        const bool ready = !c->expect("ready", 120s).empty();
        EXPECT_TRUE(ready) << "a child did not start";
        if (!ready) return {};
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (auto& c : cs) c->send("go");
    if (during) during();
    std::vector<std::map<std::string, std::int64_t>> done;
    for (auto& c : cs) {
        const std::string l = c->expect("done", std::chrono::seconds(seconds + 120));
        EXPECT_FALSE(l.empty()) << "a child did not finish";
        if (l.empty()) return {};
        done.push_back(fields_of(l));
        const int st = c->wait();
        EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    // The independent ledger: every key exactly once, across all processes.
    std::vector<int> runs(keys, 0);
    std::vector<std::uint64_t> executor(keys, 0);
    std::uint64_t effects = 0, doubles = 0;
    for (int p = 1; p <= procs; ++p)
        for (const auto& f : read_fields(dir + "/ledger." + std::to_string(p))) {
            const std::uint64_t i = std::stoull(f.at(1));
            ++effects;
            if (++runs.at(i) > 1) ++doubles;
            executor[i] = std::stoull(f.at(2));
        }
    EXPECT_EQ(doubles, 0u) << "keys executed more than once";
    std::uint64_t not_once = 0;
    for (std::uint64_t i = 0; i < keys; ++i)
        if (runs[i] != 1 && not_once++ == 0) ADD_FAILURE() << "key " << i << " ran " << runs[i] << " times";
    EXPECT_EQ(not_once, 0u) << "keys not executed exactly once";
    // Every process saw the winner's outcome (all of its threads agreed; checked in the child).
    for (int p = 1; p <= procs; ++p) {
        const auto seen = read_fields(dir + "/seen." + std::to_string(p));
        EXPECT_EQ(seen.size(), keys);
        std::uint64_t wrong = 0;
        for (const auto& f : seen) {
            const std::uint64_t i = std::stoull(f.at(1)), v = std::stoull(f.at(2));
            if (v != (executor[i] << 32 | i)) ++wrong;
        }
        EXPECT_EQ(wrong, 0u) << "process " << p << " saw outcomes other than the winner's";
    }
    for (const auto& d : done) {
        EXPECT_EQ(d.at("wrong"), 0);
        EXPECT_EQ(d.at("bad"), 0);
        EXPECT_EQ(d.at("disagree"), 0);
        EXPECT_EQ(d.at("unresolved"), 0);
    }
    // Every acknowledged success is SUCCESS in the store with the acknowledged outcome.
    std::map<std::string, std::uint64_t> acked;
    for (int p = 1; p <= procs; ++p)
        for (const auto& f : read_fields(dir + "/acks." + std::to_string(p)))
            acked[race_key(std::stoull(f.at(1)))] = std::stoull(f.at(2));
    std::uint64_t lost = 0, success = 0;
    {
        const auto st = open_store(uri);
        st->load([&](const idem::stored_record& r) {
            if (r.state == idem::record_state::succeeded) ++success;
            auto it = acked.find(r.key);
            if (it != acked.end() && (r.state != idem::record_state::succeeded || r.outcome != it->second)) ++lost;
            if (it != acked.end()) acked.erase(it);
        });
    }
    EXPECT_EQ(lost + acked.size(), 0u) << "acknowledged successes lost";
    EXPECT_EQ(success, keys);
    race_result rr;
    for (const auto& d : done)
        for (const auto& [k, v] : d) rr.total[k] += v;
    std::printf(
        "[ race     ] %d processes x %d threads, %llu keys: %.1f s, %llu effects, %lld claims sent in %lld "
        "batches, %lld answered locally; store errors %lld, commits in doubt %lld, caller timeouts %lld, "
        "unacknowledged successes %lld, withdrawn claims %lld\n",
        procs, threads, (unsigned long long)keys, secs, (unsigned long long)effects, (long long)rr.total["sent"],
        (long long)rr.total["batches"], (long long)rr.total["local"], (long long)rr.total["errors"],
        (long long)rr.total["in_doubt"], (long long)rr.total["timeouts"], (long long)rr.total["unacked"],
        (long long)rr.total["withdrawn"]);
    return rr;
}

TEST_F(Global, Race4x25) {
    race_result r = run_race(uri_, dir_, 4, 25, 10'000, 400, 15s, nullptr);
    EXPECT_GT(r.total["local"], 0) << "known keys must be answered without a round trip";
    expect_verified();
}

/// Ends every session of this test's database but the caller's: the arbiter's view of a network
/// or proxy that cuts connections (PostgreSQL: pg_terminate_backend; MariaDB: KILL CONNECTION).
/// Returns how many it ended.
int Global::end_sessions() {
    if (!on_mysql())
        return static_cast<int>(
            sql_int("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND "
                    "pid <> pg_backend_pid()"));
    std::vector<std::string> ids;
    const std::string err = mydb_.exec(
        "SELECT id FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID()",
        [&](int, idem::detail::my::row_view r) { ids.emplace_back(r[0]); });
    EXPECT_EQ(err, "");
    int ended = 0;
    for (const std::string& id : ids) ended += mydb_.exec("KILL CONNECTION " + id).empty() ? 1 : 0;
    return ended;
}

/// 2 processes x 8 threads race on 2000 keys while every one of their sessions is ended again and
/// again: claim and completion batches break before, during and after their commit, and commits in
/// doubt are resolved by the batch id. No key runs twice; no acknowledged success is lost.
TEST_F(Global, SessionsEndedWhileRacing) {
    int rounds = 0, ended = 0;
    race_result rr = run_race(uri_, dir_, 2, 8, 2'000, 300, 15s, [&] {
        for (; rounds < 60; ++rounds) {  // at most 60 rounds, 100 ms apart (the pace of the faults)
            std::uint64_t lines = 0;
            for (int p = 1; p <= 2; ++p) lines += read_fields(dir_ + "/ledger." + std::to_string(p)).size();
            if (lines >= 1'800) break;
            ended += end_sessions();
            std::this_thread::sleep_for(100ms);
        }
    });
    EXPECT_GT(ended, 0) << "no session was ended: the test proved nothing";
    EXPECT_GT(rr.total["errors"], 0) << "the ended sessions were not felt by any process";
    expect_verified();
}

TEST_F(Global, NodeDeath) {
    const int n = 40;
    const std::string ledger_path = dir_ + "/ledger";
    child holder({"holder", "uri=" + uri_, "n=" + std::to_string(n), "lease_ms=800", "ledger=" + ledger_path});
    const std::string h = holder.expect("holding", 60s);
    ASSERT_FALSE(h.empty());
    ASSERT_EQ(::kill(holder.pid(), SIGSTOP), 0);  // the node stops answering, holding 40 claims
    ASSERT_TRUE(await_expired(n)) << "the stopped node's leases never expired";

    // The resolver reads the ledger: an effect there ran (succeeded with its outcome), else not.
    // Each node's first resolver call waits on `both_scanned` until the other node has scanned too:
    // both nodes have then read all n expired claims, and both write their answers for every one of
    // them, so the fenced UPDATEs really race (not one node finding nothing left to do).
    std::latch both_scanned(2);
    std::atomic<int> asked{0};
    auto resolver_for = [&](std::shared_ptr<std::atomic<bool>> first) {
        return [&, first](const idem::expired_claim& e) {
            if (!first->exchange(true)) both_scanned.arrive_and_wait();
            ++asked;
            for (const auto& f : read_fields(ledger_path))
                if (f.at(1) == e.key) return idem::resolver_answer{idem::resolution::succeeded, std::stoull(f.at(2))};
            return idem::resolver_answer{idem::resolution::not_executed, 0};
        };
    };
    idem::options rb = opts(), rc = opts();
    rb.resolve = resolver_for(std::make_shared<std::atomic<bool>>(false));
    rc.resolve = resolver_for(std::make_shared<std::atomic<bool>>(false));
    idem::global_guard b(uri_, rb, gopts("node-b"));
    idem::global_guard c(uri_, rc, gopts("node-c"));
    std::atomic<std::size_t> resolved{0};
    {
        std::latch go(2);
        std::thread tb([&] {
            go.arrive_and_wait();
            resolved += b.compensate();
        });
        std::thread tc([&] {
            go.arrive_and_wait();
            resolved += c.compensate();
        });
        tb.join();
        tc.join();
    }
    EXPECT_EQ(asked.load(), 2 * n) << "both nodes must have tried to resolve every expired claim";
    EXPECT_EQ(b.compensate() + c.compensate(), 0u) << "nothing is left to resolve";
    EXPECT_EQ(resolved.load(), static_cast<std::size_t>(n)) << "each expired claim is resolved exactly once";
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_audit WHERE detail LIKE 'compensate%'"), n);
    EXPECT_EQ(sql_int("SELECT count(*) FROM (SELECT idempotent_key FROM idempotent_audit WHERE detail LIKE "
                      "'compensate%' GROUP BY idempotent_key HAVING count(*) > 1) d"),
              0);
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_record WHERE status = 'SUCCESS'"), n / 2);
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_record WHERE status = 'RELEASED'"), n / 2);

    // Node b takes over: the executed half replays, the other half is claimed again (fence 2) and
    // executed (once) on node b, which still holds those claims when the paused node comes back.
    std::vector<idem::global_ticket> taken;
    {
        idem::tool::drill::line_appender ledger(ledger_path, false);
        for (int i = 0; i < n; ++i) {
            const std::string k = "HK" + std::to_string(i) + "_PAY_v1";
            auto r = b.begin(idem::key(k), 0);
            if (i % 2 == 0) {
                EXPECT_EQ(r.status, idem::begin_status::succeeded) << k;
                EXPECT_EQ(r.outcome, 1000u + i) << k;
            } else {
                ASSERT_EQ(r.status, idem::begin_status::acquired) << k;
                EXPECT_EQ(r.ticket.fence(), 2u);
                ledger.append("E " + k + " " + std::to_string(2000 + i) + " node-b" + "\n");
                taken.push_back(std::move(r.ticket));
            }
        }
    }

    // The paused node comes back: every fence it holds is refused, both on the keys compensated as
    // executed (status SUCCESS) and on those node b holds now (status PROCESSING, fence 2: only the
    // fence tells the claims apart).
    ASSERT_EQ(::kill(holder.pid(), SIGCONT), 0);
    holder.send("finish");
    const auto d = fields_of(holder.expect("done", 60s));
    EXPECT_EQ(d.at("ok"), 0);
    EXPECT_EQ(d.at("stale"), n);
    EXPECT_EQ(d.at("other"), 0);
    EXPECT_EQ(d.at("extend_stale"), 1);
    holder.wait();
    for (std::size_t j = 0; j < taken.size(); ++j) {
        const int i = 2 * static_cast<int>(j) + 1;
        EXPECT_FALSE(taken[j].succeed(2000 + i)) << "node b's own claim HK" << i;
    }

    std::map<std::string, int> runs;
    for (const auto& f : read_fields(ledger_path)) ++runs[f.at(1)];
    EXPECT_EQ(runs.size(), static_cast<std::size_t>(n));
    for (const auto& [k, cnt] : runs) EXPECT_EQ(cnt, 1) << k;
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_record WHERE status = 'SUCCESS'"), n);
    // The trail names the nodes: node-a claimed, node-b (and maybe node-c) compensated, node-b re-ran.
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_audit WHERE node = 'node-a' AND detail LIKE 'claim%'"), n);
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_audit WHERE node = 'node-b' AND detail LIKE 'succeed%'"), n / 2);
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_audit WHERE node NOT IN ('node-a', 'node-b', 'node-c')"), 0);
    expect_verified();
}

/// 3 processes x 8 threads race on 3000 keys while their server (a private one) is restarted twice
/// in immediate mode. `wait` is how long callers wait for their batch: long (the restart is waited
/// out) or short (callers give up mid-restart: claims are withdrawn, successes are acknowledged
/// late or never, and asked about again).
void restart_race(const std::string& dir, std::chrono::milliseconds wait) {
    // PostgreSQL: restarted in immediate mode; MariaDB: killed (SIGKILL) and started again, InnoDB
    // recovering what it committed.
    std::optional<idem_test::private_server> pg_server;
    std::optional<idem_test::private_mysql> my_server;
    std::function<bool()> restart;
    std::string uri;
    if (on_mysql()) {
        my_server.emplace();
        uri = my_server->uri();
        ASSERT_FALSE(uri.empty()) << "could not start a private MariaDB with scripts/lib/mariadb.sh";
        restart = [&] { return my_server->crash() && my_server->resume(); };
    } else {
        pg_server.emplace();
        uri = pg_server->uri();
        ASSERT_FALSE(uri.empty()) << "could not start a private PostgreSQL with scripts/lib/postgres.sh "
                                     "(PG_BIN, default /usr/lib/postgresql/15/bin)";
        restart = [&] { return pg_server->restart(); };
    }
    int restarts = 0;
    race_result rr = run_race(uri, dir, 3, 8, 3'000, 300, wait, [&] {
        // Restart while claims and completions are in flight: once the first effects are in the
        // ledger (every connection of every process breaks), and again a little later.
        for (const std::uint64_t after : {30u, 600u}) {
            for (int i = 0; i < 400; ++i) {  // polls the ledgers for up to 10 s
                std::uint64_t lines = 0;
                for (int p = 1; p <= 3; ++p) lines += read_fields(dir + "/ledger." + std::to_string(p)).size();
                if (lines > after) break;
                std::this_thread::sleep_for(25ms);
            }
            EXPECT_TRUE(restart()) << "the private server did not restart";
            ++restarts;
        }
    });
    EXPECT_EQ(restarts, 2);
    EXPECT_GT(rr.total["errors"], 0) << "the restarts were not felt by any process: the test proved nothing";
    expect_verified(uri);
}

TEST_F(Global, ServerRestart) { restart_race(dir_, 15s); }

/// 4 processes x 25 threads race on one key space through a failover pair (private_pair: a primary
/// and a synchronous standby, one URI naming both with target_session_attrs=read-write). Once the
/// first effects are in the ledgers, the primary is killed (SIGKILL to every process of it) and the
/// standby promoted. Every process finds the new primary by itself; claims and completions in
/// flight at the switch are answered as the new primary decides (in doubt -> probed there). No key
/// runs twice, every acknowledged success is on the new primary, and verify is clean there.
TEST_F(Global, FailoverToASynchronousStandby) {
    idem_test::private_pair pair;
    ASSERT_FALSE(pair.uri().empty()) << "could not start a primary and a synchronous standby with scripts/lib/postgres.sh";
    bool failed_over = false;
    long long promote_ms = -1, first_completion_ms = -1;
    race_result rr = run_race(pair.uri(), dir_, 4, 25, 3'000, 300, 15s, [&] {
        for (int i = 0; i < 400; ++i) {  // polls the ledgers for up to 10 s
            std::uint64_t lines = 0;
            for (int p = 1; p <= 4; ++p) lines += read_fields(dir_ + "/ledger." + std::to_string(p)).size();
            if (lines > 200) break;
            std::this_thread::sleep_for(25ms);
        }
        const auto killed = std::chrono::steady_clock::now();
        const auto ms_since = [&] {
            return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed).count();
        };
        ASSERT_TRUE(pair.crash()) << "could not kill the primary";
        ASSERT_TRUE(pair.resume()) << "could not promote the standby";
        promote_ms = ms_since();
        failed_over = true;
        // Measured, not judged: when the first completion commits on the new primary.
        const std::string count = "SELECT count(*) FROM idempotent_record WHERE status = 'SUCCESS'";
        const std::string at_promotion = pair.psql(pair.standby_uri(), count);
        for (int i = 0; i < 2400 && first_completion_ms < 0; ++i) {  // polls for up to 60 s
            if (pair.psql(pair.standby_uri(), count) != at_promotion) first_completion_ms = ms_since();
            else std::this_thread::sleep_for(25ms);
        }
    });
    ASSERT_TRUE(failed_over);
    std::printf(
        "[ failover ] standby promoted %lld ms after the kill; first completion committed on it %lld ms after the kill\n",
        promote_ms, first_completion_ms);
    EXPECT_GE(first_completion_ms, 0) << "no completion committed on the new primary";
    EXPECT_GT(rr.total["errors"], 0) << "the failover was not felt by any process: the test proved nothing";
    ::expect_verified(pair.uri());
}

TEST_F(Global, ServerRestartImpatientCallers) { restart_race(dir_, 300ms); }

}  // namespace

int main(int argc, char** argv) {
    if (argc >= 3 && std::string(argv[1]) == "child") {
        const std::string mode = argv[2];
        try {
            if (mode == "race") return child_race(parse_args(argc, argv, 3));
            if (mode == "holder") return child_holder(parse_args(argc, argv, 3));
        } catch (const std::exception& e) {
            std::printf("error %s\n", e.what());
            std::fflush(stdout);
            return 3;
        }
        return 2;
    }
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
