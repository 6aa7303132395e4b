// lease_test: leases, compensation and fencing on a manual clock (no sleeps).
//
// A claim whose lease expired goes to the resolver, never to silent re-execution; the stale owner
// cannot record a completion over the resolver's answer; an unknown answer leaves the claim in
// doubt (and asked again); reclaim_expired hands the key to a new owner with a higher fence;
// extend() keeps a claim alive; an in-doubt owner that comes back still owns its claim.
#include <idem/idem.hpp>

#include <gtest/gtest.h>

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "support/manual_guard.hpp"

namespace {

using idem::begin_status;
using idem::errc;
using idem::record_state;
using idem::resolution;
using idem_test::manual_guard;

constexpr auto lease = std::chrono::seconds(30);

/// A resolver that answers from a script and records what it was asked.
struct scripted_resolver {
    scripted_resolver(std::initializer_list<idem::resolver_answer> script) : answers(script) {}
    std::vector<idem::resolver_answer> answers;  // the last one repeats
    std::vector<std::string> keys;
    std::vector<std::uint64_t> fences, fingerprints;

    idem::resolver fn() {
        return [this](const idem::expired_claim& c) {
            keys.emplace_back(c.key);
            fences.push_back(c.fence);
            fingerprints.push_back(c.fingerprint);
            const std::size_t i = std::min(keys.size(), answers.size()) - 1;
            return answers.at(i);
        };
    }
};

class Lease : public ::testing::Test {
protected:
    idem::options opts(scripted_resolver* r) {
        auto o = idem_test::test_options(64);
        o.lease = lease;
        if (r != nullptr) o.resolve = r->fn();
        return o;
    }
    idem::manual_clock clock;
    const idem::key k{"TX9_TRANSFER_v1"};
    const std::uint64_t fp = idem::fingerprint_of("amount=10");
};

TEST_F(Lease, LeaseDeadlineIsNowPlusLeaseInNanoseconds) {
    manual_guard g(opts(nullptr), clock);
    auto r = g.begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    const auto v = g.query(k);
    EXPECT_EQ(v.state, record_state::processing);
    EXPECT_EQ(v.lease_until, clock.now() + std::chrono::nanoseconds(lease)) << "a unit slip (ms vs s) shows here";
    EXPECT_EQ(v.fence, r.ticket.fence());
    EXPECT_EQ(v.fence, r.fence);
    EXPECT_GT(v.fence, 0u);
}

// abandon(): the claim is left as it is (not released: its effect may have happened), so a retry
// is refused until the lease expires, and then the resolver decides: here, that it never ran.
TEST_F(Lease, AbandonedClaimStaysUntilTheResolverDecides) {
    scripted_resolver res{{resolution::not_executed, 0}};
    manual_guard g(opts(&res), clock);
    auto r = g.begin(k, fp);
    ASSERT_EQ(r.status, begin_status::acquired);
    const auto fence = r.ticket.fence();
    r.ticket.abandon();
    EXPECT_FALSE(r.ticket.valid());
    EXPECT_EQ(r.ticket.succeed(1), errc::empty_ticket);
    EXPECT_EQ(g.query(k).state, record_state::processing) << "abandon() recorded something";
    EXPECT_EQ(g.begin(k, fp).status, begin_status::in_progress);
    clock.advance(lease - std::chrono::nanoseconds(1));
    EXPECT_EQ(g.compensate(), 0u);
    clock.advance(std::chrono::nanoseconds(1));
    EXPECT_EQ(g.compensate(), 1u);
    ASSERT_EQ(res.keys.size(), 1u);
    EXPECT_EQ(res.fences[0], fence);
    auto again = g.begin(k, fp);
    ASSERT_EQ(again.status, begin_status::acquired) << "the resolver said it never ran: claimable again";
    EXPECT_GT(again.ticket.fence(), fence);
}

TEST_F(Lease, UnexpiredClaimIsNotCompensated) {
    scripted_resolver res{{resolution::succeeded, 1}};
    manual_guard g(opts(&res), clock);
    auto r = g.begin(k);
    clock.advance(lease - std::chrono::nanoseconds(1));
    EXPECT_EQ(g.compensate(), 0u);
    EXPECT_TRUE(res.keys.empty()) << "the resolver was asked about a live claim";
    EXPECT_EQ(g.query(k).state, record_state::processing);
    EXPECT_FALSE(r.ticket.succeed(5));
    EXPECT_EQ(g.query(k).outcome, 5u);
}

TEST_F(Lease, ResolverSucceededWinsOverTheStaleOwner) {
    scripted_resolver res{{resolution::succeeded, 77}};
    manual_guard g(opts(&res), clock);
    auto r = g.begin(k, fp);
    ASSERT_EQ(r.status, begin_status::acquired);
    const auto fence = r.ticket.fence();
    clock.advance(lease);  // lease_until <= now: expired
    EXPECT_EQ(g.compensate(), 1u);
    ASSERT_EQ(res.keys.size(), 1u);
    EXPECT_EQ(res.keys[0], k.str());
    EXPECT_EQ(res.fences[0], fence);
    EXPECT_EQ(res.fingerprints[0], fp);

    EXPECT_EQ(r.ticket.succeed(5), errc::stale_ticket);
    EXPECT_FALSE(r.ticket.valid()) << "a stale ticket is spent";
    EXPECT_EQ(r.ticket.succeed(5), errc::empty_ticket);
    const auto v = g.query(k);
    EXPECT_EQ(v.state, record_state::succeeded);
    EXPECT_EQ(v.outcome, 77u);
    EXPECT_EQ(v.fence, fence);
    auto dup = g.begin(k, fp);
    EXPECT_EQ(dup.status, begin_status::succeeded);
    EXPECT_EQ(dup.outcome, 77u);
    const auto s = g.snapshot();
    EXPECT_EQ(s.compensated, 1u);
    EXPECT_EQ(s.stale_tickets, 1u);
    EXPECT_EQ(s.succeeded, 1u);
    EXPECT_EQ(g.compensate(), 0u) << "a resolved claim is not resolved again";
    EXPECT_EQ(res.keys.size(), 1u);
}

// The resolver found the response (at the processor, in a ledger): it is recorded with the outcome
// and replayed byte for byte, as if the owner had called succeed(outcome, payload).
TEST_F(Lease, ResolverPayloadIsRecordedAndReplayed) {
    const std::string body("{\"id\":\"ch_1\"}\0\xff\xfe tail", 20);
    scripted_resolver res{{resolution::succeeded, 201, body}};
    manual_guard g(opts(&res), clock);
    auto r = g.begin(k, fp);
    ASSERT_EQ(r.status, begin_status::acquired);
    clock.advance(lease);
    EXPECT_EQ(g.compensate(), 1u);
    auto dup = g.begin(k, fp);
    EXPECT_EQ(dup.status, begin_status::succeeded);
    EXPECT_EQ(dup.outcome, 201u);
    EXPECT_EQ(dup.payload, body);
    EXPECT_EQ(g.query(k).payload, body);
    EXPECT_EQ(r.ticket.succeed(5, "late"), errc::stale_ticket);
    EXPECT_EQ(g.begin(k, fp).payload, body) << "the stale owner replaced the resolver's response";
}

// The same with the payload budget spent (a response within max_payload that the arena has no
// room for): in doubt, not recorded without its bytes; an answer without a payload then records.
TEST_F(Lease, ResolverPayloadWithTheBudgetSpentLeavesTheClaimInDoubt) {
    scripted_resolver res{{resolution::succeeded, 1, std::string(16 << 10, 'r')}, {resolution::succeeded, 2}};
    auto o = opts(&res);
    o.max_payload = 16 << 10;
    o.payload_budget = 64 << 10;  // one 64 KiB chunk: four 16 KiB payloads
    manual_guard g(o, clock);
    for (int i = 0; i < 4; ++i) {
        auto f = g.begin(idem_test::key_n("FILL", static_cast<std::size_t>(i)));
        ASSERT_EQ(f.status, begin_status::acquired);
        ASSERT_FALSE(f.ticket.succeed(1, std::string(16 << 10, 'f')));
    }
    auto r = g.begin(k, fp);
    ASSERT_EQ(r.status, begin_status::acquired);
    clock.advance(lease);
    EXPECT_EQ(g.compensate(), 0u);
    EXPECT_EQ(g.begin(k, fp).status, begin_status::in_doubt) << "recorded without the resolver's bytes?";
    EXPECT_EQ(g.compensate(), 1u);
    auto dup = g.begin(k, fp);
    EXPECT_EQ(dup.status, begin_status::succeeded);
    EXPECT_EQ(dup.outcome, 2u);
    EXPECT_TRUE(dup.payload.empty());
}

// A response the guard cannot hold is neither truncated nor dropped: the claim goes in doubt, and
// the next pass asks again; a response that fits is then recorded.
TEST_F(Lease, ResolverPayloadOverTheMaximumLeavesTheClaimInDoubt) {
    scripted_resolver res{{resolution::succeeded, 1, std::string(17, 'x')},
                          {resolution::succeeded, 2, std::string(16, 'y')}};
    auto o = opts(&res);
    o.max_payload = 16;
    o.payload_budget = 1 << 20;
    manual_guard g(o, clock);
    auto r = g.begin(k, fp);
    ASSERT_EQ(r.status, begin_status::acquired);
    clock.advance(lease);
    EXPECT_EQ(g.compensate(), 0u);
    EXPECT_EQ(res.keys.size(), 1u);
    EXPECT_EQ(g.begin(k, fp).status, begin_status::in_doubt) << "a 17-byte response over max_payload 16";
    EXPECT_EQ(g.query(k).state, record_state::processing);
    EXPECT_EQ(g.snapshot().compensated, 0u);
    EXPECT_EQ(g.compensate(), 1u);
    EXPECT_EQ(res.keys.size(), 2u);
    auto dup = g.begin(k, fp);
    EXPECT_EQ(dup.status, begin_status::succeeded);
    EXPECT_EQ(dup.outcome, 2u);
    EXPECT_EQ(dup.payload, std::string(16, 'y'));
}

// The owner completes while compensation is asking the resolver about its expired claim (the
// resolver runs between compensation's read of the claim and its compare-and-swap). The owner's
// completion is first, so it stands; compensation must notice and resolve nothing.
TEST_F(Lease, OwnerCompletingWhileTheResolverIsAskedWins) {
    std::optional<idem_test::manual_ticket> owner;
    std::error_code owner_result = idem::errc::in_progress;
    auto o = opts(nullptr);
    o.resolve = [&](const idem::expired_claim&) {
        owner_result = owner->succeed(5);  // the owner wakes up right now
        return idem::resolver_answer{resolution::succeeded, 77};
    };
    manual_guard g(o, clock);
    auto r = g.begin(k);
    owner = std::move(r.ticket);
    clock.advance(lease);
    EXPECT_EQ(g.compensate(), 0u);
    EXPECT_FALSE(owner_result);
    const auto v = g.query(k);
    EXPECT_EQ(v.state, record_state::succeeded);
    EXPECT_EQ(v.outcome, 5u) << "compensation overwrote the owner's completion";
    EXPECT_EQ(g.snapshot().compensated, 0u);
    EXPECT_EQ(g.snapshot().succeeded, 1u);
}

// The same with a resolver that answers not_executed: had compensation won, the key would be
// claimable again and the operation would run twice.
TEST_F(Lease, OwnerCompletingWhileTheResolverSaysNotExecutedIsNotReRun) {
    std::optional<idem_test::manual_ticket> owner;
    auto o = opts(nullptr);
    o.resolve = [&](const idem::expired_claim&) {
        EXPECT_FALSE(owner->succeed(5));
        return idem::resolver_answer{resolution::not_executed, 0};
    };
    manual_guard g(o, clock);
    auto r = g.begin(k);
    owner = std::move(r.ticket);
    clock.advance(lease);
    EXPECT_EQ(g.compensate(), 0u);
    auto again = g.begin(k);
    EXPECT_EQ(again.status, begin_status::succeeded);
    EXPECT_EQ(again.outcome, 5u);
}

TEST_F(Lease, ResolverFailedRecordsFailure) {
    scripted_resolver res{{resolution::failed, 503}};
    manual_guard g(opts(&res), clock);
    auto r = g.begin(k);
    clock.advance(lease + std::chrono::seconds(1));
    EXPECT_EQ(g.compensate(), 1u);
    EXPECT_EQ(r.ticket.fail(1, idem::failure_policy::retryable), errc::stale_ticket);
    const auto v = g.query(k);
    EXPECT_EQ(v.state, record_state::failed);
    EXPECT_EQ(v.outcome, 503u);
    auto dup = g.begin(k);
    EXPECT_EQ(dup.status, begin_status::failed);
    EXPECT_EQ(dup.outcome, 503u);
}

TEST_F(Lease, ResolverNotExecutedMakesTheKeyClaimableWithANewFence) {
    scripted_resolver res{{resolution::not_executed, 0}};
    manual_guard g(opts(&res), clock);
    auto r = g.begin(k);
    const auto old_fence = r.ticket.fence();
    clock.advance(lease);
    EXPECT_EQ(g.compensate(), 1u);
    EXPECT_EQ(g.query(k).state, record_state::absent);

    auto again = g.begin(k);
    ASSERT_EQ(again.status, begin_status::acquired);
    EXPECT_EQ(again.ticket.fence(), old_fence + 1);
    EXPECT_EQ(r.ticket.succeed(1), errc::stale_ticket) << "the old owner must not complete the new claim";
    EXPECT_EQ(g.query(k).state, record_state::processing);
    EXPECT_FALSE(again.ticket.succeed(2));
    const auto v = g.query(k);
    EXPECT_EQ(v.state, record_state::succeeded);
    EXPECT_EQ(v.outcome, 2u);
    EXPECT_EQ(v.fence, old_fence + 1);
}

TEST_F(Lease, UnknownLeavesTheClaimInDoubtAndAsksAgain) {
    scripted_resolver res{{resolution::unknown, 0}, {resolution::unknown, 0}, {resolution::succeeded, 9}};
    manual_guard g(opts(&res), clock);
    auto r = g.begin(k);
    clock.advance(lease);
    EXPECT_EQ(g.compensate(), 0u);
    auto v = g.query(k);
    EXPECT_EQ(v.state, record_state::processing);
    EXPECT_TRUE(v.in_doubt);
    auto b = g.begin(k);
    EXPECT_EQ(b.status, begin_status::in_doubt) << "never re-executed blindly";
    EXPECT_FALSE(b.ticket.valid());
    EXPECT_EQ(g.snapshot().in_doubt, 1u);

    EXPECT_EQ(g.compensate(), 0u);
    EXPECT_EQ(res.keys.size(), 2u) << "the next pass asks again";
    EXPECT_EQ(g.snapshot().in_doubt, 1u) << "in_doubt counts claims entering doubt, not passes";
    EXPECT_EQ(g.begin(k).status, begin_status::in_doubt);

    EXPECT_EQ(g.compensate(), 1u);
    EXPECT_EQ(res.keys.size(), 3u);
    v = g.query(k);
    EXPECT_EQ(v.state, record_state::succeeded);
    EXPECT_EQ(v.outcome, 9u);
    EXPECT_FALSE(v.in_doubt);
    EXPECT_EQ(r.ticket.succeed(1), errc::stale_ticket);
    EXPECT_EQ(g.snapshot().compensated, 1u);
}

TEST_F(Lease, NoResolverMeansInDoubt) {
    manual_guard g(opts(nullptr), clock);
    auto r = g.begin(k);
    clock.advance(lease * 2);
    EXPECT_EQ(g.compensate(), 0u);
    EXPECT_TRUE(g.query(k).in_doubt);
    EXPECT_EQ(g.begin(k).status, begin_status::in_doubt);
    EXPECT_EQ(g.snapshot().in_doubt, 1u);
    // run() refuses an in-doubt key with errc::in_doubt, naming it.
    try {
        (void)g.run(k, [] { return 1; });
        ADD_FAILURE() << "run() executed an in-doubt key";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.kind(), errc::in_doubt);
        EXPECT_NE(std::string(e.what()).find(k.str()), std::string::npos) << e.what();
    }
}

