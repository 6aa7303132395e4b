// recovery_start::claims_first: a durable guard that serves once its claims in flight are in memory,
// while a thread streams the keys of the idempotency window into the cold window. Until that stream
// completes, every key memory does not hold is read from the store before it is granted. Over every
// store kind: SQLite, PostgreSQL and MySQL open a reader and start claims first; memory and RocksDB
// cannot, and start as load_window does.
//
//   DuringTheStreamEveryKeyOfTheWindowIsAnsweredFromTheStore  stream held open: every decided key is
//                                           a duplicate with its outcome, every claim in flight is
//                                           in_progress, fresh keys are granted (each read the store);
//                                           once complete, fresh keys read no store
//   RacersDuringTheStreamNeverRunAWindowKey threads on a latch, stream held: 0 grants of a key the
//                                           store holds, each fresh key granted once
//   AStreamTheStoreInterruptsStartsAgain    store_unavailable twice (and one reconnect refused), then
//                                           complete (3 attempts)
//   AStreamThatFailsForGoodLeavesTheFilterPartial  corrupt_record: not complete, the error named, the
//                                           Prometheus gauge 0, and still no window key granted
//   DestroyedWhileStreaming                 the guard is destroyed with the stream held: it stops
//   NewFencesStartAboveEveryStoredFence     a key pruned from the store and claimed again gets a
//                                           fence above every fence the store ever held
//   FallsBackToLoadWindow                   no reader (memory, RocksDB) or ordered versions: the
//                                           whole window is read before serving
//   SqliteFindsClaimsAndWindowKeysFromIndexes (SQLite) the queries' plans use the indexes, and their
//                                           answers match load()
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <sqlite3.h>

#include <atomic>
#include <latch>
#include <map>
#include <set>
#include <thread>

#include "support/store_fixtures.hpp"
#include "support/store_kinds.hpp"

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::record_state;
using guard_t = idem::basic_durable_guard<std::atomic, idem::manual_clock>;

/// What a test steers in held_stream: the window's stream waits at `gate` before its first key,
/// the next `unavailable` streams fail with store_unavailable, and with `damaged` every stream
/// fails with corrupt_record. `streams` counts the streams started.
struct stream_control {
    idem_test::commit_gate gate;
    std::atomic<int> unavailable{0};
    std::atomic<bool> damaged{false};
    std::atomic<int> streams{0};
    std::atomic<int> reconnects_failing{0};  // the next reconnects of the reader throw store_unavailable
};

/// Forwards to a store; its reader (the connection the cold loader streams on) is held as above.
class held_stream final : public idem_test::forwarding_store {
public:
    held_stream(idem::store& inner, stream_control& c, std::unique_ptr<idem::store> owned = nullptr)
        : forwarding_store(inner), c_(c), owned_(std::move(owned)) {}
    void load_window_keys(std::int64_t since_ms, const std::function<void(std::string_view, std::int64_t)>& fn) override {
        ++c_.streams;
        c_.gate.pass();
        if (c_.unavailable.load() > 0) {
            --c_.unavailable;
            throw idem::error(idem::errc::store_unavailable, "held stream: injected outage");
        }
        if (c_.damaged.load()) throw idem::error(idem::errc::corrupt_record, "held stream: injected damage");
        inner_.load_window_keys(since_ms, fn);
    }
    std::unique_ptr<idem::store> open_reader() override {
        auto r = inner_.open_reader();
        if (!r) return nullptr;
        idem::store& inner = *r;
        return std::make_unique<held_stream>(inner, c_, std::move(r));
    }
    void reconnect() override {
        if (c_.reconnects_failing.load() > 0) {
            --c_.reconnects_failing;
            throw idem::error(idem::errc::store_unavailable, "held stream: reconnect refused");
        }
        inner_.reconnect();
    }

private:
    stream_control& c_;
    std::unique_ptr<idem::store> owned_;  // a reader's own connection
};

