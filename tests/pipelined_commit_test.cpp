// Pipelined commits (pipeline_core.hpp "Lanes", docs/pg_pipeline.md): a store with several lanes
// keeps several batches in flight, and still
//   KeyOrder*       never commits a key's later row before its earlier one, also when the earlier
//                   one's lane fails or its commit is unknown while another lane commits;
//   Waiters*        wakes a sync waiter only when every row up to its own is committed;
//   FailedEarlier*  acknowledges nothing that is not committed when an earlier lane fails while a
//                   later lane commits.
// gated_store decides when and how each lane's apply ends (promises the test fulfils; no sleeps) and
// checks both rules itself at the moment they could break: at each commit (every earlier-offered row
// of the key is committed) and at each wake-up (every seq up to the waiter's is committed).
//
// Built a second time with IDEM_TEST_POSTGRES (pipelined_commit_pg_test, label postgres):
//   PipelinedPg.*   64 threads released by one latch run sync claims and successes over a
//                   postgres_store with 4 lanes; every acknowledged claim and success is in the
//                   tables, in order, and each contended key was granted once.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "idem/detail/pipeline/flush_pipeline.hpp"
#include "idem/store.hpp"
#include "support/threads.hpp"

#ifdef IDEM_TEST_POSTGRES
#include "idem/durable.hpp"
#include "idem/stores/postgres_store.hpp"
#include "support/pg_database.hpp"

extern "C" const char* __lsan_default_suppressions() { return "leak:libpqxx\n"; }
#endif

namespace {

using namespace std::chrono_literals;
using idem::record_state;
using idem::transition_cause;

#ifndef IDEM_TEST_POSTGRES

/// How the test ends one apply call.
enum class verdict {
    commit,                 ///< applies the rows
    fail,                   ///< store_unavailable, nothing written
    unknown_committed,      ///< applies the rows, then throws commit_unknown
    unknown_not_committed,  ///< throws commit_unknown, nothing written
};

/// A memory_store behind a mutex, with `lanes` lanes whose apply calls wait for the test's verdict.
class gated_store final : public idem::store, public idem::pipelined_store {
public:
    struct call {
        std::size_t lane = 0;
        std::vector<std::uint64_t> seqs;
        std::promise<verdict> gate;
        bool settled = false;
    };

    explicit gated_store(std::size_t lanes) : lanes_(lanes) {}

    // The test names each row it offered, before it lets any apply end (so commit-time checks see it).
    void offered(const std::string& k, std::uint64_t seq) {
        std::lock_guard lk(m_);
        offered_[k].push_back(seq);
    }

    std::size_t lanes() const noexcept override { return lanes_; }
    void apply_on(std::size_t lane, std::span<const idem::store_row> rows, std::uint64_t batch_id) override {
        auto c = std::make_shared<call>();
        c->lane = lane;
        for (const auto& r : rows) c->seqs.push_back(r.seq);
        auto gate = c->gate.get_future();
        {
            std::lock_guard lk(m_);
            calls_.push_back(c);
            if (open_) settle_locked(*c, verdict::commit);
        }
        cv_.notify_all();
        const verdict v = gate.get();
        std::lock_guard lk(m_);
        if (v == verdict::fail) throw idem::error(idem::errc::store_unavailable, "gated store: lane failed");
        if (v == verdict::unknown_not_committed) throw idem::commit_unknown("gated store: commit unknown (not committed)");
        // A key's later row never commits before an earlier one: every row of the key offered before
        // this one is committed already, or is in this batch.
        std::set<std::uint64_t> here(c->seqs.begin(), c->seqs.end());
        for (const auto& r : rows)
            for (const std::uint64_t earlier : offered_[std::string(r.t.k.view())])
                if (earlier < r.seq && !committed_.count(earlier) && !here.count(earlier))
                    violations_.push_back("seq " + std::to_string(r.seq) + " of key " + std::string(r.t.k.view()) +
                                          " committed before its earlier seq " + std::to_string(earlier));
        inner_.apply(rows, batch_id);
        committed_.insert(here.begin(), here.end());
        if (v == verdict::unknown_committed) throw idem::commit_unknown("gated store: commit unknown (committed)");
    }
    bool committed_on(std::size_t, std::uint64_t batch_id) override {
        std::lock_guard lk(m_);
        return inner_.committed(batch_id);
    }
    void reconnect_on(std::size_t) override {}