TEST_F(Lease, ExpiredClaimIsNotReclaimedByDefault) {
    manual_guard g(opts(nullptr), clock);
    auto r = g.begin(k);
    clock.advance(lease * 10);
    EXPECT_EQ(g.begin(k).status, begin_status::in_progress) << "reclaim_expired is off by default";
    EXPECT_FALSE(r.ticket.succeed(3)) << "the owner still owns an expired, uncompensated claim";
    EXPECT_EQ(g.query(k).outcome, 3u);
}

TEST_F(Lease, ReclaimExpiredHandsTheKeyToANewOwner) {
    auto o = opts(nullptr);
    o.reclaim_expired = true;
    manual_guard g(o, clock);
    auto first = g.begin(k);
    const auto old_fence = first.ticket.fence();
    clock.advance(lease - std::chrono::nanoseconds(1));
    EXPECT_EQ(g.begin(k).status, begin_status::in_progress) << "a live claim must never be reclaimed";
    clock.advance(std::chrono::nanoseconds(1));

    auto second = g.begin(k);
    ASSERT_EQ(second.status, begin_status::acquired);
    EXPECT_GT(second.ticket.fence(), old_fence);
    EXPECT_EQ(g.snapshot().reclaimed, 1u);
    EXPECT_EQ(g.begin(k).status, begin_status::in_progress) << "the new claim has a fresh lease";
    EXPECT_EQ(first.ticket.succeed(1), errc::stale_ticket);
    EXPECT_EQ(first.ticket.extend(lease), errc::empty_ticket);
    EXPECT_EQ(g.query(k).state, record_state::processing);
    EXPECT_FALSE(second.ticket.succeed(2));
    const auto v = g.query(k);
    EXPECT_EQ(v.state, record_state::succeeded);
    EXPECT_EQ(v.outcome, 2u);
    EXPECT_EQ(v.fence, second.fence);
    EXPECT_EQ(g.snapshot().stale_tickets, 1u);
}

