// postgres_store: the same results as memory_store, byte-exact keys, the fence guard, in-doubt
// commits, recovery load, corrupt rows, durability checks, a killed backend and a paused backend.
// Payloads: the bytes on the server are exactly the payload's (NUL, 0xFF, invalid UTF-8), a database
// from before payloads gains the column at open and keeps its rows (also one opened beside it by the
// global scope's statements, whose column lists leave the payload to its default), and a stored
// payload above the hard maximum is corrupt_record naming the key.
//
// Needs a server: IDEM_TEST_PG_URI (scripts/test starts a throwaway PostgreSQL 15 and sets it). The
// tests FAIL, never skip, when it is unset or unreachable. Each test creates its own database
// idem_t_<random> on that server and drops it afterwards, so tests cannot see each other's rows.
// The paused-backend tests send SIGSTOP to the store's server process: run as root or as the
// server's user. Timing is asserted only as "returns at all within 30 s".
#include <gtest/gtest.h>

#include "support/pg_database.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>

#include "idem/durable.hpp"
#include "idem/stores/postgres_store.hpp"

// LeakSanitizer (ASan builds): libpqxx 6.4 leaks the PGresult of the ROLLBACK that a transaction's
// destructor sends over a broken connection (pqxx::transaction_base::direct_exec from do_abort), a
// few hundred bytes per lost connection. These tests break connections on purpose.
extern "C" const char* __lsan_default_suppressions() { return "leak:libpqxx\n"; }

namespace {

using namespace std::chrono_literals;
using idem::record_state;
using idem::transition_cause;
namespace pg = idem::detail::pg;

// ---- rows ------------------------------------------------------------------------------------

struct row_spec {
    std::string key;
    record_state from = record_state::absent;
    record_state to = record_state::processing;
    transition_cause cause = transition_cause::claim;
    std::uint64_t fence = 1;
    std::uint64_t outcome = 0;
    std::uint64_t fingerprint = 0;
    std::int64_t at_ms = 1'700'000'000'000;
    std::int64_t lease_until_ms = 0;
};

idem::store_row make_row(const row_spec& s, std::uint64_t seq) {
    idem::store_row r{idem::transition{idem::key(s.key)}};
    r.t.from = s.from;
    r.t.to = s.to;
    r.t.cause = s.cause;
    r.t.fence = s.fence;
    r.t.outcome = s.outcome;
    r.t.fingerprint = s.fingerprint;
    r.seq = seq;
    r.at_ms = s.at_ms;
    r.lease_until_ms = s.lease_until_ms;
    return r;
}

/// A batch as the flusher hands it over: sorted by key, then seq.
std::vector<idem::store_row> make_batch(const std::vector<row_spec>& specs, std::uint64_t& seq) {
    std::vector<idem::store_row> rows;
    for (const auto& s : specs) rows.push_back(make_row(s, ++seq));
    std::stable_sort(rows.begin(), rows.end(),
                     [](const idem::store_row& a, const idem::store_row& b) { return a.t.k.view() < b.t.k.view(); });
    return rows;
}

// ---- server and databases ----------------------------------------------------------------------

/// Sends SIGSTOP to a server process and SIGCONT when it goes out of scope (even when a test fails).
class paused_process {
public:
    explicit paused_process(int pid) : pid_(pid) {
        if (pid_ <= 0 || ::kill(pid_, SIGSTOP) != 0) {
            ok_ = false;
            pid_ = 0;
        }
    }
    ~paused_process() { resume(); }
    paused_process(const paused_process&) = delete;
    paused_process& operator=(const paused_process&) = delete;
    [[nodiscard]] bool ok() const noexcept { return ok_; }
    void resume() {
        if (pid_ > 0) ::kill(pid_, SIGCONT);
        pid_ = 0;
    }

private:
    int pid_;
    bool ok_ = true;
};

class PostgresStore : public ::testing::Test {
protected:
    void SetUp() override {
        std::string why;
        ASSERT_TRUE(db_.create(&why)) << why;
        uri_ = db_.uri();
    }

    void TearDown() override {
        stores_.clear();
        std::string why;
        if (!db_.drop(&why)) ADD_FAILURE() << why;
    }

    idem::postgres_store& open(std::chrono::milliseconds deadline = 5s) {
        stores_.push_back(std::make_unique<idem::postgres_store>(uri_, deadline));
        stores_.back()->set_node("test-node:1");
        return *stores_.back();
    }

    /// Direct SQL on the test database (what an operator, or a disk fault, would do).
    void sql(const std::string& text) {
        pqxx::connection c(uri_);
        pqxx::nontransaction n(c);
        n.exec(text);
    }
    std::int64_t sql_int(const std::string& text) {
        pqxx::connection c(uri_);
        pqxx::nontransaction n(c);
        return n.exec(text)[0][0].as<std::int64_t>();
    }
    /// Waits until a server process has gone (after pg_terminate_backend, or a cut connection).
    void wait_backend_gone(int pid) {
        for (int i = 0; i < 300; ++i) {
            if (sql_int("SELECT count(*) FROM pg_stat_activity WHERE pid = " + std::to_string(pid)) == 0) return;
            std::this_thread::sleep_for(20ms);
        }
        ADD_FAILURE() << "backend " << pid << " still there after 6 s";
    }

