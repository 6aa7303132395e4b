// flush_pipeline_test: the flush pipeline's two waits (detail/pipeline/flush_pipeline.hpp), driven directly
// over a real store and through a durable guard. Counts, never durations: every assertion is on a
// number of store reads, queued requests or wake-ups, so a slow or loaded machine cannot fail it.
//
// Recall requests (a duplicate of an evicted key reads the store; "Recall requests" in the header):
//   Recall/StaleRequestsAreDroppedNotRead      the store hangs; 8 threads x 50 recalls with a 1 ms
//                                              timeout: the queue never holds more requests than
//                                              callers wait, holds none once they left, and after
//                                              recovery the store is read once per fresh attempt,
//                                              not once per stale request
//   Recall/WaitersOfOneKeyShareOneRead         8 callers of one key behind a held read: one queued
//                                              request, one store read, every caller answered
//   RecallGuard.DuplicatesDuringAHungReadCostNothingAfterRecovery  the same through begin() on
//                                              evicted keys of a durable SQLite guard
// Idle flusher ("Idle" in the header):
//   Idle.FlusherSleepsWhenIdle                 over SQLite: at most elapsed / idle_sleep (+3) wake-ups
//                                              in a second of idling, then a row is committed
//   Idle.LanesSleepToo                         the same for a 3-lane pipelined store, and a sync
//                                              waiter woken by its commit though idle_sleep is 1 h
//   Idle.DurableGuardThreadsStayAsleep         a durable SQLite guard's own threads make no
//                                              context switch in a second of idling (idle_sleep
//                                              1 h), then a sync claim commits: only the offer's
//                                              notification can have woken the flusher
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <latch>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "idem/detail/pipeline/flush_pipeline.hpp"
#include "support/store_fixtures.hpp"
#include "support/store_kinds.hpp"
#include "support/threads.hpp"

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::recalled;
using idem::record_state;

// ---- stores ------------------------------------------------------------------------------------

using idem_test::held_reads;
using idem_test::read_control;

/// A memory_store with `lanes` lanes (one mutex: the lanes only have to exist, not to overlap).
class laned_store final : public idem_test::forwarding_store, public idem::pipelined_store {
public:
    laned_store(idem::store& inner, std::size_t lanes) : forwarding_store(inner), lanes_(lanes) {}
    void apply(std::span<const idem::store_row> rows, std::uint64_t id) override { apply_on(0, rows, id); }
    std::size_t lanes() const noexcept override { return lanes_; }
    void apply_on(std::size_t, std::span<const idem::store_row> rows, std::uint64_t id) override {
        std::lock_guard lock(mutex_);
        inner_.apply(rows, id);
    }
    bool committed_on(std::size_t, std::uint64_t id) override {
        std::lock_guard lock(mutex_);
        return inner_.committed(id);
    }
    void reconnect_on(std::size_t) override {}

private:
    const std::size_t lanes_;
    std::mutex mutex_;
};

/// A claim and a success of `k` with `outcome`, applied straight to the store (no pipeline).
void write_succeeded(idem::store& st, const std::string& k, std::uint64_t outcome, std::uint64_t& seq) {
    idem_test::row_fields claim;
    claim.key = k;
    claim.fence = 7;
    idem_test::row_fields done = claim;
    done.from = record_state::processing;
    done.to = record_state::succeeded;
    done.cause = idem::transition_cause::succeed;
    done.outcome = outcome;
    const std::vector<idem::store_row> rows = {idem_test::row(claim, seq + 1), idem_test::row(done, seq + 2)};
    seq += 2;
    st.apply(rows, seq * 31);
}

/// A pipeline's recall conversion, as the durable guard's (durable.hpp, to_recalled) reduced to
/// what these tests read.
recalled to_recalled(const idem::stored_record& r) {
    recalled out;
    out.found = recalled::kind::record;
    out.state = r.state;
    out.fence = r.fence;
    out.outcome = r.outcome;
    return out;
}

std::int64_t wall_ms(std::chrono::nanoseconds t) {
    return 1'700'000'000'000 + std::chrono::duration_cast<std::chrono::milliseconds>(t).count();
}

idem::transition claim_of(const std::string& k, std::uint64_t fence) {
    idem::transition t;
    t.k = idem::key(k);
    t.from = record_state::absent;
    t.to = record_state::processing;
    t.cause = idem::transition_cause::claim;
    t.fence = fence;
    t.lease_until = 30s;
    return t;
}