    void apply(std::span<const idem::store_row> rows, std::uint64_t batch_id) override { apply_on(0, rows, batch_id); }
    bool committed(std::uint64_t batch_id) override { return committed_on(0, batch_id); }
    void load(const std::function<void(const idem::stored_record&)>& fn) override { inner_.load(fn); }
    std::optional<idem::stored_record> get(std::string_view k) override {
        std::lock_guard lk(m_);
        return inner_.get(k);
    }
    std::vector<idem::audit_entry> audit(std::string_view k) override {
        std::lock_guard lk(m_);
        return inner_.audit(k);
    }
    void scan_audit(const std::function<void(const idem::audit_entry&)>& fn) override { inner_.scan_audit(fn); }
    std::string name() const override { return "gated"; }
    std::uint64_t max_fence() override { return 0; }

    /// The n-th apply call (0-based) holding `seq`; fails the test after 10 s (a hang, not a race).
    std::shared_ptr<call> wait_call(std::uint64_t seq, int nth = 0) {
        std::unique_lock lk(m_);
        std::shared_ptr<call> found;
        const bool ok = cv_.wait_for(lk, 10s, [&] {
            int n = 0;
            for (auto& c : calls_)
                if (std::find(c->seqs.begin(), c->seqs.end(), seq) != c->seqs.end() && n++ == nth) {
                    found = c;
                    return true;
                }
            return false;
        });
        if (!ok) ADD_FAILURE() << "no apply call #" << nth << " holding seq " << seq << " within 10 s";
        return found;
    }
    /// Ends a waiting apply call with `v`.
    void settle(const std::shared_ptr<call>& c, verdict v) {
        std::lock_guard lk(m_);
        settle_locked(*c, v);
    }
    /// From now on every apply call commits at once, waiting ones too: a failed test ends instead of
    /// leaving flusher threads blocked on gates nobody will open.
    void open_all() {
        std::lock_guard lk(m_);
        open_ = true;
        for (auto& c : calls_) settle_locked(*c, verdict::commit);
    }
    /// Apply calls holding `seq` so far.
    int calls_holding(std::uint64_t seq) {
        std::lock_guard lk(m_);
        int n = 0;
        for (auto& c : calls_) n += std::find(c->seqs.begin(), c->seqs.end(), seq) != c->seqs.end();
        return n;
    }
    /// Whether an apply call holding `seq` has started.
    bool started(std::uint64_t seq) { return calls_holding(seq) != 0; }
    /// A waiter woke for `seq`: every seq up to it must be committed.
    void woke(std::uint64_t seq) {
        std::lock_guard lk(m_);
        for (std::uint64_t s = 1; s <= seq; ++s)
            if (!committed_.count(s))
                violations_.push_back("a waiter of seq " + std::to_string(seq) + " woke while seq " + std::to_string(s) +
                                      " was not committed");
    }
    std::vector<std::string> violations() {
        std::lock_guard lk(m_);
        return violations_;
    }

private:
    void settle_locked(call& c, verdict v) {
        if (c.settled) return;
        c.settled = true;
        c.gate.set_value(v);
    }

    const std::size_t lanes_;
    bool open_ = false;
    std::mutex m_;
    std::condition_variable cv_;
    idem::memory_store inner_;
    std::vector<std::shared_ptr<call>> calls_;
    std::map<std::string, std::vector<std::uint64_t>> offered_;
    std::set<std::uint64_t> committed_;
    std::vector<std::string> violations_;
};

/// A sync flush pipeline over a gated store: batches of one row, so every row is its own job.
class Pipelined : public ::testing::Test {
protected:
    Pipelined() : store_(2), pipe_(store_, opts(), [](std::chrono::nanoseconds t) { return t.count() / 1'000'000; }) {
        pipe_.start();
    }
    ~Pipelined() override {
        store_.open_all();
        for (auto& w : waiters_) w.join();
    }
    static idem::store_options opts() {
        idem::store_options so;
        so.mode = idem::durability::sync;
        so.max_batch = 1;
        so.idle_poll = 20us;
        so.max_backoff = 1ms;
        so.sync_timeout = 30s;
        return so;
    }
    std::uint64_t offer(const std::string& k, record_state from, record_state to, transition_cause cause,
                        std::uint64_t fence) {
        EXPECT_TRUE(pipe_.reserve());
        idem::transition t;
        t.k = idem::key(k);
        t.from = from;
        t.to = to;
        t.cause = cause;
        t.fence = fence;
        const std::uint64_t seq = pipe_.offer(t);
        store_.offered(k, seq);
        return seq;
    }
    std::uint64_t claim(const std::string& k, std::uint64_t fence) {
        return offer(k, record_state::absent, record_state::processing, transition_cause::claim, fence);
    }
    std::uint64_t succeed(const std::string& k, std::uint64_t fence) {
        return offer(k, record_state::processing, record_state::succeeded, transition_cause::succeed, fence);
    }
    /// A sync waiter for seq (what begin() does in sync mode); checks the prefix when it wakes.
    void wait_for(std::uint64_t seq) {
        waiters_.emplace_back([this, seq] {
            const auto r = pipe_.await(seq);
            EXPECT_EQ(r, idem::durability_wait::committed) << "seq " << seq;
            store_.woke(seq);
        });
    }
    void finish() {
        for (auto& w : waiters_) w.join();
        waiters_.clear();
        EXPECT_TRUE(pipe_.flush(10s));
        for (const auto& v : store_.violations()) ADD_FAILURE() << v;
    }

