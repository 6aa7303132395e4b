// Response payloads in scope::global: two guards on one database stand for two nodes. A success's
// payload is written by the same fenced UPDATE as SUCCESS (detail/global/pg_sql.hpp, complete) and
// every duplicate on every node gets the bytes back exactly (NUL, 0xFF, invalid UTF-8), through
// begin(), begin_wait() and typed run(), also after a restart; a claim resets the payload.
//
// Needs IDEM_TEST_PG_URI (a server; scripts/test starts one). FAILS, never skips, without one. Each
// test uses a fresh database.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <atomic>
#include <cstdlib>
#include <latch>
#include <thread>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "idem/global_guard.hpp"

#include "support/pg_fixture.hpp"

using namespace std::chrono_literals;

namespace {

namespace pg = idem::detail::pg;
using idem::begin_status;

/// Bytes no text column could hold: NUL, 0xFF, a lone continuation byte, a truncated sequence.
std::string raw_bytes() {
    const char b[] = {'r', 'e', 's', '\0', 'p', '\xff', '\xfe', '\x80', '\xc3', '\x28', '\0', '\xe2', '\x82'};
    return std::string(b, sizeof b);
}

class GlobalPayloads : public idem_test::pg_fixture {
protected:
    void sql(const std::string& text) {
        pqxx::connection c(uri_);
        pqxx::nontransaction n(c);
        n.exec(text);
    }

    static idem::options opts() {
        idem::options o;
        o.capacity = 1 << 12;
        o.lease = 30s;
        o.maintenance_interval = 0s;
        return o;
    }
    static idem::global_options gopts(const std::string& node) {
        idem::global_options g;
        g.node = node;
        g.prune_interval = 0ms;
        return g;
    }
};

TEST_F(GlobalPayloads, AnotherNodeGetsTheExactBytes) {
    idem::global_guard a(uri_, opts(), gopts("node-a"));
    idem::global_guard b(uri_, opts(), gopts("node-b"));
    const std::string bytes = raw_bytes();
    const idem::key k("pay-1");

    auto r = a.begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    ASSERT_FALSE(r.ticket.succeed(201, bytes));

    auto d = b.begin(k);  // from the store (b never saw k): statement 2 of the claim batch
    ASSERT_EQ(d.status, begin_status::succeeded);
    EXPECT_EQ(d.outcome, 201u);
    EXPECT_EQ(d.payload, bytes);
    EXPECT_NE(d.fence, 0u) << "the store answered";
    auto again = b.begin(k);  // from b's local table now
    ASSERT_EQ(again.status, begin_status::succeeded);
    EXPECT_EQ(again.payload, bytes);
    EXPECT_EQ(again.fence, 0u) << "the local table answered";
    auto own = a.begin(k);  // the owner's local table, cached by the completion
    ASSERT_EQ(own.status, begin_status::succeeded);
    EXPECT_EQ(own.payload, bytes);
    auto w = b.begin_wait(k, 0, 100ms);
    ASSERT_EQ(w.status, begin_status::succeeded);
    EXPECT_EQ(w.payload, bytes);

    const auto row = b.lookup("pay-1");
    ASSERT_TRUE(row);
    EXPECT_EQ(row->state, idem::record_state::succeeded);
    EXPECT_EQ(row->payload, bytes);
    const auto trail = a.audit("pay-1");
    ASSERT_EQ(trail.size(), 2u);
    EXPECT_EQ(trail[1].detail, "succeed outcome=201" + idem::payload_detail(bytes));
    EXPECT_NE(trail[1].detail.find(" payload=13B fnv="), std::string::npos) << trail[1].detail;
}

TEST_F(GlobalPayloads, TypedRunReplaysOnAnotherNodeWithoutRunning) {
    idem::global_guard a(uri_, opts(), gopts("node-a"));
    idem::global_guard b(uri_, opts(), gopts("node-b"));
    const std::string bytes = raw_bytes();
    int runs = 0;
    const std::string first = a.run(idem::key("run-1"), [&] {
        ++runs;
        return bytes;
    });
    EXPECT_EQ(first, bytes);
    const std::string replay = b.run(idem::key("run-1"), [&] {
        ++runs;
        return std::string("not this");
    });
    EXPECT_EQ(replay, bytes);
    EXPECT_EQ(runs, 1) << "a duplicate on another node ran fn";

    struct quote {
        std::int64_t price;
        std::uint32_t qty;
        char side;
    };
    const quote q = a.run(idem::key("run-2"), [&] { return quote{-12345, 7, 'S'}; });
    const quote qb = b.run(idem::key("run-2"), [&] {
        ++runs;
        return quote{};
    });
    EXPECT_EQ(qb.price, q.price);
    EXPECT_EQ(qb.qty, 7u);
    EXPECT_EQ(qb.side, 'S');
    EXPECT_EQ(runs, 1);
}

TEST_F(GlobalPayloads, RacingRunsOnTwoNodesRunOnceAndAllGetTheBytes) {
    idem::global_guard a(uri_, opts(), gopts("node-a"));
    idem::global_guard b(uri_, opts(), gopts("node-b"));
    const std::string bytes = raw_bytes() + std::string(300, '\0') + "end";  // past the small buffer
    constexpr int threads = 16;
    constexpr int keys = 20;
    std::atomic<int> runs{0};
    std::vector<std::vector<std::string>> got(threads);
    std::latch start(threads);
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            idem::global_guard& g = t % 2 == 0 ? a : b;
            idem::run_options ro;
            ro.wait = 10s;  // a loser waits for the winner's success, then replays it
            start.arrive_and_wait();
            for (int i = 0; i < keys; ++i)
                got[t].push_back(g.run(
                    idem::key("race-" + std::to_string(i)),
                    [&] {
                        runs.fetch_add(1);
                        return bytes + std::to_string(i);
                    },
                    ro));
        });
    for (auto& t : ts) t.join();
    EXPECT_EQ(runs.load(), keys) << "a key ran more than once across the two nodes";
    for (int t = 0; t < threads; ++t)
        for (int i = 0; i < keys; ++i) ASSERT_EQ(got[t][i], bytes + std::to_string(i)) << "thread " << t << " key " << i;
}