    idem_test::pg_database db_;
    std::string uri_;
    std::vector<std::unique_ptr<idem::postgres_store>> stores_;
};

// ---- comparison with memory_store -------------------------------------------------------------

void expect_same_audit(const idem::audit_entry& want, const idem::audit_entry& got, const std::string& where) {
    EXPECT_EQ(want.key, got.key) << where;
    EXPECT_EQ(want.from, got.from) << where;
    EXPECT_EQ(want.to, got.to) << where;
    EXPECT_EQ(want.fence, got.fence) << where;
    EXPECT_EQ(want.node, got.node) << where;
    EXPECT_EQ(want.at_ms, got.at_ms) << where;
    EXPECT_EQ(want.detail, got.detail) << where;
}

/// get(), audit(), load(), scan_audit() and max_fence() of both stores agree for every key.
/// Audit sequence numbers are compared by order only (BIGSERIAL may leave gaps).
void expect_same(idem::memory_store& mem, idem::postgres_store& pgs, const std::set<std::string>& keys) {
    for (const auto& k : keys) {
        const auto want = mem.get(k);
        const auto got = pgs.get(k);
        ASSERT_EQ(want.has_value(), got.has_value()) << "key '" << k << "'";
        if (want) {
            EXPECT_EQ(want->key, got->key);
            EXPECT_EQ(want->biz_type, got->biz_type) << k;
            EXPECT_EQ(want->state, got->state) << k;
            EXPECT_EQ(want->fence, got->fence) << k;
            EXPECT_EQ(want->lease_until_ms, got->lease_until_ms) << k;
            EXPECT_EQ(want->outcome, got->outcome) << k;
            EXPECT_EQ(want->fingerprint, got->fingerprint) << k;
            EXPECT_EQ(want->created_ms, got->created_ms) << k;
            EXPECT_EQ(want->updated_ms, got->updated_ms) << k;
        }
        const auto wa = mem.audit(k);
        const auto ga = pgs.audit(k);
        ASSERT_EQ(wa.size(), ga.size()) << "audit of '" << k << "'";
        for (std::size_t i = 0; i < wa.size(); ++i) {
            expect_same_audit(wa[i], ga[i], "audit of '" + k + "' row " + std::to_string(i));
            if (i > 0) {
                EXPECT_LT(ga[i - 1].sequence, ga[i].sequence);
            }
        }
    }
    std::map<std::string, idem::stored_record> want_all, got_all;
    mem.load([&](const idem::stored_record& r) { want_all.emplace(r.key, r); });
    pgs.load([&](const idem::stored_record& r) { got_all.emplace(r.key, r); });
    EXPECT_EQ(want_all.size(), got_all.size());
    EXPECT_TRUE(want_all == got_all) << "load() differs";

    std::vector<idem::audit_entry> want_scan, got_scan;
    mem.scan_audit([&](const idem::audit_entry& a) { want_scan.push_back(a); });
    pgs.scan_audit([&](const idem::audit_entry& a) { got_scan.push_back(a); });
    ASSERT_EQ(want_scan.size(), got_scan.size());
    for (std::size_t i = 0; i < want_scan.size(); ++i)
        expect_same_audit(want_scan[i], got_scan[i], "scan_audit row " + std::to_string(i));
    EXPECT_EQ(mem.max_fence(), pgs.max_fence());
}

// ---- tests -------------------------------------------------------------------------------------

TEST_F(PostgresStore, MatchesMemoryStoreOnRandomBatches) {
    auto& pgs = open();
    idem::memory_store mem;
    mem.set_node("test-node:1");
    std::mt19937_64 rng(20240615);
    // Mixed case and non-ASCII so byte order differs from any locale's order.
    std::vector<std::string> pool;
    for (int i = 0; i < 60; ++i) pool.push_back("TX" + std::to_string(1000 + i) + "_TRANSFER_v" + std::to_string(i % 3));
    for (std::string k : {"alpha_PAY_v1", "Alpha_PAY_v1", "ZULU_REFUND_v2", "zulu_x", "Ärger_PAY_v1", "a'b\"c_ORDER_v1",
                          "x;--y", "{NULL}", "\\N", " space "})
        pool.push_back(k);
    std::map<std::string, std::uint64_t> fence;  // current fence per key
    std::uniform_int_distribution<int> pick(0, static_cast<int>(pool.size()) - 1);
    std::set<std::string> keys;
    std::uint64_t seq = 0;
    for (std::uint64_t batch = 1; batch <= 40; ++batch) {
        std::vector<row_spec> specs;
        const int n = 1 + static_cast<int>(rng() % 300);
        for (int i = 0; i < n; ++i) {
            row_spec s;
            s.key = pool[pick(rng)];
            keys.insert(s.key);
            auto& f = fence[s.key];
            switch (rng() % 8) {
                case 0: s.fence = f > 2 ? f - 1 - rng() % 2 : 1; break;             // stale owner
                case 1: s.fence = f = f + 1 + rng() % 3; break;                     // new claim
                case 2: s.fence = (std::uint64_t{1} << 52) - 1 - rng() % 5; break;  // the largest fences
                default: s.fence = f = std::max<std::uint64_t>(f, 1); break;        // same claim
            }
            s.from = static_cast<record_state>(rng() % 5);
            s.to = static_cast<record_state>(1 + rng() % 4);  // a record is never ABSENT
            s.cause = static_cast<transition_cause>(rng() % 8);
            s.outcome = rng();
            s.fingerprint = rng();
            s.at_ms = 1'700'000'000'000 + static_cast<std::int64_t>(batch * 1000 + i);
            s.lease_until_ms = s.at_ms + static_cast<std::int64_t>(rng() % 30000);
            specs.push_back(s);
        }
        const auto rows = make_batch(specs, seq);
        mem.apply(rows, batch);
        pgs.apply(rows, batch);
    }
    expect_same(mem, pgs, keys);
}

TEST_F(PostgresStore, FoldCasesMatchMemoryStore) {
    // Each scenario: a stored record (batch 1), then a batch whose rows for one key fold non-trivially.
    struct scenario {
        const char* name;
        std::vector<row_spec> first, second;
    };
    const auto P = record_state::processing, S = record_state::succeeded, F = record_state::failed,
               R = record_state::released;
    auto r = [](record_state to, std::uint64_t fence, std::int64_t at, std::int64_t lease, std::uint64_t fp,
                std::uint64_t outcome = 0) {
        row_spec s;
        s.key = "TX1_PAY_v1";
        s.to = to;
        s.fence = fence;
        s.at_ms = at;
        s.lease_until_ms = lease;
        s.fingerprint = fp;
        s.outcome = outcome;
        return s;
    };
    const std::vector<scenario> scenarios = {
        {"claim then succeed in one batch keeps the claim's lease", {}, {r(P, 1, 10, 100, 7), r(S, 1, 11, 0, 0, 42)}},
        {"older fence does not overwrite", {r(S, 5, 10, 100, 7, 1)}, {r(P, 3, 20, 200, 8), r(F, 3, 21, 0, 0, 9)}},
        {"stale row inside a batch is skipped", {}, {r(P, 7, 10, 100, 7), r(P, 6, 11, 999, 9), r(S, 7, 12, 0, 0, 5)}},
        {"claim above stored fence, then higher non-claim",
         {r(S, 5, 10, 100, 7)},
         {r(P, 6, 20, 200, 8), r(S, 8, 21, 0, 0, 3)}},
        {"claim below stored fence, then higher non-claim",
         {r(P, 7, 10, 100, 7)},
         {r(P, 6, 20, 200, 8), r(S, 8, 21, 0, 0, 3)}},
        {"no claim in batch keeps stored lease", {r(P, 4, 10, 100, 7)}, {r(S, 4, 20, 0, 0, 11)}},
        {"release keeps fence and lease", {r(P, 4, 10, 100, 7)}, {r(R, 4, 20, 0, 0), r(P, 5, 21, 300, 9)}},
        {"insert without claim has zero lease", {}, {r(F, 2, 10, 500, 6, 1)}},
        {"equal fence applies", {r(S, 4, 10, 100, 7, 1)}, {r(F, 4, 20, 0, 0, 2)}},
    };
    for (const auto& sc : scenarios) {
        SCOPED_TRACE(sc.name);
        stores_.clear();
        sql("DROP TABLE IF EXISTS idempotent_record, idempotent_audit, idempotent_batch, idem_schema");
        auto& pgs = open();
        idem::memory_store mem;
        mem.set_node("test-node:1");
        std::uint64_t seq = 0;
        if (!sc.first.empty()) {
            const auto rows = make_batch(sc.first, seq);
            mem.apply(rows, 1);
            pgs.apply(rows, 1);
        }
        const auto rows = make_batch(sc.second, seq);
        mem.apply(rows, 2);
        pgs.apply(rows, 2);
        expect_same(mem, pgs, {"TX1_PAY_v1"});
    }
}

TEST_F(PostgresStore, FenceGuardKeepsNewerRecord) {
    auto& pgs = open();
    std::uint64_t seq = 0;
    row_spec claim{.key = "TX9_TRANSFER_v1", .fence = 5, .fingerprint = 77, .lease_until_ms = 5000};
    row_spec done{.key = "TX9_TRANSFER_v1",
                  .from = record_state::processing,
                  .to = record_state::succeeded,
                  .cause = transition_cause::succeed,
                  .fence = 5,
                  .outcome = 42};
    pgs.apply(make_batch({claim, done}, seq), 1);
    row_spec stale{.key = "TX9_TRANSFER_v1",
                   .from = record_state::processing,
                   .to = record_state::failed,
                   .cause = transition_cause::fail,
                   .fence = 4,
                   .outcome = 13};
    pgs.apply(make_batch({stale}, seq), 2);
    const auto rec = pgs.get("TX9_TRANSFER_v1");
    ASSERT_TRUE(rec);
    EXPECT_EQ(rec->state, record_state::succeeded);
    EXPECT_EQ(rec->fence, 5u);
    EXPECT_EQ(rec->outcome, 42u);
    EXPECT_EQ(rec->fingerprint, 77u);
    EXPECT_EQ(rec->lease_until_ms, 5000);
    EXPECT_EQ(rec->biz_type, "TRANSFER");
    const auto trail = pgs.audit("TX9_TRANSFER_v1");
    ASSERT_EQ(trail.size(), 3u);  // the stale attempt is audited, not applied
    EXPECT_EQ(trail[2].fence, 4u);
    EXPECT_EQ(trail[2].detail, "fail outcome=13");
    EXPECT_EQ(trail[2].node, "test-node:1");
    EXPECT_EQ(pgs.max_fence(), 5u);
    pgs.set_node(std::string(63, 'h') + ":4194304");  // a 63-byte hostname and a 7-digit pid
    pgs.apply(make_batch({{.key = "TX10_TRANSFER_v1"}}, seq), 3);
    EXPECT_EQ(pgs.audit("TX10_TRANSFER_v1").at(0).node, std::string(63, 'h') + ":");
}

TEST_F(PostgresStore, FencesCompareUnsignedLikeMemoryStore) {
    // Fences travel as the int64 with the same bits; 2^63 is negative there. The fence guard and
    // max_fence() still order them as uint64, as memory_store does. (get() and load() refuse fences
    // of 2^52 and above, which the guard cannot hold: see CorruptRowsAreNamedOnLoad.)
    auto& pgs = open();
    idem::memory_store mem;
    std::uint64_t seq = 0;
    const std::uint64_t below = (1ull << 63) - 1, above = 1ull << 63;
    auto both = [&](const std::vector<row_spec>& specs, std::uint64_t id) {
        const auto rows = make_batch(specs, seq);
        mem.apply(rows, id);
        pgs.apply(rows, id);
    };
    both({{.key = "up", .fence = below}, {.key = "down", .fence = above}}, 1);
    both({{.key = "up", .fence = above}, {.key = "down", .fence = below}}, 2);
    for (const char* k : {"up", "down"}) {
        EXPECT_EQ(mem.get(k)->fence, above);
        EXPECT_EQ(static_cast<std::uint64_t>(sql_int(std::string("SELECT fencing_token FROM idempotent_record WHERE "
                                                                 "idempotent_key = '") +
                                                     k + "'")),
                  above)
            << k;
    }
    EXPECT_EQ(pgs.max_fence(), mem.max_fence());
    EXPECT_EQ(pgs.max_fence(), above);
}

TEST_F(PostgresStore, HostileKeysRoundTripByteForByte) {
    auto& pgs = open();
    std::string long_utf8;
    while (long_utf8.size() + 3 <= 126) long_utf8 += "\xe2\x82\xac";  // U+20AC, 3 bytes
    long_utf8 += "_v";                                                // 128 bytes in all
    const std::vector<std::string> hostile = {
        "a'b",
        "'; DROP TABLE idempotent_record; --",
        "\"quoted\"",
        "back\\slash\\",
        "\\N",
        "\\.",
        "{brace}",
        "a,b",
        "NULL",
        "null",
        " lead and trail ",
        " ",
        "-- comment",
        "$1",
        "%s%n",
        "E'\\x00'",
        "\xe6\x97\xa5\xe6\x9c\xac_\xe6\xb1\xba\xe6\xb8\x88_v1",  // 日本_決済_v1
        "\xf0\x9f\x92\xb8 money",                                // 4-byte UTF-8
        "\xef\xbf\xbf",                                          // U+FFFF
        long_utf8,
        std::string(128, 'k'),
    };
    ASSERT_EQ(long_utf8.size(), 128u);
    std::vector<row_spec> specs;
    std::uint64_t f = 0;
    for (const auto& k : hostile) {
        ++f;
        specs.push_back({.key = k, .fence = f, .fingerprint = f * 3, .lease_until_ms = 1000});
        specs.push_back({.key = k,
                         .from = record_state::processing,
                         .to = record_state::succeeded,
                         .cause = transition_cause::succeed,
                         .fence = f,
                         .outcome = f * 7});
    }
    std::uint64_t seq = 0;
    const auto rows = make_batch(specs, seq);
    idem::memory_store mem;
    mem.set_node("test-node:1");
    mem.apply(rows, 1);
    pgs.apply(rows, 1);
    std::set<std::string> keys(hostile.begin(), hostile.end());
    expect_same(mem, pgs, keys);
    for (const auto& k : hostile) {
        const auto rec = pgs.get(k);
        ASSERT_TRUE(rec) << "key '" << k << "'";
        EXPECT_EQ(rec->key, k);
    }
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_record"), static_cast<std::int64_t>(hostile.size()));
}

TEST_F(PostgresStore, InvalidUtf8KeyIsRejectedBeforeTheServer) {
    auto& pgs = open();
    std::uint64_t seq = 0;
    const auto rows = make_batch({{.key = "ok_PAY_v1"}, {.key = "bad\xff\xfekey"}}, seq);
    try {
        pgs.apply(rows, 7);
        FAIL() << "apply accepted a key that is not UTF-8";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.kind(), idem::errc::store_error);
        EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("bad"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(idem::postgres_store::accepts_key("bad\xff"));
    EXPECT_TRUE(idem::postgres_store::accepts_key("ok"));
    EXPECT_FALSE(pgs.committed(7));
    EXPECT_FALSE(pgs.get("ok_PAY_v1"));
    EXPECT_FALSE(pgs.get("bad\xff\xfekey"));
    EXPECT_TRUE(pgs.audit("bad\xff\xfekey").empty());
}

TEST_F(PostgresStore, CommittedAnswersFromTheStore) {
    auto& pgs = open();
    std::uint64_t seq = 0;
    pgs.apply(make_batch({{.key = "TX1_PAY_v1"}}, seq), 41);
    EXPECT_TRUE(pgs.committed(41));
    EXPECT_FALSE(pgs.committed(42));
    EXPECT_FALSE(pgs.committed(42));  // asking does not record the batch
    pgs.apply(make_batch({{.key = "TX2_PAY_v1"}}, seq), 42);
    EXPECT_TRUE(pgs.committed(42));
    EXPECT_TRUE(pgs.committed(41));
    pgs.apply({}, 44);  // an empty batch still commits its id
    EXPECT_TRUE(pgs.committed(44));
    // Replaying a committed batch id is refused, and changes nothing.
    try {
        pgs.apply(make_batch({{.key = "TX3_PAY_v1"}}, seq), 41);
        FAIL() << "a replayed batch id was accepted";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.kind(), idem::errc::store_error) << e.what();
        EXPECT_NE(std::string(e.what()).find("already committed"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(pgs.get("TX3_PAY_v1"));
    // A fresh store on the same database sees the same answers.
    auto& again = open();
    EXPECT_TRUE(again.committed(41));
    EXPECT_FALSE(again.committed(43));
}

TEST_F(PostgresStore, CommitInDoubtIsResolvedByReadingTheStore) {
    auto& pgs = open(1s);
    std::uint64_t seq = 0;
    pgs.apply(make_batch({{.key = "TX1_PAY_v1"}}, seq), 1);
    const int pid = pgs.backend_pid();
    std::unique_ptr<paused_process> paused;
    pgs.set_before_commit_hook_for_testing([&] { paused = std::make_unique<paused_process>(pid); });
    const auto t0 = std::chrono::steady_clock::now();
    bool threw_unknown = false;
    try {
        pgs.apply(make_batch({{.key = "TX2_PAY_v1", .fence = 2}}, seq), 2);
    } catch (const idem::commit_unknown& e) {
        threw_unknown = true;
        EXPECT_EQ(e.kind(), idem::errc::store_unavailable);
        EXPECT_NE(std::string(e.what()).find("commit"), std::string::npos) << e.what();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "expected commit_unknown, got: " << e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
    ASSERT_TRUE(paused && paused->ok()) << "cannot SIGSTOP backend " << pid << " (run as root or postgres)";
    EXPECT_TRUE(threw_unknown);
    pgs.set_before_commit_hook_for_testing({});
    paused->resume();
    // The stopped server resumes and may still commit the COMMIT it had received; committed()
    // waits for that decision instead of guessing.
    bool done = false;
    for (int i = 0; i < 20; ++i) {
        try {
            done = pgs.committed(2);
            break;
        } catch (const idem::error& e) {
            ASSERT_EQ(e.kind(), idem::errc::store_unavailable) << e.what();
            std::this_thread::sleep_for(100ms);
        }
    }
    wait_backend_gone(pid);
    EXPECT_EQ(done, pgs.committed(2));
    EXPECT_EQ(done, pgs.get("TX2_PAY_v1").has_value()) << "committed() must agree with the records";
    EXPECT_EQ(done, pgs.audit("TX2_PAY_v1").size() == 1u);
    std::printf("[ in doubt ] the COMMIT sent to a paused server %s\n", done ? "committed" : "did not commit");
    pgs.apply(make_batch({{.key = "TX3_PAY_v1", .fence = 3}}, seq), 3);  // the store keeps working
    EXPECT_TRUE(pgs.get("TX3_PAY_v1"));
}

TEST_F(PostgresStore, LoadsHundredThousandRecords) {
    auto& pgs = open(30s);
    idem::memory_store mem;
    constexpr int records = 100'000;
    constexpr std::size_t batch_rows = 4096;
    std::uint64_t seq = 0, batch_id = 0;
    std::vector<row_spec> specs;
    double claim_seconds = 0, mixed_seconds = 0;
    std::size_t claim_rows = 0, mixed_rows = 0;
    auto flush = [&](double& seconds, std::size_t& count) {
        const auto rows = make_batch(specs, seq);  // built before timing, as the flusher would have it
        const auto t0 = std::chrono::steady_clock::now();
        pgs.apply(rows, ++batch_id);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        count += rows.size();
        mem.apply(rows, batch_id);
        specs.clear();
    };
    char key[48];
    // Fresh claims, 4096 per batch.
    for (int i = 0; i < records; ++i) {
        std::snprintf(key, sizeof key, "TX%09d_TRANSFER_v1", i);
        specs.push_back({.key = key,
                         .fence = static_cast<std::uint64_t>(i + 1),
                         .fingerprint = 99,
                         .at_ms = 1'700'000'000'000 + i,
                         .lease_until_ms = 1'700'000'030'000 + i});
        if (specs.size() == batch_rows) flush(claim_seconds, claim_rows);
    }
    if (!specs.empty()) flush(claim_seconds, claim_rows);
    // The usual mix: claim + succeed of new keys in the same batch (2048 keys per 4096-row batch).
    for (int i = 0; i < 8 * 2048; ++i) {
        std::snprintf(key, sizeof key, "TY%09d_REFUND_v2", i);
        const auto f = static_cast<std::uint64_t>(records + i + 1);
        specs.push_back({.key = key, .fence = f, .fingerprint = 5, .lease_until_ms = 9});
        specs.push_back({.key = key,
                         .from = record_state::processing,
                         .to = record_state::succeeded,
                         .cause = transition_cause::succeed,
                         .fence = f,
                         .outcome = 1});
        if (specs.size() == batch_rows) flush(mixed_seconds, mixed_rows);
    }
    std::printf("[ apply    ] fresh claims: %zu rows in %.3f s = %.0f rows/s (4096-row batches)\n", claim_rows,
                claim_seconds, claim_rows / claim_seconds);
    std::printf("[ apply    ] claim+succeed: %zu rows in %.3f s = %.0f rows/s (4096-row batches)\n", mixed_rows,
                mixed_seconds, mixed_rows / mixed_seconds);

    std::map<std::string, idem::stored_record> want;
    mem.load([&](const idem::stored_record& r) { want.emplace(r.key, r); });
    std::vector<idem::stored_record> got;
    got.reserve(want.size());
    const auto t0 = std::chrono::steady_clock::now();
    pgs.load([&](const idem::stored_record& r) { got.push_back(r); });
    const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[ load     ] %zu records in %.3f s = %.0f records/s\n", got.size(), load_seconds,
                got.size() / load_seconds);
    RecordProperty("apply_claim_rows_per_s", std::to_string(static_cast<long>(claim_rows / claim_seconds)));
    RecordProperty("apply_mixed_rows_per_s", std::to_string(static_cast<long>(mixed_rows / mixed_seconds)));
    RecordProperty("load_seconds", std::to_string(load_seconds));
    ASSERT_EQ(got.size(), want.size());
    for (const auto& r : got) {
        auto it = want.find(r.key);
        ASSERT_NE(it, want.end()) << r.key;
        ASSERT_EQ(it->second, r) << r.key;
    }
    EXPECT_EQ(pgs.max_fence(), mem.max_fence());
    std::size_t audited = 0;
    std::string last;
    pgs.scan_audit([&](const idem::audit_entry& a) {
        EXPECT_LE(last, a.key);
        last = a.key;
        ++audited;
    });
    EXPECT_EQ(audited, claim_rows + mixed_rows);
}

TEST_F(PostgresStore, CorruptRowsAreNamedOnLoad) {
    auto& pgs = open();
    std::uint64_t seq = 0;
    pgs.apply(make_batch({{.key = "TX1_GOOD_v1"}}, seq), 1);
    auto expect_corrupt = [&](const std::string& key_fragment, const std::string& rule_fragment) {
        try {
            pgs.load([](const idem::stored_record&) {});
            ADD_FAILURE() << "load accepted a corrupt row (" << rule_fragment << ")";
        } catch (const idem::error& e) {
            EXPECT_EQ(e.kind(), idem::errc::corrupt_record) << e.what();
            EXPECT_NE(std::string(e.what()).find(key_fragment), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(rule_fragment), std::string::npos) << e.what();
        }
    };
    sql("INSERT INTO idempotent_record VALUES ('TX2_ZERO_v1', 'ZERO', 'SUCCESS', 0, 0, 0, 0, 0, 0)");
    expect_corrupt("TX2_ZERO_v1", "fencing_token is 0");
    sql("DELETE FROM idempotent_record WHERE idempotent_key = 'TX2_ZERO_v1'");

    sql("INSERT INTO idempotent_record VALUES ('TX2_HUGE_v1', 'HUGE', 'SUCCESS', 4503599627370496, 0, 0, 0, 0, 0)");
    expect_corrupt("TX2_HUGE_v1", "fencing_token is 4503599627370496; expected 1 .. 2^52-1");
    sql("DELETE FROM idempotent_record WHERE idempotent_key = 'TX2_HUGE_v1'");

    sql("INSERT INTO idempotent_record VALUES ('TX2_NEG_v1', 'NEG', 'SUCCESS', -1, 0, 0, 0, 0, 0)");
    expect_corrupt("TX2_NEG_v1", "fencing_token is -1");
    sql("DELETE FROM idempotent_record WHERE idempotent_key = 'TX2_NEG_v1'");

    sql("INSERT INTO idempotent_record VALUES (E'bad\\x01key', 'default', 'SUCCESS', 3, 0, 0, 0, 0, 0)");
    expect_corrupt("bad\\x01key", "control byte");
    sql("DELETE FROM idempotent_record WHERE idempotent_key = E'bad\\x01key'");

    sql("INSERT INTO idempotent_record VALUES ('', 'default', 'SUCCESS', 3, 0, 0, 0, 0, 0)");
    expect_corrupt("''", "is empty");
    sql("DELETE FROM idempotent_record WHERE idempotent_key = ''");

    sql("ALTER TABLE idempotent_record DROP CONSTRAINT idempotent_record_status_check");
    sql("INSERT INTO idempotent_record VALUES ('TX3_ABSENT_v1', 'ABSENT', 'ABSENT', 3, 0, 0, 0, 0, 0)");
    expect_corrupt("TX3_ABSENT_v1", "status 'ABSENT' is for audit rows only");
    sql("DELETE FROM idempotent_record WHERE idempotent_key = 'TX3_ABSENT_v1'");
    sql("INSERT INTO idempotent_record VALUES ('TX3_BOGUS_v1', 'BOGUS', 'DONE', 3, 0, 0, 0, 0, 0)");
    expect_corrupt("TX3_BOGUS_v1", "status 'DONE'");
    try {
        (void)pgs.get("TX3_BOGUS_v1");
        ADD_FAILURE() << "get accepted a corrupt row";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.kind(), idem::errc::corrupt_record) << e.what();
    }
    sql("DELETE FROM idempotent_record WHERE idempotent_key = 'TX3_BOGUS_v1'");

    int n = 0;
    pgs.load([&](const idem::stored_record&) { ++n; });  // the store recovered from the aborted COPY
    EXPECT_EQ(n, 1);
}

TEST_F(PostgresStore, LoadPassesTheCallbacksExceptionOn) {
    auto& pgs = open();
    std::uint64_t seq = 0;
    std::vector<row_spec> specs;
    for (int i = 0; i < 5000; ++i) specs.push_back({.key = "K" + std::to_string(i)});
    pgs.apply(make_batch(specs, seq), 1);
    int seen = 0;
    EXPECT_THROW(pgs.load([&](const idem::stored_record&) {
        if (++seen == 10) throw std::runtime_error("recovery callback failed");
    }),
                 std::runtime_error);
    EXPECT_THROW(pgs.scan_audit([&](const idem::audit_entry&) { throw std::logic_error("stop"); }), std::logic_error);
    EXPECT_TRUE(pgs.get("K1"));
    int n = 0;
    pgs.load([&](const idem::stored_record&) { ++n; });
    EXPECT_EQ(n, 5000);
}

TEST_F(PostgresStore, LongScansAreBoundedByProgressNotByTheirLength) {
    auto& pgs = open(1s);
    std::uint64_t seq = 0;
    std::vector<row_spec> specs;
    for (int i = 0; i < 1500; ++i) specs.push_back({.key = "S" + std::to_string(i)});
    pgs.apply(make_batch(specs, seq), 1);
    // 1500 rows at 1 ms each: the scan takes longer than the 1 s deadline but never stalls.
    int n = 0;
    pgs.load([&](const idem::stored_record&) {
        std::this_thread::sleep_for(1ms);
        ++n;
    });
    EXPECT_EQ(n, 1500);
    n = 0;
    pgs.scan_audit([&](const idem::audit_entry&) {
        std::this_thread::sleep_for(1ms);
        ++n;
    });
    EXPECT_EQ(n, 1500);
}

TEST_F(PostgresStore, SyncDurabilityRefusesSynchronousCommitOff) {
    {
        auto& pgs = open();
        EXPECT_NO_THROW(pgs.check_sync_durability());
    }
    sql("ALTER DATABASE " + db_.name() + " SET synchronous_commit = local");
    EXPECT_NO_THROW(open().check_sync_durability());  // local still flushes this server's WAL
    sql("ALTER DATABASE " + db_.name() + " SET synchronous_commit = off");
    auto& off = open();
    try {
        off.check_sync_durability();
        FAIL() << "sync durability accepted synchronous_commit=off";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.kind(), idem::errc::invalid_argument);
        const std::string msg = e.what();
        EXPECT_NE(msg.find("sync durability refused: PostgreSQL at " + pg::redact(uri_) +
                           " runs with synchronous_commit=off; a commit acknowledged by it can be lost on a crash. "
                           "Set synchronous_commit=on in the server's configuration or open the durable_guard with "
                           "store_options::mode = durability::async"),
                  std::string::npos)
            << msg;
    }
}

TEST_F(PostgresStore, KilledBackendGivesUnavailableThenReconnects) {
    auto& pgs = open();
    std::uint64_t seq = 0;
    pgs.apply(make_batch({{.key = "TX1_PAY_v1"}}, seq), 1);
    const int pid = pgs.backend_pid();
    ASSERT_GT(pid, 0);
    EXPECT_EQ(sql_int("SELECT pg_terminate_backend(" + std::to_string(pid) + ")::int"), 1);
    wait_backend_gone(pid);
    try {
        pgs.apply(make_batch({{.key = "TX2_PAY_v1", .fence = 2}}, seq), 2);
        FAIL() << "apply on a terminated backend succeeded";
    } catch (const idem::commit_unknown& e) {
        FAIL() << "the connection was gone before COMMIT, so the outcome is known: " << e.what();
    } catch (const idem::error& e) {
        EXPECT_EQ(e.kind(), idem::errc::store_unavailable) << e.what();
        EXPECT_NE(std::string(e.what()).find("apply batch 2"), std::string::npos) << e.what();
    }
    pgs.reconnect();
    EXPECT_NE(pgs.backend_pid(), pid);
    EXPECT_FALSE(pgs.committed(2));
    pgs.apply(make_batch({{.key = "TX2_PAY_v1", .fence = 2}}, seq), 2);
    EXPECT_TRUE(pgs.committed(2));
    EXPECT_TRUE(pgs.get("TX2_PAY_v1"));
}

TEST_F(PostgresStore, PausedBackendIsCutAtTheDeadline) {
    auto& pgs = open(1s);
    std::uint64_t seq = 0;
    pgs.apply(make_batch({{.key = "TX1_PAY_v1"}}, seq), 1);
    {
        const int pid = pgs.backend_pid();
        paused_process paused(pid);
        ASSERT_TRUE(paused.ok()) << "cannot SIGSTOP backend " << pid << " (run as root or postgres)";
        const auto t0 = std::chrono::steady_clock::now();
        try {
            pgs.apply(make_batch({{.key = "TX2_PAY_v1", .fence = 2}}, seq), 2);
            ADD_FAILURE() << "apply on a paused server succeeded";
        } catch (const idem::commit_unknown& e) {
            ADD_FAILURE() << "the server never got COMMIT: " << e.what();
        } catch (const idem::error& e) {
            EXPECT_EQ(e.kind(), idem::errc::store_unavailable) << e.what();
            EXPECT_NE(std::string(e.what()).find("call deadline"), std::string::npos) << e.what();
        }
        const auto took = std::chrono::steady_clock::now() - t0;
        EXPECT_LT(took, 30s);
        std::printf("[ paused   ] apply returned after %.2f s (deadline 1 s)\n",
                    std::chrono::duration<double>(took).count());
        // Reads are bounded too: the store reconnects to a fresh backend; pause that one as well.
        EXPECT_TRUE(pgs.get("TX1_PAY_v1"));
        const int pid2 = pgs.backend_pid();
        paused_process paused2(pid2);
        ASSERT_TRUE(paused2.ok());
        const auto t1 = std::chrono::steady_clock::now();
        EXPECT_THROW((void)pgs.get("TX1_PAY_v1"), idem::error);
        EXPECT_LT(std::chrono::steady_clock::now() - t1, 30s);
    }  // both backends resume (and exit: their sockets were cut)
    EXPECT_FALSE(pgs.committed(2));
    pgs.apply(make_batch({{.key = "TX2_PAY_v1", .fence = 2}}, seq), 2);
    EXPECT_TRUE(pgs.get("TX2_PAY_v1"));
}

TEST_F(PostgresStore, SchemaIsCreatedOnceAndVersioned) {
    {
        std::vector<std::thread> openers;
        std::atomic<int> ok{0};
        std::vector<std::string> errors(4);
        for (int i = 0; i < 4; ++i)
            openers.emplace_back([&, i] {
                try {
                    idem::postgres_store s(uri_);
                    ++ok;
                } catch (const std::exception& e) {
                    errors[i] = e.what();
                }
            });
        for (auto& t : openers) t.join();
        EXPECT_EQ(ok.load(), 4) << errors[0] << errors[1] << errors[2] << errors[3];
    }
    EXPECT_EQ(sql_int("SELECT count(*) FROM idem_schema"), 1);
    EXPECT_EQ(sql_int("SELECT max(version) FROM idem_schema"), 2);
    std::uint64_t seq = 0;
    open().apply(make_batch({{.key = "TX1_PAY_v1"}}, seq), 1);
    EXPECT_TRUE(open().get("TX1_PAY_v1"));  // reopening keeps the data
    EXPECT_EQ(sql_int("SELECT count(*) FROM idem_schema"), 1);
    // A version 1 database (no prune columns, no updated_time index) is upgraded in place.
    sql("ALTER TABLE idem_schema DROP COLUMN records_horizon, DROP COLUMN audit_horizon, DROP COLUMN pruned_fence; "
        "DROP INDEX idx_idempotent_record_updated; UPDATE idem_schema SET version = 1");
    {
        auto& st = open();
        EXPECT_EQ(sql_int("SELECT max(version) FROM idem_schema"), 2);
        EXPECT_EQ(sql_int("SELECT count(*) FROM pg_indexes WHERE indexname = 'idx_idempotent_record_updated'"), 1);
        EXPECT_TRUE(st.get("TX1_PAY_v1")) << "the upgrade lost a record";
        EXPECT_EQ(st.horizon(), idem::prune_horizon{});
        EXPECT_EQ(st.prune({.audit_before_ms = 0}).audit_rows, 0u);
        EXPECT_EQ(st.horizon(), (idem::prune_horizon{idem::prune_limits::keep_all, 0}));
    }
    sql("UPDATE idem_schema SET version = 3");
    try {
        open();
        FAIL() << "opened a schema newer than the library";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.kind(), idem::errc::store_error);
        EXPECT_NE(std::string(e.what()).find("version 3"), std::string::npos) << e.what();
    }
}

// ---- payloads ------------------------------------------------------------------------------------

/// A batch claiming and completing `key` at fence 1 with `payload` (the view must outlive apply).
std::vector<idem::store_row> completion_with(const std::string& key, std::string_view payload, std::uint64_t& seq) {
    auto rows = make_batch({{.key = key},
                            {.key = key,
                             .from = record_state::processing,
                             .to = record_state::succeeded,
                             .cause = transition_cause::succeed,
                             .outcome = 5}},
                           seq);
    rows[1].t.payload = payload;
    return rows;
}

TEST_F(PostgresStore, PayloadBytesReachTheServerExactly) {
    const std::string bytes("\0\xff\x80\xc3\x28\xed\xa0\x80\"\\{},", 13);
    std::uint64_t seq = 0;
    auto& st = open();
    st.apply(completion_with("TX1_PAY_v1", bytes, seq), 1);
    st.apply(completion_with("TX2_PAY_v1", "", seq), 2);
    EXPECT_EQ(sql_int("SELECT count(*) FROM idempotent_record WHERE idempotent_key = 'TX1_PAY_v1' AND payload = "
                      "'\\x00ff80c328eda080225c7b7d2c'::bytea"),
              1)
        << "the bytes stored differ from the payload's";
    EXPECT_EQ(sql_int("SELECT length(payload) FROM idempotent_record WHERE idempotent_key = 'TX2_PAY_v1'"), 0);
    EXPECT_TRUE(st.get("TX1_PAY_v1")->payload == bytes);
    EXPECT_EQ(st.get("TX2_PAY_v1")->payload, "");
    std::map<std::string, std::string> loaded;
    st.load([&](const idem::stored_record& r) { loaded[r.key] = r.payload; });
    EXPECT_TRUE(loaded["TX1_PAY_v1"] == bytes);
    const auto trail = st.audit("TX1_PAY_v1");
    ASSERT_EQ(trail.size(), 2u);
    EXPECT_EQ(trail[1].detail, "succeed outcome=5" + idem::payload_detail(bytes));
}

TEST_F(PostgresStore, ADatabaseFromBeforePayloadsGainsTheColumnAtOpenKeepingItsRows) {
    std::uint64_t seq = 0;
    open().apply(completion_with("OLD_PAY_v1", "", seq), 1);
    stores_.clear();
    sql("ALTER TABLE idempotent_record DROP COLUMN payload");
    // What the global scope writes (its own column list, no payload) still inserts.
    sql("INSERT INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
        "request_fingerprint, created_time, updated_time) VALUES ('G_PAY_v1', 'PAY', 'PROCESSING', 1, 0, 0, 0, 1, 1)");
    auto& st = open();
    EXPECT_EQ(sql_int("SELECT count(*) FROM information_schema.columns WHERE table_name = 'idempotent_record' AND "
                      "column_name = 'payload'"),
              1);
    EXPECT_EQ(sql_int("SELECT max(version) FROM idem_schema"), 2);
    const auto old = st.get("OLD_PAY_v1");
    ASSERT_TRUE(old) << "the migration lost a record";
    EXPECT_EQ(old->outcome, 5u);
    EXPECT_EQ(old->payload, "");
    EXPECT_EQ(st.get("G_PAY_v1")->payload, "");
    st.apply(completion_with("NEW_PAY_v1", std::string("\0x", 2), seq), 2);
    EXPECT_EQ(st.get("NEW_PAY_v1")->payload, std::string("\0x", 2));
    sql("INSERT INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
        "request_fingerprint, created_time, updated_time) VALUES ('G2_PAY_v1', 'PAY', 'PROCESSING', 1, 0, 0, 0, 1, 1)");
    EXPECT_EQ(open().get("G2_PAY_v1")->payload, "");  // a second open changes nothing
}

TEST_F(PostgresStore, AStoredPayloadAboveTheHardMaximumIsCorruptNamingTheKey) {
    std::uint64_t seq = 0;
    auto& st = open();
    st.apply(completion_with("BIG_PAY_v1", "x", seq), 1);
    sql("UPDATE idempotent_record SET payload = decode(repeat('00', 1048577), 'hex')");
    for (const bool via_load : {false, true}) {
        try {
            if (via_load) st.load([](const idem::stored_record&) {});
            else (void)st.get("BIG_PAY_v1");
            ADD_FAILURE() << "read a payload above the hard maximum";
        } catch (const idem::error& e) {
            EXPECT_EQ(e.kind(), idem::errc::corrupt_record) << e.what();
            EXPECT_NE(std::string(e.what()).find("BIG_PAY_v1"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("hard maximum"), std::string::npos) << e.what();
        }
    }
    sql("UPDATE idempotent_record SET payload = decode(repeat('ff', 1048576), 'hex')");
    EXPECT_EQ(st.get("BIG_PAY_v1")->payload, std::string(std::size_t{1} << 20, '\xff'));
}

// A durable guard over PostgreSQL in sync mode: completions acknowledged with payloads are there
// after a restart, and duplicates are answered with the bytes (recovered into memory).
TEST_F(PostgresStore, ADurableGuardReplaysPayloadsAfterARestart) {
    const std::vector<std::pair<std::string, std::string>> keys = {
        {"R1_PAY_v1", std::string("\0\xff\xc3\x28{}", 6)}, {"R2_PAY_v1", ""}, {"R3_PAY_v1", std::string(65536, '\0')}};
    idem::options o;
    o.maintenance_interval = {};
    idem::store_options so;
    so.mode = idem::durability::sync;
    {
        idem::durable_guard g(std::make_unique<idem::postgres_store>(uri_), o, so);
        for (const auto& [k, p] : keys) {
            auto r = g->begin(idem::key(k));
            ASSERT_EQ(r.status, idem::begin_status::acquired) << k;
            ASSERT_FALSE(r.ticket.succeed(11, p)) << k;
        }
    }
    idem::durable_guard g(std::make_unique<idem::postgres_store>(uri_), o, so);
    EXPECT_EQ(g.recovery().records, keys.size());
    for (const auto& [k, p] : keys) {
        const auto r = g->begin(idem::key(k));
        EXPECT_EQ(r.status, idem::begin_status::succeeded) << k;
        EXPECT_EQ(r.outcome, 11u) << k;
        EXPECT_TRUE(r.payload == p) << k << ": " << r.payload.size() << " bytes, want " << p.size();
    }
}

TEST_F(PostgresStore, UnreachableServerIsUnavailableAndHidesThePassword) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
        idem::postgres_store s("postgresql://idem:s3cret@127.0.0.1:1/nowhere", 1s);
        FAIL() << "connected to port 1";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.kind(), idem::errc::store_unavailable) << e.what();
        const std::string msg = e.what();
        EXPECT_EQ(msg.find("s3cret"), std::string::npos) << msg;
        EXPECT_NE(msg.find("postgresql://idem@127.0.0.1:1/nowhere"), std::string::npos) << msg;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
    EXPECT_THROW(idem::postgres_store(uri_, 0ms), idem::error);
}