    gated_store store_;
    idem::detail::pipeline::flush_pipeline pipe_;
    std::vector<std::thread> waiters_;
};

TEST_F(Pipelined, RunsTwoLanes) { EXPECT_EQ(pipe_.lanes(), 2u); }

TEST_F(Pipelined, KeyOrderHeldWhileEarlierLaneFailsAndLaterLaneCommits) {
    const auto a1 = claim("A", 1);
    const auto b1 = claim("B", 2);
    auto ca = store_.wait_call(a1);  // both lanes busy: A's claim on one, B's on the other
    auto cb = store_.wait_call(b1);
    ASSERT_TRUE(ca && cb);
    EXPECT_NE(ca->lane, cb->lane);
    const auto a2 = succeed("A", 1);  // A's later row: must wait for A's claim whatever happens
    wait_for(b1);
    wait_for(a2);
    store_.settle(cb, verdict::commit);  // the later lane commits first
    // A lane is free now. C's claim, offered after A's success, reaching a store call proves the
    // flusher looked at A's success (deferred rows are taken first, in order) and held it back.
    const auto c1 = claim("C", 3);
    auto cc = store_.wait_call(c1);
    ASSERT_TRUE(cc);
    EXPECT_FALSE(store_.started(a2)) << "A's success went to the store while A's claim was in flight";
    EXPECT_FALSE(pipe_.durable(b1)) << "B's claim counts as durable while seq " << a1 << " is undecided";
    store_.settle(cc, verdict::commit);
    store_.settle(ca, verdict::fail);  // the earlier lane fails: A's claim is retried before A's success
    auto ca2 = store_.wait_call(a1, 1);
    ASSERT_TRUE(ca2);
    EXPECT_FALSE(store_.started(a2)) << "A's success went to the store before A's failed claim was retried";
    EXPECT_FALSE(pipe_.durable(b1));
    EXPECT_FALSE(pipe_.durable(c1));
    store_.settle(ca2, verdict::commit);
    auto ca3 = store_.wait_call(a2);
    ASSERT_TRUE(ca3);
    store_.settle(ca3, verdict::commit);
    finish();
    EXPECT_TRUE(pipe_.durable(a2));
    const auto trail = store_.audit("A");
    ASSERT_EQ(trail.size(), 2u);
    EXPECT_EQ(trail[0].to, record_state::processing);
    EXPECT_EQ(trail[1].to, record_state::succeeded);
    EXPECT_EQ(store_.get("A")->state, record_state::succeeded);
}

TEST_F(Pipelined, KeyOrderHeldThroughAnUnknownCommit) {
    const auto a1 = claim("A", 1);
    const auto b1 = claim("B", 2);
    auto ca = store_.wait_call(a1);
    auto cb = store_.wait_call(b1);
    ASSERT_TRUE(ca && cb);
    const auto a2 = succeed("A", 1);
    wait_for(a1);
    wait_for(b1);
    wait_for(a2);
    store_.settle(ca, verdict::unknown_not_committed);  // A's claim: in doubt, and in fact not written
    store_.settle(cb, verdict::commit);
    // After the store answers "not committed", A's claim is applied again (a second call), still
    // before A's success.
    auto ca2 = store_.wait_call(a1, 1);
    ASSERT_TRUE(ca2);
    EXPECT_FALSE(store_.started(a2));
    EXPECT_FALSE(pipe_.durable(b1));
    store_.settle(ca2, verdict::unknown_committed);  // written this time, but in doubt again
    auto ca3 = store_.wait_call(a2);                 // resolved by committed_on(): no third apply of the claim
    ASSERT_TRUE(ca3);
    store_.settle(ca3, verdict::commit);
    finish();
    EXPECT_EQ(store_.calls_holding(a1), 2) << "a committed claim was applied again";
    EXPECT_EQ(store_.audit("A").size(), 2u);
}

TEST_F(Pipelined, WaitersWakeForAContiguousCommittedPrefixOnly) {
    // Lanes finish in reverse order of seq, many times over; each waiter checks the prefix on waking.
    for (int round = 0; round < 50; ++round) {
        const std::string k1 = "K" + std::to_string(round) + "a", k2 = "K" + std::to_string(round) + "b";
        const auto s1 = claim(k1, 10 + static_cast<std::uint64_t>(round));
        const auto s2 = claim(k2, 10 + static_cast<std::uint64_t>(round));
        auto c1 = store_.wait_call(s1);
        auto c2 = store_.wait_call(s2);
        ASSERT_TRUE(c1 && c2);
        wait_for(s1);
        wait_for(s2);
        store_.settle(c2, verdict::commit);
        if (round % 2 == 0) {
            store_.settle(c1, verdict::fail);
            auto again = store_.wait_call(s1, 1);
            ASSERT_TRUE(again);
            store_.settle(again, verdict::commit);
        } else {
            store_.settle(c1, verdict::commit);
        }
        finish();
    }
}

#else  // IDEM_TEST_POSTGRES

class PipelinedPg : public ::testing::Test {
protected:
    void SetUp() override {
        std::string why;
        ASSERT_TRUE(db_.create(&why)) << why;
    }
    void TearDown() override {
        std::string why;
        if (!db_.drop(&why)) ADD_FAILURE() << why;
    }
    idem_test::pg_database db_;
};

TEST_F(PipelinedPg, EveryAcknowledgedTransitionOfRacingThreadsIsInTheTables) {
    constexpr std::size_t threads = 64, own = 40, shared = 64;
    idem::options o;
    o.capacity = 1u << 16;
    idem::store_options so;
    so.mode = idem::durability::sync;
    so.sync_timeout = 60s;
    idem::durable_guard g(std::make_unique<idem::postgres_store>(db_.uri(), 5s, 4), o, so);
    ASSERT_EQ(dynamic_cast<idem::pipelined_store&>(g.backing_store()).lanes(), 4u);
    struct acked {
        std::vector<std::string> claims, successes;
    };
    std::vector<acked> acks(threads);
    idem_test::run_on_latch(threads, [&](std::size_t t) {
        for (std::size_t i = 0; i < own + shared; ++i) {
            // Own keys, and shared keys every thread races for (each granted once).
            const std::string k = i < own ? "T" + std::to_string(t) + "_" + std::to_string(i) + "_PAY_v1"
                                          : "S" + std::to_string((i - own + t) % shared) + "_PAY_v1";
            auto r = g->begin(idem::key(k));
            if (!r) continue;
            acks[t].claims.push_back(k);
            if (!r.ticket.succeed(7)) acks[t].successes.push_back(k);
        }
    });
    ASSERT_TRUE(g.flush(60s));
    const auto s = g.snapshot();
    EXPECT_EQ(s.store_errors, 0u) << g.last_store_error();
    idem::postgres_store check(db_.uri(), 5s, 1);
    std::map<std::string, int> granted;
    std::size_t successes = 0;
    for (const auto& a : acks) {
        for (const auto& k : a.claims) {
            ++granted[k];
            EXPECT_TRUE(check.get(k)) << "acknowledged claim of " << k << " is not in idempotent_record";
        }
        for (const auto& k : a.successes) {
            ++successes;
            const auto rec = check.get(k);
            ASSERT_TRUE(rec) << k;
            EXPECT_EQ(rec->state, record_state::succeeded) << k;
            EXPECT_EQ(rec->outcome, 7u) << k;
            const auto trail = check.audit(k);
            ASSERT_EQ(trail.size(), 2u) << k;
            EXPECT_EQ(trail[0].to, record_state::processing) << k;
            EXPECT_EQ(trail[1].to, record_state::succeeded) << k;
        }
    }
    for (const auto& [k, n] : granted) EXPECT_EQ(n, 1) << k << " was granted " << n << " times";
    EXPECT_EQ(granted.size(), threads * own + shared);
    EXPECT_EQ(successes, threads * own + shared);
}

#endif

}  // namespace
