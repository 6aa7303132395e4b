// tests/support/server_crash_drill.hpp: the drill of a database server that crashes under a sync
// durable guard, for every server store (pg_server_crash_test: PostgreSQL, `pg_ctl stop -m
// immediate`; mysql_store_test: MariaDB, SIGKILL). Eight threads claim and complete payments; the
// server is crashed and started again. The flusher must notice, back off, reconnect and go on; no
// thread may hang; while the server is down claims are refused, never granted; nothing acknowledged
// is lost; no key runs twice; `verify` is clean.
//
// Server: crash() and resume() (tests/support/private_pg.hpp, private_mysql.hpp). open(): a new
// store on that server (called for the guard, then again to read everything back).
#pragma once

#include <idem/durable.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "store_fixtures.hpp"

namespace idem_test {

template <class Server, class Open>
void server_crash_drill(Server& srv, Open open) {
    using namespace std::chrono_literals;
    using idem::begin_status;
    using idem::durability;
    using idem::errc;
    using idem::record_state;
    const auto outcome_of = [](std::size_t i) -> std::uint64_t { return i * 7 + 1; };


    idem::options o;
    o.capacity = 1u << 16;
    o.maintenance_interval = {};  // no compensation during the test: every claim is live
    idem::store_options so;
    so.mode = durability::sync;
    so.sync_timeout = 1s;  // a commit that cannot happen is answered store_unavailable within 1 s
    so.max_backoff = 50ms;
    auto g = std::make_unique<idem::durable_guard>(open(), o, so);

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
    const auto crashed_at = std::chrono::steady_clock::now();
    ASSERT_TRUE(srv.crash()) << "cannot crash the server";
    const std::size_t acks_at_crash = acks.load();
    ASSERT_TRUE(wait_for([&] { return g->snapshot().store_errors > errors_before; }, 30s))
        << "the flusher never met the crashed server";
    // While the server is down, sync claims are refused rather than granted.
    ASSERT_TRUE(wait_for([&] { return refused.load() > 0; }, 30s)) << "claims were granted while the server was down";
    const auto resuming_at = std::chrono::steady_clock::now();
    ASSERT_TRUE(srv.resume()) << "cannot start the server again after the crash";
    const auto resumed_at = std::chrono::steady_clock::now();
    const std::size_t acks_at_resume = acks.load();
    ASSERT_TRUE(wait_for([&] { return acks.load() > acks_at_resume; }, 60s))
        << "no acknowledgement after the server came back: " << g->last_store_error();
    const auto first_ack_at = std::chrono::steady_clock::now();
    const auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };
    // Measured, not judged (a shared machine): how long the server took to come back (a restart, or
    // a standby's promotion), and how soon after that the guard acknowledged again.
    std::printf("[ idem    ] server back in %lld ms; first acknowledgement %lld ms after that, %lld ms after the crash\n",
                static_cast<long long>(ms(resumed_at - resuming_at)), static_cast<long long>(ms(first_ack_at - resumed_at)),
                static_cast<long long>(ms(first_ack_at - crashed_at)));
    ASSERT_TRUE(wait_for([&] { return acks.load() >= acks_at_crash + 300; }, 60s))
        << "no progress after the restart: " << g->last_store_error();
    stop = true;
    for (auto& th : pool) th.join();
    ASSERT_TRUE(g->flush(30s)) << "the queue did not drain after the restart: " << g->last_store_error();
    const idem::stats s = g->snapshot();
    std::printf(
        "[ idem    ] %zu acknowledged successes (%zu before the crash), %zu claims refused while down, "
        "%zu completions answered store_unavailable, %zu duplicate checks, %llu store errors\n",
        acks.load(), acks_at_crash, refused.load(), unavailable_completions.load(), duplicates_checked.load(),
        static_cast<unsigned long long>(s.store_errors));
    g.reset();

    // Read everything back through a fresh connection to the restarted server.
    const std::unique_ptr<idem::store> fresh = open();
    idem::store& check = *fresh;
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
    EXPECT_TRUE(rep.violations.empty()) << rep.violations.size()
                                        << " violations, first: " << (rep.violations.empty() ? "" : rep.violations.front());
    EXPECT_GE(rep.keys, claimed.size());
}

}  // namespace idem_test
