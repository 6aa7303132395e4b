// regions_drill_test: `idem drill --region ...`, the regions drill (tools/drill/regions_drill.cpp),
// run as a user runs it against three clusters of the test's own (tests/support/regions_fixture.hpp):
//   - synchronous: every fault in turn (a partition between two regions, an isolated home,
//     replication stopped and resumed, latency) with workers SIGKILLed in every region, then a
//     region lost, taken over, wiped and rebuilt: the drill passes, its report says each fault ran
//     and what it found, and the clusters are left as they were (the drill runs again);
//   - asynchronous: the same cycles, and the loss window reported instead of a lost region;
//   - the negative control (workers that do not ask idem): the drill fails, naming double
//     executions, so its checks can fail;
//   - bad input: too few regions, an address that is not loopback, flags of the other drills, and
//     clusters that already hold regions are refused by name, before anything is set up.
// And `idem drill --failover-command` on a failover pair of the test's own (private_pair): three
// workers racing through global scope on the pair's multi-host URI while the primary is SIGKILLed
// and the standby promoted; every acknowledgement written before the failover is on the new
// primary, nothing ran twice; a failover command that fails fails the drill.
// IDEM_REGIONS_DRILL_CYCLES=N runs the regions drills with N cycles instead of 4: the soak, whose
// figures are in docs/testing.md.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <iostream>
#include <string>

#include "support/regions_fixture.hpp"

