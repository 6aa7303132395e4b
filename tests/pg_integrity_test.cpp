// pg_integrity_test: PostgreSQL settings changed behind a running guard, and `idem verify` on a live
// store.
//
//   SynchronousCommit...   ALTER SYSTEM SET synchronous_commit = off + reload under an open store:
//                          the store's own session (the one that commits) keeps running with
//                          synchronous_commit=on, before and after a reconnect; remote_apply, when
//                          configured, is kept (never weakened); the global guard's sessions too
//   SyncGuardStops...      a sync durable_guard is writing when fsync is turned off, first by a
//                          reload, then by a restart of the server: acknowledgements stop with an
//                          error naming fsync, nothing started after that is acknowledged, and
//                          writing resumes once fsync=on is back; every acknowledged success is in
//                          the store
//   OpenRefuses...         a sync durable_guard and a global_guard refuse a server configured with
//                          fsync=off or synchronous_commit=off at open; the durable guard's message
//                          names the library's option (store_options::mode), not a CLI flag
//   GlobalGuardStops...    a running global_guard: a restart with fsync=off stops its claims with an
//                          error naming fsync; they resume once fsync=on is back
//   VerifyUnderWriteLoad   idem::verify runs again and again while a guard writes: zero violations
//
// The settings tests own their server (tests/support/private_pg.hpp: scripts/lib/postgres.sh), so
// changing its configuration or restarting it disturbs no other test; they need the PostgreSQL 15
// server binaries (PG_BIN). VerifyUnderWriteLoad uses IDEM_TEST_PG_URI, in a database of its own.
// The tests FAIL, never skip, when a server is missing.
#include <idem/durable.hpp>
#include <idem/global_guard.hpp>
#include <idem/stores/postgres_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/pg_database.hpp"
#include "support/pg_settings.hpp"
#include "support/private_pg.hpp"
#include "support/store_fixtures.hpp"

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::durability;
using idem::errc;
using idem::record_state;
namespace pg = idem::detail::pg;
using idem_test::admin;
using idem_test::fresh_setting;
using idem_test::reconfigure;
using idem_test::wait_for;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- synchronous_commit is pinned on the library's own sessions -------------------------------------

TEST(PgIntegrity, SynchronousCommitStaysOnInTheStoresSessionAfterAReloadTurnsItOff) {
    idem_test::private_server srv;
    ASSERT_FALSE(srv.uri().empty()) << "cannot start the test's own PostgreSQL with scripts/lib/postgres.sh (PG_BIN)";
    idem::postgres_store st(srv.uri(), 2s);
    st.check_sync_durability();  // what a sync durable_guard does at open
    ASSERT_EQ(st.session_setting("synchronous_commit"), "on");

    ASSERT_TRUE(reconfigure(srv.uri(), "synchronous_commit", "off", "off"));
    // The session that commits the batches: the reload does not reach it.
    EXPECT_EQ(st.session_setting("synchronous_commit"), "on") << "the reload weakened the store's own session";
    st.reconnect();  // a new session starts with the server's off: pinned again
    EXPECT_EQ(st.session_setting("synchronous_commit"), "on") << "a reconnect took the server's synchronous_commit=off";
    // An open store (async mode too) pins it from its first session on.
    idem::postgres_store fresh(srv.uri(), 2s);
    EXPECT_EQ(fresh.session_setting("synchronous_commit"), "on");

    // remote_apply is stricter than on: kept, and still kept after the server is set to off again.
    ASSERT_TRUE(reconfigure(srv.uri(), "synchronous_commit", "remote_apply", "remote_apply"));
    st.reconnect();
    EXPECT_EQ(st.session_setting("synchronous_commit"), "remote_apply");
    ASSERT_TRUE(reconfigure(srv.uri(), "synchronous_commit", "off", "off"));
    st.reconnect();
    EXPECT_EQ(st.session_setting("synchronous_commit"), "remote_apply") << "a reconnect weakened remote_apply";
    // local and remote_write are raised to on.
    ASSERT_TRUE(reconfigure(srv.uri(), "synchronous_commit", "local", "local"));
    idem::postgres_store local(srv.uri(), 2s);
    EXPECT_EQ(local.session_setting("synchronous_commit"), "on");
}