class ClaimsFirst : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        kind_.prepare(GetParam(), "idem-claims-first");
        ASSERT_FALSE(HasFatalFailure());
        reader_kind_ = GetParam() == "sqlite" || GetParam() == "postgres" || GetParam() == "mysql";
    }

    static idem::options opts(std::size_t capacity = 256) {
        idem::options o;
        o.capacity = capacity;
        o.maintenance_interval = {};
        o.lease = 1h;  // the claims in flight are still leased at the restart: in_progress, not compensated
        return o;
    }

    std::unique_ptr<guard_t> open(idem::store_options so = {}, idem::options o = opts()) {
        so.prune_interval = {};
        return std::make_unique<guard_t>(kind_.open(), std::move(o), so, clock_);
    }

    /// A restart in claims_first mode over held_stream.
    std::unique_ptr<guard_t> restart(idem::options o = opts()) {
        idem::store_options so;
        so.start = idem::recovery_start::claims_first;
        so.prune_interval = {};
        so.max_backoff = 20ms;
        inner_ = kind_.open();
        return std::make_unique<guard_t>(std::make_unique<held_stream>(*inner_, control_), std::move(o), so, clock_);
    }

    /// The first life: `decided` keys D<i>_PAY_v1 succeeded with outcome 1000 + i, `claims` keys
    /// C<i>_PAY_v1 claimed and abandoned (in flight at the "crash"). Returns the largest fence.
    std::uint64_t first_life(int decided, int claims) {
        auto g = open();
        std::uint64_t fence = 0;
        for (int i = 0; i < decided; ++i) {
            auto r = (*g)->begin(idem::key("D" + std::to_string(i) + "_PAY_v1"), 7);
            EXPECT_EQ(r.status, begin_status::acquired);
            fence = std::max(fence, r.fence);
            EXPECT_FALSE(r.ticket.succeed(static_cast<std::uint64_t>(1000 + i)));
        }
        for (int i = 0; i < claims; ++i) {
            auto r = (*g)->begin(idem::key("C" + std::to_string(i) + "_PAY_v1"), 7);
            EXPECT_EQ(r.status, begin_status::acquired);
            fence = std::max(fence, r.fence);
            idem_test::abandon(std::move(r.ticket));
        }
        EXPECT_TRUE(g->flush()) << g->last_store_error();
        return fence;
    }

    idem::manual_clock clock_;
    idem_test::store_kind kind_;
    bool reader_kind_ = false;
    stream_control control_;              // declared before the guards: outlives their cold loaders
    std::unique_ptr<idem::store> inner_;  // the connection held_stream forwards to
};

