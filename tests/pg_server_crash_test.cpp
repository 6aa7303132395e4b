// pg_server_crash_test: the PostgreSQL server itself crashes (`pg_ctl stop -m immediate`: no
// checkpoint, no goodbye to clients) while a durable guard in sync mode is flushing payments from
// many threads, and is started again. The flusher must notice, back off, reconnect, and go on; no
// thread may hang; nothing acknowledged may be lost; no key may run twice.
//
// The test owns its server (initdb in a temporary directory, a free loopback port, run as the
// `postgres` user when the test runs as root), so crashing it disturbs no other test. It needs the
// PostgreSQL 15 server binaries: PG_BIN (scripts/lib/postgres.sh exports it), else
// /usr/lib/postgresql/15/bin. Without them the test FAILS; it never skips.
#include <idem/durable.hpp>
#include <idem/postgres_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <latch>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support/store_fixtures.hpp"

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::durability;
using idem::errc;
using idem::record_state;
using idem_test::wait_for;

/// A throwaway PostgreSQL 15 cluster that the test may crash and restart.
class own_server {
public:
    own_server() {
        const char* bin = std::getenv("PG_BIN");
        bin_ = bin && *bin ? bin : "/usr/lib/postgresql/15/bin";
        char tmpl[] = "/tmp/idem-pgcrash.XXXXXX";
        if (::mkdtemp(tmpl) == nullptr) return;
        dir_ = tmpl;
        std::filesystem::permissions(dir_, std::filesystem::perms::all & ~std::filesystem::perms::others_write &
                                               ~std::filesystem::perms::group_write);
        if (::getuid() == 0 && run("chown postgres:postgres " + dir_, false) != 0) return;
        port_ = free_port();
        ok_ = port_ != 0 && run(as_postgres(bin_ + "/initdb -D " + dir_ + "/data -A trust -U postgres") + " >" + dir_ +
                                    "/initdb.log 2>&1",
                                false) == 0;
    }
    ~own_server() {
        if (dir_.empty()) return;
        (void)crash();
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
    own_server(const own_server&) = delete;
    own_server& operator=(const own_server&) = delete;

    /// Why the cluster could not be made, or "".
    [[nodiscard]] std::string problem() const {
        if (dir_.empty()) return "cannot create a temporary directory";
        if (!std::filesystem::exists(bin_ + "/initdb")) return "no PostgreSQL server binaries in " + bin_ + " (set PG_BIN)";
        if (port_ == 0) return "no free loopback port";
        return ok_ ? "" : "initdb failed (" + dir_ + "/initdb.log)";
    }
    [[nodiscard]] bool start() {
        return run(as_postgres(bin_ + "/pg_ctl -D " + dir_ + "/data -l " + dir_ + "/log -w -t 60 -o \"-k " + dir_ +
                               " -p " + std::to_string(port_) +
                               " -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on\" start") +
                       " >/dev/null",
                   true) == 0;
    }
    /// Kills the postmaster and every backend at once: what a machine crash looks like to clients.
    [[nodiscard]] bool crash() {
        return run(as_postgres(bin_ + "/pg_ctl -D " + dir_ + "/data -m immediate stop") + " >/dev/null 2>&1", false) == 0;
    }
    [[nodiscard]] std::string uri() const { return "postgresql://postgres@127.0.0.1:" + std::to_string(port_) + "/postgres"; }

private:
    static std::string as_postgres(const std::string& cmd) {
        return ::getuid() == 0 ? "runuser -u postgres -- " + cmd : cmd;
    }
    int run(const std::string& cmd, bool show) const {
        const int rc = std::system(cmd.c_str());
        if (rc != 0 && show) std::fprintf(stderr, "command failed (%d): %s\n", rc, cmd.c_str());
        return rc;
    }
    static int free_port() {
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0) return 0;
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        int port = 0;
        if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
            port = ntohs(a.sin_port);
        ::close(fd);
        return port;
    }

    std::string bin_, dir_;
    int port_ = 0;
    bool ok_ = false;
};

std::uint64_t outcome_of(std::size_t i) { return i * 7 + 1; }

