// takeover_test: home leases and the takeover of a lost region's key space (idem/home_lease.hpp),
// on three PostgreSQL clusters of the test's own as regions a, b and c (support/regions_fixture.hpp),
// with fault-injecting TCP proxies (support/fault_proxy.hpp) for partitions.
//
//   * A home cut off from a majority of the lease stores (an outage that ends): once its lease ran
//     out, its cluster's fence refuses its claims (no row written) and its guard answers
//     store_unavailable; after the outage it renews and grants again.
//   * A takeover while the home still renews waits out the timeout and takes nothing; a planned
//     move hands the lease over with the key space (the new home grants, the old one is fenced).
//   * A lost home (synchronous mode; its cluster and its processes cut off from the others while
//     it keeps running and trying to grant): after its lease ran out, b takes its key space over;
//     every decision a acknowledged is answered at b with its outcome, none is granted again,
//     new keys are granted at b and replicated to c; once the partition heals, a's keeper sees the
//     newer epoch and a grants nothing more. Half of a's acknowledged decisions are only in c's
//     copy (b's subscription stopped first): the takeover must merge them.
//   * A region wiped (its cluster killed for good): b takes its key space over, a new empty cluster
//     takes its name and is rebuilt from the others; it answers a's old decisions from its copy.
//   * Two regions and a witness (a lease store without data): the witness's vote makes the
//     majority with which b takes a's key space over; a, healed, is fenced by the witness's epoch.
//   * Bad input: unknown regions, more than four lease stores, a call deadline too long for the lease.
//
// Needs the PostgreSQL 15 server binaries and root or the postgres user; FAILS, never skips, when a
// cluster cannot start. Waits on conditions (the keeper's view, a replica), bounded, never sleeps.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "idem/takeover.hpp"
#include "idem/regional_guard.hpp"
#include "idem/move_home.hpp"
#include "idem/regions.hpp"
#include "idem/rebuild_region.hpp"
#include "idem/verify.hpp"
#include "support/fault_proxy.hpp"
#include "support/regions_fixture.hpp"
#include "support/store_fixtures.hpp"

extern "C" const char* __lsan_default_suppressions() { return "leak:libpqxx\n"; }

