// cache_test: memory is a cache of the idempotency window.
//
// A durable guard's store is the window; memory holds the claims in flight and the recent
// decisions. These tests check the two rules that make that true under load that never stops:
//
// * a table full of decided, durable records evicts the oldest of them into the cold window
//   (the store answers for them) instead of refusing new keys: capacity_exhausted means too many
//   claims in flight, never "this service has been up for a day";
// * a rotation waits only for the rows of the generation it recycles, not for every row offered
//   so far: a steady load never lets the queue drain, and must not starve the rotation.
#include <idem/idem.hpp>
#include <idem/stores/sqlite_store.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "support/manual_guard.hpp"
#include "support/store_fixtures.hpp"
#include "support/store_kinds.hpp"

namespace {

using idem::begin_status;
using idem_test::key_n;

// 2,000 fresh keys through a table of capacity 8 with the default 24 h retention: every claim is
// granted (the review's payment service refused keys, and charged twice, once its table filled),
// and afterwards every key's duplicate gets its recorded outcome and payload, from memory or from
// the store.
TEST(Cache, AFullTableOfDecidedRecordsEvictsIntoTheColdWindow) {
    idem_test::temp_dir dir("idem-cache");
    idem::manual_clock clock;
    auto o = idem_test::durable_options(8);  // retention: the default 24 h
    idem::store_options so;
    so.mode = idem::durability::async;
    idem::basic_durable_guard<std::atomic, idem::manual_clock> g(
        std::make_unique<idem::sqlite_store>((dir.path() / "c.db").string()), o, so, clock);
    auto& guard = g.guard();
    constexpr int keys = 2000;
    for (int i = 0; i < keys; ++i) {
        auto r = guard.begin(key_n("PAY", i));
        ASSERT_EQ(r.status, begin_status::acquired) << "key " << i << " of a table of capacity 8";
        ASSERT_FALSE(r.ticket.succeed(static_cast<std::uint64_t>(i), "receipt-" + std::to_string(i)));
        clock.advance(std::chrono::milliseconds(1));
        if (i % 4 == 3) {
            ASSERT_TRUE(g.flush());
            (void)guard.collect();  // what the maintenance thread does
        }
    }
    const auto st = g.snapshot();
    EXPECT_EQ(st.capacity_exhausted, 0u);
    EXPECT_GT(st.evicted, static_cast<std::uint64_t>(keys / 2)) << "the records left memory for the store";
    for (int i = 0; i < keys; ++i) {
        auto d = guard.begin(key_n("PAY", i));
        ASSERT_EQ(d.status, begin_status::succeeded) << "key " << i;
        EXPECT_EQ(d.outcome, static_cast<std::uint64_t>(i));
        EXPECT_EQ(d.payload, "receipt-" + std::to_string(i));
    }
}

// Claims in flight are what a full table refuses: with every record of both generations
// processing, a new key is capacity_exhausted (no record was evicted, none may be).
TEST(Cache, ClaimsInFlightAreWhatAFullTableRefuses) {
    idem_test::temp_dir dir("idem-cache-inflight");
    idem::manual_clock clock;
    auto o = idem_test::durable_options(4);
    o.max_probe = 64;
    idem::store_options so;
    so.mode = idem::durability::async;
    idem::basic_durable_guard<std::atomic, idem::manual_clock> g(
        std::make_unique<idem::sqlite_store>((dir.path() / "f.db").string()), o, so, clock);
    auto& guard = g.guard();
    std::vector<idem::basic_ticket<std::atomic, idem::manual_clock>> held;
    begin_status last = begin_status::acquired;
    for (int i = 0; i < 200 && last == begin_status::acquired; ++i) {
        auto r = guard.begin(key_n("OPEN", i));
        last = r.status;
        if (r.status == begin_status::acquired) held.push_back(std::move(r.ticket));
        ASSERT_TRUE(g.flush());
        (void)guard.collect();
    }
    EXPECT_EQ(last, begin_status::capacity_exhausted);
    EXPECT_GE(held.size(), 4u) << "at least options.capacity claims in flight fit";
    EXPECT_EQ(g.snapshot().evicted, 0u);
    for (auto& t : held) EXPECT_FALSE(t.succeed(1));
}

// A rotation needs the rows of the generation it recycles in the store, not the rows of claims
// made since. The review saw 469 of 489 rotations refused under a steady 15k claims/s, the queue
// at 0-20 rows: the rotation waited for the queue to be empty. Here the store holds back every
// commit of the newest claims; the previous generation's rows are committed, so it rotates.
TEST(Cache, RotationWaitsOnlyForTheLeavingGenerationsRows) {
    idem_test::temp_dir dir("idem-cache-steady");
    idem::sqlite_store inner((dir.path() / "s.db").string());
    idem_test::commit_gate gate;
    idem::options o = idem_test::durable_options(8);
    o.retention = std::chrono::nanoseconds(0);
    idem::store_options so;
    idem_test::gated_store* gated = nullptr;
    auto g = idem_test::open_wrapped(&gated, idem::durability::async, o, so, inner, gate);
    idem_test::gate_opener opener(gate);
    auto& guard = g->guard();
    auto complete = [&](const idem::key& k) {
        auto r = guard.begin(k);
        ASSERT_EQ(r.status, begin_status::acquired) << k.str();
        ASSERT_FALSE(r.ticket.succeed(1));
    };
    for (int i = 0; i < 4; ++i) complete(key_n("G0-", i));
    ASSERT_TRUE(g->flush());
    ASSERT_TRUE(guard.collect()) << "generation 0 becomes the previous one";
    for (int i = 0; i < 4; ++i) complete(key_n("G1-", i));
    ASSERT_TRUE(g->flush());
    // The steady load: there is always a claim whose rows the store has not committed yet.
    gate.close();
    complete(idem::key("X"));
    EXPECT_FALSE(guard.collect()) << "rows offered before this rotation's scan are not all durable yet";
    gate.open();
    ASSERT_TRUE(g->flush());
    gate.close();
    complete(idem::key("Y"));
    EXPECT_TRUE(guard.collect()) << "generation 0's rows are committed: Y's pending rows must not block it";
    gate.open();
    ASSERT_TRUE(g->flush());
    EXPECT_EQ(guard.begin(key_n("G0-", 1)).status, begin_status::succeeded) << "answered from the store";
}

// A decided record whose rows the store refused (rejected_row: set aside) is evicted like any
// other once its rows are decided. Its key must still be answered with the decision: the store
// does not have it, so before the fix a duplicate found nothing and ran the operation again.
TEST(Cache, ADecisionTheStoreRefusedIsStillAnsweredAfterItsRecordLeavesMemory) {
    idem::memory_store mem;
    const idem::key poison("POISON_PAY_v1");
    idem::manual_clock clock;
    idem::store_options so;
    so.mode = idem::durability::async;
    idem::basic_durable_guard<std::atomic, idem::manual_clock> g(
        std::make_unique<idem_test::poisoned_store>(mem, poison.str()), idem_test::durable_options(8), so, clock);
    auto& guard = g.guard();
    {
        auto r = guard.begin(poison);
        ASSERT_EQ(r.status, begin_status::acquired);
        ASSERT_FALSE(r.ticket.succeed(42, "charged"));
    }
    ASSERT_TRUE(g.flush());
    ASSERT_EQ(g.snapshot().rejected_rows, 2u) << "the claim and the success are each set aside";
    ASSERT_FALSE(mem.get(poison.view())) << "the store has no row for the refused key";
    constexpr int keys = 200;
    for (int i = 0; i < keys; ++i) {
        auto r = guard.begin(key_n("PAY", i));
        ASSERT_EQ(r.status, begin_status::acquired) << i;
        ASSERT_FALSE(r.ticket.succeed(static_cast<std::uint64_t>(i)));
        clock.advance(std::chrono::milliseconds(1));
        if (i % 4 == 3) {
            ASSERT_TRUE(g.flush());
            (void)guard.collect();
        }
    }
    ASSERT_GT(g.snapshot().evicted, static_cast<std::uint64_t>(keys / 2)) << "the poisoned key's generation left memory";
    auto d = guard.begin(poison);
    ASSERT_EQ(d.status, begin_status::succeeded) << "the charge that ran was granted again";
    EXPECT_EQ(d.outcome, 42u);
    EXPECT_EQ(d.payload, "charged");
}

/// Refuses with idem::rejected_row every batch holding `key` while `refusing` is set.
class refusing_store final : public idem_test::forwarding_store {
public:
    refusing_store(idem::store& inner, std::string key) : forwarding_store(inner), key_(std::move(key)) {}
    std::atomic<bool> refusing{true};
    void apply(std::span<const idem::store_row> rows, std::uint64_t batch_id) override {
        if (refusing.load())
            for (const auto& r : rows)
                if (r.t.k.view() == key_) throw idem::rejected_row("refusing store: key " + key_);
        inner_.apply(rows, batch_id);
    }

private:
    std::string key_;
};

// A decision kept because the store refused its row is superseded by a later life of the key that
// the store took: past the window the key is claimed again, and that life's outcome must be
// answered from the store after eviction, not hidden by the old kept decision (which is past the
// window: a recall answering from it would find "absent" and grant the key a third time).
TEST(Cache, ALaterLifeTheStoreTookSupersedesAKeptDecision) {
    using namespace std::chrono_literals;
    idem::memory_store mem;
    const idem::key k("LIVES_PAY_v1");
    idem::manual_clock clock;
    idem::store_options so;
    so.mode = idem::durability::async;
    so.window = 1h;
    so.prune_interval = {};
    auto o = idem_test::durable_options(8);
    o.retention = 1ms;
    auto owned = std::make_unique<refusing_store>(mem, k.str());
    refusing_store& st = *owned;
    idem::basic_durable_guard<std::atomic, idem::manual_clock> g(std::move(owned), o, so, clock);
    auto& guard = g.guard();
    int filler = 0;
    {
        auto r = guard.begin(k);
        ASSERT_EQ(r.status, begin_status::acquired);
        ASSERT_FALSE(r.ticket.succeed(1));
    }
    ASSERT_TRUE(g.flush());
    ASSERT_EQ(g.snapshot().rejected_rows, 2u);
    st.refusing = false;
    clock.advance(2h);  // the first life is past the window
    idem_test::evict(g, k.str(), clock, filler);
    {
        auto r = guard.begin(k);
        ASSERT_EQ(r.status, begin_status::acquired) << "past the window the key is new again";
        ASSERT_FALSE(r.ticket.succeed(2));
    }
    ASSERT_TRUE(g.flush());
    idem_test::evict(g, k.str(), clock, filler);
    auto d = guard.begin(k);
    ASSERT_EQ(d.status, begin_status::succeeded) << "the second life, which ran, was granted again";
    EXPECT_EQ(d.outcome, 2u);
}

}  // namespace