TEST(PgIntegrity, SynchronousCommitStaysOnInAGlobalGuardSessionAfterAReloadTurnsItOff) {
    idem_test::private_server srv;
    ASSERT_FALSE(srv.uri().empty()) << "cannot start the test's own PostgreSQL with scripts/lib/postgres.sh (PG_BIN)";
    // The session class every batcher of global_guard runs its statements on (the PostgreSQL arbiter).
    idem::detail::global::pg_session db(srv.uri(), pg::redact(srv.uri()), 2000ms, "idem-test",
                                        /*standby=*/false);
    auto show = [&] {
        std::string v;
        const auto r = db.run("show", [&](pqxx::connection& c) {
            pqxx::nontransaction n(c);
            v = n.exec("SELECT current_setting('synchronous_commit')")[0][0].c_str();
        });
        EXPECT_EQ(r, idem::detail::global::global_session::result::ok) << db.last_error();
        return v;
    };
    ASSERT_EQ(show(), "on");
    ASSERT_TRUE(reconfigure(srv.uri(), "synchronous_commit", "off", "off"));
    EXPECT_EQ(show(), "on") << "the reload weakened the global guard's session";
    db.drop();  // reconnect at the next call
    EXPECT_EQ(show(), "on") << "a reconnect took the server's synchronous_commit=off";
}

// ---- fsync turned off under a running sync guard ----------------------------------------------------

TEST(PgIntegrity, SyncGuardStopsAcknowledgingWhenFsyncIsTurnedOffByAReloadOrARestart) {
    idem_test::private_server srv;
    ASSERT_FALSE(srv.uri().empty()) << "cannot start the test's own PostgreSQL with scripts/lib/postgres.sh (PG_BIN)";
    idem::options o;
    o.capacity = 1u << 16;
    o.maintenance_interval = {};
    idem::store_options so;
    so.mode = durability::sync;
    so.sync_timeout = 300ms;  // a commit refused is answered store_unavailable within 300 ms
    so.max_backoff = 50ms;
    auto g = std::make_unique<idem::durable_guard>(std::make_unique<idem::postgres_store>(srv.uri(), 2s), o, so);

    // phase: 0 normal, 1 fsync is off and the guard said so, 2 fsync is being turned on again. A call
    // that started and returned within phase 1 ran entirely while fsync was off: it must never be
    // acknowledged. (One still waiting when fsync=on is back may be: its commit is durable.)
    std::atomic<int> phase{0};
    std::atomic<std::size_t> acks{0}, refused_in_off{0}, acked_in_off{0};
    std::mutex m;
    std::map<std::string, std::uint64_t> succeeded;  // acknowledged successes
    std::atomic<bool> stop{false};
    std::thread writer([&] {
        for (std::size_t i = 0; !stop.load(); ++i) {
            const idem::key k("FS" + std::to_string(i) + "_PAY_v1");
            const int at_begin = phase.load();
            auto r = g->guard().begin(k);
            if (r.status != begin_status::acquired) {
                if (r.status == begin_status::store_unavailable && at_begin == 1) ++refused_in_off;
                continue;
            }
            if (at_begin == 1 && phase.load() == 1) ++acked_in_off;  // a claim acknowledged while fsync was off
            const int at_succeed = phase.load();
            if (r.ticket.succeed(i + 1)) {
                if (at_succeed == 1) ++refused_in_off;
                continue;
            }
            if (at_succeed == 1 && phase.load() == 1) ++acked_in_off;
            std::lock_guard lock(m);
            succeeded[std::string(k.view())] = i + 1;
            ++acks;
        }
    });
    auto turned_off = [&](const char* how, std::uint64_t errors_before) {
        // The guard says why it stops: its last store error (one met after the change) names the setting.
        EXPECT_TRUE(wait_for([&] {
            return g->snapshot().store_errors > errors_before && contains(g->last_store_error(), "fsync=off");
        })) << how
            << ": the guard never named fsync=off; last store error: " << g->last_store_error();
        phase = 1;
        EXPECT_TRUE(wait_for([&] { return refused_in_off.load() >= 3; }))
            << how << ": calls made while fsync is off neither returned nor were refused";
        EXPECT_EQ(acked_in_off.load(), 0u) << how << ": acknowledged while the server runs with fsync=off";
    };
    auto turned_on = [&](const char* how) {
        phase = 2;
        ASSERT_TRUE(reconfigure(srv.uri(), "fsync", "", "on"));
        const std::size_t before = acks.load();
        EXPECT_TRUE(wait_for([&] { return acks.load() >= before + 20; }))
            << how << ": no acknowledgement after fsync=on came back: " << g->last_store_error();
    };

    ASSERT_TRUE(wait_for([&] { return acks.load() >= 50; })) << "no progress: " << g->last_store_error();
    // 1. A reload: the sessions stay open, so only a check per batch can see it.
    std::uint64_t errors = g->snapshot().store_errors;
    ASSERT_TRUE(reconfigure(srv.uri(), "fsync", "off", "off"));
    turned_off("reload", errors);
    turned_on("reload");
    // 2. A restart with fsync=off: the flusher reconnects to it.
    phase = 0;
    refused_in_off = 0;
    errors = g->snapshot().store_errors;
    admin(srv.uri(), "ALTER SYSTEM SET fsync = off");
    ASSERT_TRUE(srv.restart()) << "pg_ctl restart failed";
    ASSERT_EQ(fresh_setting(srv.uri(), "fsync"), "off");
    turned_off("restart", errors);
    turned_on("restart");

    stop = true;
    writer.join();
    ASSERT_TRUE(g->flush(30s)) << g->last_store_error();
    g.reset();
    idem::postgres_store check(srv.uri());
    for (const auto& [k, outcome] : succeeded) {
        const auto rec = check.get(k);
        ASSERT_TRUE(rec.has_value()) << "acknowledged success of " << k << " lost";
        EXPECT_EQ(rec->state, record_state::succeeded) << k;
        EXPECT_EQ(rec->outcome, outcome) << k;
    }
    const idem::verify_report rep = idem::verify(check);
    EXPECT_TRUE(rep.violations.empty()) << rep.violations.front();
}

