// Ordered versions (options.ordered_versions) in scope::global: two guards on one database stand for
// two nodes. The store's version table (detail/global/pg_sql.hpp, claim_ordered) decides; these tests
// check the rule from outside: once version N of a (txid, operation) was claimed, a claim of a lower
// version is refused with superseded(N) and not run, a claim of N or higher proceeds, a duplicate of
// an existing record keeps its usual answer, and keys that do not split are not affected.
//
// Needs IDEM_TEST_PG_URI (a server; scripts/test starts one). FAILS, never skips, without one. Each
// test uses a fresh database.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <latch>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "idem/global_guard.hpp"
#include "idem/verify.hpp"

#include "support/pg_fixture.hpp"

using namespace std::chrono_literals;

namespace {

namespace pg = idem::detail::pg;
using idem::begin_status;

class GlobalVersions : public idem_test::pg_fixture {
protected:
    std::int64_t sql_int(const std::string& text) {
        pqxx::connection c(uri_);
        pqxx::nontransaction n(c);
        return n.exec(text)[0][0].as<std::int64_t>();
    }

    static idem::options opts(bool ordered = true) {
        idem::options o;
        o.capacity = 1 << 14;
        o.lease = 30s;
        o.maintenance_interval = 0s;
        o.ordered_versions = ordered;
        return o;
    }
    static idem::global_options gopts(const std::string& node) {
        idem::global_options g;
        g.node = node;
        g.prune_interval = 0ms;
        return g;
    }

