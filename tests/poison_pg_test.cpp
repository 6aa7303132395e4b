// poison_pg_test: keys PostgreSQL cannot hold, against a real server.
//
//   Guard*         a durable guard over postgres_store answers begin() of a key that is not valid
//                  UTF-8 with invalid_key at once (store::accepts), queues nothing, leaves the store
//                  untouched, and later keys reach the store; run() throws invalid_key naming the
//                  key and the rule.
//   PipelineCore*  the flush pipeline's core, stepped by hand over a real postgres_store, sets aside
//                  a row with an invalid UTF-8 key (rejected_row) and commits the valid rows of the
//                  same batch, then keeps flowing.
//
// Needs a server: IDEM_TEST_PG_URI (scripts/test starts a throwaway PostgreSQL 15 and sets it). The
// tests FAIL, never skip, when it is unset or unreachable. Each test creates its own database
// idem_t_<random> on that server and drops it afterwards.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "idem/detail/pipeline/pipeline_core.hpp"
#include "idem/durable.hpp"
#include "idem/stores/postgres_store.hpp"
#include "support/pg_database.hpp"
#include "support/store_fixtures.hpp"

// LeakSanitizer (ASan builds): libpqxx 6.4 leaks the PGresult of the ROLLBACK that a transaction's
// destructor sends over a broken connection; harmless here, suppressed as in the other store tests.
extern "C" const char* __lsan_default_suppressions() { return "leak:libpqxx\n"; }

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::durability;
using idem::errc;
using idem::record_state;
using idem_test::durable_options;
namespace pg = idem::detail::pg;

/// A key PostgreSQL text cannot hold: 0xff never appears in UTF-8. A valid idem::key.
const std::string bad_text = "bad\xff";

class PoisonPg : public ::testing::Test {
protected:
    void SetUp() override {
        std::string why;
        ASSERT_TRUE(db_.create(&why)) << why;
        uri_ = db_.uri();
    }

    void TearDown() override {
        std::string why;
        if (!db_.drop(&why)) ADD_FAILURE() << why;
    }

    idem_test::pg_database db_;
    std::string uri_;
};

template <class Fn>
std::optional<idem::error> error_of(Fn&& fn) {
    try {
        fn();
    } catch (const idem::error& e) {
        return e;
    }
    return std::nullopt;
}

TEST_F(PoisonPg, GuardAnswersInvalidKeyForAKeyPostgresCannotHoldAndLaterKeysReachTheStore) {
    const auto bad = idem::key(bad_text);
    for (const durability mode : {durability::async, durability::sync}) {
        const std::string tag = mode == durability::sync ? "SYNC" : "ASYNC";
        SCOPED_TRACE(tag);
        idem::store_options so;
        so.mode = mode;
        so.max_backoff = 5ms;
        idem::durable_guard g(std::make_unique<idem::postgres_store>(uri_), durable_options(), so);
        const std::size_t audit_before = [&] {
            idem::postgres_store check(uri_);
            return idem_test::scan_all(check).size();
        }();

        const auto r = g->begin(bad);
        EXPECT_EQ(r.status, begin_status::invalid_key) << "begin answered " << idem::to_string(r.status);
        EXPECT_FALSE(r.ticket.valid());
        EXPECT_EQ(g->query(bad).state, record_state::absent);
        EXPECT_EQ(g.snapshot().queue_depth, 0u) << "the key reached the flush queue";
        int executed = 0;
        const auto thrown = error_of([&] { (void)g->run(bad, [&] { ++executed; }); });
        ASSERT_TRUE(thrown.has_value()) << "run() executed a key PostgreSQL cannot hold";
        EXPECT_EQ(thrown->kind(), errc::invalid_key) << thrown->what();
        const std::string what = thrown->what();
        EXPECT_NE(what.find("'" + bad_text + "'"), std::string::npos) << "the message does not name the key: " << what;
        EXPECT_NE(what.find("UTF-8"), std::string::npos) << "the message does not name the rule: " << what;
        EXPECT_EQ(executed, 0);
        ASSERT_TRUE(g.flush(30s)) << g.last_store_error();
        {
            idem::postgres_store check(uri_);
            EXPECT_EQ(idem_test::scan_all(check).size(), audit_before) << "the refused key touched the store";
            EXPECT_EQ(idem_test::load_all(check).count(bad_text), 0u);
        }

        for (std::size_t i = 0; i < 100; ++i) {
            const auto k = idem::key("PG" + tag + std::to_string(i) + "_PAY_v1");
            auto c = g->begin(k);
            ASSERT_EQ(c.status, begin_status::acquired)
                << k.str() << ": " << idem::to_string(c.status) << "; " << g.last_store_error();
            ASSERT_FALSE(c.ticket.succeed(i + 1)) << k.str();
        }
        ASSERT_TRUE(g.flush(30s)) << g.last_store_error();
        EXPECT_EQ(g.snapshot().rejected_rows, 0u);
        EXPECT_EQ(g.snapshot().store_errors, 0u) << g.last_store_error();

        idem::postgres_store check(uri_);
        const auto all = idem_test::load_all(check);
        std::size_t found = 0;
        for (std::size_t i = 0; i < 100; ++i) {
            const auto it = all.find("PG" + tag + std::to_string(i) + "_PAY_v1");
            if (it == all.end()) continue;
            ++found;
            EXPECT_EQ(it->second.state, record_state::succeeded) << it->first;
            EXPECT_EQ(it->second.outcome, i + 1) << it->first;
        }
        EXPECT_EQ(found, 100u) << "later keys did not reach the store";
        EXPECT_EQ(all.count(bad_text), 0u);
        EXPECT_TRUE(idem_test::verify_clean(check));
    }
}