namespace {

using namespace std::chrono_literals;
using idem_test::port_of;
using idem_test::wait_for;
using Takeover = idem_test::Regions;

idem::lease_options short_leases() {
    idem::lease_options lo;
    lo.lease = 2000ms;
    lo.margin = 500ms;
    lo.call_deadline = 400ms;
    lo.renew_every = 250ms;
    return lo;
}

std::string via(const idem_test::fault_proxy& p) {
    return "postgresql://postgres@127.0.0.1:" + std::to_string(p.port()) + "/postgres";
}

/// The keeper's state of key space `space` (a default state when it holds none).
idem::home_lease_keeper::lease_state lease_of(const idem::regional_guard& g, const std::string& space) {
    for (auto& l : g.lease_keeper()->leases())
        if (l.space == space) return l;
    return {};
}

TEST_F(Takeover, AHomeCutOffFromTheLeaseMajorityStopsGrantingAndResumesAfterTheOutage) {
    idem::setup_regions(rs_, idem::replication_mode::asynchronous);
    const auto lo = short_leases();
#ifdef IDEM_TEST_CLI
    const auto [code, out] = cli("leases", "--lease-ms 2000 --margin-ms 500 --call-deadline-ms 400");
    ASSERT_EQ(code, 0) << out;
    const auto [bad, why] = cli("leases", "--lease-ms 2000");  // the default call deadline is too long for it
    EXPECT_EQ(bad, 3) << why;
    EXPECT_NE(why.find("call_deadline"), std::string::npos) << why;
#else
    idem::setup_home_leases(rs_, lo);
#endif
    // a's process reaches b's and c's clusters (lease stores) through proxies; its own directly.
    idem_test::fault_proxy a_to_b(port_of(uri_of("b"))), a_to_c(port_of(uri_of("c")));
    auto rs = rs_;
    rs[1].uri = via(a_to_b);
    rs[2].uri = via(a_to_c);
    auto ro = opts("a", rs);
    ro.leases = lo;
    idem::regional_guard ga(fast(), ro);
    ASSERT_TRUE(ga.lease_keeper()->valid("a")) << "the keeper renews before the guard's constructor returns";
    auto r = ga.begin(idem::key("a-before"), 1);
    ASSERT_EQ(r.status, idem::begin_status::acquired);
    ASSERT_FALSE(r.ticket.succeed(3));

    a_to_b.partition();
    a_to_c.partition();
    ASSERT_TRUE(wait_for([&] { return !ga.lease_keeper()->valid("a"); }, 20s))
        << "a's lease stayed valid with one store of three";
    // The cluster's own fence refuses (the keeper's view there ran out too): no row, no grant.
    ASSERT_TRUE(
        wait_for([&] { return ga.begin(idem::key("a-during"), 2).status == idem::begin_status::store_unavailable; }, 10s));
    EXPECT_EQ(row_status("a", "a", "a-during"), "") << "a claim was written while the lease had run out";
    EXPECT_EQ(ga.begin(idem::key("a-before"), 1).outcome, 3u) << "a decision already made is still answered";
    const auto st = lease_of(ga, "a");
    EXPECT_FALSE(st.fenced) << "no other region took it: an outage is not a takeover";

    a_to_b.heal();
    a_to_c.heal();
    ASSERT_TRUE(wait_for([&] { return ga.lease_keeper()->valid("a"); }, 20s))
        << "the lease was not renewed after the outage";
    idem::begin_status got = idem::begin_status::store_unavailable;
    ASSERT_TRUE(wait_for(
        [&] {
            auto again = ga.begin(idem::key("a-during"), 2);
            got = again.status;
            if (got == idem::begin_status::acquired) {
                EXPECT_FALSE(again.ticket.succeed(4));
            }
            return got != idem::begin_status::store_unavailable;
        },
        20s));
    EXPECT_EQ(got, idem::begin_status::acquired);
    EXPECT_EQ(row_status("a", "a", "a-during"), "SUCCESS");
}

TEST_F(Takeover, ATakeoverWhileTheHomeRenewsTakesNothingAndAPlannedMoveHandsTheLeaseOver) {
    idem::setup_regions(rs_, idem::replication_mode::asynchronous);
    const auto lo = short_leases();
    idem::setup_home_leases(rs_, lo);
    idem::setup_home_leases(rs_, lo);  // idempotent
    auto roa = opts("a");
    roa.leases = lo;
    idem::regional_guard ga(fast(), roa);
    {
        auto r = ga.begin(idem::key("a-1"), 1);
        ASSERT_EQ(r.status, idem::begin_status::acquired);
        ASSERT_FALSE(r.ticket.succeed(5));
    }
    try {
        (void)idem::take_over(rs_, "a", "b", lo, 3000ms);
        ADD_FAILURE() << "a key space was taken over while its home renews its lease";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), idem::errc::store_unavailable) << e.what();
        EXPECT_NE(std::string(e.what()).find("owner 'a'"), std::string::npos) << e.what();
    }
    // Nothing handed over: a still grants, b still refuses a's keys.
    auto rob = opts("b");
    rob.decided_at["a"] = "b";
    rob.leases = lo;
    {
        idem::regional_guard early(fast(), rob);
        EXPECT_EQ(early.begin(idem::key("a-2"), 1).status, idem::begin_status::store_unavailable);
    }
    {
        auto r = ga.begin(idem::key("a-2"), 2);
        ASSERT_EQ(r.status, idem::begin_status::acquired);
        ASSERT_FALSE(r.ticket.succeed(6));
    }
    EXPECT_FALSE(lease_of(ga, "a").fenced);

    // A planned move takes the lease along.
    idem::move_home(rs_, "a", "a", "b");
    idem::regional_guard gb(fast(), rob);
    EXPECT_TRUE(gb.lease_keeper()->valid("a")) << "the new home's keeper did not pick up the lease";
    EXPECT_EQ(gb.begin(idem::key("a-2"), 2).outcome, 6u);
    auto r = gb.begin(idem::key("a-3"), 3);
    ASSERT_EQ(r.status, idem::begin_status::acquired);
    ASSERT_FALSE(r.ticket.succeed(7));
    ASSERT_TRUE(wait_for([&] { return lease_of(ga, "a").fenced; }, 20s)) << "the old home's keeper was not fenced";
    EXPECT_FALSE(ga.lease_keeper()->valid("a"));
    const auto v = idem::verify_regions(rs_, idem_test::home_rule, {{"a", "b"}});
    EXPECT_TRUE(v.clean()) << (v.violations.empty() ? "a home's verify" : v.violations.front());

    // c's key space was never renewed (no process of c runs): its lease has run out from the start,
    // and a takeover needs no wait. c is reachable: its own copy is fenced, not skipped.