namespace idem_test {
namespace {

using json = nlohmann::json;

/// The drill's JSON report: the line of the output that is one (stderr is mixed in).
json report_of(const std::string& out) {
    std::size_t at = 0;
    while (at < out.size()) {
        std::size_t nl = out.find('\n', at);
        if (nl == std::string::npos) nl = out.size();
        const std::string line = out.substr(at, nl - at);
        if (line.starts_with("{\"")) return json::parse(line);
        at = nl + 1;
    }
    return json();
}

/// `idem ARGS` with its output (stdout and stderr).
std::pair<int, std::string> run_idem(const std::string& args) {
    std::FILE* p = ::popen((std::string(IDEM_TEST_CLI) + " " + args + " 2>&1").c_str(), "r");
    std::string out;
    std::array<char, 4096> buf;
    while (std::size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
    const int s = ::pclose(p);
    return {WIFEXITED(s) ? WEXITSTATUS(s) : -1, out};
}

std::string quoted(const std::string& s) {
    std::string q = "'";
    for (const char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return q + "'";
}

/// One value from the pair's standby (the new primary after a failover), trimmed.
std::string trimmed_psql(private_pair& pair, const std::string& sql) {
    std::string v = pair.psql(pair.standby_uri(), sql);
    while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
    return v;
}

/// Cycles of the regions drills: 4 (each fault once), or IDEM_REGIONS_DRILL_CYCLES for a soak
/// (docs/testing.md has the figures of the long runs).
unsigned drill_cycles() {
    const char* v = std::getenv("IDEM_REGIONS_DRILL_CYCLES");
    const int n = v != nullptr ? std::atoi(v) : 0;
    return n >= 4 ? static_cast<unsigned>(n) : 4u;
}

class RegionsDrill : public Regions {
protected:
    /// Schemas, subscriptions and publications of idem in region `name`'s cluster.
    int idem_objects(const std::string& name) {
        pqxx::connection c(uri_of(name));
        pqxx::nontransaction n(c);
        return n
            .exec(
                "SELECT (SELECT count(*) FROM pg_namespace WHERE left(nspname, 5) = 'idem_') + (SELECT count(*) "
                "FROM pg_subscription) + (SELECT count(*) FROM pg_publication) + (SELECT count(*) FROM "
                "pg_replication_slots)")[0][0]
            .as<int>();
    }
};

TEST_F(RegionsDrill, SynchronousDrillLosesNothingThroughEveryFaultAndALostRegion) {
    const unsigned cycles = drill_cycles();
    const auto [st, out] = run_cli("drill",
                                   "--cycles " + std::to_string(cycles) + " --keys 30 --synchronous --seed 7 --json");
    const json r = report_of(out);
    ASSERT_TRUE(r.is_object()) << out;
    std::cout << "the drill's report: " << r.dump() << '\n';  // the figures, printed (not asserted)
    EXPECT_EQ(st, 0) << out;
    EXPECT_TRUE(r["ok"].get<bool>()) << out;
    EXPECT_EQ(r["mode"], "regions");
    EXPECT_EQ(r["double_executions"].get<int>(), 0);
    EXPECT_EQ(r["lost_acknowledged"].get<int>(), 0);
    EXPECT_EQ(r["unresolved"].get<int>(), 0);
    EXPECT_EQ(r["phantom_successes"].get<int>(), 0);
    EXPECT_EQ(r["violations"].get<int>(), 0);
    // Every fault ran, the lost region last.
    const auto faults = r["faults"].get<std::vector<std::string>>();
    ASSERT_EQ(faults.size(), cycles + 2) << out;
    for (unsigned k = 0; k < cycles; k += 4) {
        EXPECT_NE(faults[k].find("partition"), std::string::npos) << faults[k];
        if (k + 3 >= cycles) break;
        EXPECT_NE(faults[k + 1].find("isolated"), std::string::npos) << faults[k + 1];
        EXPECT_NE(faults[k + 2].find("stopped and resumed"), std::string::npos) << faults[k + 2];
        EXPECT_NE(faults[k + 3].find("latency"), std::string::npos) << faults[k + 3];
    }
    EXPECT_NE(faults[cycles].find("lost"), std::string::npos) << faults[cycles];
    EXPECT_NE(faults[cycles + 1].find("final run"), std::string::npos) << faults[cycles + 1];
    // It did what a drill must: killed workers, acknowledged operations, answered duplicates
    // from replicas, and took the lost region's key space over at a new epoch.
    EXPECT_GT(r["kills"].get<int>(), 0);
    EXPECT_GT(r["acknowledged"].get<int>(), 0);
    // New keys in each cycle, in the cycle that loses a region and in the one after it.
    EXPECT_EQ(r["keys_issued"].get<unsigned>(), 30 * (cycles + 2));
    EXPECT_GT(r["answered_by_replica"].get<int>(), 0);
    ASSERT_TRUE(r.contains("takeover")) << out;
    EXPECT_GE(r["takeover"]["epoch"].get<int>(), 1);
    EXPECT_NE(r["takeover"]["lost"], r["takeover"]["to"]);
    // The rebuilt region holds a copy of every key claimed by then (its own among them).
    EXPECT_GT(r["takeover"]["rebuilt_records"].get<int>(), 0);
    EXPECT_LE(r["takeover"]["rebuilt_records"].get<unsigned>(), 30 * (cycles + 2));
    // Nothing left behind: the drill runs again on the same clusters.
    for (const char* name : {"a", "b", "c"}) EXPECT_EQ(idem_objects(name), 0) << name;
}

TEST_F(RegionsDrill, AsynchronousDrillReportsTheLossWindow) {
    const unsigned cycles = drill_cycles();
    const auto [st, out] = run_cli("drill", "--cycles " + std::to_string(cycles) + " --keys 30 --seed 11 --json");
    const json r = report_of(out);
    ASSERT_TRUE(r.is_object()) << out;
    std::cout << "the drill's report: " << r.dump() << '\n';
    EXPECT_EQ(st, 0) << out;
    EXPECT_TRUE(r["ok"].get<bool>()) << out;
    EXPECT_EQ(r["double_executions"].get<int>(), 0);
    EXPECT_EQ(r["lost_acknowledged"].get<int>(), 0);
    EXPECT_EQ(r["violations"].get<int>(), 0);
    EXPECT_FALSE(r.contains("takeover")) << "a region is lost in synchronous mode only";
    // Replication was stopped for a whole cycle while homes decided: the lag seen is not zero.
    EXPECT_GT(r["max_lag_bytes"].get<std::int64_t>(), 0) << out;
    for (const char* name : {"a", "b", "c"}) EXPECT_EQ(idem_objects(name), 0) << name;
}

TEST_F(RegionsDrill, TheNegativeControlFailsTheDrill) {
    // Workers that execute without asking idem: three regions race on every key.
    const std::string prom = ::testing::TempDir() + "regions-drill.prom";
    const auto [st, out] = run_cli("drill", "--cycles 1 --keys 20 --seed 3 --no-guard --json --prometheus " + prom);
    const json r = report_of(out);
    ASSERT_TRUE(r.is_object()) << out;
    EXPECT_EQ(st, 1) << out;
    EXPECT_FALSE(r["ok"].get<bool>());
    EXPECT_GT(r["double_executions"].get<int>(), 0) << out;
    EXPECT_GT(r["lost_acknowledged"].get<int>(), 0) << "acknowledged without a record";
    EXPECT_NE(out.find("two effects in the ledger"), std::string::npos) << out;
    // The textfile for Prometheus says so too: failed checks out of the checks made.
    std::ifstream in(prom);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("idem_drill_checks{store=\"regions\"} 5"), std::string::npos) << text;
    EXPECT_EQ(text.find("idem_drill_failures{store=\"regions\"} 0"), std::string::npos) << text;
    EXPECT_NE(text.find("idem_drill_failures{store=\"regions\"}"), std::string::npos) << text;
    for (const char* name : {"a", "b", "c"}) EXPECT_EQ(idem_objects(name), 0) << name;
}

TEST_F(RegionsDrill, BadInputIsRefusedByNameBeforeAnythingIsSetUp) {
    {
        const auto [st, out] = run_idem("drill --region a=" + uri_of("a") + " --region b=" + uri_of("b"));
        EXPECT_EQ(st, 2) << out;
        EXPECT_NE(out.find("3 or 4"), std::string::npos) << out;
    }
    {
        // Refused by its address before any connection (the proxies forward to loopback only).
        const auto [st, out] = run_idem("drill --region a=" + uri_of("a") + " --region b=" + uri_of("b") +
                                        " --region 'c=postgresql://postgres@192.0.2.1:5432/postgres'");
        EXPECT_EQ(st, 2) << out;
        EXPECT_NE(out.find("c: the drill's proxies forward to loopback only"), std::string::npos) << out;
    }
    {
        const auto [st, out] = run_cli("drill", "--store sqlite:/tmp/x.db");
        EXPECT_EQ(st, 2) << out;
        EXPECT_NE(out.find("--store: not an option of the regions drill"), std::string::npos) << out;
    }
    {
        const auto [st, out] = run_cli("drill", "--region d=" + uri_of("a"));
        EXPECT_EQ(st, 2) << out;
        EXPECT_NE(out.find("regions a and d name the same cluster"), std::string::npos) << out;
    }
    for (const char* name : {"a", "b", "c"}) EXPECT_EQ(idem_objects(name), 0) << name;
    // A cluster that holds regions already (an operator's, or a drill's kept with --keep).
    exec("b", "CREATE SCHEMA idem_b");
    const auto [st, out] = run_cli("drill", "--cycles 1");
    EXPECT_EQ(st, 3) << out;
    EXPECT_NE(out.find("region b's cluster holds idem regions already (schema idem_b)"), std::string::npos) << out;
    EXPECT_EQ(idem_objects("a"), 0) << "nothing set up in the others";
}

TEST(FailoverDrill, RacingWorkersRideThroughAPromotionAndLoseNothingAcknowledged) {
    private_pair pair(/*sync=*/true);
    ASSERT_FALSE(pair.uri().empty()) << "the failover pair did not start (scripts/lib/postgres.sh)";
    const auto [st, out] = run_idem("drill --workers 3 --cycles 3 --keys 300 --seed 5 --json --store " + quoted(pair.uri()) +
                                    " --failover-command " + quoted(pair.failover_command()));
    const json r = report_of(out);
    ASSERT_TRUE(r.is_object()) << out;
    EXPECT_EQ(st, 0) << out;
    EXPECT_TRUE(r["ok"].get<bool>()) << out;
    EXPECT_EQ(r["double_executions"].get<int>(), 0);
    EXPECT_EQ(r["lost_acknowledged"].get<int>(), 0);
    EXPECT_EQ(r["unresolved"].get<int>(), 0);
    EXPECT_EQ(r["violations"].get<int>(), 0);
    ASSERT_TRUE(r.contains("failover")) << out;
    EXPECT_TRUE(r["failover"]["ran"].get<bool>());
    EXPECT_EQ(r["failover"]["exit"].get<int>(), 0);
    EXPECT_EQ(r["failover"]["cycle"].get<int>(), 2);
    EXPECT_EQ(r["failover"]["workers"].get<int>(), 3);
    // The failover landed under load: acknowledgements were made before it, and the drill's
    // checks found every one on the new primary (lost_acknowledged 0 above).
    EXPECT_GT(r["failover"]["acknowledged_before"].get<int>(), 0);
    EXPECT_EQ(r["failover"]["primary_before"].get<std::string>(),
              "127.0.0.1:" + std::to_string(port_of(pair.primary_uri())));
    EXPECT_EQ(r["failover"]["primary_after"].get<std::string>(), "127.0.0.1:" + std::to_string(port_of(pair.standby_uri())));
    // It really failed over: the old primary is gone, the standby accepts writes and holds the keys.
    EXPECT_NE(run_idem("verify --store " + quoted(pair.primary_uri())).first, 0) << "the old primary still answers";
    EXPECT_EQ(trimmed_psql(pair, "SELECT pg_is_in_recovery()"), "f");
    EXPECT_EQ(std::stoi(trimmed_psql(pair,
                                     "SELECT count(*) FROM idempotent_record WHERE status = 'SUCCESS' AND "
                                     "left(idempotent_key, 2) = 'DR'")),
              r["keys_issued"].get<int>());
}

TEST(FailoverDrill, AFailoverCommandThatFailsOrFailsNothingOverFailsTheDrill) {
    private_pair pair(/*sync=*/true);
    ASSERT_FALSE(pair.uri().empty()) << "the failover pair did not start (scripts/lib/postgres.sh)";
    const auto [st, out] = run_idem("drill --workers 2 --cycles 1 --keys 50 --seed 5 --json --store " + quoted(pair.uri()) +
                                    " --failover-command 'exit 7'");
    const json r = report_of(out);
    ASSERT_TRUE(r.is_object()) << out;
    EXPECT_EQ(st, 1) << out;
    EXPECT_EQ(r["failover"]["exit"].get<int>(), 7);
    EXPECT_NE(out.find("the failover command exited with code 7"), std::string::npos) << out;
    // A command that exits 0 but fails nothing over: the same primary answers before and after.
    const auto [st1, out1] = run_idem("drill --workers 2 --cycles 1 --keys 50 --seed 5 --json --store " +
                                      quoted(pair.uri()) + " --failover-command true");
    EXPECT_EQ(st1, 1) << out1;
    EXPECT_NE(out1.find("after it: no failover"), std::string::npos) << out1;
    // And on a store that cannot fail over, the option is refused by name.
    const auto [st2, out2] = run_idem("drill --cycles 1 --failover-command true");
    EXPECT_EQ(st2, 2) << out2;
    EXPECT_NE(out2.find("--failover-command: the failover is one of a PostgreSQL store"), std::string::npos) << out2;
}

}  // namespace
}  // namespace idem_test
