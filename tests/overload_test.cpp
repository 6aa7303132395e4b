// overload_test: the durable guard under overload and bad input, over memory_store and SQLite
// through the fault wrappers of tests/support/store_fixtures.hpp.
//
//   Outage*                an outage long enough to refuse claims (backpressure) leaves no trace in
//                          the record table: every refusal is backpressure, never capacity_exhausted;
//                          a refused key is absent and is later claimed with a fresh key's fence;
//                          once the store is back, new keys are claimed and generations rotate.
//   Refusal*               a million refused begins keep queue_depth exact (rows really queued),
//                          are all counted, and cost no memory; callers spinning on backpressure all
//                          get through once the store is back, every key claimed exactly once.
//   DurableBeforeVisible*  sync mode: while the owner of a claim waits for the commit of its
//                          succeed() or terminal fail(), duplicates see in_progress (never the
//                          result); after the owner gave up (store_unavailable) they see in_doubt;
//                          once the row commits, the recorded outcome. Async mode shows it at once.
//   Poison*                a row the store can never take (idem::rejected_row) is set aside, counted
//                          and named; the other rows of its batch commit and later keys keep
//                          flowing. In sync mode the claim of that key answers invalid_key.
//   EmptyKey*              key{} is invalid_key on every guard, never reaches the store, and the
//                          store opens again afterwards.
//   SyncWaiters*           every sync waiter returns once its row commits, however many wait at once.
// After every workload that reaches a store, idem::verify must report no violation.
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "support/store_fixtures.hpp"
#include "support/threads.hpp"

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::durability;
using idem::errc;
using idem::record_state;
using idem_test::commit_gate;
using idem_test::durable_options;
using idem_test::faulty_store;
using idem_test::gate_opener;
using idem_test::gated_store;
using idem_test::open_wrapped;
using idem_test::poisoned_store;
using idem_test::temp_dir;
using idem_test::verify_clean;
using idem_test::wait_for;

using manual_durable_guard = idem::basic_durable_guard<std::atomic, idem::manual_clock>;

idem::key pay_key(const std::string& prefix, std::size_t i) { return idem::key(prefix + std::to_string(i) + "_PAY_v1"); }


/// begin() until the answer is not backpressure (the queue is small in these tests), as run() and
/// a well-behaved caller do. The last answer, backpressure only if the wait timed out.
template <class Guard>
auto begin_through(Guard& g, const idem::key& k) {
    typename Guard::result_type r{begin_status::backpressure, {}};
    (void)wait_for([&] { return (r = g.begin(k)).status != begin_status::backpressure; });
    return r;
}

/// ticket.succeed() until the answer is not backpressure.
template <class Ticket>
std::error_code succeed_through(Ticket& t, std::uint64_t outcome) {
    std::error_code ec;
    (void)wait_for([&] { return (ec = t.succeed(outcome)) != errc::backpressure; });
    return ec;
}

/// The idem::error fn threw, or nullopt when it returned.
template <class Fn>
std::optional<idem::error> error_of(Fn&& fn) {
    try {
        fn();
    } catch (const idem::error& e) {
        return e;
    }
    return std::nullopt;
}

std::string summary(const std::map<begin_status, std::size_t>& answers) {
    std::string s;
    for (const auto& [st, n] : answers) s += std::string(" ") + idem::to_string(st) + "=" + std::to_string(n);
    return s;
}

/// Resident set size of this process, from /proc/self/statm.
std::int64_t resident_bytes() {
    std::ifstream f("/proc/self/statm");
    std::int64_t size = 0, resident = 0;
    f >> size >> resident;
    return resident * static_cast<std::int64_t>(::sysconf(_SC_PAGESIZE));
}

// ---- 1. an outage must not wedge the table ---------------------------------------------------------