#ifdef IDEM_TEST_CLI
    const auto [code, out] = cli(
        "takeover", "--space c --to a --lease-ms 2000 --margin-ms 500 --call-deadline-ms 400 --timeout-ms 10000 --json");
    ASSERT_EQ(code, 0) << out;
    EXPECT_NE(out.find("\"from\":\"c\""), std::string::npos) << out;
    EXPECT_NE(out.find("\"epoch\":1"), std::string::npos) << out;
    EXPECT_NE(out.find("\"skipped\":[]"), std::string::npos) << out;
    EXPECT_NE(out.find("\"rebuild\":[\"c\"]"), std::string::npos) << out;
    const auto [again, refused] = cli(
        "takeover", "--space c --to a --lease-ms 2000 --margin-ms 500 --call-deadline-ms 400 --timeout-ms 100");
    EXPECT_EQ(again, 3) << refused;
    EXPECT_NE(refused.find("already held by 'a'"), std::string::npos) << refused;
    const auto [st, status] = cli("status");
    EXPECT_NE(status.find("lease c (at b)"), std::string::npos) << status;
    EXPECT_NE(status.find("owner a, epoch 1"), std::string::npos) << status;
#else
    const auto rep = idem::take_over(rs_, "c", "a", lo, 10000ms);
    EXPECT_EQ(rep.from, "c");
    EXPECT_EQ(rep.epoch, 1);
    EXPECT_TRUE(rep.skipped.empty());
    EXPECT_EQ(rep.rebuild, std::vector<std::string>{"c"});
#endif
    auto roc = opts("a");
    roc.decided_at = {{"c", "a"}};
    roc.leases = lo;
    idem::regional_guard ga2(fast(), roc);
    auto rc = ga2.begin(idem::key("c-1"), 1);
    ASSERT_EQ(rc.status, idem::begin_status::acquired);
    ASSERT_FALSE(rc.ticket.succeed(9));
    EXPECT_EQ(row_status("a", "c", "c-1"), "SUCCESS");
    EXPECT_EQ(row_status("c", "c", "c-1"), "") << "c's fenced copy no longer follows its key space";
    const auto v2 = idem::verify_regions(rs_, idem_test::home_rule, {{"a", "b"}, {"c", "a"}});
    EXPECT_TRUE(v2.clean()) << (v2.violations.empty() ? "a home's verify" : v2.violations.front());
}