// A terminal failure's error response is written by the same UPDATE as FAILED and replayed on
// every node with the failure code; a retryable failure cannot keep one and changes nothing.
TEST_F(GlobalPayloads, ATerminalFailuresResponseIsReplayedOnAnotherNode) {
    idem::global_guard a(uri_, opts(), gopts("node-a"));
    idem::global_guard b(uri_, opts(), gopts("node-b"));
    const idem::key k("TXD_PAY_v1");
    auto r = a.begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    EXPECT_EQ(r.ticket.fail(402, idem::failure_policy::retryable, raw_bytes()), idem::errc::invalid_argument);
    ASSERT_TRUE(r.ticket.valid());
    EXPECT_EQ(b.begin(k).status, begin_status::in_progress);
    ASSERT_FALSE(r.ticket.fail(402, idem::failure_policy::terminal, raw_bytes()));
    for (auto* g : {&b, &a}) {
        for (int again = 0; again < 2; ++again) {  // the second answer comes from the node's table
            const auto d = g->begin(k);
            ASSERT_EQ(d.status, begin_status::failed);
            EXPECT_EQ(d.outcome, 402u);
            EXPECT_EQ(d.payload, raw_bytes());
        }
    }
    const auto row = b.lookup("TXD_PAY_v1");
    ASSERT_TRUE(row);
    EXPECT_EQ(row->state, idem::record_state::failed);
    EXPECT_EQ(row->payload, raw_bytes());
}

TEST_F(GlobalPayloads, EmptyPayloadReplaysEmpty) {
    idem::global_guard a(uri_, opts(), gopts("node-a"));
    idem::global_guard b(uri_, opts(), gopts("node-b"));
    auto r = a.begin(idem::key("empty"));
    ASSERT_EQ(r.status, begin_status::acquired);
    ASSERT_FALSE(r.ticket.succeed(7, std::string_view()));
    auto d = b.begin(idem::key("empty"));
    ASSERT_EQ(d.status, begin_status::succeeded);
    EXPECT_EQ(d.outcome, 7u);
    EXPECT_TRUE(d.payload.empty());
    EXPECT_EQ(a.audit("empty").back().detail, "succeed outcome=7");  // no payload part
}