    /// Polls `done` every 5 ms (a poll interval, not a synchronisation) for 10 s at most.
    static bool await(const std::function<bool()>& done) {
        const auto until = std::chrono::steady_clock::now() + 10s;
        for (;;) {
            if (done()) return true;
            if (std::chrono::steady_clock::now() >= until) return false;
            std::this_thread::sleep_for(5ms);
        }
    }
};

std::string answer(const idem::global_begin_result& r) {
    return std::string(idem::to_string(r.status)) +
           (r.status == begin_status::superseded || r.status == begin_status::succeeded
                ? "(" + std::to_string(r.outcome) + ")"
                : "");
}

TEST_F(GlobalVersions, ALowerVersionIsSupersededOnEveryNode) {
    idem::global_guard a(uri_, opts(), gopts("node-a"));
    idem::global_guard b(uri_, opts(), gopts("node-b"));

    auto a2 = a.begin(idem::key("TX1_AMEND_v2"));
    ASSERT_EQ(answer(a2), "acquired");
    EXPECT_EQ(answer(b.begin(idem::key("TX1_AMEND_v1"))), "superseded(2)");
    EXPECT_EQ(b.snapshot().superseded, 1u);
    EXPECT_FALSE(b.lookup("TX1_AMEND_v1")) << "a superseded claim wrote a record";
    // The same version again is a duplicate of the live claim, not superseded.
    EXPECT_EQ(answer(b.begin(idem::key("TX1_AMEND_v2"))), "in_progress");
    auto b3 = b.begin(idem::key("TX1_AMEND_v3"));
    ASSERT_EQ(answer(b3), "acquired");
    EXPECT_FALSE(a2.ticket.succeed(20));
    EXPECT_FALSE(b3.ticket.succeed(30));
    // A duplicate of an existing record keeps its usual answer, though a newer version exists.
    EXPECT_EQ(answer(b.begin(idem::key("TX1_AMEND_v2"))), "succeeded(20)");
    EXPECT_EQ(answer(a.begin(idem::key("TX1_AMEND_v1"))), "superseded(3)");
    EXPECT_EQ(answer(a.begin(idem::key("TX1_AMEND_v3"))), "succeeded(30)");

    // Other transactions, other operations and keys that do not split are not affected.
    auto other_tx = a.begin(idem::key("TX2_AMEND_v1"));
    EXPECT_EQ(answer(other_tx), "acquired");
    auto other_op = b.begin(idem::key("TX1_CANCEL_v1"));
    EXPECT_EQ(answer(other_op), "acquired");
    auto plain = a.begin(idem::key("order-7731"));
    EXPECT_EQ(answer(plain), "acquired");
    auto plain2 = a.begin(idem::key("TX1_AMEND_v0_x"));  // three '_': does not split
    EXPECT_EQ(answer(plain2), "acquired");
    EXPECT_EQ(sql_int("SELECT version FROM idempotent_version WHERE txid_op = 'TX1_AMEND'"), 3);
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_version"), 3);  // TX1_AMEND, TX2_AMEND, TX1_CANCEL
}

TEST_F(GlobalVersions, ARetryableFailureKeepsTheVersionAndDuplicatesKeepTheirAnswers) {
    idem::global_guard a(uri_, opts(), gopts("node-a"));
    idem::global_guard b(uri_, opts(), gopts("node-b"));
    // A RELEASED record of a lower version would be claimable again: the newer version refuses it.
    auto a1 = a.begin(idem::key("TX3_AMEND_v1"));
    ASSERT_EQ(answer(a1), "acquired");
    EXPECT_FALSE(a1.ticket.fail(9, idem::failure_policy::retryable));
    auto b2 = b.begin(idem::key("TX3_AMEND_v2"));
    ASSERT_EQ(answer(b2), "acquired");
    EXPECT_EQ(answer(a.begin(idem::key("TX3_AMEND_v1"))), "superseded(2)");
    EXPECT_EQ(answer(b.begin(idem::key("TX3_AMEND_v1"))), "superseded(2)");
    EXPECT_EQ(b.lookup("TX3_AMEND_v1")->state, idem::record_state::released);  // untouched
    // A lower version still executing elsewhere is in_progress for a duplicate (not superseded).
    auto a4 = a.begin(idem::key("TX4_AMEND_v1"));
    ASSERT_EQ(answer(a4), "acquired");
    auto b4 = b.begin(idem::key("TX4_AMEND_v2"));
    ASSERT_EQ(answer(b4), "acquired");
    EXPECT_EQ(answer(b.begin(idem::key("TX4_AMEND_v1"))), "in_progress");
    // A failed version stays failed; a released version claimed again at the newest version runs.
    EXPECT_FALSE(b2.ticket.fail(0, idem::failure_policy::retryable));
    auto again = a.begin(idem::key("TX3_AMEND_v2"));
    EXPECT_EQ(answer(again), "acquired");
    EXPECT_EQ(again.fence, 2u);
}

TEST_F(GlobalVersions, OptionOffChangesNothing) {
    idem::global_guard a(uri_, opts(false), gopts("node-a"));
    idem::global_guard b(uri_, opts(false), gopts("node-b"));
    auto a2 = a.begin(idem::key("TX1_AMEND_v2"));
    ASSERT_EQ(answer(a2), "acquired");
    auto b1 = b.begin(idem::key("TX1_AMEND_v1"));
    EXPECT_EQ(answer(b1), "acquired");
    EXPECT_EQ(sql_int("SELECT count(*) FROM pg_tables WHERE tablename = 'idempotent_version'"), 0)
        << "the option is off: no version table";
}

TEST_F(GlobalVersions, RunThrowsSuperseded) {
    idem::global_guard a(uri_, opts(), gopts("node-a"));
    idem::global_guard b(uri_, opts(), gopts("node-b"));
    EXPECT_EQ(a.run(idem::key("TX5_REPLACE_v4"), [] { return std::uint64_t{44}; }), 44u);
    bool ran = false;
    try {
        (void)b.run(idem::key("TX5_REPLACE_v3"), [&] {
            ran = true;
            return std::uint64_t{33};
        });
        ADD_FAILURE() << "run() of a superseded version returned";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.kind(), idem::errc::superseded) << e.what();
        EXPECT_NE(std::string(e.what()).find("version 4"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(ran);
    EXPECT_EQ(b.run(idem::key("TX5_REPLACE_v5"), [] { return std::uint64_t{55}; }), 55u);
}

TEST_F(GlobalVersions, OrderingSurvivesRestartsAndPrunedRecords) {
    {
        idem::global_guard a(uri_, opts(), gopts("node-a"));
        auto r = a.begin(idem::key("TX6_AMEND_v5"));
        ASSERT_EQ(answer(r), "acquired");
        EXPECT_FALSE(r.ticket.succeed(5));
    }
    {
        idem::global_guard b(uri_, opts(), gopts("node-b"));  // a new process: nothing cached
        EXPECT_EQ(answer(b.begin(idem::key("TX6_AMEND_v4"))), "superseded(5)");
        EXPECT_EQ(answer(b.begin(idem::key("TX6_AMEND_v5"))), "succeeded(5)");
    }
    // The record goes (what prune does past the window); its version stays and still orders.
    {
        pqxx::connection c(uri_);
        pqxx::nontransaction n(c);
        n.exec("DELETE FROM idempotent_record WHERE idempotent_key = 'TX6_AMEND_v5'");
    }
    idem::global_guard c(uri_, opts(), gopts("node-c"));
    EXPECT_EQ(answer(c.begin(idem::key("TX6_AMEND_v3"))), "superseded(5)");
    auto again = c.begin(idem::key("TX6_AMEND_v5"));  // new again, and not lower than the newest
    EXPECT_EQ(answer(again), "acquired");
}

/// What happened to one begin() of a racing test: its version, its answer, and two ticks of a
/// shared clock (a counter): before the call, after the answer.
struct attempt {
    std::uint32_t version;
    begin_status status;
    std::uint64_t newest;  // superseded: the version it reported
    std::uint64_t called, returned;
};

/// The invariant: no version was acquired after a higher version's acquire had returned, and a
/// superseded answer names a version above the attempt's, at least as high as any acquired before
/// the call. Returns the violations found.
std::vector<std::string> violations(const std::vector<attempt>& all) {
    std::vector<std::string> out;
    for (const attempt& x : all) {
        std::uint32_t before = 0;  // highest version acquired (returned) before x was called
        for (const attempt& y : all)
            if (y.status == begin_status::acquired && y.returned < x.called) before = std::max(before, y.version);
        if (x.status == begin_status::acquired && x.version < before)
            out.push_back("v" + std::to_string(x.version) + " acquired after v" + std::to_string(before));
        if (x.status == begin_status::superseded && (x.newest <= x.version || x.newest < before))
            out.push_back("v" + std::to_string(x.version) + " superseded by v" + std::to_string(x.newest) + " after v" +
                          std::to_string(before) + " was acquired");
    }
    return out;
}

/// `threads` threads on two guards, started by a latch, each making `rounds` claims of random
/// versions (1..max_version) of one pair; an acquired claim succeeds or is released at random
/// (released ones are claimable again). Returns every attempt.
std::vector<attempt> race(idem::global_guard& a, idem::global_guard& b, const std::string& pair, int threads, int rounds,
                          std::uint32_t max_version) {
    std::atomic<std::uint64_t> clock{0};
    std::mutex m;
    std::vector<attempt> all;
    std::latch start(threads);
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            idem::global_guard& g = t % 2 ? b : a;
            std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 1);
            std::uniform_int_distribution<std::uint32_t> pick(1, max_version);
            std::vector<attempt> mine;
            start.arrive_and_wait();
            for (int i = 0; i < rounds; ++i) {
                const std::uint32_t v = pick(rng);
                attempt x{v, begin_status::acquired, 0, clock.fetch_add(1) + 1, 0};
                auto r = g.begin(idem::key::compose(pair.substr(0, pair.find('_')), pair.substr(pair.find('_') + 1), v));
                x.returned = clock.fetch_add(1) + 1;
                x.status = r.status;
                x.newest = r.outcome;
                if (r) {
                    if (rng() % 2) (void)r.ticket.succeed(v);
                    else (void)r.ticket.fail(0, idem::failure_policy::retryable);
                }
                mine.push_back(x);
            }
            std::lock_guard lk(m);
            all.insert(all.end(), mine.begin(), mine.end());
        });
    for (auto& t : ts) t.join();
    return all;
}