TEST_F(Takeover, ALostHomeIsTakenOverAfterItsLeaseAndNothingItAcknowledgedRunsAgain) {
    // Every connection to a's cluster (b's and c's processes, their subscriptions, the takeover)
    // goes through to_a; a's process reaches b and c through a_to_b and a_to_c.
    idem_test::fault_proxy to_a(port_of(uri_of("a"))), a_to_b(port_of(uri_of("b"))), a_to_c(port_of(uri_of("c")));
    auto outside = rs_;
    outside[0].uri = via(to_a);
    idem::setup_regions(rs_, idem::replication_mode::synchronous, [&](const idem::region& home, const idem::region&) {
        return home.name == "a" ? via(to_a) : home.uri;
    });
    const auto lo = short_leases();
    idem::setup_home_leases(rs_, lo);
    auto inside = rs_;
    inside[1].uri = via(a_to_b);
    inside[2].uri = via(a_to_c);
    auto roa = opts("a", inside);
    roa.leases = lo;
    auto ga = std::make_unique<idem::regional_guard>(fast(), roa);
    idem::regional_guard gb(fast(), opts("b", outside));

    // What a acknowledged: at a, and claims b forwarded to a.
    std::map<std::string, std::uint64_t> acknowledged;  // key -> outcome of an acknowledged success
    for (int i = 0; i < 20; ++i) {
        // From the 10th on, b's copy stops following a: those decisions are acknowledged because c
        // holds them, and b, the taker, must get them from c's copy.
        if (i == 10) exec("b", "ALTER SUBSCRIPTION idem_a_to_b DISABLE");
        const std::string k = "a-home-" + std::to_string(i);
        auto r = ga->begin(idem::key(k), 1);
        ASSERT_EQ(r.status, idem::begin_status::acquired) << k;
        ASSERT_FALSE(r.ticket.succeed(100 + i)) << k;
        acknowledged[k] = 100 + i;
    }
    for (int i = 0; i < 10; ++i) {
        const std::string k = "a-fwd-" + std::to_string(i);
        auto r = gb.begin(idem::key(k), 1);
        ASSERT_EQ(r.status, idem::begin_status::acquired) << k;
        ASSERT_FALSE(r.ticket.succeed(200 + i)) << k;
        acknowledged[k] = 200 + i;
    }

    // a is cut off from everyone; it keeps running and trying to grant new keys.
    to_a.partition();
    a_to_b.partition();
    a_to_c.partition();
    std::atomic<bool> stop{false};
    std::atomic<int> granted_during{0};
    std::vector<std::string> acked_during;  // the trying thread's only
    std::thread trying([&] {
        for (int i = 0; i < 2000 && !stop.load(); ++i) {
            const std::string k = "a-cut-" + std::to_string(i % 40);
            auto r = ga->begin(idem::key(k), 1);
            if (r.status == idem::begin_status::acquired) {
                granted_during.fetch_add(1);
                if (!r.ticket.succeed(300)) acked_during.push_back(k);
            }
        }
    });
    struct joiner {
        std::thread& t;
        std::atomic<bool>& stop;
        ~joiner() {
            stop = true;
            if (t.joinable()) t.join();
        }
    } join_trying{trying, stop};
    ASSERT_TRUE(wait_for([&] { return !ga->lease_keeper()->valid("a"); }, 20s));

    const auto rep = idem::take_over(outside, "a", "b", lo, 30000ms);
    EXPECT_EQ(rep.from, "a");
    EXPECT_EQ(rep.epoch, 1);
    EXPECT_EQ(rep.skipped, std::vector<std::string>{"a"});
    EXPECT_EQ(rep.rebuild, std::vector<std::string>{"a"});
    EXPECT_EQ(rep.accepted.size(), 2u);
    EXPECT_EQ(rep.merged, std::vector<std::string>{"c"});
    EXPECT_GE(rep.records, acknowledged.size());
    stop = true;
    trying.join();
    EXPECT_EQ(granted_during.load(), 0) << "synchronous mode: a cut-off home acknowledges nothing";
    for (const auto& k : acked_during) acknowledged[k] = 300;

    // b decides a's keys now.
    auto rob = opts("b", outside);
    rob.decided_at["a"] = "b";
    rob.leases = lo;
    idem::regional_guard gb2(fast(), rob);
    ASSERT_TRUE(gb2.lease_keeper()->valid("a"));
    for (const auto& [k, outcome] : acknowledged) {
        auto d = gb2.begin(idem::key(k), 1);
        EXPECT_EQ(d.status, idem::begin_status::succeeded) << k << ": an acknowledged decision was lost";
        EXPECT_EQ(d.outcome, outcome) << k;
    }
    auto fresh = gb2.begin(idem::key("a-after"), 1);
    ASSERT_EQ(fresh.status, idem::begin_status::acquired);
    ASSERT_FALSE(fresh.ticket.succeed(400));
    ASSERT_TRUE(arrives("c", "a", "a-after", "SUCCESS")) << "c does not follow the key space's new home";

    // The partition heals: a's keeper meets epoch 1, is fenced, and a decides nothing more.
    a_to_b.heal();
    a_to_c.heal();
    to_a.heal();
    ASSERT_TRUE(wait_for([&] { return lease_of(*ga, "a").fenced; }, 20s)) << "a's keeper never saw the takeover";
    EXPECT_EQ(ga->begin(idem::key("a-late"), 1).status, idem::begin_status::store_unavailable);
    EXPECT_EQ(row_status("a", "a", "a-late"), "");
    EXPECT_EQ(row_status("b", "a", "a-late"), "");
    // a's copy is stale (what it wrote while cut off was never replicated): rebuilt from the
    // clusters that decide each key space, it follows b's decisions of its keys, and every copy
    // agrees with its decider.
#ifdef IDEM_TEST_CLI
    const auto [code, out] = cli("rebuild", "--name a --leases --lease-ms 2000 --margin-ms 500 --call-deadline-ms 400");
    ASSERT_EQ(code, 0) << out;
    EXPECT_NE(out.find("holds 3 copies again"), std::string::npos) << out;
#else
    const auto rebuilt = idem::rebuild_region(rs_, "a", lo);
    EXPECT_EQ(rebuilt.copied.size(), 3u);
    EXPECT_GE(rebuilt.records, acknowledged.size() + 1);
#endif
    EXPECT_EQ(row_status("a", "a", "a-after"), "SUCCESS");
    ga.reset();
    auto roa2 = opts("a");
    roa2.decided_at["a"] = "b";
    roa2.leases = lo;
    idem::regional_guard ga2(fast(), roa2);
    EXPECT_EQ(ga2.begin(idem::key("a-home-15"), 1).outcome, 115u) << "a duplicate answered from a's rebuilt copy";
    EXPECT_EQ(ga2.snapshot().answered_by_replica, 1u);
    auto next = ga2.begin(idem::key("a-next"), 1);
    ASSERT_EQ(next.status, idem::begin_status::acquired) << "a forwards its own keys to b now";
    ASSERT_FALSE(next.ticket.succeed(500));
    EXPECT_EQ(row_status("b", "a", "a-next"), "SUCCESS");
    ASSERT_TRUE(arrives("a", "a", "a-next", "SUCCESS"));
    const auto v = idem::verify_regions(rs_, idem_test::home_rule, {{"a", "b"}});
    EXPECT_TRUE(v.clean()) << (v.violations.empty() ? "a home's verify" : v.violations.front());
    EXPECT_GT(v.replica_rows, 0u);
}