TEST_F(Lease, StaleOwnerCannotExtendAReclaimedClaim) {
    auto o = opts(nullptr);
    o.reclaim_expired = true;
    manual_guard g(o, clock);
    auto first = g.begin(k);
    clock.advance(lease);
    auto second = g.begin(k);
    ASSERT_EQ(second.status, begin_status::acquired);
    EXPECT_EQ(first.ticket.extend(lease), errc::stale_ticket);
    EXPECT_EQ(g.query(k).lease_until, clock.now() + std::chrono::nanoseconds(lease)) << "the stale extend changed it";
}

TEST_F(Lease, ExtendKeepsTheClaimAlivePastTheOldDeadline) {
    scripted_resolver res{{resolution::not_executed, 0}};
    manual_guard g(opts(&res), clock);
    auto r = g.begin(k);
    clock.advance(lease / 2);
    ASSERT_FALSE(r.ticket.extend(lease));
    EXPECT_EQ(g.query(k).lease_until, clock.now() + std::chrono::nanoseconds(lease));
    clock.advance(lease / 2 + std::chrono::seconds(1));  // past the original deadline
    EXPECT_EQ(g.compensate(), 0u);
    EXPECT_TRUE(res.keys.empty());
    EXPECT_EQ(g.query(k).state, record_state::processing);
    EXPECT_FALSE(g.query(k).in_doubt);
    EXPECT_FALSE(r.ticket.succeed(8));
    EXPECT_EQ(g.query(k).outcome, 8u);
    EXPECT_EQ(r.ticket.extend(lease), errc::empty_ticket);
}

