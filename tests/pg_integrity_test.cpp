// pg_integrity_test: PostgreSQL integrity under faults.
//
//   VerifyUnderWriteLoad   idem::verify runs again and again while a guard writes: zero violations
//
// VerifyUnderWriteLoad uses IDEM_TEST_PG_URI, in a database of its own. The tests FAIL, never skip,
// when a server is missing.
#include <idem/durable.hpp>
#include <idem/postgres_store.hpp>
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

#include "support/store_fixtures.hpp"

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::durability;
using idem::errc;
using idem::record_state;
namespace pg = idem::detail::pg;
using idem_test::wait_for;

/// Runs one statement as the administrator, on a connection of its own.
void admin(const std::string& uri, const std::string& sql) {
    pqxx::connection c(uri);
    pqxx::nontransaction n(c);
    n.exec(sql);
}

// ---- idem verify on a live store ------------------------------------------------------------------

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
        std::atomic<bool> stop{false};
        std::thread writer([&] {
            for (std::size_t i = 0; !stop.load(); ++i) {
                auto r = g->begin(idem::key("VL" + std::to_string(i) + "_PAY_v1"));
                if (r.status == begin_status::acquired) (void)r.ticket.succeed(i);
            }
        });
        idem::postgres_store reader(uri, 5s);
        std::size_t runs = 0, violations = 0;
        std::string first;
        for (; runs < 25; ++runs) {
            // Each run overlaps new batches: wait for the writer's next commits first.
            const std::uint64_t batches = g.snapshot().flush_batches;
            ASSERT_TRUE(wait_for([&] { return g.snapshot().flush_batches >= batches + 2; }))
                << "the writer made no progress: " << g.last_store_error();
            const idem::verify_report rep = idem::verify(reader);
            violations += rep.violations.size();
            if (first.empty() && !rep.violations.empty()) first = rep.violations.front();
        }
        stop = true;
        writer.join();
        EXPECT_EQ(violations, 0u) << "in " << runs << " runs of verify during the write load; first: " << first;
        ASSERT_TRUE(g.flush(30s)) << g.last_store_error();
    }
    idem::postgres_store check(uri);
    const idem::verify_report rep = idem::verify(check);
    EXPECT_TRUE(rep.violations.empty()) << rep.violations.front();
    EXPECT_GT(rep.keys, 0u);
}

}  // namespace