TEST_F(Takeover, TwoRegionsAndAWitnessTakeOverALostHomeWithTheWitnessVote) {
    // Two data regions, a and b; c's cluster is only a witness (a lease store holding no data).
    // a is cut off from b and from the witness; b takes a's key space over with the votes of b and
    // the witness. Synchronous mode: everything a acknowledged is in b's copy.
    idem_test::fault_proxy to_a(port_of(uri_of("a"))), a_to_b(port_of(uri_of("b"))), a_to_w(port_of(uri_of("c")));
    const std::vector<idem::region> two{{"a", uri_of("a")}, {"b", uri_of("b")}};
    idem::setup_regions(two, idem::replication_mode::synchronous, [&](const idem::region& home, const idem::region&) {
        return home.name == "a" ? via(to_a) : home.uri;
    });
    auto lo = short_leases();
    lo.witnesses = {{"w", uri_of("c")}};
    idem::setup_home_leases(two, lo);
    EXPECT_EQ(idem::read_leases(lo.witnesses[0]).size(), 2u) << "the witness holds a lease row per key space";

    auto inside = two;
    inside[1].uri = via(a_to_b);
    auto roa = opts("a", inside);
    roa.leases = lo;
    roa.leases->witnesses = {{"w", via(a_to_w)}};
    auto ga = std::make_unique<idem::regional_guard>(fast(), roa);
    ASSERT_TRUE(ga->lease_keeper()->valid("a"));
    EXPECT_EQ(ga->lease_keeper()->majority(), 2u);
    for (int i = 0; i < 10; ++i) {
        auto r = ga->begin(idem::key("a-w-" + std::to_string(i)), 1);
        ASSERT_EQ(r.status, idem::begin_status::acquired);
        ASSERT_FALSE(r.ticket.succeed(10 + i));
    }
    to_a.partition();
    a_to_b.partition();
    a_to_w.partition();
    ASSERT_TRUE(wait_for([&] { return !ga->lease_keeper()->valid("a"); }, 20s));
    auto outside = two;
    outside[0].uri = via(to_a);
    const auto rep = idem::take_over(outside, "a", "b", lo, 30000ms);
    EXPECT_EQ(rep.epoch, 1);
    EXPECT_EQ(rep.accepted, (std::vector<std::string>{"b", "w"}));
    EXPECT_EQ(rep.rebuild, std::vector<std::string>{"a"});
    auto rob = opts("b", outside);
    rob.decided_at["a"] = "b";
    rob.leases = lo;
    idem::regional_guard gb(fast(), rob);
    ASSERT_TRUE(gb.lease_keeper()->valid("a")) << "b's keeper holds a's key space with b's and the witness's votes";
    for (int i = 0; i < 10; ++i) EXPECT_EQ(gb.begin(idem::key("a-w-" + std::to_string(i)), 1).outcome, 10u + i);
    auto fresh = gb.begin(idem::key("a-w-new"), 1);
    ASSERT_EQ(fresh.status, idem::begin_status::acquired);
    ASSERT_FALSE(fresh.ticket.succeed(99));
    a_to_b.heal();
    a_to_w.heal();
    ASSERT_TRUE(wait_for([&] { return lease_of(*ga, "a").fenced; }, 20s)) << "the witness's epoch did not fence a";
    EXPECT_EQ(ga->begin(idem::key("a-w-late"), 1).status, idem::begin_status::store_unavailable);
    EXPECT_EQ(row_status("a", "a", "a-w-late"), "");
}