TEST_P(ClaimsFirst, DuringTheStreamEveryKeyOfTheWindowIsAnsweredFromTheStore) {
    first_life(40, 3);
    control_.gate.close();
    auto g = restart();
    const auto rep = g->recovery();
    if (!reader_kind_) {
        EXPECT_FALSE(rep.claims_first);
        EXPECT_TRUE(rep.cold_complete);
        EXPECT_EQ(rep.records + rep.cold, 43u);
        control_.gate.open();
        return;
    }
    ASSERT_TRUE(rep.claims_first);
    EXPECT_FALSE(rep.cold_complete);
    EXPECT_EQ(rep.records, 3u) << "only the claims in flight are read before serving";
    EXPECT_EQ(rep.processing, 3u);
    ASSERT_TRUE(idem_test::wait_for([&] { return control_.gate.waiting() == 1; })) << "the stream started";

    // Half the decided keys now, while the filter is partial: each is read from the store.
    const auto before = g->snapshot();
    for (int i = 0; i < 20; ++i) {
        const auto r = (*g)->begin(idem::key("D" + std::to_string(i) + "_PAY_v1"), 7);
        EXPECT_EQ(r.status, begin_status::succeeded) << i;
        EXPECT_EQ(r.outcome, static_cast<std::uint64_t>(1000 + i)) << i;
    }
    for (int i = 0; i < 3; ++i)
        EXPECT_EQ((*g)->begin(idem::key("C" + std::to_string(i) + "_PAY_v1"), 7).status, begin_status::in_progress) << i;
    for (int i = 0; i < 10; ++i) {
        auto r = (*g)->begin(idem::key("N" + std::to_string(i) + "_PAY_v1"));
        ASSERT_EQ(r.status, begin_status::acquired) << i;
        ASSERT_FALSE(r.ticket.succeed(1));
    }
    EXPECT_EQ(g->snapshot().recalls - before.recalls, 30u) << "20 decided keys and 10 fresh ones, one store read each";
    // A recalled key is in memory again: its next duplicate reads no store.
    const auto recalls = g->snapshot().recalls;
    EXPECT_EQ((*g)->begin(idem::key("D0_PAY_v1"), 7).status, begin_status::succeeded);
    EXPECT_EQ(g->snapshot().recalls, recalls);

    control_.gate.open();
    ASSERT_TRUE(g->wait_for_cold_window(30s)) << g->recovery().cold_error;
    const auto done = g->recovery();
    EXPECT_TRUE(done.cold_complete);
    EXPECT_GE(done.cold, 43u) << "every record of the window, the claims included";
    EXPECT_EQ(done.cold_attempts, 1u);
    EXPECT_TRUE(done.cold_error.empty()) << done.cold_error;
    EXPECT_GE(done.cold_complete_after, done.elapsed);

    // The rest of the decided keys, now through the complete filter: still their outcomes.
    for (int i = 20; i < 40; ++i) {
        const auto r = (*g)->begin(idem::key("D" + std::to_string(i) + "_PAY_v1"), 7);
        EXPECT_EQ(r.status, begin_status::succeeded) << i;
        EXPECT_EQ(r.outcome, static_cast<std::uint64_t>(1000 + i)) << i;
    }
    // Fresh keys now skip the store but for the filter's false positives (0.42 % each).
    const auto mark = g->snapshot().recalls;
    for (int i = 0; i < 100; ++i) {
        auto r = (*g)->begin(idem::key("M" + std::to_string(i) + "_PAY_v1"));
        ASSERT_EQ(r.status, begin_status::acquired) << i;
        ASSERT_FALSE(r.ticket.succeed(1));
    }
    EXPECT_LE(g->snapshot().recalls - mark, 5u);
    ASSERT_TRUE(g->flush());
    g.reset();
    inner_.reset();
    auto st = kind_.open();
    EXPECT_TRUE(idem_test::verify_clean(*st));
}

TEST_P(ClaimsFirst, RacersDuringTheStreamNeverRunAWindowKey) {
    constexpr int decided = 60, threads = 4, fresh_each = 15;
    first_life(decided, 2);
    control_.gate.close();
    auto g = restart();
    std::atomic<int> window_grants{0}, fresh_grants{0}, wrong{0};
    std::latch start(threads);
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            start.arrive_and_wait();
            for (int i = 0; i < decided; ++i) {
                const int k = (i + t * 17) % decided;  // each thread in its own order: they meet on keys
                const auto r = (*g)->begin(idem::key("D" + std::to_string(k) + "_PAY_v1"), 7);
                if (r.status == begin_status::acquired) ++window_grants;
                else if (r.status != begin_status::succeeded || r.outcome != static_cast<std::uint64_t>(1000 + k))
                    if (r.status != begin_status::in_progress) ++wrong;  // in_progress: a racer holds the recall
            }
            for (int i = 0; i < 2; ++i)
                if ((*g)->begin(idem::key("C" + std::to_string(i) + "_PAY_v1"), 7).status == begin_status::acquired)
                    ++window_grants;
            for (int i = 0; i < fresh_each; ++i) {
                // Every thread asks every fresh key: exactly one of them runs it.
                auto r = (*g)->begin(idem::key("R" + std::to_string(i) + "_PAY_v1"));
                if (r.status == begin_status::acquired) {
                    ++fresh_grants;
                    (void)r.ticket.succeed(5);
                }
            }
        });
    for (auto& t : ts) t.join();
    control_.gate.open();
    EXPECT_EQ(window_grants.load(), 0) << "a key the store holds was granted again";
    EXPECT_EQ(fresh_grants.load(), fresh_each);
    EXPECT_EQ(wrong.load(), 0);
    if (reader_kind_) {
        EXPECT_TRUE(g->wait_for_cold_window(30s)) << g->recovery().cold_error;
    }
}