TEST_F(Lease, ExtendedClaimStillExpiresAtItsNewDeadline) {
    scripted_resolver res{{resolution::not_executed, 0}};
    manual_guard g(opts(&res), clock);
    auto r = g.begin(k);
    ASSERT_FALSE(r.ticket.extend(lease * 2));
    clock.advance(lease * 2);
    EXPECT_EQ(g.compensate(), 1u);
    EXPECT_EQ(r.ticket.succeed(), errc::stale_ticket);
}

TEST_F(Lease, InDoubtOwnerComingBackCanStillSucceed) {
    manual_guard g(opts(nullptr), clock);
    auto r = g.begin(k, fp);
    clock.advance(lease);
    EXPECT_EQ(g.compensate(), 0u);
    ASSERT_TRUE(g.query(k).in_doubt);
    EXPECT_FALSE(r.ticket.succeed(41)) << "its fence is still current";
    const auto v = g.query(k);
    EXPECT_EQ(v.state, record_state::succeeded);
    EXPECT_EQ(v.outcome, 41u);
    EXPECT_FALSE(v.in_doubt);
    EXPECT_EQ(g.begin(k, fp).outcome, 41u);
}

TEST_F(Lease, InDoubtOwnerComingBackCanFail) {
    manual_guard g(opts(nullptr), clock);
    auto r = g.begin(k);
    const auto fence = r.ticket.fence();
    clock.advance(lease);
    (void)g.compensate();
    ASSERT_TRUE(g.query(k).in_doubt);
    EXPECT_FALSE(r.ticket.fail(7, idem::failure_policy::retryable));
    auto again = g.begin(k);
    ASSERT_EQ(again.status, begin_status::acquired);
    EXPECT_EQ(again.ticket.fence(), fence + 1);
}

