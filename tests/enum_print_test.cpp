// enum_print_test: every public enum of the engine prints as its enumerator's name (so GoogleTest
// and logs show `acquired`, not `1-byte object <00>`), and a value outside the enum as `type(n)`.
//
// Each expected() below is a switch over every enumerator with no default, and -Wswitch is an
// error in this file: an enumerator added to an enum without a line here does not compile, and
// once it has one, the loop fails until the library names it too.
#pragma GCC diagnostic error "-Wswitch"

#include <idem/status.hpp>
#include <idem/transition.hpp>

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace {

using idem::begin_status;
using idem::durability_wait;
using idem::record_state;
using idem::transition_cause;
using recalled_kind = idem::recalled::kind;

const char* expected(begin_status v) {
    switch (v) {
        case begin_status::acquired: return "acquired";
        case begin_status::in_progress: return "in_progress";
        case begin_status::succeeded: return "succeeded";
        case begin_status::failed: return "failed";
        case begin_status::in_doubt: return "in_doubt";
        case begin_status::payload_mismatch: return "payload_mismatch";
        case begin_status::capacity_exhausted: return "capacity_exhausted";
        case begin_status::backpressure: return "backpressure";
        case begin_status::store_unavailable: return "store_unavailable";
        case begin_status::invalid_key: return "invalid_key";
        case begin_status::superseded: return "superseded";
    }
    return nullptr;
}

const char* expected(record_state v) {
    switch (v) {
        case record_state::absent: return "absent";
        case record_state::processing: return "processing";
        case record_state::succeeded: return "succeeded";
        case record_state::failed: return "failed";
        case record_state::released: return "released";
    }
    return nullptr;
}

const char* expected(transition_cause v) {
    switch (v) {
        case transition_cause::claim: return "claim";
        case transition_cause::reclaim: return "reclaim";
        case transition_cause::succeed: return "succeed";
        case transition_cause::fail: return "fail";
        case transition_cause::release: return "release";
        case transition_cause::compensate: return "compensate";
        case transition_cause::doubt: return "doubt";
        case transition_cause::not_durable: return "not_durable";
        case transition_cause::imported: return "imported";
    }
    return nullptr;
}

const char* expected(durability_wait v) {
    switch (v) {
        case durability_wait::committed: return "committed";
        case durability_wait::timed_out: return "timed_out";
        case durability_wait::rejected: return "rejected";
    }
    return nullptr;
}

const char* expected(recalled_kind v) {
    switch (v) {
        case recalled_kind::absent: return "absent";
        case recalled_kind::record: return "record";
        case recalled_kind::unavailable: return "unavailable";
    }
    return nullptr;
}

template <class E>
std::string printed(E v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

// Every value of the enum's 8-bit underlying type: the named ones print their name, the others
// `type(n)`. Returns how many were named, so a test can check that the table is not empty.
template <class E>
int check_every_value(const std::string& type) {
    int named = 0;
    for (unsigned n = 0; n <= 255; ++n) {
        const auto v = static_cast<E>(n);
        const char* name = expected(v);
        if (name != nullptr) ++named;
        const std::string want = name != nullptr ? std::string(name) : type + "(" + std::to_string(n) + ")";
        EXPECT_EQ(printed(v), want) << type << " value " << n;
    }
    return named;
}

TEST(EnumPrint, BeginStatusPrintsEveryEnumeratorByName) {
    EXPECT_EQ(check_every_value<begin_status>("begin_status"), 11);
    EXPECT_EQ(printed(static_cast<begin_status>(42)), "begin_status(42)");
}

TEST(EnumPrint, RecordStatePrintsEnumeratorNamesNotStoreText) {
    EXPECT_EQ(check_every_value<record_state>("record_state"), 5);
    EXPECT_EQ(printed(record_state::succeeded), "succeeded");
    EXPECT_STREQ(idem::to_string(record_state::succeeded), "SUCCESS");  // the store's text is unchanged
}

TEST(EnumPrint, TransitionCausePrintsEveryEnumeratorByName) {
    EXPECT_EQ(check_every_value<transition_cause>("transition_cause"), 9);
}

TEST(EnumPrint, DurabilityWaitPrintsEveryEnumeratorByName) {
    EXPECT_EQ(check_every_value<durability_wait>("durability_wait"), 3);
}

TEST(EnumPrint, RecalledKindPrintsEveryEnumeratorByName) {
    EXPECT_EQ(check_every_value<recalled_kind>("recalled::kind"), 3);
}

TEST(EnumPrint, GoogleTestUsesTheNames) {
    EXPECT_EQ(testing::PrintToString(begin_status::acquired), "acquired");
    EXPECT_EQ(testing::PrintToString(record_state::released), "released");
}

TEST(EnumPrint, ToStringKeepsItsAnswers) {
    EXPECT_STREQ(idem::to_string(begin_status::store_unavailable), "store_unavailable");
    EXPECT_STREQ(idem::to_string(static_cast<begin_status>(200)), "?");
    EXPECT_STREQ(idem::to_string(transition_cause::not_durable), "not_durable");
    EXPECT_STREQ(idem::to_string(static_cast<transition_cause>(200)), "?");
}

}  // namespace
