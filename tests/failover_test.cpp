// failover_test: PostgreSQL failover pairs of the test's own (tests/support/private_pg.hpp's
// private_pair: a primary and a streaming standby, synchronous unless said, reached through one
// multi-host URI with target_session_attrs=read-write).
//
//   * A durable guard in sync mode rides through a failover: the primary is killed (SIGKILL to the
//     postmaster and every backend) while eight threads claim and complete payments, the standby is
//     promoted, the guard finds it by itself; nothing acknowledged is lost, no key runs twice,
//     `verify` is clean on the new primary (tests/support/server_crash_drill.hpp). Twice: promoted
//     by the test at once, and by a real failover manager (pg_auto_failover: a monitor and two
//     nodes, private_formation) that detects the death itself. The same under a
//     global guard with 4 processes x 25 threads is global_test's Global.FailoverToASynchronousStandby.
//   * require_synchronous_standby: refused at open without a standby (naming the setting), accepted
//     with one, and a standby un-named behind a running store refuses the next commit, which goes
//     through once a standby is named again; the global guard's option likewise.
//   * A commit whose wait for the standby an operator cancels is visible on the primary before the
//     standby has it: the store answers commit_unknown, not success, and the in-doubt probe answers
//     "committed" only once the standby has it.
//
// Needs the PostgreSQL 15 server binaries (PG_BIN), pg_auto_failover (packages
// postgresql-15-auto-failover, pg-auto-failover-cli) and root or the postgres user; the test FAILS,
// never skips, when a pair or a formation cannot start. Timing is measured and printed, never asserted.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "idem/durable.hpp"
#include "idem/global_guard.hpp"
#include "idem/stores/postgres_store.hpp"
#include "support/pg_settings.hpp"
#include "support/private_pg.hpp"
#include "support/server_crash_drill.hpp"
#include "support/store_fixtures.hpp"

// LeakSanitizer (ASan builds): libpqxx 6.4 leaks the PGresult of the ROLLBACK that a transaction's
// destructor sends over a broken connection; these tests break connections on purpose.
extern "C" const char* __lsan_default_suppressions() { return "leak:libpqxx\n"; }