TEST(PostgresServerCrash, FlusherRidesThroughAServerCrashAndNothingAcknowledgedIsLost) {
    own_server srv;
    ASSERT_EQ(srv.problem(), "");
    ASSERT_TRUE(srv.start()) << "cannot start the test's own PostgreSQL";

    idem::options o;
    o.capacity = 1u << 16;
    o.maintenance_interval = {};  // no compensation during the test: every claim is live
    idem::store_options so;
    so.mode = durability::sync;
    so.sync_timeout = 1s;  // a commit that cannot happen is answered store_unavailable within 1 s
    so.max_backoff = 50ms;
    auto g = std::make_unique<idem::durable_guard>(std::make_unique<idem::postgres_store>(srv.uri(), 2s), o, so);

    constexpr std::size_t threads = 8;
    std::mutex m;
    std::map<std::string, int> executed;             // the independent ledger: effects per key
    std::map<std::string, std::uint64_t> succeeded;  // succeed() answered OK: acknowledged, durable
    std::set<std::string> claimed;                   // begin() answered acquired: the claim is durable
    std::atomic<std::size_t> acks{0}, refused{0}, unavailable_completions{0}, duplicates_checked{0};
    std::atomic<bool> stop{false};
    std::latch go(threads + 1);
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < threads; ++t)
        pool.emplace_back([&, t] {
            std::vector<std::size_t> mine;  // keys this thread was granted
            go.arrive_and_wait();
            for (std::size_t i = t; !stop.load(); i += threads) {
                const idem::key k("TX" + std::to_string(i) + "_PAY_v1");
                auto r = g->guard().begin(k);
                if (r.status == begin_status::store_unavailable || r.status == begin_status::backpressure) {
                    ++refused;  // not granted: must not execute, and does not
                    continue;
                }
                ASSERT_EQ(r.status, begin_status::acquired) << k.view();
                {
                    std::lock_guard lock(m);
                    ++executed[std::string(k.view())];
                    claimed.insert(std::string(k.view()));
                }
                const std::error_code ec = r.ticket.succeed(outcome_of(i));
                if (!ec) {
                    std::lock_guard lock(m);
                    succeeded[std::string(k.view())] = outcome_of(i);
                    ++acks;
                } else {
                    // The completion is queued and stays pending; it is not acknowledged.
                    ASSERT_EQ(ec, errc::store_unavailable) << k.view() << ": " << ec.message();
                    ++unavailable_completions;
                }
                mine.push_back(i);
                // A retry of a key this thread was granted a few payments ago: never a second grant.
                if (mine.size() > 4) {
                    const idem::key old("TX" + std::to_string(mine[mine.size() - 5]) + "_PAY_v1");
                    auto d = g->guard().begin(old);
                    ASSERT_NE(d.status, begin_status::acquired) << old.view() << " was granted twice";
                    ++duplicates_checked;
                }
            }
        });
    go.arrive_and_wait();

    ASSERT_TRUE(wait_for([&] { return acks.load() >= 300; }, 60s)) << "no progress before the crash";
    const std::size_t errors_before = g->snapshot().store_errors;
    ASSERT_TRUE(srv.crash()) << "pg_ctl stop -m immediate failed";
    const std::size_t acks_at_crash = acks.load();
    ASSERT_TRUE(wait_for([&] { return g->snapshot().store_errors > errors_before; }, 30s))
        << "the flusher never met the crashed server";
    // While the server is down, sync claims are refused rather than granted.
    ASSERT_TRUE(wait_for([&] { return refused.load() > 0; }, 30s)) << "claims were granted while the server was down";
    ASSERT_TRUE(srv.start()) << "cannot restart PostgreSQL after the crash";
    ASSERT_TRUE(wait_for([&] { return acks.load() >= acks_at_crash + 300; }, 60s))
        << "no progress after the restart: " << g->last_store_error();
    stop = true;
    for (auto& th : pool) th.join();
    ASSERT_TRUE(g->flush(30s)) << "the queue did not drain after the restart: " << g->last_store_error();
    const idem::stats s = g->snapshot();
    std::printf("[ idem    ] %zu acknowledged successes (%zu before the crash), %zu claims refused while down, "
                "%zu completions answered store_unavailable, %zu duplicate checks, %llu store errors\n",
                acks.load(), acks_at_crash, refused.load(), unavailable_completions.load(), duplicates_checked.load(),
                static_cast<unsigned long long>(s.store_errors));
    g.reset();

    // Read everything back through a fresh connection to the restarted server.
    idem::postgres_store check(srv.uri());
    for (const auto& [k, n] : executed) EXPECT_EQ(n, 1) << k << " executed " << n << " times";
    for (const auto& [k, outcome] : succeeded) {
        const auto rec = check.get(k);
        ASSERT_TRUE(rec.has_value()) << "acknowledged success of " << k << " lost";
        EXPECT_EQ(rec->state, record_state::succeeded) << k;
        EXPECT_EQ(rec->outcome, outcome) << k;
    }
    for (const auto& k : claimed) {
        const auto rec = check.get(k);
        ASSERT_TRUE(rec.has_value()) << "acknowledged claim of " << k << " lost";
        // Completions answered store_unavailable were still queued; after the drain they are SUCCESS too.
        EXPECT_EQ(rec->state, record_state::succeeded) << k;
    }
    const idem::verify_report rep = idem::verify(check);
    EXPECT_TRUE(rep.violations.empty()) << rep.violations.size() << " violations, first: "
                                        << (rep.violations.empty() ? "" : rep.violations.front());
    EXPECT_GE(rep.keys, claimed.size());
}

}  // namespace
