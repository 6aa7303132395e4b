// payment_test: the seed's payment test on a small in-memory ledger. A transfer guarded by run()
// moves money once; a duplicate is refused (duplicate_policy::raise) or replayed; a falsy outcome
// is replayed like any other (a classic bug of idempotency layers); a transfer that throws is retried or refused per
// the failure policy.
#include <idem/idem.hpp>

#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <thread>

#include "support/manual_guard.hpp"

namespace {

using idem::errc;

/// A toy ledger. transfer() returns a receipt number, so the outcome is something a duplicate must
/// get back unchanged.
class ledger {
public:
    ledger() {
        balance_["alice"] = 1000;
        balance_["bob"] = 0;
    }
    std::uint64_t transfer(const std::string& from, const std::string& to, long amount) {
        if (balance_.at(from) < amount) throw std::runtime_error("insufficient funds");
        balance_[from] -= amount;
        balance_[to] += amount;
        return ++receipts_ + 7000;
    }
    long balance(const std::string& who) const { return balance_.at(who); }
    int receipts() const { return receipts_; }

private:
    std::map<std::string, long> balance_;
    int receipts_ = 0;
};

idem::run_options raise() {
    idem::run_options ro;
    ro.on_duplicate = idem::duplicate_policy::raise;
    return ro;
}

template <class Fn>
idem::error thrown_by(Fn fn) {
    try {
        fn();
    } catch (const idem::error& e) {
        return e;
    }
    ADD_FAILURE() << "expected idem::error";
    return idem::error(errc::invalid_argument, "<nothing thrown>");
}

TEST(Payment, DuplicateTransferIsRefusedAndMovesNothing) {
    idem::guard g(idem_test::test_options());
    ledger book;
    const auto k = idem::key::compose("TX20230615123456", "TRANSFER", 2);
    const std::uint64_t receipt = g.run(
        k, [&] { return book.transfer("alice", "bob", 100); }, raise());
    EXPECT_EQ(receipt, 7001u);
    EXPECT_EQ(book.balance("alice"), 900);
    EXPECT_EQ(book.balance("bob"), 100);

    int executed = 0;
    const auto e = thrown_by([&] {
        (void)g.run(
            k,
            [&] {
                ++executed;
                return book.transfer("alice", "bob", 100);
            },
            raise());
    });
    EXPECT_EQ(e.kind(), errc::duplicate_request);
    EXPECT_NE(std::string(e.what()).find("TX20230615123456_TRANSFER_v2"), std::string::npos) << e.what();
    EXPECT_EQ(executed, 0);
    EXPECT_EQ(book.balance("alice"), 900);
    EXPECT_EQ(book.balance("bob"), 100);
    EXPECT_EQ(book.receipts(), 1);
    EXPECT_EQ(g.snapshot().duplicates, 1u);
}

TEST(Payment, DuplicateTransferReplaysTheReceipt) {
    idem::guard g(idem_test::test_options());
    ledger book;
    const auto k = idem::key::compose("TX1", "PAY", 1);
    const auto first = g.run(k, [&] { return book.transfer("alice", "bob", 250); });
    for (int i = 0; i < 3; ++i) {
        const auto again = g.run(k, [&]() -> std::uint64_t {
            ADD_FAILURE() << "a duplicate executed the transfer";
            return book.transfer("alice", "bob", 250);
        });
        EXPECT_EQ(again, first);
    }
    EXPECT_EQ(book.balance("alice"), 750);
    EXPECT_EQ(book.balance("bob"), 250);
    // A different version of the same transaction is another operation.
    const auto v2 = g.run(idem::key::compose("TX1", "PAY", 2), [&] { return book.transfer("alice", "bob", 1); });
    EXPECT_NE(v2, first);
    EXPECT_EQ(book.balance("bob"), 251);
}

// "Empty or falsy outcomes not replayed" is a classic bug of idempotency layers. Outcome 0 (and a void
// fn, which records 0) must be replayed as a completed duplicate, not taken as "absent".
TEST(Payment, FalsyOutcomeIsReplayed) {
    idem::guard g(idem_test::test_options());
    int executed = 0;
    const idem::key zero("TX-ZERO_PAY_v1");
    EXPECT_EQ(g.run(zero,
                    [&] {
                        ++executed;
                        return 0;
                    }),
              0u);
    EXPECT_EQ(g.run(zero,
                    [&] {
                        ++executed;
                        return 5;
                    }),
              0u);
    EXPECT_EQ(executed, 1);
    auto r = g.begin(zero);
    EXPECT_EQ(r.status, idem::begin_status::succeeded);
    EXPECT_EQ(r.outcome, 0u);
    EXPECT_EQ(g.query(zero).state, idem::record_state::succeeded);
    EXPECT_EQ(thrown_by([&] {
                  (void)g.run(
                      zero, [&] { ++executed; }, raise());
              }).kind(),
              errc::duplicate_request);

    const idem::key unit("TX-VOID_PAY_v1");
    g.run(unit, [&] { ++executed; });
    g.run(unit, [&] { ++executed; });
    EXPECT_EQ(executed, 2);
    EXPECT_EQ(g.query(unit).state, idem::record_state::succeeded);

    // false is falsy too.
    const idem::key no("TX-FALSE_PAY_v1");
    EXPECT_EQ(g.run(no,
                    [&] {
                        ++executed;
                        return false;
                    }),
              0u);
    EXPECT_EQ(g.run(no,
                    [&] {
                        ++executed;
                        return true;
                    }),
              0u);
    EXPECT_EQ(executed, 3);
}

TEST(Payment, ThrowingTransferIsRetriedUnderRetryablePolicy) {
    auto opts = idem_test::test_options();
    opts.on_failure = idem::failure_policy::retryable;
    idem::guard g(opts);
    ledger book;
    const auto k = idem::key::compose("TX2", "PAY", 1);
    EXPECT_THROW((void)g.run(k, [&]() -> std::uint64_t { throw std::runtime_error("gateway timeout"); }),
                 std::runtime_error);
    EXPECT_EQ(g.query(k).state, idem::record_state::absent) << "the claim must be released";
    EXPECT_EQ(g.snapshot().released, 1u);
    EXPECT_EQ(book.balance("alice"), 1000);

    const auto receipt = g.run(k, [&] { return book.transfer("alice", "bob", 10); });
    EXPECT_EQ(book.balance("bob"), 10);
    EXPECT_EQ(g.run(k, [&] { return book.transfer("alice", "bob", 10); }), receipt);
    EXPECT_EQ(book.balance("bob"), 10);
}

TEST(Payment, ThrowingTransferIsFinalUnderTerminalPolicy) {
    auto opts = idem_test::test_options();
    opts.on_failure = idem::failure_policy::terminal;
    idem::guard g(opts);
    ledger book;
    const auto k = idem::key::compose("TX3", "PAY", 1);
    EXPECT_THROW((void)g.run(k, [&] { return book.transfer("bob", "alice", 5); }), std::runtime_error);
    EXPECT_EQ(g.query(k).state, idem::record_state::failed);

    int executed = 0;
    const auto e = thrown_by([&] {
        (void)g.run(k, [&] {
            ++executed;
            return 1;
        });
    });
    // Not a duplicate_request: that names a completed success; this key failed and is not run again.
    EXPECT_EQ(e.kind(), errc::already_failed);
    EXPECT_NE(std::string(e.what()).find("failed"), std::string::npos) << e.what();
    EXPECT_EQ(executed, 0);
    EXPECT_EQ(book.balance("alice"), 1000);
}

TEST(Payment, InProgressAndPayloadMismatchThrow) {
    idem::guard g(idem_test::test_options());
    const idem::key k("TX4_PAY_v1");
    idem::run_options ro;
    ro.fingerprint = idem::fingerprint_of(R"({"to":"bob","amount":10})");
    auto held = g.begin(k, ro.fingerprint);
    ASSERT_EQ(held.status, idem::begin_status::acquired);
    EXPECT_EQ(thrown_by([&] {
                  (void)g.run(
                      k, [] { return 1; }, ro);
              }).kind(),
              errc::in_progress);
    ASSERT_FALSE(held.ticket.succeed(33));

    EXPECT_EQ(g.run(
                  k, [] { return 1; }, ro),
              33u);
    idem::run_options other = ro;
    other.fingerprint = idem::fingerprint_of(R"({"to":"bob","amount":1000})");
    const auto e = thrown_by([&] {
        (void)g.run(
            k, [] { return 1; }, other);
    });
    EXPECT_EQ(e.kind(), errc::payload_mismatch);
    EXPECT_NE(std::string(e.what()).find("TX4_PAY_v1"), std::string::npos) << e.what();
}

// run() with a wait: a duplicate arriving while the first transfer runs gets its receipt once the
// owner completes. The clock is manual, so the wait cannot time out on the guard's clock; the
// owner completes after the waiter has seen in_progress at least once.
TEST(Payment, WaitingDuplicateGetsTheReceipt) {
    idem::manual_clock clock;
    idem_test::manual_guard g(idem_test::test_options(), clock);
    const idem::key k("TX5_PAY_v1");
    auto held = g.begin(k);
    ASSERT_EQ(held.status, idem::begin_status::acquired);
    std::uint64_t replay = 0;
    std::jthread waiter([&] {
        idem::run_options ro;
        ro.wait = std::chrono::hours(1);
        try {
            replay = g.run(
                k,
                []() -> std::uint64_t {
                    ADD_FAILURE() << "executed twice";
                    return 0;
                },
                ro);
        } catch (const idem::error& e) {
            ADD_FAILURE() << "the waiting duplicate threw: " << e.what();
        }
    });
    while (g.snapshot().in_progress_hits == 0) std::this_thread::yield();  // the waiter is waiting
    ASSERT_FALSE(held.ticket.succeed(4242));
    waiter.join();
    EXPECT_EQ(replay, 4242u);
}

}  // namespace