// ---- refusal at open ----------------------------------------------------------------------------------

TEST(PgIntegrity, OpenRefusesFsyncOffAndSynchronousCommitOffNamingTheLibrarysOption) {
    idem_test::private_server srv;
    ASSERT_FALSE(srv.uri().empty()) << "cannot start the test's own PostgreSQL with scripts/lib/postgres.sh (PG_BIN)";
    idem::store_options sync;
    sync.mode = durability::sync;
    idem::global_options go;
    go.call_deadline = 2000ms;
    go.wait_timeout = 2000ms;
    auto durable_refusal = [&]() -> std::string {
        try {
            idem::durable_guard g(std::make_unique<idem::postgres_store>(srv.uri(), 2s), {}, sync);
        } catch (const idem::error& e) {
            EXPECT_EQ(e.kind(), errc::invalid_argument) << e.what();
            return e.what();
        }
        return "(opened)";
    };
    auto global_refusal = [&]() -> std::string {
        try {
            idem::global_guard g(srv.uri(), {}, go);
        } catch (const idem::error& e) {
            EXPECT_EQ(e.kind(), errc::invalid_argument) << e.what();
            return e.what();
        }
        return "(opened)";
    };
    for (const char* setting : {"fsync", "synchronous_commit"}) {
        SCOPED_TRACE(setting);
        ASSERT_TRUE(reconfigure(srv.uri(), setting, "off", "off"));
        const std::string d = durable_refusal();
        EXPECT_TRUE(contains(d, std::string(setting) + "=off")) << d;
        EXPECT_TRUE(contains(d, "store_options::mode = durability::async")) << d;
        EXPECT_FALSE(contains(d, "--durability")) << "a CLI flag in a library message: " << d;
        const std::string gl = global_refusal();
        EXPECT_TRUE(contains(gl, std::string(setting) + "=off")) << "global_guard: " << gl;
        EXPECT_FALSE(contains(gl, "--durability")) << gl;
        ASSERT_TRUE(reconfigure(srv.uri(), setting, "", "on"));
    }
    // Both open again once the server is fixed.
    EXPECT_NO_THROW((void)idem::durable_guard(std::make_unique<idem::postgres_store>(srv.uri(), 2s), {}, sync));
    EXPECT_NO_THROW((void)idem::global_guard(srv.uri(), {}, go));
}

// ---- fsync turned off under a running global guard -------------------------------------------------

TEST(PgIntegrity, GlobalGuardStopsClaimingWhenRestartedWithFsyncOff) {
    idem_test::private_server srv;
    ASSERT_FALSE(srv.uri().empty()) << "cannot start the test's own PostgreSQL with scripts/lib/postgres.sh (PG_BIN)";
    idem::options o;
    o.maintenance_interval = {};
    idem::global_options go;
    go.call_deadline = 2000ms;
    go.wait_timeout = 500ms;
    go.max_backoff = 50ms;
    idem::global_guard g(srv.uri(), o, go);
    std::size_t next = 0;
    auto claim = [&] {  // a fresh key: claimed and completed, or refused
        const idem::key k("GF" + std::to_string(next++) + "_PAY_v1");
        auto r = g.begin(k);
        if (r.status != begin_status::acquired) return r.status;
        return r.ticket.succeed(1) ? begin_status::store_unavailable : begin_status::acquired;
    };
    ASSERT_EQ(claim(), begin_status::acquired) << g.last_error();

    admin(srv.uri(), "ALTER SYSTEM SET fsync = off");
    ASSERT_TRUE(srv.restart()) << "pg_ctl restart failed";
    ASSERT_EQ(fresh_setting(srv.uri(), "fsync"), "off");
    // Until a session met the restarted server, a claim may still fail for the restart itself.
    EXPECT_TRUE(wait_for([&] { return claim() != begin_status::acquired && contains(g.last_error(), "fsync=off"); }))
        << "the global guard never named fsync=off; last error: " << g.last_error();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(claim(), begin_status::store_unavailable) << "claimed while fsync=off";
    EXPECT_TRUE(contains(g.last_error(), "fsync=off")) << g.last_error();

    ASSERT_TRUE(reconfigure(srv.uri(), "fsync", "", "on"));
    EXPECT_TRUE(wait_for([&] { return claim() == begin_status::acquired; }))
        << "no claim after fsync=on came back: " << g.last_error();
}