// ---- recall requests -----------------------------------------------------------------------------

/// A flush pipeline over held_reads: "sqlite" (its reader thread serves recalls) or "memory" (no
/// reader: the flusher serves them between batches). Keys K0..K3 hold succeeded records with
/// outcomes 100..103.
class Recall : public ::testing::TestWithParam<std::string> {
protected:
    void start(idem::store_options so) {
        if (GetParam() == "sqlite") {
            dir_ = std::make_unique<idem_test::temp_dir>("idem-recall");
            inner_ = std::make_unique<idem::sqlite_store>(dir_->file("r.db"));
        } else {
            inner_ = std::make_unique<idem::memory_store>();
        }
        std::uint64_t seq = 0;
        for (int i = 0; i < 4; ++i) write_succeeded(*inner_, key(i), 100 + static_cast<std::uint64_t>(i), seq);
        write_succeeded(*inner_, "A_PAY_v1", 1, seq);
        write_succeeded(*inner_, "B_PAY_v1", 2, seq);
        store_ = std::make_unique<held_reads>(*inner_, ctl_);
        so.prune_interval = {};
        pipe_ = std::make_unique<idem::detail::pipeline::flush_pipeline>(*store_, so, wall_ms);
        pipe_->set_recall(to_recalled);
        pipe_->start();
    }
    void TearDown() override {
        ctl_.gate.open();  // a held read must end before the pipeline stops
        pipe_.reset();
    }
    static std::string key(int i) { return "K" + std::to_string(i) + "_PAY_v1"; }

    read_control ctl_;
    std::unique_ptr<idem_test::temp_dir> dir_;
    std::unique_ptr<idem::store> inner_;
    std::unique_ptr<held_reads> store_;
    std::unique_ptr<idem::detail::pipeline::flush_pipeline> pipe_;
};

// The store's reads hang (3 s each in the field; here until the gate opens). Callers with a 1 ms
// recall_timeout give up at once. Their requests must go with them: the queue never holds more
// requests than callers wait, holds none once every caller left, and after recovery the store is
// not read once per call made during the outage.
TEST_P(Recall, StaleRequestsAreDroppedNotRead) {
    idem::store_options so;
    so.recall_timeout = 1ms;
    start(so);
    ctl_.gate.close();
    constexpr std::size_t threads = 8;
    constexpr int calls = 50;
    std::atomic<bool> storm{true};
    std::uint64_t most_queued = 0, most_excess = 0, samples = 0;
    std::thread monitor([&] {  // samples the queue while the callers come and go
        while (storm.load()) {
            const auto s = pipe_->snapshot();
            most_queued = std::max(most_queued, s.recall_queue);
            if (s.recall_queue > s.recall_waiters) most_excess = std::max(most_excess, s.recall_queue - s.recall_waiters);
            ++samples;
            std::this_thread::yield();
        }
    });
    std::atomic<int> unavailable{0};
    idem_test::run_on_latch(threads, [&](std::size_t t) {
        for (int i = 0; i < calls; ++i)
            if (pipe_->recall(idem::key(key((static_cast<int>(t) + i) % 4))).found == recalled::kind::unavailable)
                ++unavailable;
    });
    storm = false;
    monitor.join();
    EXPECT_EQ(unavailable.load(), static_cast<int>(threads) * calls) << "a read went through a closed gate";
    const auto after = pipe_->snapshot();
    EXPECT_EQ(after.recall_waiters, 0u);
    EXPECT_EQ(after.recall_queue, 0u) << "requests of callers that gave up are still queued";
    EXPECT_LE(most_queued, threads) << "more requests queued than callers waiting (" << samples << " samples)";
    EXPECT_EQ(most_excess, 0u) << "a queued request nobody waited for";
    EXPECT_GT(after.recalls_dropped, 0u);
    const int held = ctl_.reads.load();  // the read in flight when the callers came (0 or 1)
    EXPECT_LE(held, 1);

    ctl_.gate.open();  // the store answers again
    int attempts = 0;
    recalled r;
    ASSERT_TRUE(idem_test::wait_for([&] {
        ++attempts;
        r = pipe_->recall(idem::key(key(2)));
        return r.found != recalled::kind::unavailable;
    }));
    EXPECT_EQ(r.found, recalled::kind::record);
    EXPECT_EQ(r.outcome, 102u);
    // Each fresh attempt is at most one read (one that timed out in the queue is none); the
    // requests of the outage are never read.
    EXPECT_LE(ctl_.reads.load(), held + attempts)
        << attempts << " attempt(s) after recovery; " << threads * calls << " calls during the outage";
    EXPECT_EQ(pipe_->snapshot().recall_reads, static_cast<std::uint64_t>(ctl_.reads.load()));
}