TEST_P(ClaimsFirst, AStreamTheStoreInterruptsStartsAgain) {
    first_life(10, 0);
    control_.unavailable = 2;
    control_.reconnects_failing = 1;  // the first reconnect fails too: the next attempt still runs
    auto g = restart();
    if (!reader_kind_) {  // no reader: nothing is streamed, the window was read before serving
        EXPECT_EQ(control_.streams.load(), 0);
        EXPECT_TRUE(g->recovery().cold_complete);
        return;
    }
    ASSERT_TRUE(g->wait_for_cold_window(30s)) << g->recovery().cold_error;
    const auto rep = g->recovery();
    EXPECT_EQ(rep.cold_attempts, 3u);
    EXPECT_EQ(control_.streams.load(), 3);
    EXPECT_GE(rep.cold, 10u);
    EXPECT_TRUE(rep.cold_error.empty()) << rep.cold_error;
}

TEST_P(ClaimsFirst, AStreamThatFailsForGoodLeavesTheFilterPartial) {
    first_life(10, 0);
    control_.damaged = true;
    auto g = restart();
    if (!reader_kind_) {
        EXPECT_EQ(control_.streams.load(), 0);
        EXPECT_TRUE(g->wait_for_cold_window(30s));
        return;
    }
    EXPECT_FALSE(g->wait_for_cold_window(30s));
    const auto rep = g->recovery();
    EXPECT_FALSE(rep.cold_complete);
    EXPECT_EQ(rep.cold_attempts, 1u) << "damage is not retried";
    EXPECT_NE(rep.cold_error.find("injected damage"), std::string::npos) << rep.cold_error;
    EXPECT_NE(idem::to_prometheus(rep).find("idem_recovery_cold_complete 0"), std::string::npos);
    // Partial for good, and still correct: every decided key is answered from the store.
    for (int i = 0; i < 10; ++i) {
        const auto r = (*g)->begin(idem::key("D" + std::to_string(i) + "_PAY_v1"), 7);
        EXPECT_EQ(r.status, begin_status::succeeded) << i;
        EXPECT_EQ(r.outcome, static_cast<std::uint64_t>(1000 + i)) << i;
    }
}

TEST_P(ClaimsFirst, DestroyedWhileStreaming) {
    first_life(20, 1);
    control_.gate.close();
    auto g = restart();
    if (reader_kind_) {
        ASSERT_TRUE(idem_test::wait_for([&] { return control_.gate.waiting() == 1; }));
    }
    // The destructor stops the loader; the gate opens from another thread once it waits for it.
    std::thread opener([&] { control_.gate.open(); });
    g.reset();
    opener.join();
    // The next life still knows every key.
    inner_.reset();
    auto again = restart();
    ASSERT_EQ((*again)->begin(idem::key("D3_PAY_v1"), 7).status, begin_status::succeeded);
    if (reader_kind_) {
        EXPECT_TRUE(again->wait_for_cold_window(30s)) << again->recovery().cold_error;
    }
}

TEST_P(ClaimsFirst, NewFencesStartAboveEveryStoredFence) {
    const std::uint64_t top = first_life(30, 0);  // no claim in flight: the floor must come from max_fence()
    auto g = restart();
    auto r = (*g)->begin(idem::key("AFTER_PAY_v1"));
    ASSERT_EQ(r.status, begin_status::acquired);
    EXPECT_GT(r.fence, top) << "a fence at or below one the store holds could be refused by it, or mistaken for "
                               "an earlier claim";
    ASSERT_FALSE(r.ticket.succeed(1));
    if (reader_kind_) {
        EXPECT_TRUE(g->wait_for_cold_window(30s)) << g->recovery().cold_error;
    }
}