// ---- idem verify on a live store ------------------------------------------------------------------

// A second store opened beside a live writer (idem verify, a reader) only checks the schema: the
// DDL's CREATE INDEX IF NOT EXISTS takes a SHARE lock even when the index exists, which waits for a
// writer's batch, and deadlocked with one holding the audit table and waiting for the record table.
// Here a transaction holds what a batch holds (ROW EXCLUSIVE on both tables) for the whole test:
// the second open must not wait for it.
TEST(PgIntegrity, ASecondStoreOpensBesideALiveWriterWithoutTakingSchemaLocks) {
    idem_test::pg_database db;
    std::string why;
    ASSERT_TRUE(db.create(&why)) << why;
    { idem::postgres_store first(db.uri()); }  // creates the schema
    pqxx::connection writer(db.uri());
    pqxx::work batch(writer);
    batch.exec("LOCK TABLE idempotent_audit, idempotent_record IN ROW EXCLUSIVE MODE");
    try {
        idem::postgres_store second(db.uri(), 2s);
        EXPECT_FALSE(second.get("NONE_PAY_v1").has_value());
    } catch (const idem::error& e) {
        ADD_FAILURE() << "opening a second store waited for the writer's batch: " << e.what();
    }
    batch.abort();
}

TEST(PgIntegrity, VerifyUnderWriteLoadReportsNoViolation) {
    const char* u = std::getenv("IDEM_TEST_PG_URI");
    const std::string server = u ? u : "";
    ASSERT_FALSE(server.empty()) << "IDEM_TEST_PG_URI is unset: this test needs a PostgreSQL server "
                                    "(scripts/test starts one; or source scripts/lib/postgres.sh && pg_start)";
    std::random_device rd;
    char name[32];
    std::snprintf(name, sizeof name, "idem_i_%08x%08x", rd(), rd());
    const std::string db = name;  // hex digits only
    admin(server, "CREATE DATABASE " + db);
    struct dropper {
        std::string server, db;
        ~dropper() {
            try {
                admin(server, "DROP DATABASE IF EXISTS " + db + " WITH (FORCE)");
            } catch (const std::exception& e) {
                ADD_FAILURE() << "cannot drop test database " << db << ": " << e.what();
            }
        }
    } drop{server, db};
    const std::string uri = pg::with_database(server, db);

    {
        idem::options o;
        o.capacity = 1u << 20;
        o.maintenance_interval = {};
        idem::store_options so;  // async: acknowledged at once, flushed in batches behind
        so.max_batch = 64;
        idem::durable_guard g(std::make_unique<idem::postgres_store>(uri, 5s), o, so);
        // The writer gets a fixed number of new keys per run (see the SQLite twin of this test);
        // its destructor stops and joins it on every exit.
        idem_test::paced_writer writer(g, "VL");
        idem::postgres_store reader(uri, 5s);
        std::size_t runs = 0, violations = 0;
        std::string first;
        for (; runs < 25; ++runs) {
            // Each run overlaps new batches: wait for the writer's next commits first.
            const std::uint64_t batches = g.snapshot().flush_batches;
            writer.allow(4000);  // 8,000 transitions: at least 125 batches of 64, verify runs among them
            ASSERT_TRUE(wait_for([&] { return g.snapshot().flush_batches >= batches + 2; }))
                << "the writer made no progress after " << writer.written() << " keys: " << g.last_store_error();
            const idem::verify_report rep = idem::verify(reader);
            violations += rep.violations.size();
            if (first.empty() && !rep.violations.empty()) first = rep.violations.front();
        }
        writer.stop();
        EXPECT_EQ(violations, 0u) << "in " << runs << " runs of verify during the write load; first: " << first;
        ASSERT_TRUE(g.flush(30s)) << g.last_store_error();
    }
    idem::postgres_store check(uri);
    const idem::verify_report rep = idem::verify(check);
    EXPECT_TRUE(rep.violations.empty()) << rep.violations.front();
    EXPECT_GT(rep.keys, 0u);
}

}  // namespace