TEST_F(Takeover, AWipedRegionIsRebuiltFromTheOthersOnANewCluster) {
    // a decides 12 keys, then its cluster dies for good (SIGKILL; never started again). b takes its
    // key space over; a new, empty cluster takes a's name (a new URI) and is rebuilt from b and c.
    idem::setup_regions(rs_, idem::replication_mode::asynchronous);
    const auto lo = short_leases();
    idem::setup_home_leases(rs_, lo);
    {
        auto roa = opts("a");
        roa.leases = lo;
        idem::regional_guard ga(fast(), roa);
        for (int i = 0; i < 12; ++i) {
            auto r = ga.begin(idem::key("a-wipe-" + std::to_string(i)), 1);
            ASSERT_EQ(r.status, idem::begin_status::acquired);
            ASSERT_FALSE(r.ticket.succeed(40 + i));
        }
    }
    for (const char* on : {"b", "c"}) ASSERT_TRUE(arrives(on, "a", "a-wipe-11", "SUCCESS"));
    ASSERT_TRUE(servers_[0]->crash());
    const auto rep = idem::take_over(rs_, "a", "b", lo, 30000ms);
    EXPECT_EQ(rep.skipped, std::vector<std::string>{"a"});

    idem_test::private_server fresh(conf);
    ASSERT_FALSE(fresh.uri().empty()) << "the replacement cluster did not start";
    auto rs = rs_;
    rs[0].uri = fresh.uri();
    const auto rebuilt = idem::rebuild_region(rs, "a", lo);
    EXPECT_EQ(rebuilt.copied.size(), 3u);
    EXPECT_GE(rebuilt.records, 12u);
    auto roa = opts("a", rs);
    roa.decided_at["a"] = "b";
    roa.leases = lo;
    idem::regional_guard ga(fast(), roa);
    for (int i = 0; i < 12; ++i) EXPECT_EQ(ga.begin(idem::key("a-wipe-" + std::to_string(i)), 1).outcome, 40u + i) << i;
    EXPECT_EQ(ga.snapshot().answered_by_replica, 12u) << "the new cluster's copy answers a's duplicates";
    // A new key of a's goes to b, whose own processes hold the lease (without them b's fence
    // refuses: the takeover's view runs out after one lease).
    auto rob = opts("b", rs);
    rob.decided_at["a"] = "b";
    rob.leases = lo;
    idem::regional_guard gb(fast(), rob);
    ASSERT_TRUE(gb.lease_keeper()->valid("a"));
    auto r = ga.begin(idem::key("a-wipe-new"), 1);
    ASSERT_EQ(r.status, idem::begin_status::acquired);
    ASSERT_FALSE(r.ticket.succeed(77));
    ASSERT_TRUE(wait_for([&] {
        pqxx::connection c(fresh.uri());
        pqxx::nontransaction n(c);
        return !n.exec("SELECT 1 FROM idem_a.idempotent_record WHERE idempotent_key = 'a-wipe-new' AND status = 'SUCCESS'")
                    .empty();
    })) << "the new cluster does not follow b's decisions of a's keys";
    const auto v = idem::verify_regions(rs, idem_test::home_rule, {{"a", "b"}});
    EXPECT_TRUE(v.clean()) << (v.violations.empty() ? "a home's verify" : v.violations.front());
    EXPECT_GT(v.replica_rows, 0u);
}