// capacity 64 (two generations of 128 index positions) and a queue of 4 rows: while the store is
// down, 400 new keys are asked for. A refused claim must change nothing: no index position, no
// slot. If a refusal kept an index position without counting it in the generation's fill, the
// table would answer capacity_exhausted once the positions were gone, and rotation (due at half
// fill) would never come to free them: the table would stay wedged after the store came back.
TEST(Outage, RefusedClaimsLeaveNoTraceAndTheTableStillRotates) {
    idem::memory_store mem;
    auto owned = std::make_unique<faulty_store>(mem);
    faulty_store* f = owned.get();
    idem::options o = durable_options(64);
    o.retention = 1h;
    idem::store_options so;
    so.queue_capacity = 4;
    so.max_backoff = 2ms;
    idem::manual_clock clock;
    manual_durable_guard g(std::move(owned), o, so, clock);
    auto& guard = g.guard();
    f->down = true;

    std::vector<manual_durable_guard::guard_type::ticket_type> held;
    std::vector<idem::key> refused;
    std::map<begin_status, std::size_t> answers;
    for (std::size_t i = 0; i < 400; ++i) {
        const auto k = pay_key("OUT", i);
        auto r = guard.begin(k);
        ++answers[r.status];
        if (r.status == begin_status::acquired) held.push_back(std::move(r.ticket));
        if (r.status == begin_status::backpressure) refused.push_back(k);
    }
    EXPECT_EQ(answers[begin_status::capacity_exhausted], 0u)
        << "refused claims used up the table while the store was down:" << summary(answers);
    EXPECT_EQ(held.size() + refused.size(), 400u) << summary(answers);
    ASSERT_FALSE(refused.empty()) << "the queue of 4 never filled:" << summary(answers);
    ASSERT_FALSE(held.empty());
    // The queue holds 4 rows; the flusher holds at most the one batch it popped (at most 4 more).
    EXPECT_LE(held.size(), 2 * so.queue_capacity) << summary(answers);
    EXPECT_EQ(g.snapshot().backpressure, refused.size());
    EXPECT_EQ(g.snapshot().queue_depth, held.size()) << "queue_depth must count the rows really queued";
    for (const auto& k : refused) {
        const auto v = guard.query(k);
        ASSERT_EQ(v.state, record_state::absent) << k.str() << ": a refused claim changed memory";
        ASSERT_EQ(v.fence, 0u) << k.str();
    }
    const std::uint64_t fresh_fence = held.front().fence();
    EXPECT_EQ(fresh_fence & 0xffffffffu, 1u) << "a key's first claim in a generation has count 1";

    // The store is back: the held claims complete and reach it.
    f->down = false;
    for (std::size_t j = 0; j < held.size(); ++j) ASSERT_FALSE(succeed_through(held[j], j + 1)) << j;
    ASSERT_TRUE(g.flush(10s)) << g.last_store_error();

    // A refused key is claimed later like a key never seen: acquired, with a fresh key's fence.
    for (std::size_t j = 0; j < 10; ++j) {
        auto r = begin_through(guard, refused[j]);
        ASSERT_EQ(r.status, begin_status::acquired) << refused[j].str() << ": " << idem::to_string(r.status);
        EXPECT_EQ(r.fence, fresh_fence) << refused[j].str() << " was refused once; its claim must get the first fence";
        ASSERT_FALSE(succeed_through(r.ticket, 1000 + j));
    }

    // Each round claims 40 new keys (more than half the capacity), lets the retention pass and
    // runs maintenance: every key must be acquired, and every round must rotate a generation.
    for (std::size_t round = 0; round < 4; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        for (std::size_t j = 0; j < 40; ++j) {
            const auto k = pay_key("ROUND" + std::to_string(round) + "X", j);
            auto r = begin_through(guard, k);
            ASSERT_EQ(r.status, begin_status::acquired) << k.str() << ": " << idem::to_string(r.status);
            ASSERT_FALSE(succeed_through(r.ticket, j));
        }
        clock.advance(2 * o.retention);
        ASSERT_TRUE(g.flush(10s)) << g.last_store_error();
        const std::uint64_t before = g.snapshot().rotations;
        for (int n = 0; n < 3; ++n) guard.maintain();
        EXPECT_EQ(g.snapshot().rotations, before + 1) << "maintenance did not rotate a generation after the outage";
    }
    EXPECT_GT(g.snapshot().evicted, 0u);
    EXPECT_EQ(g.snapshot().capacity_exhausted, 0u);
    f->down = false;
    ASSERT_TRUE(g.flush(10s));
    EXPECT_TRUE(verify_clean(mem));
}

// ---- 2. refusals cost nothing; callers spinning on backpressure get through --------------------------