// An in-doubt owner that comes back and renews its lease still owns the claim (succeed() accepts
// its fence), so extend() must accept it too: answering stale_ticket would tell a live owner it
// lost a claim that is still its own.
TEST_F(Lease, InDoubtOwnerComingBackCanExtend) {
    scripted_resolver res{{resolution::unknown, 0}};
    manual_guard g(opts(&res), clock);
    auto r = g.begin(k);
    clock.advance(lease);
    (void)g.compensate();
    ASSERT_TRUE(g.query(k).in_doubt);
    EXPECT_FALSE(r.ticket.extend(lease)) << "the owner's fence is current";
    EXPECT_EQ(g.query(k).lease_until, clock.now() + std::chrono::nanoseconds(lease));
    clock.advance(lease / 2);
    EXPECT_EQ(g.compensate(), 0u);
    EXPECT_EQ(res.keys.size(), 1u) << "a renewed claim is not expired";
    EXPECT_FALSE(r.ticket.succeed(6));
    EXPECT_EQ(g.query(k).state, record_state::succeeded);
}

// A classic bug of idempotency layers: records stuck in progress after a crash. A PROCESSING record restored at
// start with a lease that ran out while the process was down goes to the resolver on the first
// pass, with its fence and fingerprint; it is not handed to a new caller.
TEST_F(Lease, RestoredExpiredClaimGoesToCompensation) {
    scripted_resolver res{{resolution::not_executed, 0}};
    manual_guard g(opts(&res), clock);
    constexpr std::uint64_t fence = 41;
    ASSERT_EQ(idem::detail::guard_access::restore(g, k,
                                                  {record_state::processing, fence, 0, fp,
                                                   clock.now() - std::chrono::seconds(1), clock.now() - lease}),
              begin_status::acquired);
    ASSERT_EQ(idem::detail::guard_access::restore(g, idem::key("done"),
                                                  {record_state::succeeded, 7, 99, 0, {}, clock.now()}),
              begin_status::acquired);
    EXPECT_EQ(g.begin(k, fp).status, begin_status::in_progress);
    auto done = g.begin(idem::key("done"));
    EXPECT_EQ(done.status, begin_status::succeeded);
    EXPECT_EQ(done.outcome, 99u);

    EXPECT_EQ(g.compensate(), 1u);
    ASSERT_EQ(res.keys.size(), 1u);
    EXPECT_EQ(res.keys[0], k.str());
    EXPECT_EQ(res.fences[0], fence);
    EXPECT_EQ(res.fingerprints[0], fp);
    auto again = g.begin(k, fp);
    ASSERT_EQ(again.status, begin_status::acquired);
    EXPECT_EQ(again.ticket.fence(), fence + 1);
}

}  // namespace