TEST_F(GlobalPayloads, OverMaxIsRefusedAndChangesNothing) {
    auto o = opts();
    o.max_payload = 16;
    idem::global_guard a(uri_, o, gopts("node-a"));
    idem::global_guard b(uri_, o, gopts("node-b"));
    const idem::key k("big");
    auto r = a.begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    const std::string exactly(16, '\xff');
    const std::string over(17, 'x');
    EXPECT_EQ(r.ticket.succeed(1, over), idem::errc::invalid_argument);
    ASSERT_TRUE(r.ticket.valid()) << "a refused payload must leave the ticket valid";
    EXPECT_EQ(b.begin(k).status, begin_status::in_progress);
    const auto row = b.lookup("big");
    ASSERT_TRUE(row);
    EXPECT_EQ(row->state, idem::record_state::processing);
    EXPECT_TRUE(row->payload.empty());
    EXPECT_EQ(a.audit("big").size(), 1u) << "a refused payload wrote an audit row";
    ASSERT_FALSE(r.ticket.succeed(1, exactly));  // the maximum itself is accepted
    auto d = b.begin(k);
    ASSERT_EQ(d.status, begin_status::succeeded);
    EXPECT_EQ(d.payload, exactly);

    // Then succeed without a payload works on a ticket that was refused one.
    auto r2 = a.begin(idem::key("big-2"));
    ASSERT_EQ(r2.status, begin_status::acquired);
    EXPECT_EQ(r2.ticket.succeed(2, over), idem::errc::invalid_argument);
    ASSERT_FALSE(r2.ticket.succeed(2));
    auto d2 = b.begin(idem::key("big-2"));
    ASSERT_EQ(d2.status, begin_status::succeeded);
    EXPECT_EQ(d2.outcome, 2u);
    EXPECT_TRUE(d2.payload.empty());

    // run(): a result over the maximum is never truncated, and the operation that ran is never
    // recorded as FAILED (a retry would run it again): the claim is left in doubt for the resolver.
    EXPECT_THROW((void)a.run(idem::key("big-3"), [&] { return over; }), idem::error);
    EXPECT_EQ(b.begin(idem::key("big-3")).status, begin_status::in_progress);
    const auto row3 = b.lookup("big-3");
    ASSERT_TRUE(row3);
    EXPECT_EQ(row3->state, idem::record_state::processing) << "an operation that ran was recorded as decided";
}

// The resolver's response is written with its verdict by the compensation statement, and every
// node replays it; one over options.max_payload is not written without it: the claim goes in doubt
// and the next pass asks again.
TEST_F(GlobalPayloads, TheResolversPayloadIsRecordedAndOneOverTheMaximumLeavesTheClaimInDoubt) {
    std::atomic<int> asked{0};
    auto ro = opts();
    ro.max_payload = 16;
    ro.resolve = [&](const idem::expired_claim&) {
        const bool first = asked++ == 0;
        return idem::resolver_answer{idem::resolution::succeeded, 201, first ? std::string(17, 'x') : raw_bytes()};
    };
    idem::global_guard owner(uri_, opts(), gopts("owner"));
    idem::global_guard resolver(uri_, ro, gopts("resolver"));
    const idem::key k("TXR_PAY_v1");
    auto r = owner.begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    sql("UPDATE idempotent_record SET lease_until = 0 WHERE idempotent_key = 'TXR_PAY_v1'");  // expired
    EXPECT_EQ(resolver.compensate(), 0u) << "a 17-byte response over max_payload 16 was recorded";
    EXPECT_EQ(asked.load(), 1);
    EXPECT_EQ(resolver.begin(k).status, begin_status::in_doubt);
    const auto trail = resolver.audit("TXR_PAY_v1");
    ASSERT_FALSE(trail.empty());
    EXPECT_EQ(trail.back().detail.rfind("doubt", 0), 0u) << "not marked in doubt: " << trail.back().detail;
    const auto doubted = resolver.lookup("TXR_PAY_v1");
    ASSERT_TRUE(doubted);
    EXPECT_EQ(doubted->state, idem::record_state::processing);
    EXPECT_TRUE(doubted->payload.empty());
    EXPECT_EQ(resolver.compensate(), 1u);
    EXPECT_EQ(asked.load(), 2);
    EXPECT_EQ(r.ticket.succeed(5, "late"), idem::errc::stale_ticket);
    auto d = owner.begin(k);
    ASSERT_EQ(d.status, begin_status::succeeded);
    EXPECT_EQ(d.outcome, 201u);
    EXPECT_EQ(d.payload, raw_bytes());
    EXPECT_EQ(resolver.begin(k).payload, raw_bytes());
}