// ---- helpers without a server ------------------------------------------------------------------

TEST(PostgresSql, Utf8CheckMatchesPostgres) {
    EXPECT_TRUE(pg::valid_utf8("plain"));
    EXPECT_TRUE(pg::valid_utf8("\xc3\xa4\xe2\x82\xac\xf0\x9f\x92\xb8\xf4\x8f\xbf\xbf"));
    EXPECT_FALSE(pg::valid_utf8("\xc0\xaf"));          // overlong '/'
    EXPECT_FALSE(pg::valid_utf8("\xe0\x80\xaf"));      // overlong
    EXPECT_FALSE(pg::valid_utf8("\xed\xa0\x80"));      // surrogate U+D800
    EXPECT_FALSE(pg::valid_utf8("\xf4\x90\x80\x80"));  // above U+10FFFF
    EXPECT_FALSE(pg::valid_utf8("\xe2\x82"));          // truncated
    EXPECT_FALSE(pg::valid_utf8("\x80"));
    EXPECT_EQ(pg::utf8_prefix("ab\xe2\x82"), "ab");
    EXPECT_EQ(pg::utf8_prefix("ab\xe2\x82\xac"), "ab\xe2\x82\xac");
    EXPECT_EQ(pg::utf8_truncate("a\xe2\x82\xac"
                                "bc",
                                2),
              "a\xe2\x82\xac");
    EXPECT_EQ(pg::utf8_truncate("abc", 3), "abc");
    EXPECT_EQ(pg::utf8_truncate("abc", 0), "");
}