namespace {

using namespace std::chrono_literals;
using idem_test::private_pair;
using idem_test::reconfigure;
using idem_test::row;

std::vector<idem::store_row> claim_rows(const std::string& prefix, int n) {
    std::vector<idem::store_row> rows;
    for (int i = 0; i < n; ++i) rows.push_back(row({.key = prefix + std::to_string(i) + "_PAY_v1"}, i + 1));
    idem_test::sort_like_flusher(rows);
    return rows;
}

std::string trimmed(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

TEST(Failover, DurableGuardRidesThroughAPromotion) {
    private_pair pair;
    ASSERT_FALSE(pair.uri().empty()) << "cannot start a primary and a synchronous standby with scripts/lib/postgres.sh";
    // The guard's store and the one that reads everything back both name the pair: after the
    // promotion they find the standby, which must hold everything acknowledged before the kill.
    idem_test::server_crash_drill(pair, [&] { return std::make_unique<idem::postgres_store>(pair.uri(), 2s); });
    EXPECT_EQ(trimmed(pair.psql(pair.standby_uri(), "SELECT pg_is_in_recovery()")), "f") << "the standby was not promoted";
}

// The same drill with a real failover manager: pg_auto_failover's monitor notices the dead primary
// and promotes the secondary by itself (its timeouts lowered to seconds, in the order its safety
// needs: scripts/lib/pgautofailover.sh). The secondary was synchronous (the monitor names it in
// synchronous_standby_names), so nothing acknowledged is lost.
TEST(Failover, DurableGuardRidesThroughAPgAutoFailoverFailover) {
    idem_test::private_formation f;
    ASSERT_FALSE(f.uri().empty()) << "cannot start a pg_auto_failover formation with scripts/lib/pgautofailover.sh";
    idem_test::server_crash_drill(f, [&] { return std::make_unique<idem::postgres_store>(f.uri(), 2s); });
    const std::string state = f.state();
    EXPECT_NE(state.find("node_2:wait_primary"), std::string::npos) << "the monitor did not promote node_2: " << state;
}

TEST(Failover, RequireSynchronousStandby) {
    private_pair pair;
    ASSERT_FALSE(pair.uri().empty()) << "cannot start a primary and a synchronous standby with scripts/lib/postgres.sh";
    {
        // A standby that is not synchronous protects nothing acknowledged: the standby itself, as a
        // server of its own after promotion, names none. Its exposure says so, and the requirement
        // is refused naming the setting.
        ASSERT_TRUE(reconfigure(pair.primary_uri(), "synchronous_standby_names", "''", ""));
        idem::postgres_store s(pair.uri(), 2s);
        EXPECT_NE(s.failover_exposure().find("no synchronous standby"), std::string::npos) << s.failover_exposure();
        try {
            s.require_synchronous_standby();
            ADD_FAILURE() << "a server without a synchronous standby was accepted";
        } catch (const idem::error& e) {
            EXPECT_EQ(e.code(), idem::errc::invalid_argument) << e.what();
            EXPECT_NE(std::string(e.what()).find("synchronous_standby_names"), std::string::npos) << e.what();
        }
        idem::global_options go;
        go.require_synchronous_standby = true;
        try {
            idem::global_guard g(pair.uri(), {}, go);
            ADD_FAILURE() << "a global guard opened without a synchronous standby";
        } catch (const idem::error& e) {
            EXPECT_EQ(e.code(), idem::errc::invalid_argument) << e.what();
            EXPECT_NE(std::string(e.what()).find("synchronous_standby_names"), std::string::npos) << e.what();
        }
        ASSERT_TRUE(reconfigure(pair.primary_uri(), "synchronous_standby_names", "'idem_standby'", "idem_standby"));
    }
    idem::postgres_store s(pair.uri(), 2s);
    EXPECT_NE(s.failover_exposure().find("synchronous standby 'idem_standby'"), std::string::npos) << s.failover_exposure();
    ASSERT_NO_THROW(s.require_synchronous_standby());
    const auto first = claim_rows("RQ", 3);
    ASSERT_NO_THROW(s.apply(first, 1));
    EXPECT_EQ(trimmed(pair.psql(pair.standby_uri(), "SELECT count(*) FROM idempotent_record")), "3")
        << "an acknowledged batch is not on the synchronous standby";

    // The standby is un-named behind the running store: the next batch commits nothing.
    ASSERT_TRUE(reconfigure(pair.primary_uri(), "synchronous_standby_names", "''", ""));
    const auto second = claim_rows("RS", 2);
    try {
        s.apply(second, 2);
        ADD_FAILURE() << "a batch committed while no synchronous standby was named";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), idem::errc::store_unavailable) << e.what();
        EXPECT_NE(std::string(e.what()).find("synchronous_standby_names"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(s.committed(2));
    EXPECT_EQ(
        trimmed(pair.psql(pair.primary_uri(), "SELECT count(*) FROM idempotent_record WHERE idempotent_key LIKE 'RS%'")),
        "0");
    // A standby is named again: the same batch goes through.
    ASSERT_TRUE(reconfigure(pair.primary_uri(), "synchronous_standby_names", "'idem_standby'", "idem_standby"));
    ASSERT_NO_THROW(s.apply(second, 2));
    EXPECT_TRUE(s.committed(2));

    // The global guard's option: accepted with the standby named, and its claims are on the standby.
    idem::global_options go;
    go.require_synchronous_standby = true;
    go.call_deadline = 2s;
    idem::global_guard g(pair.uri(), {}, go);
    auto r = g.begin(idem::key("RG1_PAY_v1"));
    ASSERT_EQ(r.status, idem::begin_status::acquired);
    EXPECT_FALSE(r.ticket.succeed(9));
    EXPECT_EQ(
        trimmed(pair.psql(pair.standby_uri(),
                          "SELECT status || ':' || outcome FROM idempotent_record WHERE idempotent_key = 'RG1_PAY_v1'")),
        "SUCCESS:9");
}

// The standby stops answering (SIGSTOP), so a commit waits for it; an operator cancels that wait
// (pg_cancel_backend), which PostgreSQL answers with a WARNING and a successful COMMIT: the batch
// is then visible on the primary while the standby lacks it. The store must not acknowledge it, and
// its in-doubt probe must not say "committed" until the standby has it.
TEST(Failover, ACancelledWaitForTheStandbyIsNotAnAcknowledgement) {
    private_pair pair;
    ASSERT_FALSE(pair.uri().empty()) << "cannot start a primary and a synchronous standby with scripts/lib/postgres.sh";
    idem::postgres_store s(pair.uri(), 30s);
    s.require_synchronous_standby();
    ASSERT_TRUE(pair.pause_standby(true));
    struct resume_standby {
        private_pair& p;
        ~resume_standby() { (void)p.pause_standby(false); }
    } resume{pair};

    const auto rows = claim_rows("CW", 4);
    auto applied = std::async(std::launch::async, [&]() -> std::string {
        try {
            s.apply(rows, 7);
            return "acknowledged";
        } catch (const idem::commit_unknown& e) {
            return std::string("commit_unknown: ") + e.what();
        } catch (const std::exception& e) {
            return std::string("other: ") + e.what();
        }
    });
    // Wait (bounded) until the batch's backend waits for the standby, then cancel that wait.
    const std::string waiting =
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idem' AND wait_event = 'SyncRep'";
    ASSERT_TRUE(idem_test::wait_for([&] { return trimmed(pair.psql(pair.primary_uri(), waiting)) == "1"; }, 20s))
        << "the batch never waited for the standby";
    ASSERT_EQ(trimmed(pair.psql(pair.primary_uri(),
                                "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity WHERE application_name = "
                                "'idem' AND wait_event = 'SyncRep'")),
              "1");
    ASSERT_EQ(applied.wait_for(25s), std::future_status::ready) << "apply() did not return after the cancel";
    const std::string answer = applied.get();
    EXPECT_EQ(answer.rfind("commit_unknown: ", 0), 0u) << answer;
    EXPECT_NE(answer.find("synchronous standby"), std::string::npos) << answer;
    // The hazard is real: the primary shows the batch, which the standby does not have.
    EXPECT_EQ(trimmed(pair.psql(pair.primary_uri(), "SELECT count(*) FROM idempotent_batch WHERE batch_id = 7")), "1");

    // The probe confirms with a write of its own, which waits for the stopped standby: no answer.
    idem::postgres_store probe(pair.uri(), 2s);
    try {
        const bool c = probe.committed(7);
        ADD_FAILURE() << "the probe answered " << c << " while the standby could not have the batch";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), idem::errc::store_unavailable) << e.what();
    }
    ASSERT_TRUE(pair.pause_standby(false));
    // The standby catches up: now the batch is durable on both, and the probe says so.
    ASSERT_TRUE(idem_test::wait_for(
        [&] {
            try {
                return probe.committed(7);
            } catch (const idem::error&) {
                return false;  // the probe's own wait was cut before the standby answered: ask again
            }
        },
        30s));
    EXPECT_TRUE(idem_test::wait_for(
        [&] {
            return trimmed(pair.psql(pair.standby_uri(), "SELECT count(*) FROM idempotent_batch WHERE batch_id = 7")) == "1";
        },
        30s))
        << "the standby never received the batch";
}

}  // namespace