// The flusher holds one row (max_batch 1) and the queue 8 more while the store is down; then the
// same new key is asked for a million times. Each refusal must leave no trace: no sequence number
// (queue_depth stays the number of rows really queued), no memory (an entry per refusal kept until
// the store came back would grow the process by tens of MB), and it is counted.
TEST(Refusal, AMillionRefusedBeginsKeepQueueDepthExactAndCostNoMemory) {
    idem::memory_store mem;
    faulty_store* f = nullptr;
    idem::store_options so;
    so.queue_capacity = 8;
    so.max_batch = 1;
    so.max_backoff = 2ms;
    auto g = open_wrapped(&f, durability::async, durable_options(), so, mem);
    auto& guard = g->guard();
    f->down = true;

    std::vector<idem::ticket> held;
    {
        auto r = guard.begin(pay_key("HELD", 0));
        ASSERT_EQ(r.status, begin_status::acquired);
        held.push_back(std::move(r.ticket));
    }
    // Once the flusher has tried the store it holds that row as its batch: the room is fixed now.
    ASSERT_TRUE(wait_for([&] { return g->snapshot().store_errors > 0; })) << "the flusher never tried the store";
    for (std::size_t i = 1;; ++i) {
        ASSERT_LT(i, 100u) << "the queue never filled";
        auto r = guard.begin(pay_key("HELD", i));
        if (r.status != begin_status::acquired) {
            ASSERT_EQ(r.status, begin_status::backpressure);
            break;
        }
        held.push_back(std::move(r.ticket));
    }
    ASSERT_EQ(held.size(), so.queue_capacity + so.max_batch);
    ASSERT_EQ(g->snapshot().queue_depth, held.size());

    const auto k = pay_key("REFUSED", 0);
    constexpr std::size_t n = 1'000'000;
    std::size_t refused = 0;
    const std::int64_t rss_before = resident_bytes();
    for (std::size_t i = 0; i < n; ++i) refused += guard.begin(k).status == begin_status::backpressure;
    const std::int64_t rss_after = resident_bytes();
    EXPECT_EQ(refused, n);
    const auto s = g->snapshot();
    EXPECT_EQ(s.queue_depth, held.size()) << "queue_depth counts refused offers, not rows really queued";
    EXPECT_LE(s.queue_depth, so.queue_capacity + so.max_batch);
    EXPECT_EQ(s.backpressure, n + 1);
    EXPECT_EQ(s.acquired, held.size());
    EXPECT_LT(rss_after - rss_before, 4 << 20)
        << "a million refused begins grew the process by " << (rss_after - rss_before) / 1024 << " KiB";
    EXPECT_EQ(guard.query(k).state, record_state::absent) << "a refused claim changed memory";

    // The store is back: the held claims and the refused key all go through.
    f->down = false;
    for (std::size_t j = 0; j < held.size(); ++j) ASSERT_FALSE(succeed_through(held[j], j + 1)) << j;
    auto r = begin_through(guard, k);
    ASSERT_EQ(r.status, begin_status::acquired);
    ASSERT_FALSE(succeed_through(r.ticket, 77));
    ASSERT_TRUE(g->flush(10s)) << g->last_store_error();
    g.reset();
    EXPECT_EQ(mem.audit(k.view()).size(), 2u) << "the refused begins must not reach the store";
    EXPECT_EQ(idem_test::load_all(mem).size(), held.size() + 1);
    EXPECT_TRUE(verify_clean(mem));
}

