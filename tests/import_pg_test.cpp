// import_pg_test: `idem import` end to end on PostgreSQL (IDEM_TEST_PG_URI; label postgres). The
// old design's table, in its PostgreSQL flavour (status VARCHAR(16), TIMESTAMP(3), a trigger in
// place of MySQL's ON UPDATE CURRENT_TIMESTAMP(3)), in one fresh database; idem's store
// (postgres_store) in another (both name their table idempotent_record).
//
//   IncrementalPassesWhileTheOldSystemWritesThenAFinalPass
//     300 rows of every state; a writer thread plays the old system (bounded: 300 more keys, each
//     inserted PROCESSING and then decided, one in seven left PROCESSING; 60 of the first rows
//     decided) while a full pass and an incremental pass (--since the first's next_since) run; the
//     writer stops; a final pass. Then: every old row is in idem, in the old table's state or, for a
//     key a pass imported as a claim and the old table decided later, still a claim (counted as a
//     claim conflict); no other conflict, nothing refused; verify passes. A durable guard over the
//     store, with a resolver that reads the old table (the migration's checkTxStatus): the resolver
//     is asked once per claim, at start; no key is acquired; each answers its old state. The CLI
//     (when built) runs one more pass: exit 0, everything present, nothing imported.
#include <idem/durable.hpp>
#include <idem/stores/postgres_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../tools/import.hpp"
#include "../tools/import_sources.hpp"
#include "support/pg_database.hpp"

#ifdef IDEM_TEST_CLI
#include <nlohmann/json.hpp>
#endif

namespace {

using idem::begin_status;
using idem::record_state;
namespace imports = idem::tool::imports;

constexpr const char* old_table_ddl = R"sql(
CREATE TABLE idempotent_record (
  idempotent_key VARCHAR(128) PRIMARY KEY,
  biz_type VARCHAR(32),
  status VARCHAR(16),
  created_time TIMESTAMP(3) DEFAULT CURRENT_TIMESTAMP(3),
  updated_time TIMESTAMP(3) DEFAULT CURRENT_TIMESTAMP(3));
CREATE INDEX idx_biz_status ON idempotent_record (biz_type, status);
CREATE FUNCTION touch_updated_time() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN NEW.updated_time := CURRENT_TIMESTAMP(3); RETURN NEW; END $$;
CREATE TRIGGER on_update_current_timestamp BEFORE UPDATE ON idempotent_record
  FOR EACH ROW EXECUTE FUNCTION touch_updated_time();
)sql";

/// The old table as it is now: key -> status.
std::map<std::string, std::string> old_states(const std::string& uri) {
    pqxx::connection c(uri);
    pqxx::nontransaction n(c);
    std::map<std::string, std::string> out;
    for (const auto& row : n.exec("SELECT idempotent_key, status FROM idempotent_record"))
        out[row[0].as<std::string>()] = row[1].as<std::string>();
    return out;
}

record_state state_of(const std::string& status) { return *imports::parse_old_status(status); }