TEST_F(GlobalPayloads, APayloadTheLocalTableCannotCacheIsAskedOfTheStore) {
    auto o = opts();
    o.max_payload = 64 << 10;
    o.payload_budget = 64 << 10;  // one chunk: the local table caches one 40 KB payload, not two
    idem::global_guard a(uri_, o, gopts("node-a"));
    const std::string big1(40 << 10, '\x01'), big2(40 << 10, '\x02');
    auto r1 = a.begin(idem::key("cache-1"));
    ASSERT_EQ(r1.status, begin_status::acquired);
    ASSERT_FALSE(r1.ticket.succeed(1, big1));
    auto r2 = a.begin(idem::key("cache-2"));
    ASSERT_EQ(r2.status, begin_status::acquired);
    EXPECT_FALSE(r2.ticket.succeed(2, big2)) << "global scope answered a local budget refusal";
    for (int i = 0; i < 2; ++i) {
        auto d1 = a.begin(idem::key("cache-1"));
        ASSERT_EQ(d1.status, begin_status::succeeded);
        EXPECT_EQ(d1.payload, big1);
        auto d2 = a.begin(idem::key("cache-2"));
        ASSERT_EQ(d2.status, begin_status::succeeded);
        EXPECT_EQ(d2.payload, big2);
        EXPECT_NE(d2.fence, 0u) << "not cached: the store answers";
    }
}

TEST_F(GlobalPayloads, AKeyClaimedAgainDoesNotKeepOldBytes) {
    idem::global_guard a(uri_, opts(), gopts("node-a"));
    idem::global_guard b(uri_, opts(), gopts("node-b"));
    const idem::key k("again");
    auto r = a.begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    ASSERT_FALSE(r.ticket.fail(0, idem::failure_policy::retryable));  // RELEASED
    // Stale bytes on the RELEASED row (an operator, an older writer): the claim must not keep them.
    sql("UPDATE idempotent_record SET payload = '\\xdeadbeef'::bytea WHERE idempotent_key = 'again'");
    auto r2 = b.begin(k);
    ASSERT_EQ(r2.status, begin_status::acquired);
    EXPECT_GE(r2.fence, 2u);
    const auto claimed = a.lookup("again");
    ASSERT_TRUE(claimed);
    EXPECT_TRUE(claimed->payload.empty()) << "the claim kept " << claimed->payload.size() << " old bytes";
    ASSERT_FALSE(r2.ticket.succeed(5));
    auto d = a.begin(k);
    ASSERT_EQ(d.status, begin_status::succeeded);
    EXPECT_EQ(d.outcome, 5u);
    EXPECT_TRUE(d.payload.empty());

    // A success with a payload, released rows taken again by the ordinary path: same rule.
    auto r3 = a.begin(idem::key("again-2"));
    ASSERT_EQ(r3.status, begin_status::acquired);
    ASSERT_FALSE(r3.ticket.fail(0, idem::failure_policy::retryable));
    auto r4 = b.begin(idem::key("again-2"));
    ASSERT_EQ(r4.status, begin_status::acquired);
    ASSERT_FALSE(r4.ticket.succeed(9, "second"));
    EXPECT_EQ(a.begin(idem::key("again-2")).payload, "second");
}

TEST_F(GlobalPayloads, BytesSurviveARestart) {
    const std::string bytes = raw_bytes();
    {
        idem::global_guard a(uri_, opts(), gopts("node-a"));
        auto r = a.begin(idem::key("durable"));
        ASSERT_EQ(r.status, begin_status::acquired);
        ASSERT_FALSE(r.ticket.succeed(3, bytes));
        ASSERT_EQ(a.begin(idem::key("durable")).payload, bytes);
    }
    idem::global_guard a(uri_, opts(), gopts("node-a"));  // a restarted node: an empty local table
    idem::global_guard c(uri_, opts(), gopts("node-c"));
    auto d = a.begin(idem::key("durable"));
    ASSERT_EQ(d.status, begin_status::succeeded);
    EXPECT_EQ(d.payload, bytes);
    int runs = 0;
    EXPECT_EQ(c.run(idem::key("durable"),
                    [&] {
                        ++runs;
                        return std::string();
                    }),
              bytes);
    EXPECT_EQ(runs, 0);
}

TEST_F(GlobalPayloads, OpeningADatabaseWithoutThePayloadColumnAddsIt) {
    { idem::global_guard a(uri_, opts(), gopts("node-a")); }
    sql("ALTER TABLE idempotent_record DROP COLUMN payload");  // a database of before payloads
    idem::global_guard a(uri_, opts(), gopts("node-a"));
    idem::global_guard b(uri_, opts(), gopts("node-b"));
    auto r = a.begin(idem::key("migrated"));
    ASSERT_EQ(r.status, begin_status::acquired);
    ASSERT_FALSE(r.ticket.succeed(4, raw_bytes()));
    EXPECT_EQ(b.begin(idem::key("migrated")).payload, raw_bytes());
}

}  // namespace