/// A claim row of `text` (which must be a valid idem::key).
idem::store_row claim_row(const std::string& text) {
    idem_test::row_fields f;
    f.key = text;
    f.fence = (std::uint64_t{1} << 32) | 1;
    f.lease_until_ms = f.at_ms + 30'000;
    return idem_test::row(f, 0);  // push() assigns the sequence number
}

TEST_F(PoisonPg, PipelineCoreSetsAsideTheInvalidUtf8RowAndCommitsTheOthers) {
    idem::postgres_store st(uri_);
    std::random_device rd;
    const std::uint64_t prefix = (static_cast<std::uint64_t>(rd()) << 32) & 0x7fffffff00000000ull;
    idem::detail::pipeline::pipeline_core core(64, 64, prefix);

    // "K07\xff" sorts between K07 and K08: the bad row sits in the middle of the batch.
    std::map<std::string, std::uint64_t> seq;
    const std::string bad = "K07\xff";
    auto push = [&](const std::string& text) {
        ASSERT_TRUE(core.try_reserve());
        seq[text] = core.push(claim_row(text));
    };
    for (int i = 0; i < 20; ++i) {
        char name[8];
        std::snprintf(name, sizeof name, "K%02d", i);
        push(name);
        if (i == 7) push(bad);
    }
    auto drain = [&] {
        for (int n = 0; n < 200 && !core.drained(); ++n) {
            const auto r = core.step(st);
            ASSERT_NE(r, idem::detail::pipeline::pipeline_core::step_result::failed)
                << "a rejected row was treated as an outage: " << core.snapshot().last_error;
        }
        ASSERT_TRUE(core.drained()) << "the batch never drained: " << core.snapshot().last_error;
    };
    drain();
    if (HasFatalFailure()) return;

    EXPECT_EQ(core.fate(seq[bad]), idem::detail::pipeline::row_fate::rejected);
    for (const auto& [text, s] : seq) {
        if (text == bad) continue;
        EXPECT_EQ(core.fate(s), idem::detail::pipeline::row_fate::committed) << text;
    }
    const auto c = core.snapshot();
    EXPECT_EQ(c.rejected, 1u);
    EXPECT_EQ(c.rows, 20u);
    EXPECT_NE(c.last_error.find("'" + bad + "'"), std::string::npos) << "last_error does not name the key: " << c.last_error;

    // Later rows keep flowing.
    for (int i = 20; i < 25; ++i) push("K" + std::to_string(i));
    drain();
    if (HasFatalFailure()) return;
    EXPECT_EQ(core.snapshot().rows, 25u);
    EXPECT_EQ(core.snapshot().rejected, 1u);

    idem::postgres_store check(uri_);
    const auto all = idem_test::load_all(check);
    EXPECT_EQ(all.size(), 25u);
    for (const auto& [text, s] : seq) {
        if (text == bad) continue;
        const auto it = all.find(text);
        ASSERT_NE(it, all.end()) << text << " did not reach the store";
        EXPECT_EQ(it->second.state, record_state::processing) << text;
    }
}

}  // namespace