TEST_F(GlobalVersions, ConcurrentClaimsOnTwoNodesNeverRunALowerVersionLater) {
    idem::global_guard a(uri_, opts(), gopts("node-a"));
    idem::global_guard b(uri_, opts(), gopts("node-b"));
    const auto all = race(a, b, "TXC_AMEND", 8, 40, 40);
    const auto bad = violations(all);
    EXPECT_TRUE(bad.empty()) << bad.size() << " violations, first: " << bad.front();
    std::size_t acquired = 0, superseded = 0;
    for (const attempt& x : all) {
        acquired += x.status == begin_status::acquired;
        superseded += x.status == begin_status::superseded;
        EXPECT_TRUE(x.status == begin_status::acquired || x.status == begin_status::superseded ||
                    x.status == begin_status::succeeded || x.status == begin_status::in_progress)
            << idem::to_string(x.status);
    }
    EXPECT_GT(acquired, 0u);
    EXPECT_GT(superseded, 0u);
    // The newest version in the store is the highest acquired.
    std::uint32_t top = 0;
    for (const attempt& x : all)
        if (x.status == begin_status::acquired) top = std::max(top, x.version);
    EXPECT_EQ(sql_int("SELECT version FROM idempotent_version WHERE txid_op = 'TXC_AMEND'"), top);
}

