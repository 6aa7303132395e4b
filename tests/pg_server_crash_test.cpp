// pg_server_crash_test: the PostgreSQL server itself crashes (`pg_ctl stop -m immediate`: no
// checkpoint, no goodbye to clients) while a durable guard in sync mode is flushing payments from
// many threads, and is started again. The flusher must notice, back off, reconnect, and go on; no
// thread may hang; nothing acknowledged may be lost; no key may run twice.
//
// The test owns its server (tests/support/private_pg.hpp: scripts/lib/postgres.sh's pg_start,
// pg_crash, pg_resume), so crashing it disturbs no other test. It needs the PostgreSQL 15 server
// binaries (PG_BIN, default /usr/lib/postgresql/15/bin); without them the test FAILS, never skips.
#include <idem/stores/postgres_store.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "support/private_pg.hpp"
#include "support/server_crash_drill.hpp"

namespace {

using namespace std::chrono_literals;

TEST(PostgresServerCrash, FlusherRidesThroughAServerCrashAndNothingAcknowledgedIsLost) {
    idem_test::private_server srv;
    ASSERT_FALSE(srv.uri().empty()) << "cannot start the test's own PostgreSQL with scripts/lib/postgres.sh (PG_BIN)";
    idem_test::server_crash_drill(srv, [&] { return std::make_unique<idem::postgres_store>(srv.uri(), 2s); });
}

}  // namespace
