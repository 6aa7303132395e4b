// misuse_test: what the guard does when it is full, when tickets are misused, when a key is
// reused with another payload, and when options are out of range.
#include <idem/idem.hpp>

#include <gtest/gtest.h>

#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "support/manual_guard.hpp"

namespace {

using idem::begin_status;
using idem::errc;
using idem::record_state;

// Fill a small table with distinct keys until begin() answers capacity_exhausted. Every key
// accepted before must still be answered correctly afterwards (nothing accepted is lost or
// evicted to make room), open claims must still complete, and refusals are counted.
TEST(Capacity, ExhaustionLosesNothingAccepted) {
    auto opts = idem_test::test_options(4);
    opts.max_probe = 1024;
    idem::guard g(opts);

    struct accepted {
        idem::key k;
        int kind;  // 0 succeeded, 1 failed terminally, 2 still processing
        std::optional<idem::ticket> open;
    };
    std::vector<accepted> in;
    std::size_t refused_at = 0;
    for (std::size_t i = 0; i < 10000; ++i) {
        const idem::key k = idem_test::key_n("cap-", i);
        auto r = g.begin(k, i + 1);
        if (r.status == begin_status::capacity_exhausted) {
            refused_at = i;
            break;
        }
        ASSERT_EQ(r.status, begin_status::acquired) << k.str();
        const int kind = static_cast<int>(i % 3);
        if (kind == 0) {
            ASSERT_FALSE(r.ticket.succeed(1000 + i));
            in.push_back({k, kind, std::nullopt});
        } else if (kind == 1) {
            ASSERT_FALSE(r.ticket.fail(2000 + i, idem::failure_policy::terminal));
            in.push_back({k, kind, std::nullopt});
        } else {
            in.push_back({k, kind, std::move(r.ticket)});
        }
    }
    ASSERT_GT(refused_at, 0u) << "the table never filled";
    EXPECT_GE(in.size(), opts.capacity) << "the guard must hold at least `capacity` live records";
    EXPECT_EQ(g.snapshot().capacity_exhausted, 1u);

    // More new keys are refused, consistently, and each refusal is counted.
    for (std::size_t i = 0; i < 5; ++i) {
        const idem::key k = idem_test::key_n("late-", i);
        EXPECT_EQ(g.begin(k).status, begin_status::capacity_exhausted);
        EXPECT_EQ(g.query(k).state, record_state::absent);
    }
    EXPECT_EQ(g.snapshot().capacity_exhausted, 6u);
    try {
        (void)g.run(idem::key("late-run"), [] { return 1; });
        ADD_FAILURE() << "run() executed without a claim";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.kind(), errc::capacity_exhausted);
        EXPECT_NE(std::string(e.what()).find("late-run"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("max_probe"), std::string::npos) << e.what();
    }

    // Everything accepted is still there.
    for (std::size_t i = 0; i < in.size(); ++i) {
        auto& a = in[i];
        SCOPED_TRACE(a.k.str());
        const auto v = g.query(a.k);
        auto r = g.begin(a.k, i + 1);
        switch (a.kind) {
            case 0:
                EXPECT_EQ(v.state, record_state::succeeded);
                EXPECT_EQ(r.status, begin_status::succeeded);
                EXPECT_EQ(r.outcome, 1000 + i);
                break;
            case 1:
                EXPECT_EQ(v.state, record_state::failed);
                EXPECT_EQ(r.status, begin_status::failed);
                EXPECT_EQ(r.outcome, 2000 + i);
                break;
            default:
                EXPECT_EQ(v.state, record_state::processing);
                EXPECT_EQ(r.status, begin_status::in_progress);
                EXPECT_FALSE(a.open->succeed(3000 + i)) << "an open claim completes in a full table";
                EXPECT_EQ(g.begin(a.k, i + 1).outcome, 3000 + i);
                break;
        }
        EXPECT_EQ(g.begin(a.k, 999999).status, begin_status::payload_mismatch) << "fingerprints survive";
    }
}

// A key released for retry keeps its slot: re-claiming it in a full table works.
TEST(Capacity, ReleasedKeyIsReclaimableInAFullTable) {
    auto opts = idem_test::test_options(4);
    opts.max_probe = 1024;
    idem::guard g(opts);
    std::optional<idem::ticket> first;
    idem::key first_key("full-0");
    for (std::size_t i = 0;; ++i) {
        ASSERT_LT(i, 10000u);
        auto r = g.begin(idem_test::key_n("full-", i));
        if (r.status == begin_status::capacity_exhausted) break;
        ASSERT_EQ(r.status, begin_status::acquired);
        if (i == 0) first = std::move(r.ticket);
        else ASSERT_FALSE(r.ticket.succeed(i));
    }
    ASSERT_FALSE(first->fail(0, idem::failure_policy::retryable));
    auto again = g.begin(first_key);
    EXPECT_EQ(again.status, begin_status::acquired);
}

TEST(Capacity, ProbeLengthIsBoundedAndReported) {
    auto opts = idem_test::test_options(1024);
    opts.max_probe = 4;
    idem::guard g(opts);
    std::size_t accepted = 0;
    for (std::size_t i = 0; i < 4096; ++i) {
        auto r = g.begin(idem_test::key_n("probe-", i));
        if (r.status == begin_status::acquired) {
            ++accepted;
            ASSERT_FALSE(r.ticket.succeed(i));
        } else {
            ASSERT_EQ(r.status, begin_status::capacity_exhausted);
        }
    }
    const auto s = g.snapshot();
    EXPECT_LE(s.max_probe, 4u);
    EXPECT_GE(s.max_probe, 1u);
    EXPECT_EQ(accepted + s.capacity_exhausted, 4096u);
    EXPECT_GE(accepted, 1024u / 2) << "a 2048-slot table with probe bound 4 takes far more than this";
}

TEST(Ticket, DoubleSucceedIsAnEmptyTicket) {
    idem::guard g(idem_test::test_options());
    auto r = g.begin(idem::key("double"));
    ASSERT_TRUE(r);
    EXPECT_TRUE(r.ticket.valid());
    EXPECT_FALSE(r.ticket.succeed(1));
    EXPECT_FALSE(r.ticket.valid());
    EXPECT_EQ(r.ticket.succeed(2), errc::empty_ticket);
    EXPECT_EQ(r.ticket.fail(3), errc::empty_ticket);
    EXPECT_EQ(r.ticket.fail(3, idem::failure_policy::terminal), errc::empty_ticket);
    EXPECT_EQ(r.ticket.extend(std::chrono::seconds(1)), errc::empty_ticket);
    EXPECT_EQ(r.ticket.fence(), 0u);
    EXPECT_EQ(g.query(idem::key("double")).outcome, 1u) << "the second succeed changed the record";
    EXPECT_EQ(g.snapshot().succeeded, 1u);
}

TEST(Ticket, MovedFromTicketIsEmpty) {
    idem::guard g(idem_test::test_options());
    const idem::key k("moved");
    auto r = g.begin(k);
    const auto fence = r.ticket.fence();
    idem::ticket t = std::move(r.ticket);
    EXPECT_FALSE(r.ticket.valid());
    EXPECT_EQ(r.ticket.succeed(1), errc::empty_ticket);
    EXPECT_EQ(r.ticket.fence(), 0u);
    EXPECT_TRUE(t.valid());
    EXPECT_EQ(t.fence(), fence);
    EXPECT_EQ(t.get_key(), k);
    EXPECT_EQ(g.query(k).state, record_state::processing) << "moving a ticket must not release it";
    EXPECT_FALSE(t.succeed(2));
    EXPECT_EQ(g.query(k).outcome, 2u);
}

TEST(Ticket, DefaultTicketIsEmpty) {
    idem::ticket t;
    EXPECT_FALSE(t.valid());
    EXPECT_FALSE(static_cast<bool>(t));
    EXPECT_EQ(t.succeed(), errc::empty_ticket);
    EXPECT_EQ(t.fail(), errc::empty_ticket);
    EXPECT_EQ(t.extend(std::chrono::seconds(1)), errc::empty_ticket);
}

TEST(Ticket, DroppedTicketIsReleasedUnderRetryablePolicy) {
    auto opts = idem_test::test_options();
    opts.on_failure = idem::failure_policy::retryable;
    idem::guard g(opts);
    const idem::key k("dropped-retryable");
    std::uint64_t fence = 0;
    {
        auto r = g.begin(k);
        ASSERT_TRUE(r);
        fence = r.ticket.fence();
    }  // dropped without completion
    EXPECT_EQ(g.query(k).state, record_state::absent);
    EXPECT_EQ(g.snapshot().released, 1u);
    auto again = g.begin(k);
    ASSERT_EQ(again.status, begin_status::acquired);
    EXPECT_EQ(again.ticket.fence(), fence + 1);
    EXPECT_EQ(again.fence, fence + 1);
}

TEST(Ticket, DroppedTicketFailsUnderTerminalPolicy) {
    auto opts = idem_test::test_options();
    opts.on_failure = idem::failure_policy::terminal;
    idem::guard g(opts);
    const idem::key k("dropped-terminal");
    { auto r = g.begin(k); }
    EXPECT_EQ(g.query(k).state, record_state::failed);
    auto again = g.begin(k);
    EXPECT_EQ(again.status, begin_status::failed);
    EXPECT_FALSE(again.ticket.valid());
    EXPECT_EQ(g.snapshot().failed, 1u);
}

TEST(Ticket, FailWithoutPolicyUsesTheGuardsPolicy) {
    auto opts = idem_test::test_options();
    opts.on_failure = idem::failure_policy::terminal;
    idem::guard g(opts);
    auto r = g.begin(idem::key("fail-default"));
    EXPECT_FALSE(r.ticket.fail(12));
    auto again = g.begin(idem::key("fail-default"));
    EXPECT_EQ(again.status, begin_status::failed);
    EXPECT_EQ(again.outcome, 12u);
}

TEST(Ticket, MoveAssignmentReleasesTheOverwrittenClaim) {
    idem::guard g(idem_test::test_options());
    const idem::key a("assign-a"), b("assign-b");
    auto ra = g.begin(a);
    auto rb = g.begin(b);
    const auto fence_a = ra.ticket.fence();
    ra.ticket = std::move(rb.ticket);  // a's claim is dropped, b's claim moves
    EXPECT_EQ(g.query(a).state, record_state::absent);
    EXPECT_EQ(g.query(b).state, record_state::processing);
    EXPECT_EQ(ra.ticket.get_key(), b);
    auto again = g.begin(a);
    ASSERT_EQ(again.status, begin_status::acquired);
    EXPECT_EQ(again.ticket.fence(), fence_a + 1);
    EXPECT_FALSE(ra.ticket.succeed(5));
    EXPECT_EQ(g.query(b).outcome, 5u);
}

TEST(Payload, MismatchOnProcessingAndSucceededKeys) {
    idem::guard g(idem_test::test_options());
    const idem::key k("TX7_PAY_v1");
    const auto fa = idem::fingerprint_of("a"), fb = idem::fingerprint_of("b");
    ASSERT_NE(fa, fb);
    auto r = g.begin(k, fa);
    ASSERT_TRUE(r);

    auto m1 = g.begin(k, fb);
    EXPECT_EQ(m1.status, begin_status::payload_mismatch) << "while processing";
    EXPECT_FALSE(m1.ticket.valid());
    EXPECT_EQ(g.begin(k, fa).status, begin_status::in_progress) << "same payload is a duplicate";

    ASSERT_FALSE(r.ticket.succeed(10));
    auto m2 = g.begin(k, fb);
    EXPECT_EQ(m2.status, begin_status::payload_mismatch) << "after success";
    EXPECT_NE(m2.outcome, 10u) << "a mismatched request must not be handed the outcome";
    auto d = g.begin(k, fa);
    EXPECT_EQ(d.status, begin_status::succeeded);
    EXPECT_EQ(d.outcome, 10u);
    EXPECT_EQ(g.begin(k).status, begin_status::succeeded) << "fingerprint 0 means no check";
    EXPECT_EQ(g.query(k).fingerprint, fa);
    EXPECT_EQ(g.snapshot().payload_mismatches, 2u);
}

TEST(Payload, MismatchOnFailedKey) {
    idem::guard g(idem_test::test_options());
    const idem::key k("TX8_PAY_v1");
    auto r = g.begin(k, idem::fingerprint_of("a"));
    ASSERT_FALSE(r.ticket.fail(1, idem::failure_policy::terminal));
    EXPECT_EQ(g.begin(k, idem::fingerprint_of("b")).status, begin_status::payload_mismatch);
    EXPECT_EQ(g.begin(k, idem::fingerprint_of("a")).status, begin_status::failed);
}

TEST(Payload, FingerprintIsNeverZero) {
    EXPECT_NE(idem::fingerprint_of(""), 0u);
    EXPECT_EQ(idem::fingerprint_of("payload"), idem::fingerprint_of("payload"));
    EXPECT_NE(idem::fingerprint_of("payload"), idem::fingerprint_of("payloae"));
}

// Every invalid option throws idem::error(errc::invalid_argument) naming the option.
TEST(Options, InvalidOptionsThrowNamingTheOption) {
    struct bad {
        const char* name;
        void (*set)(idem::options&);
    };
    const bad cases[] = {
        {"capacity", [](idem::options& o) { o.capacity = 0; }},
        {"capacity", [](idem::options& o) { o.capacity = (std::size_t{1} << 30) + 1; }},
        {"max_probe", [](idem::options& o) { o.max_probe = 0; }},
        {"lease", [](idem::options& o) { o.lease = std::chrono::nanoseconds(0); }},
        {"lease", [](idem::options& o) { o.lease = std::chrono::seconds(-1); }},
        {"retention", [](idem::options& o) { o.retention = std::chrono::nanoseconds(-1); }},
    };
    for (const auto& c : cases) {
        auto o = idem_test::test_options();
        c.set(o);
        try {
            idem::guard g(o);
            ADD_FAILURE() << "accepted a bad options." << c.name;
        } catch (const idem::error& e) {
            EXPECT_EQ(e.kind(), errc::invalid_argument) << c.name;
            EXPECT_NE(std::string(e.what()).find(std::string("options.") + c.name), std::string::npos)
                << "the message must name the option: " << e.what();
        }
    }
}

TEST(Options, SmallestValidOptionsWork) {
    auto o = idem_test::test_options(1);
    o.max_probe = 1;
    o.lease = std::chrono::nanoseconds(1);
    o.retention = std::chrono::nanoseconds(0);
    idem::manual_clock clock;
    idem_test::manual_guard g(o, clock);
    EXPECT_EQ(g.run(idem::key("one"), [] { return 1; }), 1u);
    EXPECT_EQ(g.run(idem::key("one"), [] { return 2; }), 1u);
}

// run() of a key whose operation failed terminally: not a duplicate of a success, so not
// duplicate_request (whose text says the key "completed"), but already_failed, naming the key and
// the failure code and saying the operation is not run again. Still an idem::error.
TEST(Run, TerminallyFailedKeyThrowsAlreadyFailedNamingKeyAndCode) {
    auto opts = idem_test::test_options();
    opts.on_failure = idem::failure_policy::terminal;
    idem::guard g(opts);
    const idem::key k("TX9_REFUND_v1");
    auto r = g.begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    ASSERT_FALSE(r.ticket.fail(17));
    int executed = 0;
    for (const auto policy : {idem::duplicate_policy::replay, idem::duplicate_policy::raise}) {
        idem::run_options ro;
        ro.on_duplicate = policy;
        try {
            (void)g.run(
                k, [&] { return ++executed; }, ro);
            ADD_FAILURE() << "run() of a failed key returned (" << policy << ")";
        } catch (const idem::error& e) {
            EXPECT_EQ(e.kind(), errc::already_failed) << policy << ": " << e.what();
            EXPECT_EQ(e.code(), errc::already_failed);
            const std::string what = e.what();
            EXPECT_NE(what.find("TX9_REFUND_v1"), std::string::npos) << what;
            EXPECT_NE(what.find("code 17"), std::string::npos) << what;
            EXPECT_NE(what.find("not run again"), std::string::npos) << what;
            EXPECT_EQ(what.find("already completed"), std::string::npos) << what;
        }
    }
    EXPECT_EQ(executed, 0);
    EXPECT_EQ(idem::make_error_code(errc::already_failed).message(),
              "the key already failed terminally; the operation is not run again");
}

template <class E>
std::string printed(E e) {
    std::ostringstream os;
    os << e;
    return os.str();
}

// Every enumerator prints its name (GoogleTest, logs); a value outside the enum prints as
// type(value) instead of nothing or a byte dump.
TEST(Print, EveryPublicEnumeratorPrintsItsName) {
    const std::vector<std::pair<errc, const char*>> codes = {
        {errc::invalid_key, "invalid_key"},
        {errc::invalid_argument, "invalid_argument"},
        {errc::capacity_exhausted, "capacity_exhausted"},
        {errc::stale_ticket, "stale_ticket"},
        {errc::payload_mismatch, "payload_mismatch"},
        {errc::duplicate_request, "duplicate_request"},
        {errc::in_progress, "in_progress"},
        {errc::in_doubt, "in_doubt"},
        {errc::empty_ticket, "empty_ticket"},
        {errc::timeout, "timeout"},
        {errc::backpressure, "backpressure"},
        {errc::store_unavailable, "store_unavailable"},
        {errc::store_error, "store_error"},
        {errc::corrupt_record, "corrupt_record"},
        {errc::busy, "busy"},
        {errc::already_failed, "already_failed"},
        {errc::superseded, "superseded"},
    };
    // The table above is complete: one past the last enumerator has no name.
    EXPECT_EQ(static_cast<int>(codes.back().first) - static_cast<int>(codes.front().first) + 1,
              static_cast<int>(codes.size()));
    EXPECT_EQ(idem::detail::name_of(static_cast<errc>(static_cast<int>(codes.back().first) + 1)), nullptr);
    for (const auto& [e, name] : codes) {
        EXPECT_EQ(printed(e), name);
        // The category's message differs from the name: both are worth having.
        EXPECT_NE(idem::make_error_code(e).message(), "unknown idem error") << name;
    }
    EXPECT_EQ(printed(static_cast<errc>(42)), "errc(42)");
    EXPECT_EQ(printed(static_cast<errc>(0)), "errc(0)");

    EXPECT_EQ(printed(idem::failure_policy::terminal), "terminal");
    EXPECT_EQ(printed(idem::failure_policy::retryable), "retryable");
    EXPECT_EQ(printed(static_cast<idem::failure_policy>(9)), "failure_policy(9)");

    EXPECT_EQ(printed(idem::duplicate_policy::replay), "replay");
    EXPECT_EQ(printed(idem::duplicate_policy::raise), "raise");
    EXPECT_EQ(printed(static_cast<idem::duplicate_policy>(200)), "duplicate_policy(200)");

    EXPECT_EQ(printed(idem::resolution::succeeded), "succeeded");
    EXPECT_EQ(printed(idem::resolution::failed), "failed");
    EXPECT_EQ(printed(idem::resolution::not_executed), "not_executed");
    EXPECT_EQ(printed(idem::resolution::unknown), "unknown");
    EXPECT_EQ(printed(static_cast<idem::resolution>(4)), "resolution(4)");

    // Written with the stream's state untouched: a following number is not affected.
    std::ostringstream os;
    os << errc::busy << ' ' << 7;
    EXPECT_EQ(os.str(), "busy 7");
}

}  // namespace