/// The same race without the option: the check above must see violations (it can fail).
TEST_F(GlobalVersions, TheRaceCheckSeesViolationsWithoutTheOption) {
    idem::global_guard a(uri_, opts(false), gopts("node-a"));
    idem::global_guard b(uri_, opts(false), gopts("node-b"));
    const auto all = race(a, b, "TXC_AMEND", 8, 40, 40);
    EXPECT_FALSE(violations(all).empty());
}

/// Many pairs and keys that do not split but sort between a pair's versions ("P_AMEND_v1_x" lies
/// between "P_AMEND_v1" and "P_AMEND_v2"), on two nodes with 16 threads: batches of either node mix
/// version rows and record rows of overlapping pairs. The invariant holds per pair, and no batch
/// failed (a lock cycle between batches would be broken by PostgreSQL with a deadlock error, which
/// the batcher counts as a store error before it retries).
TEST_F(GlobalVersions, ManyPairsAndPlainKeysOnTwoNodes) {
    idem::global_guard a(uri_, opts(), gopts("node-a"));
    idem::global_guard b(uri_, opts(), gopts("node-b"));
    constexpr int threads = 16, rounds = 30, pairs = 4;
    std::atomic<std::uint64_t> clock{0};
    std::mutex m;
    std::vector<std::vector<attempt>> per_pair(pairs);
    std::latch start(threads);
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            idem::global_guard& g = t % 2 ? b : a;
            std::mt19937 rng(static_cast<unsigned>(t) * 104729u + 7);
            std::vector<std::vector<attempt>> mine(pairs);
            start.arrive_and_wait();
            for (int i = 0; i < rounds; ++i) {
                const int p = static_cast<int>(rng() % pairs);
                const auto v = static_cast<std::uint32_t>(rng() % 12 + 1);
                const bool plain = rng() % 3 == 0;
                const idem::key ordered = idem::key::compose("TXM" + std::to_string(p), "AMEND", v);
                const idem::key k = plain ? idem::key(ordered.str() + "_x") : ordered;
                attempt x{v, begin_status::acquired, 0, clock.fetch_add(1) + 1, 0};
                auto r = g.begin(k);
                x.returned = clock.fetch_add(1) + 1;
                x.status = r.status;
                x.newest = r.outcome;
                if (r) {
                    if (rng() % 2) (void)r.ticket.succeed(v);
                    else (void)r.ticket.fail(0, idem::failure_policy::retryable);
                }
                if (plain) {
                    EXPECT_NE(r.status, begin_status::superseded) << k.view() << " does not split";
                } else {
                    mine[p].push_back(x);
                }
            }
            std::lock_guard lk(m);
            for (int p = 0; p < pairs; ++p) per_pair[p].insert(per_pair[p].end(), mine[p].begin(), mine[p].end());
        });
    for (auto& t : ts) t.join();
    for (int p = 0; p < pairs; ++p) {
        const auto bad = violations(per_pair[p]);
        EXPECT_TRUE(bad.empty()) << "pair " << p << ": " << bad.size() << " violations, first: " << bad.front();
        for (const attempt& x : per_pair[p])
            EXPECT_NE(x.status, begin_status::store_unavailable) << "pair " << p << " v" << x.version;
    }
    EXPECT_EQ(a.snapshot().store_errors, 0u) << a.last_error();
    EXPECT_EQ(b.snapshot().store_errors, 0u) << b.last_error();
    // Every audit trail (superseded claims leave none) still follows the transition rules.
    idem::postgres_store st(uri_, 10s);
    const idem::verify_report vr = idem::verify(st);
    EXPECT_TRUE(vr.violations.empty()) << vr.violations.size() << " violations, first: " << vr.violations.front();
    EXPECT_GT(vr.keys, 0u);
}