// Four threads released together ask for the same 64 keys and retry backpressure in a tight loop
// while the store is down (a queue of 4 rows), then the store comes back. Every key must be
// acquired exactly once (the others see it in progress or done) and committed.
TEST(Refusal, CallersSpinningOnBackpressureAllGetThroughOnceTheStoreIsBack) {
    idem::memory_store mem;
    faulty_store* f = nullptr;
    idem::store_options so;
    so.queue_capacity = 4;
    so.max_backoff = 2ms;
    auto g = open_wrapped(&f, durability::async, durable_options(), so, mem);
    auto& guard = g->guard();
    f->down = true;

    constexpr std::size_t threads = 4, keys = 64;
    std::array<std::atomic<int>, keys> acquired{};
    std::atomic<std::size_t> wrong{0};
    std::mutex m;
    std::string first_wrong;
    auto note = [&](const std::string& what) {
        if (wrong.fetch_add(1) == 0) {
            std::lock_guard lock(m);
            first_wrong = what;
        }
    };
    std::jthread restore([&] {
        // The callers have been refused many times: bring the store back.
        (void)wait_for([&] { return g->snapshot().backpressure >= 20'000; }, 60s);
        f->down = false;
    });
    idem_test::run_on_latch(threads, [&](std::size_t t) {
        for (std::size_t j = 0; j < keys; ++j) {
            const std::size_t i = (j + t * keys / threads) % keys;
            const auto k = pay_key("SPIN", i);
            auto r = guard.begin(k);
            while (r.status == begin_status::backpressure) r = guard.begin(k);
            if (r.status == begin_status::acquired) {
                acquired[i].fetch_add(1);
                std::error_code ec = r.ticket.succeed(i + 1);
                while (ec == errc::backpressure) ec = r.ticket.succeed(i + 1);
                if (ec) note(k.str() + ": succeed: " + ec.message());
            } else if (r.status != begin_status::in_progress && r.status != begin_status::succeeded) {
                note(k.str() + ": begin " + idem::to_string(r.status));
            } else if (r.status == begin_status::succeeded && r.outcome != i + 1) {
                note(k.str() + ": replayed outcome " + std::to_string(r.outcome));
            }
        }
    });
    restore.join();
    EXPECT_EQ(wrong.load(), 0u) << first_wrong;
    EXPECT_GT(g->snapshot().backpressure, 0u);
    for (std::size_t i = 0; i < keys; ++i) EXPECT_EQ(acquired[i].load(), 1) << pay_key("SPIN", i).str();
    ASSERT_TRUE(g->flush(10s)) << g->last_store_error();
    g.reset();
    for (std::size_t i = 0; i < keys; ++i) {
        const auto rec = mem.get(pay_key("SPIN", i).view());
        ASSERT_TRUE(rec.has_value()) << i;
        EXPECT_EQ(rec->state, record_state::succeeded) << i;
        EXPECT_EQ(rec->outcome, i + 1) << i;
    }
    EXPECT_TRUE(verify_clean(mem));
}

// ---- 3. sync mode: durable before visible ------------------------------------------------------

enum class ending { succeed, fail_terminal };

std::string ending_name(ending e) { return e == ending::succeed ? "Succeed" : "FailTerminal"; }

/// Completes the claim as the test's parameter says.
std::error_code finish(idem::ticket& t, ending e) {
    return e == ending::succeed ? t.succeed(7) : t.fail(13, idem::failure_policy::terminal);
}
begin_status finished_status(ending e) { return e == ending::succeed ? begin_status::succeeded : begin_status::failed; }
record_state finished_state(ending e) { return e == ending::succeed ? record_state::succeeded : record_state::failed; }
std::uint64_t finished_outcome(ending e) { return e == ending::succeed ? 7 : 13; }

class DurableBeforeVisible : public ::testing::TestWithParam<ending> {
protected:
    ending e() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(Endings, DurableBeforeVisible, ::testing::Values(ending::succeed, ending::fail_terminal),
                         [](const auto& info) { return ending_name(info.param); });

// The owner's commit is held at a gate: while the owner waits, a duplicate from another thread
// must see in_progress and query() processing; once the gate opens the owner returns success and
// duplicates replay the recorded result.
TEST_P(DurableBeforeVisible, WhileTheCommitIsHeldDuplicatesSeeInProgress) {
    idem::memory_store mem;
    commit_gate gate;
    gated_store* gated = nullptr;
    idem::store_options so;
    so.sync_timeout = 20s;  // the owner waits as long as the gate is closed
    auto g = open_wrapped(&gated, durability::sync, durable_options(), so, mem, gate);
    gate_opener open_at_exit(gate);
    const auto k = idem::key("TXHELD_PAY_v1");
    auto r = g->guard().begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);

    gate.close();
    std::error_code owner_ec = errc::timeout;
    std::atomic<bool> owner_returned{false};
    std::jthread owner([&] {
        owner_ec = finish(r.ticket, e());
        owner_returned = true;
    });
    // The owner has published its result in memory (counted) and queued its row, which the flusher
    // holds at the gate (the claim committed before begin returned: this is the only row).
    ASSERT_TRUE(wait_for([&] {
        const auto s = g->snapshot();
        return s.succeeded + s.failed == 1 && gate.waiting() == 1;
    })) << "the owner's row never reached the store";
    for (int i = 0; i < 3; ++i) {
        begin_status seen = begin_status::acquired;
        std::uint64_t outcome = 0;
        std::jthread dup([&] {
            const auto d = g->guard().begin(k);
            seen = d.status;
            outcome = d.outcome;
        });
        dup.join();
        EXPECT_EQ(seen, begin_status::in_progress) << "a duplicate saw " << idem::to_string(seen) << " (outcome " << outcome
                                                   << ") while the owner's result was not yet durable";
        const auto v = g->guard().query(k);
        EXPECT_EQ(v.state, record_state::processing)
            << "query() showed " << idem::to_string(v.state) << " before the commit";
        EXPECT_EQ(v.outcome, 0u);
        EXPECT_FALSE(v.in_doubt);
    }
    EXPECT_FALSE(owner_returned.load()) << "the owner returned while its row was held at the gate";
    EXPECT_EQ(mem.audit(k.view()).size(), 1u) << "only the claim may have committed";

    gate.open();
    owner.join();
    EXPECT_FALSE(owner_ec) << owner_ec.message();
    const auto d = g->guard().begin(k);
    EXPECT_EQ(d.status, finished_status(e()));
    EXPECT_EQ(d.outcome, finished_outcome(e()));
    const auto v = g->guard().query(k);
    EXPECT_EQ(v.state, finished_state(e()));
    EXPECT_EQ(v.outcome, finished_outcome(e()));
    g.reset();
    const auto rec = mem.get(k.view());
    ASSERT_TRUE(rec.has_value());
    EXPECT_EQ(rec->state, finished_state(e()));
    EXPECT_TRUE(verify_clean(mem));
}

// The store goes down after the claim: the owner's wait passes sync_timeout and it is told
// store_unavailable. Duplicates must never see the result before it is durable: in_progress or
// in_doubt while the owner waits, in_doubt after it gave up (run() throws in_doubt and does not
// execute). When the store is back and the row commits, duplicates replay the result.
TEST_P(DurableBeforeVisible, AfterTheOwnerGaveUpDuplicatesSeeInDoubtUntilTheRowCommits) {
    idem::memory_store mem;
    faulty_store* f = nullptr;
    idem::store_options so;
    so.sync_timeout = 200ms;
    so.max_backoff = 5ms;
    auto g = open_wrapped(&f, durability::sync, durable_options(), so, mem);
    const auto k = idem::key("TXGAVEUP_PAY_v1");
    auto r = g->guard().begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    f->down = true;

    std::error_code owner_ec;
    std::jthread owner([&] { owner_ec = finish(r.ticket, e()); });
    ASSERT_TRUE(wait_for([&] {
        const auto s = g->snapshot();
        return s.succeeded + s.failed == 1;
    }));
    {
        const auto d = g->guard().begin(k);  // the owner may be waiting or may have given up
        EXPECT_TRUE(d.status == begin_status::in_progress || d.status == begin_status::in_doubt)
            << "a duplicate saw " << idem::to_string(d.status) << " before the result was durable";
        EXPECT_EQ(g->guard().query(k).state, record_state::processing);
    }
    owner.join();
    EXPECT_EQ(owner_ec, errc::store_unavailable) << owner_ec.message();
    EXPECT_EQ(f->acked(k.view()).state, record_state::processing) << "the result committed while the store was down";

    const auto d = g->guard().begin(k);
    EXPECT_EQ(d.status, begin_status::in_doubt) << "after the owner gave up, a duplicate saw " << idem::to_string(d.status);
    EXPECT_EQ(d.outcome, 0u);
    const auto v = g->guard().query(k);
    EXPECT_EQ(v.state, record_state::processing);
    EXPECT_TRUE(v.in_doubt);
    EXPECT_EQ(v.outcome, 0u);
    int executed = 0;
    const auto thrown = error_of([&] { (void)g->guard().run(k, [&] { ++executed; }); });
    ASSERT_TRUE(thrown.has_value()) << "run() returned for a key whose result is not durable";
    EXPECT_EQ(thrown->kind(), errc::in_doubt) << thrown->what();
    EXPECT_EQ(executed, 0);

    f->down = false;
    ASSERT_TRUE(g->flush(10s)) << g->last_store_error();
    EXPECT_EQ(f->acked(k.view()).state, finished_state(e()));
    const auto after = g->guard().begin(k);
    EXPECT_EQ(after.status, finished_status(e()));
    EXPECT_EQ(after.outcome, finished_outcome(e()));
    const auto va = g->guard().query(k);
    EXPECT_EQ(va.state, finished_state(e()));
    EXPECT_EQ(va.outcome, finished_outcome(e()));
    EXPECT_FALSE(va.in_doubt);
    g.reset();
    EXPECT_TRUE(verify_clean(mem));
}

// Async mode acknowledges at once (documented: a crash may lose the rows still queued), so a
// duplicate replays the result at once, even while the store is down.
TEST_P(DurableBeforeVisible, AsyncModeShowsTheResultAtOnce) {
    idem::memory_store mem;
    faulty_store* f = nullptr;
    idem::store_options so;
    so.max_backoff = 5ms;
    auto g = open_wrapped(&f, durability::async, durable_options(), so, mem);
    const auto k = idem::key("TXASYNC_PAY_v1");
    f->down = true;
    auto r = g->guard().begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    ASSERT_FALSE(finish(r.ticket, e()));
    const auto d = g->guard().begin(k);
    EXPECT_EQ(d.status, finished_status(e()));
    EXPECT_EQ(d.outcome, finished_outcome(e()));
    EXPECT_EQ(g->guard().query(k).state, finished_state(e()));
    EXPECT_EQ(f->acked(k.view()).state, record_state::absent);
    f->down = false;
    ASSERT_TRUE(g->flush(10s)) << g->last_store_error();
    EXPECT_EQ(f->acked(k.view()).state, finished_state(e()));
    g.reset();
    EXPECT_TRUE(verify_clean(mem));
}

// ---- 4. poison rows ------------------------------------------------------------------------------

// Async mode: 50 keys are claimed and completed while the store is down, so their rows meet in
// one batch with the poisoned key's. The flusher must set aside the poisoned rows (a claim and a
// success: two rows), commit the other 49 keys, name the key, and keep flowing afterwards.
TEST(Poison, AsyncRowTheStoreCanNeverTakeIsSetAsideAndTheOthersCommit) {
    idem::memory_store mem;
    const auto poison = pay_key("POISON", 17);
    poisoned_store poisoned(mem, poison.str());
    faulty_store* f = nullptr;
    idem::store_options so;
    so.max_backoff = 2ms;
    auto g = open_wrapped(&f, durability::async, durable_options(), so, poisoned);
    f->down = true;
    for (std::size_t i = 0; i < 50; ++i) {
        auto r = g->guard().begin(pay_key("POISON", i));
        ASSERT_EQ(r.status, begin_status::acquired) << i;
        ASSERT_FALSE(r.ticket.succeed(i + 1)) << i;
    }
    f->down = false;
    ASSERT_TRUE(g->flush(10s)) << "the batch holding the poisoned row wedged the flusher: " << g->last_store_error();
    for (std::size_t i = 0; i < 50; ++i) {
        const auto a = f->acked(pay_key("POISON", i).view());
        if (i == 17) {
            EXPECT_EQ(a.state, record_state::absent);
            continue;
        }
        EXPECT_EQ(a.state, record_state::succeeded) << i;
        EXPECT_EQ(a.outcome, i + 1) << i;
    }
    const auto s = g->snapshot();
    EXPECT_GE(s.rejected_rows, 1u);
    EXPECT_EQ(s.rejected_rows, 2u) << "the poisoned key's claim and success are each set aside, nothing else";
    const std::string err = g->last_store_error();
    EXPECT_NE(err.find(poison.str()), std::string::npos) << "last_store_error() does not name the key: " << err;
    EXPECT_GE(poisoned.refused.load(), 2);

    // Later keys keep flowing, with and without the poisoned key among them.
    for (std::size_t i = 50; i < 70; ++i) {
        auto r = g->guard().begin(pay_key("POISON", i));
        ASSERT_EQ(r.status, begin_status::acquired) << i;
        ASSERT_FALSE(r.ticket.succeed(i + 1)) << i;
    }
    ASSERT_TRUE(g->flush(10s)) << g->last_store_error();
    for (std::size_t i = 50; i < 70; ++i)
        EXPECT_EQ(f->acked(pay_key("POISON", i).view()).state, record_state::succeeded) << i;
    g.reset();
    EXPECT_FALSE(mem.get(poison.view()).has_value());
    EXPECT_TRUE(verify_clean(mem));
}

// Sync mode, eight threads released together: the claim of the poisoned key is rejected at the
// wait for its commit, so begin answers invalid_key (do not execute, retrying cannot help) while
// every other key is acquired and completed durably.
TEST(Poison, SyncClaimOfAKeyTheStoreRejectsAnswersInvalidKey) {
    idem::memory_store mem;
    const auto poison = pay_key("SPOISON", 17);
    poisoned_store poisoned(mem, poison.str());
    faulty_store* f = nullptr;
    idem::store_options so;
    so.max_backoff = 2ms;
    so.sync_timeout = 20s;
    auto g = open_wrapped(&f, durability::sync, durable_options(), so, poisoned);

    constexpr std::size_t threads = 8, keys = 50;
    std::atomic<std::size_t> wrong{0};
    std::mutex m;
    std::vector<std::string> first;
    auto note = [&](const std::string& what) {
        if (wrong.fetch_add(1) < 5) {
            std::lock_guard lock(m);
            first.push_back(what);
        }
    };
    idem_test::run_on_latch(threads, [&](std::size_t t) {
        for (std::size_t i = t; i < keys; i += threads) {
            const auto k = pay_key("SPOISON", i);
            auto r = g->guard().begin(k);
            if (i == 17) {
                if (r.status != begin_status::invalid_key)
                    note(k.str() + ": poisoned claim answered " + idem::to_string(r.status));
                continue;
            }
            if (r.status != begin_status::acquired) {
                note(k.str() + ": begin " + idem::to_string(r.status));
                continue;
            }
            if (const auto ec = r.ticket.succeed(i + 1)) note(k.str() + ": succeed " + ec.message());
        }
    });
    EXPECT_EQ(wrong.load(), 0u) << [&] {
        std::string s;
        for (auto& x : first) s += "\n  " + x;
        return s;
    }();
    EXPECT_EQ(g->guard().query(poison).state, record_state::absent) << "the rejected claim must not stay granted";
    EXPECT_EQ(g->guard().begin(poison).status, begin_status::invalid_key);
    int executed = 0;
    const auto thrown = error_of([&] { (void)g->guard().run(poison, [&] { ++executed; }); });
    ASSERT_TRUE(thrown.has_value());
    EXPECT_EQ(thrown->kind(), errc::invalid_key) << thrown->what();
    EXPECT_EQ(executed, 0);
    ASSERT_TRUE(g->flush(10s)) << g->last_store_error();
    EXPECT_GE(g->snapshot().rejected_rows, 1u);
    // Every row is decided now, and the last decision about a batch holding the key set it aside.
    EXPECT_NE(g->last_store_error().find(poison.str()), std::string::npos) << g->last_store_error();
    g.reset();
    for (std::size_t i = 0; i < keys; ++i) {
        const auto rec = mem.get(pay_key("SPOISON", i).view());
        if (i == 17) {
            EXPECT_FALSE(rec.has_value());
            continue;
        }
        ASSERT_TRUE(rec.has_value()) << i;
        EXPECT_EQ(rec->state, record_state::succeeded) << i;
        EXPECT_EQ(rec->outcome, i + 1) << i;
    }
    EXPECT_TRUE(verify_clean(mem));
}

// ---- 5. the empty key ---------------------------------------------------------------------------

TEST(EmptyKey, PlainGuardAnswersInvalidKey) {
    idem::options o;
    o.maintenance_interval = {};
    idem::guard g(o);
    const auto r = g.begin(idem::key{});
    EXPECT_EQ(r.status, begin_status::invalid_key);
    EXPECT_FALSE(r.ticket.valid());
    int executed = 0;
    const auto thrown = error_of([&] { (void)g.run(idem::key{}, [&] { ++executed; }); });
    ASSERT_TRUE(thrown.has_value()) << "run() executed the empty key";
    EXPECT_EQ(thrown->kind(), errc::invalid_key) << thrown->what();
    EXPECT_EQ(executed, 0);
    EXPECT_EQ(g.snapshot().acquired, 0u);
}

class EmptyKey : public ::testing::TestWithParam<durability> {};

INSTANTIATE_TEST_SUITE_P(Modes, EmptyKey, ::testing::Values(durability::async, durability::sync),
                         [](const auto& info) { return std::string(info.param == durability::sync ? "sync" : "async"); });

// A durable guard over SQLite refuses key{} before the queue: no row '' reaches the file, so the
// next open (recovery reads every record and refuses a row with an empty key as corrupt) works.
TEST_P(EmptyKey, DurableGuardAnswersInvalidKeyAndTheStoreOpensAgain) {
    temp_dir dir("idem-overload");
    const std::string db = dir.file("idem.db");
    const bool sync = GetParam() == durability::sync;
    idem::store_options so;
    so.mode = GetParam();
    const auto k = idem::key("TXEMPTY_PAY_v1");
    {
        idem::durable_guard g(std::make_unique<idem::sqlite_store>(db, sync), durable_options(), so);
        const auto r = g->begin(idem::key{});
        EXPECT_EQ(r.status, begin_status::invalid_key);
        EXPECT_FALSE(r.ticket.valid());
        int executed = 0;
        const auto thrown = error_of([&] { (void)g->run(idem::key{}, [&] { ++executed; }); });
        ASSERT_TRUE(thrown.has_value()) << "run() executed the empty key";
        EXPECT_EQ(thrown->kind(), errc::invalid_key) << thrown->what();
        EXPECT_EQ(executed, 0);
        EXPECT_EQ(g.snapshot().queue_depth, 0u) << "the empty key reached the flush queue";
        auto ok = g->begin(k);
        ASSERT_EQ(ok.status, begin_status::acquired);
        ASSERT_FALSE(ok.ticket.succeed(5));
        ASSERT_TRUE(g.flush(10s)) << g.last_store_error();
    }
    {
        idem::sqlite_store st(db);
        const auto all = idem_test::load_all(st);
        EXPECT_EQ(all.count(""), 0u) << "a row with the empty key reached the store";
        EXPECT_EQ(all.size(), 1u);
        EXPECT_TRUE(verify_clean(st));
    }
    std::unique_ptr<idem::durable_guard> again;
    const auto reopened = error_of([&] {
        again = std::make_unique<idem::durable_guard>(std::make_unique<idem::sqlite_store>(db, sync), durable_options(), so);
    });
    ASSERT_FALSE(reopened.has_value()) << "reopening the store failed: " << reopened->what();
    EXPECT_EQ(again->recovery().records, 1u);
    const auto d = again->guard().begin(k);
    EXPECT_EQ(d.status, begin_status::succeeded);
    EXPECT_EQ(d.outcome, 5u);
    EXPECT_EQ(again->guard().begin(idem::key{}).status, begin_status::invalid_key);
}

// ---- 8. every sync waiter wakes ------------------------------------------------------------------

// Sixteen sync-mode callers wait at once for commits the test holds at a gate (first their claims,
// then their successes). When the gate opens every one must return success. A waiter that missed
// the wakeup for its row would return store_unavailable after sync_timeout (20 s), or hang: the
// results say so, no timing is measured.
TEST(SyncWaiters, EveryWaiterReturnsOnceItsRowCommits) {
    idem::memory_store mem;
    commit_gate gate;
    gated_store* gated = nullptr;
    idem::store_options so;
    so.sync_timeout = 20s;
    so.max_batch = 5;  // the held rows commit in several batches: the watermark moves several times
    auto g = open_wrapped(&gated, durability::sync, durable_options(), so, mem, gate);
    gate_opener open_at_exit(gate);
    constexpr std::size_t threads = 16, rounds = 3;

    for (std::size_t round = 0; round < rounds; ++round) {
        SCOPED_TRACE("round " + std::to_string(round));
        std::vector<idem::ticket> tickets(threads);
        std::vector<begin_status> claimed(threads, begin_status::backpressure);
        std::vector<std::error_code> completed(threads, errc::timeout);
        auto key_of = [&](std::size_t t) { return pay_key("WAKE" + std::to_string(round) + "X", t); };

        // Claims: every caller waits for the commit of its claim, which the gate holds.
        gate.close();
        std::jthread claims([&] {
            idem_test::run_on_latch(threads, [&](std::size_t t) {
                auto r = g->guard().begin(key_of(t));
                claimed[t] = r.status;
                tickets[t] = std::move(r.ticket);
            });
        });
        ASSERT_TRUE(wait_for([&] { return g->snapshot().queue_depth == threads && gate.waiting() == 1; }))
            << "the claims never all queued";
        gate.open();
        claims.join();
        for (std::size_t t = 0; t < threads; ++t)
            ASSERT_EQ(claimed[t], begin_status::acquired) << key_of(t).str() << ": a sync waiter was not woken";

        // Completions: every owner waits for the commit of its success.
        gate.close();
        std::jthread successes(
            [&] { idem_test::run_on_latch(threads, [&](std::size_t t) { completed[t] = tickets[t].succeed(t + 1); }); });
        ASSERT_TRUE(wait_for([&] { return g->snapshot().queue_depth == threads && gate.waiting() == 1; }))
            << "the successes never all queued";
        gate.open();
        successes.join();
        for (std::size_t t = 0; t < threads; ++t)
            EXPECT_FALSE(completed[t]) << key_of(t).str() << ": " << completed[t].message()
                                       << " (a sync waiter was not woken by its commit)";
    }
    g.reset();
    EXPECT_EQ(idem_test::load_all(mem).size(), threads * rounds);
    EXPECT_TRUE(verify_clean(mem));
}

}  // namespace