TEST_F(Takeover, RefusalsChangeNothingAndATakeoverEveryStoreAcceptedIsFinishedWhenRunAgain) {
    idem::setup_regions(rs_, idem::replication_mode::asynchronous);
    const auto lo = short_leases();
    idem::setup_home_leases(rs_, lo);
    // A rebuild of a region that still decides its key space would empty the only copy that decides.
    try {
        (void)idem::rebuild_region(rs_, "a", lo);
        ADD_FAILURE() << "a region still deciding its key space was rebuilt";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), idem::errc::invalid_argument) << e.what();
        EXPECT_NE(std::string(e.what()).find("key space 'a' is decided by no region but 'a'"), std::string::npos)
            << e.what();
    }
    auto roa = opts("a");
    roa.leases = lo;
    {
        idem::regional_guard ga(fast(), roa);  // the refused rebuild changed nothing: a decides
        auto r = ga.begin(idem::key("a-1"), 1);
        ASSERT_EQ(r.status, idem::begin_status::acquired);
        ASSERT_FALSE(r.ticket.succeed(5));
    }  // a's process is gone: its lease runs out
    ASSERT_TRUE(arrives("c", "a", "a-1", "SUCCESS"));

    // A takeover of a's key space to c that every lease store accepted and that stopped right there
    // (what its conditional writes leave, once a's lease ran out): no store shows a as the owner any
    // more. Run again, it finishes from the owner the stores keep as previous.
    ASSERT_TRUE(wait_for(
        [&] {
            for (const auto& l : idem::read_leases(rs_[0]))
                if (l.space == "a") return l.valid_ms <= -500;  // ran out by the margin
            return false;
        },
        20s));
    for (const char* name : {"a", "b", "c"})
        exec(name,
             "UPDATE idem__leases.home_lease SET previous = owner, owner = 'c', epoch = 1, lease_until = clock_timestamp() "
             "+ interval '2 seconds' WHERE space = 'a'");
    const auto rep = idem::take_over(rs_, "a", "c", lo, 10000ms);
    EXPECT_EQ(rep.from, "a");
    EXPECT_EQ(rep.epoch, 1);
    {
        auto roc = opts("c");
        roc.decided_at = {{"a", "c"}};
        roc.leases = lo;
        idem::regional_guard gc(fast(), roc);
        EXPECT_EQ(gc.begin(idem::key("a-1"), 1).outcome, 5u);
        auto r = gc.begin(idem::key("a-2"), 2);
        ASSERT_EQ(r.status, idem::begin_status::acquired);
        ASSERT_FALSE(r.ticket.succeed(6));
        EXPECT_EQ(row_status("c", "a", "a-2"), "SUCCESS");
    }
    // Finished: run once more, it says so.
    try {
        (void)idem::take_over(rs_, "a", "c", lo, 1000ms);
        ADD_FAILURE() << "a finished takeover ran again";
    } catch (const idem::error& e) {
        EXPECT_NE(std::string(e.what()).find("already held by 'c'"), std::string::npos) << e.what();
    }

    // A taker whose copy does not follow the old home: b's key space (never renewed: its lease ran
    // out from the start) to c, after c's subscription to b was dropped (as after an earlier
    // takeover c was not rebuilt from).
    exec("c", "ALTER SUBSCRIPTION idem_b_to_c DISABLE");
    exec("c", "ALTER SUBSCRIPTION idem_b_to_c SET (slot_name = NONE)");
    exec("c", "DROP SUBSCRIPTION idem_b_to_c");
    try {
        (void)idem::take_over(rs_, "b", "c", lo, 10000ms);
        ADD_FAILURE() << "a taker whose copy does not follow the old home took the key space";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), idem::errc::store_unavailable) << e.what();
        EXPECT_NE(std::string(e.what()).find("'c''s copy of key space 'b' does not follow 'b'"), std::string::npos)
            << e.what();
    }
    // Nothing taken: every lease store still shows b's lease at epoch 0 (a lease taken by c, which
    // cannot decide, would leave the key space to no one).
    int rows = 0;
    for (const auto& r : rs_)
        for (const auto& l : idem::read_leases(r))
            if (l.space == "b") {
                ++rows;
                EXPECT_EQ(l.owner, "b") << "at " << r.name;
                EXPECT_EQ(l.epoch, 0) << "at " << r.name;
            }
    EXPECT_EQ(rows, 3);
}