// Callers of one key wait together: one queued request, one read, one answer for all of them.
TEST_P(Recall, WaitersOfOneKeyShareOneRead) {
    idem::store_options so;
    so.recall_timeout = 120s;  // nobody gives up here
    start(so);
    ctl_.gate.close();
    recalled first;
    std::thread a([&] { first = pipe_->recall(idem::key("A_PAY_v1")); });
    ASSERT_TRUE(idem_test::wait_for([&] { return ctl_.gate.waiting() == 1; })) << "A's read never reached the store";
    constexpr int waiters = 8;
    std::vector<recalled> got(waiters);
    std::vector<std::thread> threads;
    for (int i = 0; i < waiters; ++i) threads.emplace_back([&, i] { got[i] = pipe_->recall(idem::key("B_PAY_v1")); });
    ASSERT_TRUE(idem_test::wait_for([&] { return pipe_->snapshot().recall_waiters == 1 + waiters; }))
        << pipe_->snapshot().recall_waiters << " waiting";
    const auto s = pipe_->snapshot();
    EXPECT_EQ(s.recall_queue, 1u) << waiters << " callers of one key queued separate requests";
    EXPECT_EQ(s.recalls_joined, static_cast<std::uint64_t>(waiters - 1));
    ctl_.gate.open();
    a.join();
    for (auto& t : threads) t.join();
    EXPECT_EQ(first.found, recalled::kind::record);
    EXPECT_EQ(first.outcome, 1u);
    for (int i = 0; i < waiters; ++i) {
        EXPECT_EQ(got[i].found, recalled::kind::record) << "caller " << i;
        EXPECT_EQ(got[i].outcome, 2u) << "caller " << i;
    }
    EXPECT_EQ(ctl_.reads.load(), 2) << "one read for A, one shared by B's callers";
    EXPECT_EQ(pipe_->snapshot().recall_queue, 0u);
}

INSTANTIATE_TEST_SUITE_P(Stores, Recall, ::testing::Values("sqlite", "memory"), [](const auto& info) { return info.param; });

// The same storm through the guard: 8 threads send duplicates of 4 evicted keys while the store's
// reads hang, each told store_unavailable (or in_progress, behind a racer); once the store answers
// again a duplicate gets its outcome at the cost of its own read, not of the outage's calls.
TEST(RecallGuard, DuplicatesDuringAHungReadCostNothingAfterRecovery) {
    using guard_t = idem::basic_durable_guard<std::atomic, idem::manual_clock>;
    idem_test::temp_dir dir("idem-recall-guard");
    idem::sqlite_store inner(dir.file("g.db"));
    read_control ctl;
    idem::manual_clock clock;
    idem::options o;
    o.capacity = 8;
    o.retention = 1ms;
    o.maintenance_interval = {};
    idem::store_options so;
    so.prune_interval = {};
    so.recall_timeout = 1ms;
    guard_t g(std::make_unique<held_reads>(inner, ctl), o, so, clock);
    idem_test::gate_opener opener(ctl.gate);
    const auto name = [](int i) { return "E" + std::to_string(i) + "_PAY_v1"; };
    for (int i = 0; i < 4; ++i) {
        auto a = g->begin(idem::key(name(i)));
        ASSERT_EQ(a.status, begin_status::acquired);
        ASSERT_FALSE(a.ticket.succeed(500 + static_cast<std::uint64_t>(i)));
    }
    // Evict them: fill and rotate until memory no longer holds any (window_test's evict()).
    for (int round = 0, filler = 0;; ++round) {
        bool gone = true;
        for (int i = 0; i < 4; ++i) gone = gone && g->query(idem::key(name(i))).state == record_state::absent;
        if (gone) break;
        ASSERT_LT(round, 50) << "the keys never left memory";
        for (int f = 0; f < 4; ++f) {
            auto r = g->begin(idem::key("F" + std::to_string(filler++) + "_PAY_v1"));
            ASSERT_EQ(r.status, begin_status::acquired);
            ASSERT_FALSE(r.ticket.succeed(1));
        }
        ASSERT_TRUE(g.flush(10s)) << g.last_store_error();
        clock.advance(10ms);
        (void)g->collect();
    }
    ctl.gate.close();
    constexpr std::size_t threads = 8;
    constexpr int calls = 25;
    std::atomic<int> granted{0};
    idem_test::run_on_latch(threads, [&](std::size_t t) {
        for (int i = 0; i < calls; ++i) {
            const auto r = g->begin(idem::key(name((static_cast<int>(t) + i) % 4)));
            if (r.status != begin_status::store_unavailable && r.status != begin_status::in_progress) ++granted;
        }
    });
    EXPECT_EQ(granted.load(), 0) << "a duplicate of an evicted key was answered while its store read hung";
    const int held = ctl.reads.load();
    EXPECT_LE(held, 1);
    ctl.gate.open();
    int attempts = 0;
    begin_status last = begin_status::store_unavailable;
    std::uint64_t outcome = 0;
    ASSERT_TRUE(idem_test::wait_for([&] {
        ++attempts;
        const auto r = g->begin(idem::key(name(1)));
        EXPECT_NE(r.status, begin_status::acquired) << "granted while the store holds its success";
        last = r.status;
        outcome = r.outcome;
        return last != begin_status::store_unavailable;
    }));
    EXPECT_EQ(last, begin_status::succeeded);
    EXPECT_EQ(outcome, 501u);
    EXPECT_LE(ctl.reads.load(), held + attempts)
        << attempts << " attempt(s) after recovery; " << threads * calls << " calls during the outage";
}