TEST_P(ClaimsFirst, FallsBackToLoadWindow) {
    first_life(12, 1);
    idem::options o = opts();
    o.ordered_versions = true;
    auto g = restart(o);
    const auto rep = g->recovery();
    EXPECT_FALSE(rep.claims_first) << "ordered versions are seeded from every record: the window is read first";
    EXPECT_TRUE(rep.cold_complete);
    EXPECT_EQ(rep.records + rep.cold, 13u);
    EXPECT_EQ(control_.streams.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Kinds, ClaimsFirst, ::testing::ValuesIn(idem_test::store_kinds()),
                         [](const auto& info) { return info.param; });

/// EXPLAIN QUERY PLAN of `sql` on `db`, one line per step.
std::string plan(const std::string& db, const std::string& sql) {
    sqlite3* h = nullptr;
    EXPECT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
    sqlite3_stmt* s = nullptr;
    std::string out;
    EXPECT_EQ(sqlite3_prepare_v2(h, ("EXPLAIN QUERY PLAN " + sql).c_str(), -1, &s, nullptr), SQLITE_OK) << sqlite3_errmsg(h);
    while (s != nullptr && sqlite3_step(s) == SQLITE_ROW)
        out += std::string(reinterpret_cast<const char*>(sqlite3_column_text(s, 3))) + "\n";
    sqlite3_finalize(s);
    sqlite3_close(h);
    return out;
}

TEST(ClaimsFirstSqlite, ClaimsAndWindowKeysComeFromIndexesAndMatchLoad) {
    idem_test::temp_dir dir("idem-claims-first-sqlite");
    const std::string db = dir.file("c.db");
    std::uint64_t fence = 0;
    {
        idem::sqlite_store st(db);
        std::vector<idem::store_row> rows;
        for (int i = 0; i < 50; ++i) {
            const std::string k = "K" + std::to_string(i) + "_PAY_v1";
            const std::uint64_t f = 100 + static_cast<std::uint64_t>(i) * 3;
            fence = std::max(fence, f);
            rows.push_back(idem_test::row({.key = k, .fence = f, .at_ms = 1'700'000'000'000 + i}, rows.size() + 1));
            if (i % 5 != 0)  // every fifth key stays PROCESSING
                rows.push_back(idem_test::row({.key = k,
                                               .from = record_state::processing,
                                               .to = record_state::succeeded,
                                               .cause = idem::transition_cause::succeed,
                                               .fence = f,
                                               .at_ms = 1'700'000'000'000 + i},
                                              rows.size() + 1));
        }
        idem_test::sort_like_flusher(rows);
        st.apply(rows, 1);
        EXPECT_EQ(st.max_fence(), fence) << "idem_schema.max_fence follows the batches";

        std::set<std::string> claims, expected_claims, keys, expected_keys;
        for (const auto& [k, r] : idem_test::load_all(st)) {
            if (r.state == record_state::processing) expected_claims.insert(k);
            if (r.updated_ms >= 1'700'000'000'020) expected_keys.insert(k);
        }
        st.load_claims([&](const idem::stored_record& r) { claims.insert(r.key); });
        st.load_window_keys(1'700'000'000'020, [&](std::string_view k, std::int64_t) { keys.emplace(k); });
        EXPECT_EQ(claims, expected_claims);
        EXPECT_EQ(claims.size(), 10u);
        EXPECT_EQ(keys, expected_keys);
        EXPECT_EQ(keys.size(), 30u);
    }
    const std::string claims_plan = plan(db, idem::detail::sqlite::select_claims);
    EXPECT_NE(claims_plan.find("INDEX idx_idempotent_record_claims"), std::string::npos) << claims_plan;
    const std::string keys_plan = plan(db, idem::detail::sqlite::select_window_keys);
    EXPECT_NE(keys_plan.find("COVERING INDEX idx_idempotent_record_updated"), std::string::npos)
        << "the window's keys are read from the index alone, never the rows: " << keys_plan;
}

}  // namespace