/// Claims of one pair that the request queue puts in one batch: the one claim batcher is held back
/// by a key another transaction inserted and holds uncommitted, the claims queue up behind it, and
/// the next batch takes them all. Their answers must be those of some sequential order (the highest
/// version first: it is claimed, the lower ones are superseded by it, or keep their usual answer).
TEST_F(GlobalVersions, OneBatchAnswersAsSomeSequentialOrder) {
    idem::global_options go = gopts("node-a");
    go.claim_connections = 1;
    go.call_deadline = 30s;
    go.wait_timeout = 30s;
    idem::global_guard g(uri_, opts(), go);
    idem::global_guard other(uri_, opts(), gopts("node-b"));

    int batched = 0;
    for (int round = 0; round < 5 && batched == 0; ++round) {
        // Per round, three fresh pairs: TB1 no earlier claim; TB2 v3 claimed on the other node; TB3
        // v2 decided (SUCCEEDED) on the other node (so this guard's local table knows none of them).
        const std::string r = "R" + std::to_string(round);
        const std::string tb1 = "TB1" + r, tb2 = "TB2" + r, tb3 = "TB3" + r;
        auto x3 = other.begin(idem::key(tb2 + "_AMEND_v3"));
        ASSERT_EQ(answer(x3), "acquired");
        {
            auto s2 = other.begin(idem::key(tb3 + "_AMEND_v2"));
            ASSERT_EQ(answer(s2), "acquired");
            EXPECT_FALSE(s2.ticket.succeed(22));
        }
        const std::string hold_key = "hold-" + std::to_string(round);
        pqxx::connection holder(uri_);
        pqxx::work hold(holder);
        hold.exec("INSERT INTO idempotent_record VALUES (" + hold.quote(hold_key) +
                  ", 'X', 'PROCESSING', 1, 0, 0, 0, 0, 0)");
        const std::uint64_t sent_before = g.snapshot().claims_sent;
        std::thread blocked([&] { (void)g.begin(idem::key(hold_key)); });  // occupies the one batcher
        // claims_sent counts a batch the batcher took: the claims below queue behind it.
        ASSERT_TRUE(await([&] { return g.snapshot().claims_sent > sent_before; }));
        const std::uint64_t batches_before = g.snapshot().claim_batches;

        // Submitted in both orders (the batch sorts them by key anyway).
        const std::vector<std::string> keys = {tb1 + "_AMEND_v2", tb1 + "_AMEND_v1", tb2 + "_AMEND_v1",
                                               tb2 + "_AMEND_v2", tb3 + "_AMEND_v1", tb3 + "_AMEND_v2"};
        std::vector<std::string> got(keys.size());
        std::vector<std::thread> ts;
        std::latch start(static_cast<std::ptrdiff_t>(keys.size()));
        for (std::size_t i = 0; i < keys.size(); ++i)
            ts.emplace_back([&, i] {
                start.arrive_and_wait();
                auto r = g.begin(idem::key(keys[i]));
                got[i] = answer(r);
                if (r) (void)r.ticket.succeed(1);
            });
        // Each claim is queued once its local claim is taken (then it is only a push away).
        const bool queued = await([&] {
            return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) {
                return g.query(idem::key(k)).state == idem::record_state::processing;
            });
        });
        std::this_thread::yield();
        hold.abort();
        blocked.join();
        for (auto& t : ts) t.join();
        ASSERT_TRUE(queued);
        // The held batch, then (when all six made it into the queue in time) one batch for them.
        if (g.snapshot().claim_batches == batches_before + 2) ++batched;

        // TB1 (fresh): v2 then v1 -> acquired, superseded(2); v1 then v2 -> acquired, acquired.
        const bool v2_first = got[0] == "acquired" && got[1] == "superseded(2)";
        const bool v1_first = got[0] == "acquired" && got[1] == "acquired";
        EXPECT_TRUE(v2_first || v1_first) << got[0] << " / " << got[1];
        if (g.snapshot().claim_batches == batches_before + 2) {
            EXPECT_TRUE(v2_first) << "one batch: the highest first";
        }
        // TB2 (v3 claimed elsewhere): both superseded by 3, in any order.
        EXPECT_EQ(got[2], "superseded(3)");
        EXPECT_EQ(got[3], "superseded(3)");
        // TB3 (v2 SUCCEEDED): v2 replays; v1 is superseded by it (no record to answer with).
        EXPECT_EQ(got[5], "succeeded(22)");
        EXPECT_EQ(got[4], "superseded(2)");
        // Later duplicates: the decided answers stay.
        EXPECT_EQ(answer(g.begin(idem::key(tb3 + "_AMEND_v1"))), "superseded(2)");
    }
    EXPECT_GT(batched, 0) << "no round put the six claims into one batch";
}

}  // namespace