// ---- the idle flusher ------------------------------------------------------------------------------

/// Wake-ups the flusher may make while idle for `elapsed`: one per idle_sleep, and a few for the
/// edges (the sleep it was in when the interval began, the one it is in when it ends).
std::uint64_t idle_bound(std::chrono::nanoseconds elapsed, std::chrono::nanoseconds idle_sleep, std::size_t threads = 1) {
    return threads * (static_cast<std::uint64_t>(elapsed / idle_sleep) + 3);
}

TEST(Idle, FlusherSleepsWhenIdle) {
    idem_test::temp_dir dir("idem-idle");
    idem::sqlite_store st(dir.file("i.db"));
    idem::store_options so;  // idle_poll 200 us, idle_sleep 100 ms: the defaults
    so.prune_interval = {};
    idem::detail::pipeline::flush_pipeline pipe(st, so, wall_ms);
    pipe.start();
    ASSERT_TRUE(pipe.reserve());
    (void)pipe.offer(claim_of("IDLE1_PAY_v1", 1));
    ASSERT_TRUE(pipe.flush(30s));
    ASSERT_TRUE(idem_test::wait_for([&] { return pipe.snapshot().sleeping; }, 5s)) << "the flusher never slept";
    const auto w0 = pipe.snapshot().wakeups;
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(1s);  // the idle interval itself, not a synchronization
    const auto w1 = pipe.snapshot().wakeups;
    const auto elapsed = std::chrono::steady_clock::now() - t0;
    EXPECT_LE(w1 - w0, idle_bound(elapsed, so.idle_sleep))
        << "wake-ups in " << std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count() << " ms idle";
    // Work after idling is taken at once (the offer wakes the flusher) and committed.
    ASSERT_TRUE(pipe.reserve());
    const auto seq = pipe.offer(claim_of("IDLE2_PAY_v1", 2));
    ASSERT_TRUE(pipe.flush(30s));
    EXPECT_TRUE(pipe.durable(seq));
    ASSERT_TRUE(st.get("IDLE2_PAY_v1").has_value());
    EXPECT_EQ(st.get("IDLE2_PAY_v1")->state, record_state::processing);
}

