// tests/assert_test.cpp: the assertions of detail/assert.hpp, and preconditions of the record table
// that they check, shown firing (gtest death tests).
//
// This translation unit turns the hot path's assertions on (IDEM_DEBUG_ASSERTS 1, defined before
// any idem header), whatever the build type: the other tests run a release build, where
// IDEM_DEBUG_ASSERT compiles to nothing (scripts/count-instructions shows it costs the hot path no
// instruction). The table's preconditions below are ones a mutation of the library could break:
// guard::fill handing a ticket the claim_ref of an answer that was not acquired, begin_many pairing
// a key with another key's prepare() hash, a ticket finishing into a state a completion cannot end
// in. Each is reached here through the table's own interface, as the misuse would reach it.
//
// Death tests run threadsafe (the child re-executes the test): a table starts its toucher thread.
#define IDEM_DEBUG_ASSERTS 1

#include <gtest/gtest.h>

#include <atomic>

#include "idem/detail/assert.hpp"
#include "idem/detail/table/record_table.hpp"
#include "idem/options.hpp"

static_assert(IDEM_DEBUG_ASSERTS == 1, "this test needs the hot path's assertions compiled in");

namespace {

using table = idem::detail::table::record_table<std::atomic, idem::manual_clock>;
using idem::begin_status;
using idem::transition_cause;
using idem::detail::table::slot_state;

idem::options small() {
    idem::options o;
    o.capacity = 64;
    o.maintenance_interval = {};
    return o;
}

class AssertDeathTest : public ::testing::Test {
protected:
    void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// (a) IDEM_ASSERT is on in every build: it prints where, the rule and the condition, then aborts.
TEST_F(AssertDeathTest, AssertAbortsNamingTheRule) {
    volatile int two = 2;
    EXPECT_DEATH(IDEM_ASSERT(two == 3, "two is three"),
                 "idem: assertion failed at .*assert_test\\.cpp:[0-9]+: two is three \\(two == 3\\)");
    IDEM_ASSERT(two == 2, "two is two");  // a kept rule costs a compare and changes nothing
}

// (b) With IDEM_DEBUG_ASSERTS 1, IDEM_DEBUG_ASSERT checks like IDEM_ASSERT.
TEST_F(AssertDeathTest, DebugAssertIsActiveWhenEnabled) {
    volatile int two = 2;
    EXPECT_DEATH(IDEM_DEBUG_ASSERT(two == 3, "a debug rule"), "assertion failed at .*: a debug rule \\(two == 3\\)");
}

// (c) A duplicate's answer carries no claim (its claim_ref is empty): completing with it is a
// ticket that was never acquired. In a release build that dereferences a null slot; the
// precondition names the misuse instead.
TEST_F(AssertDeathTest, CompletingAClaimThatWasNotAcquired) {
    table t(small(), idem::manual_clock{}, nullptr);
    const idem::key k("TX1_PAY_v1");
    auto first = t.begin(k, 0);
    ASSERT_EQ(first.status, begin_status::acquired);
    ASSERT_FALSE(t.complete(k, first.claim, slot_state::succeeded, 7, transition_cause::succeed));
    auto dup = t.begin(k, 0);
    ASSERT_EQ(dup.status, begin_status::succeeded);
    EXPECT_DEATH((void)t.complete(k, dup.claim, slot_state::succeeded, 8, transition_cause::succeed),
                 "complete\\(\\) takes an acquired claim's claim_ref");
}

// (c) A completion ends in succeeded, failed or released: a claim "completed" into processing (or
// any transient state) would publish a word no reader or rotation expects.
TEST_F(AssertDeathTest, CompletingIntoAStateThatIsNotAnEnd) {
    table t(small(), idem::manual_clock{}, nullptr);
    const idem::key k("TX2_PAY_v1");
    auto a = t.begin(k, 0);
    ASSERT_EQ(a.status, begin_status::acquired);
    EXPECT_DEATH((void)t.complete(k, a.claim, slot_state::processing, 0, transition_cause::succeed),
                 "a completion ends in succeeded, failed or released");
    EXPECT_FALSE(t.complete(k, a.claim, slot_state::released, 0, transition_cause::release));  // the claim is intact
}

// (c) claim(k, h) decides k's record at h's place: a batch that paired a key with its neighbour's
// hash would claim (or answer with) the neighbour's record.
TEST_F(AssertDeathTest, ClaimingWithAnotherKeysHash) {
    table t(small(), idem::manual_clock{}, nullptr);
    const idem::key a("TX3_PAY_v1"), b("TX4_PAY_v1");
    EXPECT_DEATH((void)t.claim(a, t.prepare(b), 0), "claim\\(k, h\\): h is prepare\\(k\\)");
    EXPECT_EQ(t.claim(a, t.prepare(a), 0).status, begin_status::acquired);  // its own hash: a claim
}

}  // namespace