TEST(TakeoverInput, BadOptionsAreRefusedByName) {
    const std::vector<idem::region> rs{{"a", "postgresql://127.0.0.1:1/x"}, {"b", "postgresql://127.0.0.1:2/x"}};
    idem::lease_options lo;
    lo.lease = 1000ms;
    lo.call_deadline = 600ms;
    try {
        idem::setup_home_leases(rs, lo);
        ADD_FAILURE() << "a call deadline over half the lease was accepted";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), idem::errc::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("call_deadline"), std::string::npos) << e.what();
    }
    lo = {};
    lo.witnesses = {
        {"w1", "postgresql://127.0.0.1:3/x"}, {"w2", "postgresql://127.0.0.1:4/x"}, {"w3", "postgresql://127.0.0.1:5/x"}};
    try {
        idem::setup_home_leases(rs, lo);
        ADD_FAILURE() << "five lease stores were accepted";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), idem::errc::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("5 lease stores"), std::string::npos) << e.what();
    }
    lo.witnesses = {{"a", "postgresql://127.0.0.1:3/x"}};
    EXPECT_THROW(idem::setup_home_leases(rs, lo), idem::error);
    lo.witnesses.clear();
    try {
        (void)idem::take_over(rs, "a", "z", lo, 100ms);
        ADD_FAILURE() << "an unknown region was accepted";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), idem::errc::invalid_argument);
        EXPECT_NE(std::string(e.what()).find("'z'"), std::string::npos) << e.what();
    }
}

}  // namespace