TEST(Idle, LanesSleepToo) {
    idem::memory_store mem;
    laned_store st(mem, 3);
    idem::store_options so;
    so.mode = idem::durability::sync;
    so.prune_interval = {};
    so.sync_timeout = 120s;
    so.idle_sleep = 1h;  // only a notification can wake a sleeping lane in this test's time
    idem::detail::pipeline::flush_pipeline pipe(st, so, wall_ms);
    ASSERT_EQ(pipe.lanes(), 3u);
    pipe.start();
    ASSERT_TRUE(pipe.reserve());
    ASSERT_EQ(pipe.await(pipe.offer(claim_of("LANE1_PAY_v1", 1))), idem::durability_wait::committed);
    ASSERT_TRUE(idem_test::wait_for([&] { return pipe.snapshot().sleeping; }, 5s)) << "no lane slept";
    const auto w0 = pipe.snapshot().wakeups;
    std::this_thread::sleep_for(1s);  // the idle interval
    const auto w1 = pipe.snapshot().wakeups;
    EXPECT_LE(w1 - w0, 3u * 3u) << "idle lanes woke up";
    // A sync waiter after idling: the offer wakes the sleeping lane, its commit wakes the waiter.
    for (int i = 0; i < 3; ++i) {
        ASSERT_TRUE(pipe.reserve());
        const auto seq = pipe.offer(claim_of("LANE" + std::to_string(i + 2) + "_PAY_v1", 2 + static_cast<std::uint64_t>(i)));
        EXPECT_EQ(pipe.await(seq), idem::durability_wait::committed) << "round " << i;
        ASSERT_TRUE(idem_test::wait_for([&] { return pipe.snapshot().sleeping; }, 5s)) << "no lane slept again";
    }
}

/// Voluntary context switches of the threads `tids` (from /proc/self/task/<tid>/status): each one
/// a time the thread blocked, so each wake-up of an idle thread counts one.
std::uint64_t voluntary_switches(const std::set<std::string>& tids) {
    std::uint64_t n = 0;
    for (const auto& tid : tids) {
        std::ifstream in("/proc/self/task/" + tid + "/status");
        for (std::string line; std::getline(in, line);)
            if (line.rfind("voluntary_ctxt_switches:", 0) == 0) n += std::stoull(line.substr(24));
    }
    return n;
}

std::set<std::string> task_ids() {
    std::set<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) out.insert(e.path().filename());
    return out;
}

TEST(Idle, DurableGuardThreadsStayAsleep) {
    idem_test::temp_dir dir("idem-idle-guard");
    idem::store_options so;
    so.mode = idem::durability::sync;
    so.sync_timeout = 120s;
    so.prune_interval = {};
    so.idle_sleep = 1h;  // a commit within sync_timeout proves the offer woke the flusher
    const auto before = task_ids();
    idem::durable_guard g(std::make_unique<idem::sqlite_store>(dir.file("g.db")), idem_test::durable_options(), so);
    std::set<std::string> mine;  // the guard's threads: the flusher and the reader (no maintenance)
    for (const auto& t : task_ids())
        if (!before.contains(t)) mine.insert(t);
    ASSERT_GE(mine.size(), 1u);
    {
        auto r = g->begin(idem::key("WARM_PAY_v1"));
        ASSERT_EQ(r.status, begin_status::acquired);
        ASSERT_FALSE(r.ticket.succeed(1));
    }
    // Asleep: the guard's threads stop switching (a polling flusher never does).
    std::uint64_t last = voluntary_switches(mine);
    int still = 0;
    ASSERT_TRUE(idem_test::wait_for(
        [&] {
            std::this_thread::sleep_for(20ms);
            const std::uint64_t now = voluntary_switches(mine);
            still = now == last ? still + 1 : 0;
            last = now;
            return still >= 3;
        },
        10s))
        << "the guard's threads never went quiet";
    const std::uint64_t s0 = voluntary_switches(mine);
    std::this_thread::sleep_for(1s);  // the idle interval
    const std::uint64_t s1 = voluntary_switches(mine);
    EXPECT_LE(s1 - s0, 2u) << "context switches of the guard's " << mine.size() << " threads in 1 s idle";
    // A claim after idling: committed (sync mode: begin() returns after the commit) long before the
    // flusher's 1 h sleep would have ended by itself.
    auto r = g->begin(idem::key("AFTER_PAY_v1"));
    ASSERT_EQ(r.status, begin_status::acquired) << g.last_store_error();
    ASSERT_FALSE(r.ticket.succeed(7));
    ASSERT_TRUE(g.flush(30s));
    const auto rec = g.backing_store().get("AFTER_PAY_v1");
    ASSERT_TRUE(rec.has_value());
    EXPECT_EQ(rec->state, record_state::succeeded);
    EXPECT_EQ(rec->outcome, 7u);
}

}  // namespace
