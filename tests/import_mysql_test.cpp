// import_mysql_test: `idem import` end to end on MySQL/MariaDB (IDEM_TEST_MY_URI; label mysql). The
// old design's table exactly as the article writes it (status ENUM, TIMESTAMP(3) times, updated_time
// ON UPDATE CURRENT_TIMESTAMP(3)) in one fresh database; idem's store (mysql_store) in another on
// the same server (both name their table idempotent_record).
//
//   IncrementalPassesWhileTheOldSystemWritesThenAFinalPass
//     300 rows of every state; a writer thread on its own session plays the old system (bounded:
//     300 more keys, each inserted PROCESSING and then decided, one in seven left PROCESSING; 60 of
//     the first rows decided), started on a latch, while a full pass and an incremental pass
//     (--since the first's next_since) run; the writer stops; a final pass. Then: every old row is
//     in idem, in the old table's state or, for a key a pass imported as a claim and the old table
//     decided later, still a claim (counted as a claim conflict); no other conflict, nothing
//     refused; a second full run changes nothing (no record, no fence); verify passes. A durable
//     guard over the store, with a resolver that reads the old table (the migration's
//     checkTxStatus): the resolver is asked once per claim, at start; no key is acquired; each
//     answers its old state. The CLI (when built) runs one more full pass: exit 0, everything
//     present, nothing imported; and it refuses an idem store in the old table's own database.
//   RefusedRowsAreCountedAndNamedTheRestImported
//     A NULL status, a key of 100 two-byte characters (fits VARCHAR(128), 208 bytes: over idem's
//     128) and a row the old system inserted without its times (NULL under the article's DDL) are
//     refused, each counted under its rule and named; the other rows are imported; a second run
//     (full, and --since) refuses them again and imports nothing. The CLI exits 1 naming them, and
//     0 once the rows are fixed.
//   DecisionsOlderThanTheWindowFailTheRunUntilTheWindowCoversThem (CLI)
//     A SUCCESS decided 30 days ago beside one decided now: with the default --window 7d the run
//     imports both but exits 1 naming the window (a guard with that window would forget the old
//     decision and run its key again); into another store with --window 60d it exits 0.
#include <idem/detail/my/connection.hpp>
#include <idem/durable.hpp>
#include <idem/stores/mysql_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <latch>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../tools/import.hpp"
#include "../tools/import_sources.hpp"
#include "support/my_database.hpp"

#ifdef IDEM_TEST_CLI
#include <sys/wait.h>

#include <nlohmann/json.hpp>
#endif

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::record_state;
namespace imports = idem::tool::imports;
namespace my = idem::detail::my;

/// The article's table, word for word.
constexpr const char* old_table_ddl =
    "CREATE TABLE idempotent_record (idempotent_key VARCHAR(128) PRIMARY KEY, biz_type VARCHAR(32), "
    "status ENUM('PROCESSING','SUCCESS','FAILED'), created_time TIMESTAMP(3), "
    "updated_time TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3), INDEX idx_biz_status (biz_type, status))";

/// The old table as it is now: key -> status (nullopt: NULL).
std::map<std::string, std::optional<std::string>> old_states(const idem_test::my_database& db) {
    std::map<std::string, std::optional<std::string>> out;
    const std::string err = db.exec(
        "SELECT idempotent_key, CAST(status AS CHAR) FROM idempotent_record", [&](int, my::row_view r) {
            out[std::string(r[0])] = r[1].data() == nullptr ? std::nullopt : std::optional(std::string(r[1]));
        });
    EXPECT_EQ(err, "");
    return out;
}

std::size_t record_count(idem::store& st) {
    std::size_t n = 0;
    st.load([&](const idem::stored_record&) { ++n; });
    return n;
}

record_state state_of(const std::string& status) { return *imports::parse_old_status(status); }

#ifdef IDEM_TEST_CLI
struct cli_result {
    int exit_code = -1;
    std::string out;  ///< stdout and stderr
};