TEST(ImportPg, IncrementalPassesWhileTheOldSystemWritesThenAFinalPass) {
    idem_test::pg_database old_db, idem_db;
    std::string why;
    ASSERT_TRUE(old_db.create(&why)) << why;
    ASSERT_TRUE(idem_db.create(&why)) << why;
    {
        pqxx::connection c(old_db.uri());
        pqxx::work w(c);
        w.exec(old_table_ddl);
        // The history: 300 keys, a third in each state, created over the last hour.
        w.exec(
            "INSERT INTO idempotent_record (idempotent_key, biz_type, status, created_time, updated_time) "
            "SELECT 'H' || i || '_PAY_v1', 'PAY', (ARRAY['SUCCESS','FAILED','PROCESSING'])[i % 3 + 1], "
            "CURRENT_TIMESTAMP(3) - interval '1 hour' + i * interval '1 second', "
            "CURRENT_TIMESTAMP(3) - interval '1 hour' + i * interval '1 second' + interval '200 milliseconds' "
            "FROM generate_series(0, 299) AS i");
        w.commit();
    }

    // The old system goes on writing: bounded, no sleeps.
    constexpr int new_keys = 300;
    std::atomic<int> written{0};
    std::thread writer([&] {
        pqxx::connection c(old_db.uri());
        pqxx::nontransaction n(c);
        for (int i = 0; i < new_keys; ++i) {
            const std::string k = "W" + std::to_string(i) + "_PAY_v1";
            n.exec("INSERT INTO idempotent_record (idempotent_key, biz_type, status) VALUES ('" + k +
                   "', 'PAY', 'PROCESSING')");
            if (i % 7 != 0)  // one in seven: the old worker died, the row stays PROCESSING
                n.exec(std::string("UPDATE idempotent_record SET status = '") + (i % 5 == 0 ? "FAILED" : "SUCCESS") +
                       "' WHERE idempotent_key = '" + k + "'");
            if (i % 5 == 0) {                   // an old claim decided meanwhile
                const int h = 3 * (i / 5) + 2;  // H2, H5, ...: rows written PROCESSING
                n.exec("UPDATE idempotent_record SET status = 'SUCCESS' WHERE idempotent_key = 'H" + std::to_string(h) +
                       "_PAY_v1'");
            }
            written.fetch_add(1, std::memory_order_release);
        }
    });
    // Let the writer start before the first pass (a condition, not a sleep).
    while (written.load(std::memory_order_acquire) < 20) std::this_thread::yield();

    idem::postgres_store st(idem_db.uri());
    imports::postgres_source src(old_db.uri(), {"idempotent_record"});
    std::vector<imports::report> passes;
    passes.push_back(imports::run(st, src));  // while the old system writes
    imports::options incremental;
    incremental.since_ms = passes.back().next_since_ms;
    passes.push_back(imports::run(st, src, incremental));
    const int written_during = written.load();
    writer.join();  // writes stop
    imports::options final_pass;
    final_pass.since_ms = passes.back().next_since_ms;
    passes.push_back(imports::run(st, src, final_pass));
    std::printf("writer: %d of %d keys written before the incremental passes ended\n", written_during, new_keys);

    std::uint64_t claim_conflicts = 0;
    for (const imports::report& r : passes) {
        EXPECT_EQ(r.refused_total(), 0u);
        EXPECT_EQ(r.conflicts, r.conflicts_claim) << "only claims the old table decided later disagree";
        EXPECT_EQ(r.read, r.imported() + r.present + r.conflicts);
        claim_conflicts += r.conflicts_claim;
        std::printf("pass: read %llu imported %llu present %llu claim conflicts %llu\n",
                    static_cast<unsigned long long>(r.read), static_cast<unsigned long long>(r.imported()),
                    static_cast<unsigned long long>(r.present), static_cast<unsigned long long>(r.conflicts_claim));
    }
    EXPECT_LT(passes[2].read, passes[0].read + new_keys) << "the final pass reads from the mark, not the whole table";

    const auto old = old_states(old_db.uri());
    ASSERT_EQ(old.size(), 600u);
    std::set<std::string> claims;  // keys idem holds as claims in doubt
    std::size_t kept_claims = 0;
    for (const auto& [k, status] : old) {
        const auto rec = st.get(k);
        ASSERT_TRUE(rec.has_value()) << k << " is not in idem";
        if (rec->state == record_state::processing) claims.insert(k);
        if (rec->state == state_of(status)) continue;
        EXPECT_EQ(rec->state, record_state::processing) << k << ": idem " << rec->state << ", old " << status;
        EXPECT_NE(status, "PROCESSING") << k;
        ++kept_claims;
    }
    EXPECT_LE(kept_claims, claim_conflicts);
    EXPECT_EQ(kept_claims > 0, claim_conflicts > 0);
    std::size_t records = 0;
    st.load([&](const idem::stored_record&) { ++records; });
    EXPECT_EQ(records, old.size()) << "idem holds exactly the old table's keys";
    {
        const idem::verify_report v = idem::verify(st);
        EXPECT_TRUE(v.violations.empty()) << (v.violations.empty() ? "" : v.violations.front());
    }

    // Cut-over: a durable guard over the store. Its resolver is the migration's checkTxStatus: it
    // reads the old table's final word.
    std::map<std::string, int> asked;
    idem::options opts;
    opts.capacity = 4096;
    opts.maintenance_interval = std::chrono::nanoseconds(0);  // compensation at start only: counted exactly
    opts.resolve = [&](const idem::expired_claim& c) {
        ++asked[std::string(c.key)];
        const std::string& s = old.at(std::string(c.key));
        if (s == "SUCCESS") return idem::resolver_answer{idem::resolution::succeeded, 0, {}};
        if (s == "FAILED") return idem::resolver_answer{idem::resolution::failed, 0, {}};
        return idem::resolver_answer{idem::resolution::unknown, 0, {}};
    };
    {
        idem::durable_guard g(std::make_unique<idem::postgres_store>(idem_db.uri()), opts);
        EXPECT_EQ(g.recovery().processing, claims.size());
        for (const auto& [k, status] : old) {
            const auto r = g->begin(idem::key(k));
            EXPECT_NE(r.status, begin_status::acquired) << k << " was imported and must not run again";
            const begin_status want = status == "SUCCESS"  ? begin_status::succeeded
                                      : status == "FAILED" ? begin_status::failed
                                                           : begin_status::in_doubt;
            EXPECT_EQ(r.status, want) << k << " (old: " << status << ")";
        }
        ASSERT_TRUE(g.flush());
    }
    EXPECT_EQ(asked.size(), claims.size());
    for (const auto& [k, n] : asked) {
        EXPECT_EQ(n, 1) << k << " asked " << n << " times";
        EXPECT_TRUE(claims.count(k)) << k << " was not a claim";
    }
    {
        const idem::verify_report v = idem::verify(st);
        EXPECT_TRUE(v.violations.empty()) << (v.violations.empty() ? "" : v.violations.front());
    }

#ifdef IDEM_TEST_CLI
    // One more pass through the command line: everything is present, nothing changes.
    const std::string cmd = std::string(IDEM_TEST_CLI) + " import --json --from '" + old_db.uri() + "' --store '" +
                            idem_db.uri() + "' --since " + std::to_string(*passes[2].next_since_ms) + " 2>&1";
    std::FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    std::array<char, 4096> buf;
    while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
    ASSERT_EQ(::pclose(p), 0) << cmd << "\n" << out;
    const auto j = nlohmann::json::parse(out);
    EXPECT_EQ(j.at("command"), "import");
    EXPECT_EQ(j.at("imported_total"), 0);
    EXPECT_EQ(j.at("refused_total"), 0);
    EXPECT_EQ(j.at("read").get<std::uint64_t>(),
              j.at("present").get<std::uint64_t>() + j.at("conflicts").get<std::uint64_t>());
    EXPECT_EQ(j.at("since_ms"), *passes[2].next_since_ms);
    // The CLI refuses an idem store in the old table's own database (idem's table has its name).
    const std::string same = std::string(IDEM_TEST_CLI) + " import --from '" + old_db.uri() + "' --store '" + old_db.uri() +
                             "' 2>&1";
    p = ::popen(same.c_str(), "r");
    ASSERT_NE(p, nullptr);
    out.clear();
    while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
    const int status = ::pclose(p);
    EXPECT_EQ(WEXITSTATUS(status), 2) << out;
    EXPECT_NE(out.find("same database"), std::string::npos) << out;
#endif
}

}  // namespace