TEST(PostgresSql, ArrayLiteralsQuoteEverything) {
    pg::array_literal a;
    a.add_text("a\"b");
    a.add_text("c\\d");
    a.add_text("NULL");
    a.add_text("");
    EXPECT_EQ(a.str(), R"({"a\"b","c\\d","NULL",""})");
    pg::array_literal n;
    n.add_uint(~std::uint64_t{0});
    n.add_int(5);
    EXPECT_EQ(n.str(), "{-1,5}");
    pg::array_literal empty;
    EXPECT_EQ(empty.str(), "{}");
}

TEST(PostgresSql, ConnectionStrings) {
    EXPECT_EQ(pg::redact("postgresql://u:pw@h:5/db?sslmode=require&password=x"), "postgresql://u@h:5/db?sslmode=require");
    EXPECT_EQ(pg::redact("postgresql://u@h/db"), "postgresql://u@h/db");
    EXPECT_EQ(pg::redact("postgres://h"), "postgres://h");
    EXPECT_EQ(pg::redact("host=h password='a b\\'c' dbname=d"), "host=h dbname=d");
    std::string uri = "postgresql://u@h/db";
    pg::add_option(uri, "connect_timeout", "2");
    pg::add_option(uri, "keepalives", "1");
    EXPECT_EQ(uri, "postgresql://u@h/db?connect_timeout=2&keepalives=1");
    std::string kv = "host=h connect_timeout=9";
    pg::add_option(kv, "connect_timeout", "2");
    pg::add_option(kv, "application_name", "idem");
    EXPECT_EQ(kv, "host=h connect_timeout=9 application_name=idem");
}

}  // namespace