cli_result run_cli(const std::string& args) {
    const std::string cmd = std::string(IDEM_TEST_CLI) + " import " + args + " 2>&1";
    cli_result r;
    std::FILE* p = ::popen(cmd.c_str(), "r");
    if (p == nullptr) return r;
    std::array<char, 4096> buf;
    while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) r.out.append(buf.data(), n);
    const int status = ::pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}
#endif

TEST(ImportMysql, IncrementalPassesWhileTheOldSystemWritesThenAFinalPass) {
    idem_test::my_database old_db, idem_db;
    std::string why;
    ASSERT_TRUE(old_db.create(&why)) << why;
    ASSERT_TRUE(idem_db.create(&why)) << why;
    ASSERT_EQ(old_db.exec(old_table_ddl), "");
    {
        // The history: 300 keys, a third in each state, created over the last hour (the old system
        // sets both times when it inserts; ON UPDATE moves updated_time at every later write).
        constexpr std::array<const char*, 3> states = {"SUCCESS", "FAILED", "PROCESSING"};
        std::string insert =
            "INSERT INTO idempotent_record (idempotent_key, biz_type, status, created_time, updated_time) VALUES ";
        for (int i = 0; i < 300; ++i) {
            const std::string at = "NOW(3) - INTERVAL 3600 SECOND + INTERVAL " + std::to_string(i) + " SECOND";
            insert += std::string(i ? ", " : "") + "('H" + std::to_string(i) + "_PAY_v1', 'PAY', '" + states[i % 3] + "', " +
                      at + ", " + at + " + INTERVAL 200000 MICROSECOND)";
        }
        ASSERT_EQ(old_db.exec(insert), "");
    }

    // The old system goes on writing on a session of its own: bounded, no sleeps. It starts on
    // `go`; `warmed` tells the main thread that it is well under way before the first pass.
    constexpr int new_keys = 300;
    constexpr int warm_keys = 20;
    std::latch go(1), warmed(1);
    std::atomic<int> written{0};
    std::string writer_error;
    std::thread writer([&] {
        bool counted = false;
        try {
            my::session s;
            s.open(my::parse_uri(old_db.uri()), 10s);
            go.wait();
            for (int i = 0; i < new_keys; ++i) {
                const std::string k = "W" + std::to_string(i) + "_PAY_v1";
                s.run(
                    "INSERT INTO idempotent_record (idempotent_key, biz_type, status, created_time, updated_time) "
                    "VALUES ('" +
                    k + "', 'PAY', 'PROCESSING', NOW(3), NOW(3))");
                if (i % 7 != 0)  // one in seven: the old worker died, the row stays PROCESSING
                    s.run(std::string("UPDATE idempotent_record SET status = '") + (i % 5 == 0 ? "FAILED" : "SUCCESS") +
                          "' WHERE idempotent_key = '" + k + "'");
                if (i % 5 == 0) {                   // an old claim decided meanwhile
                    const int h = 3 * (i / 5) + 2;  // H2, H5, ...: rows written PROCESSING
                    s.run("UPDATE idempotent_record SET status = 'SUCCESS' WHERE idempotent_key = 'H" + std::to_string(h) +
                          "_PAY_v1'");
                }
                written.fetch_add(1, std::memory_order_release);
                if (i + 1 == warm_keys) {
                    counted = true;
                    warmed.count_down();
                }
            }
        } catch (const std::exception& e) {
            writer_error = e.what();
        }
        if (!counted) warmed.count_down();
    });

    idem::mysql_store st(idem_db.uri());
    imports::mysql_source src(old_db.uri(), {"idempotent_record"});
    go.count_down();
    warmed.wait();
    std::vector<imports::report> passes;
    passes.push_back(imports::run(st, src));  // while the old system writes
    imports::options incremental;
    incremental.since_ms = passes.back().next_since_ms;
    passes.push_back(imports::run(st, src, incremental));
    const int written_during = written.load();
    writer.join();  // writes stop
    ASSERT_EQ(writer_error, "");
    imports::options final_pass;
    final_pass.since_ms = passes.back().next_since_ms;
    passes.push_back(imports::run(st, src, final_pass));
    std::printf("writer: %d of %d keys written before the incremental passes ended\n", written_during, new_keys);

    std::uint64_t claim_conflicts = 0;
    for (const imports::report& r : passes) {
        EXPECT_EQ(r.refused_total(), 0u) << (r.refused_list.empty() ? "" : r.refused_list.front());
        EXPECT_EQ(r.conflicts, r.conflicts_claim) << "only claims the old table decided later disagree";
        EXPECT_EQ(r.read, r.imported() + r.present + r.conflicts);
        claim_conflicts += r.conflicts_claim;
        std::printf("pass: read %llu imported %llu present %llu claim conflicts %llu\n",
                    static_cast<unsigned long long>(r.read), static_cast<unsigned long long>(r.imported()),
                    static_cast<unsigned long long>(r.present), static_cast<unsigned long long>(r.conflicts_claim));
    }
    EXPECT_EQ(passes[0].read, passes[0].imported()) << "the first pass finds an empty store";
    EXPECT_GE(passes[0].read, 300u + warm_keys);
    EXPECT_LT(passes[2].read, passes[0].read + new_keys) << "the final pass reads from the mark, not the whole table";
    ASSERT_TRUE(passes[2].next_since_ms.has_value());

    const auto old = old_states(old_db);
    ASSERT_EQ(old.size(), 600u);
    std::set<std::string> claims;  // keys idem holds as claims in doubt
    std::size_t kept_claims = 0;
    for (const auto& [k, status] : old) {
        ASSERT_TRUE(status.has_value()) << k;
        const auto rec = st.get(k);
        ASSERT_TRUE(rec.has_value()) << k << " is not in idem";
        if (rec->state == record_state::processing) claims.insert(k);
        if (rec->state == state_of(*status)) continue;
        EXPECT_EQ(rec->state, record_state::processing) << k << ": idem " << rec->state << ", old " << *status;
        EXPECT_NE(*status, "PROCESSING") << k;
        ++kept_claims;
    }
    EXPECT_LE(kept_claims, claim_conflicts);
    EXPECT_EQ(kept_claims > 0, claim_conflicts > 0);
    EXPECT_EQ(record_count(st), old.size()) << "idem holds exactly the old table's keys";
    {
        const idem::verify_report v = idem::verify(st);
        EXPECT_TRUE(v.violations.empty()) << (v.violations.empty() ? "" : v.violations.front());
    }

    // A second run, full and from the mark, changes nothing: no record, no fence.
    {
        const std::uint64_t fence_before = st.max_fence();
        const imports::report full = imports::run(st, src);
        EXPECT_EQ(full.read, old.size());
        EXPECT_EQ(full.imported(), 0u);
        EXPECT_EQ(full.refused_total(), 0u);
        EXPECT_EQ(full.conflicts, kept_claims) << "exactly the claims the old table decided after their pass";
        EXPECT_EQ(full.conflicts_claim, kept_claims);
        EXPECT_EQ(full.present, old.size() - kept_claims);
        EXPECT_EQ(full.batches, 0u);
        imports::options again;
        again.since_ms = passes[2].next_since_ms;
        const imports::report incr = imports::run(st, src, again);
        EXPECT_EQ(incr.imported(), 0u);
        EXPECT_EQ(incr.refused_total(), 0u);
        EXPECT_EQ(incr.batches, 0u);
        EXPECT_EQ(st.max_fence(), fence_before);
        EXPECT_EQ(record_count(st), old.size());
    }

    // Cut-over: a durable guard over the store. Its resolver is the migration's checkTxStatus: it
    // reads the old table's final word.
    std::map<std::string, int> asked;
    idem::options opts;
    opts.capacity = 4096;
    opts.maintenance_interval = std::chrono::nanoseconds(0);  // compensation at start only: counted exactly
    opts.resolve = [&](const idem::expired_claim& c) {
        ++asked[std::string(c.key)];
        const std::string& s = *old.at(std::string(c.key));
        if (s == "SUCCESS") return idem::resolver_answer{idem::resolution::succeeded, 0, {}};
        if (s == "FAILED") return idem::resolver_answer{idem::resolution::failed, 0, {}};
        return idem::resolver_answer{idem::resolution::unknown, 0, {}};
    };
    {
        idem::durable_guard g(std::make_unique<idem::mysql_store>(idem_db.uri()), opts);
        EXPECT_EQ(g.recovery().processing, claims.size());
        for (const auto& [k, status] : old) {
            const auto r = g->begin(idem::key(k));
            EXPECT_NE(r.status, begin_status::acquired) << k << " was imported and must not run again";
            const begin_status want = *status == "SUCCESS"  ? begin_status::succeeded
                                      : *status == "FAILED" ? begin_status::failed
                                                            : begin_status::in_doubt;
            EXPECT_EQ(r.status, want) << k << " (old: " << *status << ")";
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
    // One more full pass through the command line: the guard has decided every claim the old table
    // decided, so idem holds every key in its old state: all present, nothing changes.
    const std::uint64_t fence_before_cli = st.max_fence();
    const cli_result r = run_cli("--json --from '" + old_db.uri() + "' --store '" + idem_db.uri() + "'");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("command"), "import");
    EXPECT_EQ(j.at("read"), old.size());
    EXPECT_EQ(j.at("imported_total"), 0);
    EXPECT_EQ(j.at("refused_total"), 0);
    EXPECT_EQ(j.at("conflicts"), 0);
    EXPECT_EQ(j.at("present"), old.size());
    EXPECT_EQ(j.at("batches"), 0);
    EXPECT_EQ(st.max_fence(), fence_before_cli);
    EXPECT_EQ(record_count(st), old.size());
    // The CLI refuses an idem store in the old table's own database (idem's table has its name),
    // before it writes anything there.
    const cli_result same = run_cli("--from '" + old_db.uri() + "' --store '" + old_db.uri() + "'");
    EXPECT_EQ(same.exit_code, 2) << same.out;
    EXPECT_NE(same.out.find("same database"), std::string::npos) << same.out;
    std::string tables;
    ASSERT_EQ(old_db.exec("SELECT GROUP_CONCAT(table_name ORDER BY table_name) FROM information_schema.tables "
                          "WHERE table_schema = DATABASE()",
                          [&](int, my::row_view row) { tables = std::string(row[0]); }),
              "");
    EXPECT_EQ(tables, "idempotent_record") << "the old database got tables of idem's";
#endif
}

TEST(ImportMysql, RefusedRowsAreCountedAndNamedTheRestImported) {
    idem_test::my_database old_db, idem_db;
    std::string why;
    ASSERT_TRUE(old_db.create(&why)) << why;
    ASSERT_TRUE(idem_db.create(&why)) << why;
    ASSERT_EQ(old_db.exec(old_table_ddl), "");
    std::string long_key = "L";
    for (int i = 0; i < 100; ++i) long_key += "\xc3\xa9";  // U+00E9: 100 characters, 200 bytes
    long_key += "_PAY_v1";                                 // 107 characters (VARCHAR(128) holds it), 208 bytes
    ASSERT_EQ(long_key.size(), 208u);
    ASSERT_EQ(
        old_db.exec("INSERT INTO idempotent_record (idempotent_key, biz_type, status, created_time, updated_time) VALUES "
                    "('G1_PAY_v1', 'PAY', 'SUCCESS', NOW(3) - INTERVAL 2 SECOND, NOW(3) - INTERVAL 1 SECOND), "
                    "('G2_PAY_v1', 'PAY', 'FAILED', NOW(3) - INTERVAL 2 SECOND, NOW(3) - INTERVAL 1 SECOND), "
                    "('G3_PAY_v1', 'PAY', 'PROCESSING', NOW(3) - INTERVAL 2 SECOND, NOW(3) - INTERVAL 1 SECOND), "
                    "('N1_PAY_v1', 'PAY', NULL, NOW(3), NOW(3)), "
                    "('" +
                    long_key + "', 'PAY', 'SUCCESS', NOW(3), NOW(3))"),
        "");
    // The old system inserted this one without its times: NULL under the article's DDL (MariaDB's
    // explicit_defaults_for_timestamp); with the older default the server fills them in.
    ASSERT_EQ(old_db.exec("INSERT INTO idempotent_record (idempotent_key, biz_type, status) "
                          "VALUES ('T1_PAY_v1', 'PAY', 'SUCCESS')"),
              "");
    bool null_times = false;
    ASSERT_EQ(old_db.exec("SELECT updated_time IS NULL FROM idempotent_record WHERE idempotent_key = 'T1_PAY_v1'",
                          [&](int, my::row_view r) { null_times = r[0] == "1"; }),
              "");
    ASSERT_EQ(old_states(old_db).at(long_key), "SUCCESS") << "the long key is stored as it is";
    std::printf("a row inserted without its times has them %s\n", null_times ? "NULL" : "filled in by the server");

    idem::mysql_store st(idem_db.uri());
    imports::mysql_source src(old_db.uri(), {"idempotent_record"});
    const auto contains = [](const std::vector<std::string>& lines, const std::string& a, const std::string& b) {
        for (const std::string& l : lines)
            if (l.find(a) != std::string::npos && l.find(b) != std::string::npos) return true;
        return false;
    };
    const auto check_refusals = [&](const imports::report& r) {
        EXPECT_EQ(r.refused[static_cast<std::size_t>(imports::refusal::invalid_key)], 1u);
        EXPECT_EQ(r.refused[static_cast<std::size_t>(imports::refusal::null_column)], null_times ? 2u : 1u);
        EXPECT_EQ(r.refused_total(), null_times ? 3u : 2u);
        EXPECT_EQ(r.refused_list.size(), r.refused_total());
        EXPECT_TRUE(contains(r.refused_list, "'N1_PAY_v1'", "status is NULL")) << ::testing::PrintToString(r.refused_list);
        EXPECT_TRUE(contains(r.refused_list, "'L\xc3\xa9\xc3\xa9", "208 bytes; the limit is 128"))
            << ::testing::PrintToString(r.refused_list);
        if (null_times) {
            EXPECT_TRUE(contains(r.refused_list, "'T1_PAY_v1'", "created_time is NULL"))
                << ::testing::PrintToString(r.refused_list);
        }
    };

    const imports::report first = imports::run(st, src);
    EXPECT_EQ(first.read, 6u);
    check_refusals(first);
    EXPECT_EQ(first.imported_succeeded, null_times ? 1u : 2u);
    EXPECT_EQ(first.imported_failed, 1u);
    EXPECT_EQ(first.imported_processing, 1u);
    EXPECT_EQ(first.conflicts, 0u);
    EXPECT_EQ(st.get("G1_PAY_v1")->state, record_state::succeeded);
    EXPECT_EQ(st.get("G2_PAY_v1")->state, record_state::failed);
    EXPECT_EQ(st.get("G3_PAY_v1")->state, record_state::processing);
    EXPECT_FALSE(st.get("N1_PAY_v1").has_value());
    EXPECT_EQ(st.get("T1_PAY_v1").has_value(), !null_times);
    EXPECT_EQ(record_count(st), null_times ? 3u : 4u);

    // Again, full and from the mark (a row with a NULL updated_time is read by every --since pass):
    // the same refusals, nothing imported.
    const std::uint64_t fence = st.max_fence();
    const imports::report second = imports::run(st, src);
    check_refusals(second);
    EXPECT_EQ(second.imported(), 0u);
    EXPECT_EQ(second.present, first.imported());
    imports::options since;
    since.since_ms = first.next_since_ms;
    const imports::report third = imports::run(st, src, since);
    check_refusals(third);
    EXPECT_EQ(third.imported(), 0u);
    EXPECT_EQ(st.max_fence(), fence);
    {
        const idem::verify_report v = idem::verify(st);
        EXPECT_TRUE(v.violations.empty()) << (v.violations.empty() ? "" : v.violations.front());
    }

#ifdef IDEM_TEST_CLI
    const std::string args = "--from '" + old_db.uri() + "' --store '" + idem_db.uri() + "'";
    const cli_result refused = run_cli(args);
    EXPECT_EQ(refused.exit_code, 1) << refused.out;
    EXPECT_NE(refused.out.find("refused: key 'N1_PAY_v1': status is NULL"), std::string::npos) << refused.out;
    EXPECT_NE(refused.out.find("208 bytes; the limit is 128"), std::string::npos) << refused.out;
    // Fix the rows the run named, as the runbook says, and run it again.
    ASSERT_EQ(old_db.exec("UPDATE idempotent_record SET status = 'FAILED' WHERE idempotent_key = 'N1_PAY_v1'; "
                          "DELETE FROM idempotent_record WHERE idempotent_key = '" +
                          long_key +
                          "'; UPDATE idempotent_record SET created_time = NOW(3), updated_time = NOW(3) "
                          "WHERE idempotent_key = 'T1_PAY_v1'"),
              "");
    const cli_result fixed = run_cli("--json " + args);
    ASSERT_EQ(fixed.exit_code, 0) << fixed.out;
    const auto j = nlohmann::json::parse(fixed.out);
    EXPECT_EQ(j.at("refused_total"), 0);
    EXPECT_EQ(j.at("imported_total"), null_times ? 2 : 1);
    EXPECT_EQ(st.get("N1_PAY_v1")->state, record_state::failed);
    EXPECT_EQ(st.get("T1_PAY_v1")->state, record_state::succeeded);
#endif
}

#ifdef IDEM_TEST_CLI
TEST(ImportMysql, DecisionsOlderThanTheWindowFailTheRunUntilTheWindowCoversThem) {
    idem_test::my_database old_db, idem_a, idem_b;
    std::string why;
    ASSERT_TRUE(old_db.create(&why)) << why;
    ASSERT_TRUE(idem_a.create(&why)) << why;
    ASSERT_TRUE(idem_b.create(&why)) << why;
    ASSERT_EQ(old_db.exec(old_table_ddl), "");
    ASSERT_EQ(old_db.exec("INSERT INTO idempotent_record (idempotent_key, biz_type, status, created_time, updated_time) "
                          "VALUES ('OLD1_PAY_v1', 'PAY', 'SUCCESS', NOW(3) - INTERVAL 31 DAY, NOW(3) - INTERVAL 30 DAY), "
                          "('NEW1_PAY_v1', 'PAY', 'SUCCESS', NOW(3) - INTERVAL 2 SECOND, NOW(3) - INTERVAL 1 SECOND)"),
              "");
    const cli_result short_window = run_cli("--json --from '" + old_db.uri() + "' --store '" + idem_a.uri() + "'");
    EXPECT_EQ(short_window.exit_code, 1) << short_window.out;
    EXPECT_NE(short_window.out.find("1 decided row(s) imported are older than --window 7d"), std::string::npos)
        << short_window.out;
    {
        idem::mysql_store st(idem_a.uri());
        ASSERT_TRUE(st.get("OLD1_PAY_v1").has_value()) << "the old decision is imported all the same";
        EXPECT_EQ(st.get("OLD1_PAY_v1")->state, record_state::succeeded);
    }
    const cli_result covering = run_cli("--json --window 60d --from '" + old_db.uri() + "' --store '" + idem_b.uri() + "'");
    ASSERT_EQ(covering.exit_code, 0) << covering.out;
    const auto j = nlohmann::json::parse(covering.out);
    EXPECT_EQ(j.at("past_window"), 0);
    EXPECT_EQ(j.at("imported_total"), 2);
}
#endif

}  // namespace
