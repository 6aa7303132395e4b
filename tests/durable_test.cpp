// durable_test: idem::durable_guard over SQLite (and memory_store where a fault is injected), in
// both durability modes.
//
//   Reopen*            100k records in mixed states survive a close and reopen: query() and begin()
//                      answer as before; the fingerprint of a completed claim survives too.
//   Recovery*          an expired PROCESSING record goes to the resolver at reopen (succeeded,
//                      failed, not_executed, unknown -> in doubt, asked again next pass); a live one
//                      does not; every resolution is audited.
//   StoreDown*         the flusher retries with backoff while the store fails (injected outage,
//                      an unwritable file, commit_unknown either way) and nothing acknowledged is lost.
//   Sync*              sync mode answers only after the commit; with the store down, begin answers
//                      store_unavailable within sync_timeout and the key is not granted.
//   Backpressure*      a full queue refuses a transition without changing memory, or waits with
//                      offer_wait.
//   Fences*            fences continue above everything stored, across reopens.
// After every workload idem::verify must report no violation.
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/store_fixtures.hpp"
#include "support/threads.hpp"

namespace {

using namespace std::chrono_literals;
using idem::begin_status;
using idem::durability;
using idem::errc;
using idem::record_state;
using idem_test::durable_options;
using idem_test::faulty_store;
using idem_test::mix;
using idem_test::temp_dir;
using idem_test::verify_clean;
using idem_test::wait_for;

std::string mode_name(durability m) { return m == durability::sync ? "sync" : "async"; }

/// A durable guard on the SQLite file `path` (synchronous=FULL in sync mode, as a user would).
std::unique_ptr<idem::durable_guard> open_sqlite(const std::string& path, durability mode,
                                                 idem::options o = durable_options(), idem::store_options so = {}) {
    so.mode = mode;
    return std::make_unique<idem::durable_guard>(std::make_unique<idem::sqlite_store>(path, mode == durability::sync),
                                                 std::move(o), so);
}

/// A durable guard over `inner` through a faulty_store; *faults receives the wrapper's address.
std::unique_ptr<idem::durable_guard> open_faulty(idem::store& inner, faulty_store** faults, durability mode,
                                                 idem::options o = durable_options(), idem::store_options so = {}) {
    return idem_test::open_wrapped(faults, mode, std::move(o), so, inner);
}

idem::key pay_key(std::size_t i) { return idem::key("TX" + std::to_string(i) + "_PAY_v1"); }

std::int64_t wall_ms_now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

class Durable : public ::testing::TestWithParam<durability> {
protected:
    durability mode() const { return GetParam(); }
    bool sync() const { return GetParam() == durability::sync; }
    temp_dir dir_{"idem-durable"};
    std::string db_ = dir_.file("idem.db");
};

INSTANTIATE_TEST_SUITE_P(Modes, Durable, ::testing::Values(durability::async, durability::sync),
                         [](const auto& info) { return mode_name(info.param); });

// ---- (a) reopen ---------------------------------------------------------------------------------

// What each key of the reopen workload ends as: i % 10 picks the state.
enum class kind { succeeded, failed, released, dropped, processing };
kind kind_of(std::size_t i) {
    const auto r = i % 10;
    return r < 5   ? kind::succeeded
           : r < 7 ? kind::failed
           : r < 8 ? kind::released
           : r < 9 ? kind::dropped
                   : kind::processing;
}
std::uint64_t fp_of(std::size_t i) { return i % 3 == 0 ? 0 : mix(i) | 1; }
std::uint64_t outcome_of(std::size_t i) { return i % 20 == 0 ? 0 : mix(i + 1) >> 1; }  // falsy outcomes too

TEST_P(Durable, ReopenRestoresEveryRecordAndBeginAnswersTheSame) {
    // 100k in async mode; sync mode pays a commit (fsync) per group of waiters, so it runs 20k keys
    // on 64 threads (IDEM_SYNC_KEYS to change).
    const std::size_t n = sync() ? idem_test::env_size("IDEM_SYNC_KEYS", 100'000, 4'000)
                                 : idem_test::env_size("IDEM_KEYS", 100'000, 20'000);
    const std::size_t threads = sync() ? 64 : 1;
    idem::options o = durable_options(n + n / 4);
    // Claims left PROCESSING must stay live through the whole test, however slow the machine
    // (ThreadSanitizer runs took over a minute): a lease that expires mid-test is compensated.
    o.lease = 1h;
    idem::store_options so;
    so.offer_wait = 30s;  // the hot path outruns SQLite: wait for room instead of failing

    std::vector<idem::record_view> before(n);
    std::chrono::nanoseconds taken_at{};
    {
        auto g = open_sqlite(db_, mode(), o, so);
        std::atomic<std::size_t> errors{0};
        idem_test::run_on_latch(threads, [&](std::size_t t) {
            for (std::size_t i = t; i < n; i += threads) {
                auto r = g->guard().begin(pay_key(i), fp_of(i));
                if (r.status != begin_status::acquired) {
                    ++errors;
                    continue;
                }
                std::error_code ec;
                switch (kind_of(i)) {
                    case kind::succeeded: ec = r.ticket.succeed(outcome_of(i)); break;
                    case kind::failed: ec = r.ticket.fail(i % 100, idem::failure_policy::terminal); break;
                    case kind::released: ec = r.ticket.fail(i % 100 + 1, idem::failure_policy::retryable); break;
                    case kind::dropped: break;  // the ticket's destructor releases it
                    case kind::processing: idem_test::abandon(std::move(r.ticket)); break;
                }
                if (ec) ++errors;
            }
        });
        ASSERT_EQ(errors.load(), 0u);
        ASSERT_TRUE(g->flush(60s)) << g->last_store_error();
        for (std::size_t i = 0; i < n; ++i) before[i] = g->guard().query(pay_key(i));
        taken_at = g->guard().now();
        EXPECT_EQ(before[0].state, record_state::succeeded);
        EXPECT_EQ(before[9].state, record_state::processing);
        EXPECT_EQ(before[7].state, record_state::absent);  // released reads as absent
    }
    const auto gone_at = std::chrono::steady_clock::now();

    const auto opening = std::chrono::steady_clock::now();
    auto g = open_sqlite(db_, mode(), o, so);
    const auto open_time = std::chrono::steady_clock::now() - opening;
    const auto& rec = g->recovery();
    std::cout << "[ idem    ] reopen of " << n << " records (" << mode_name(mode()) << "): recovery "
              << std::chrono::duration_cast<std::chrono::milliseconds>(rec.elapsed).count() << " ms, constructor "
              << std::chrono::duration_cast<std::chrono::milliseconds>(open_time).count() << " ms\n";
    EXPECT_EQ(rec.records, n);
    EXPECT_EQ(rec.processing, n / 10);
    EXPECT_EQ(rec.compensated, 0u) << "live claims (1 h leases) must not be compensated";
    const auto elapsed = std::chrono::steady_clock::now() - gone_at;

    std::map<std::string, std::size_t> field_diffs;
    std::vector<std::string> first;
    auto note = [&](const char* field, std::size_t i, const std::string& detail) {
        ++field_diffs[field];
        if (first.size() < 6) first.push_back(pay_key(i).str() + " " + field + ": " + detail);
    };
    const auto now2 = g->guard().now();
    for (std::size_t i = 0; i < n; ++i) {
        const auto a = before[i];
        const auto b = g->guard().query(pay_key(i));
        if (a.state != b.state) note("state", i, std::string(idem::to_string(a.state)) + " -> " + idem::to_string(b.state));
        if (a.fence != b.fence) note("fence", i, std::to_string(a.fence) + " -> " + std::to_string(b.fence));
        if (a.outcome != b.outcome) note("outcome", i, std::to_string(a.outcome) + " -> " + std::to_string(b.outcome));
        if (a.fingerprint != b.fingerprint)
            note("fingerprint", i, std::to_string(a.fingerprint) + " -> " + std::to_string(b.fingerprint));
        if (a.in_doubt != b.in_doubt) note("in_doubt", i, "changed");
        if (a.state == record_state::processing) {
            // Leases travel as wall-clock ms: the time left may shrink by the time the reopen took.
            const auto left_before = a.lease_until - taken_at;
            const auto left_after = b.lease_until - now2;
            if (left_after > left_before + 1s || left_after < left_before - elapsed - 1s)
                note("lease", i,
                     std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(left_before).count()) +
                         " ms left -> " +
                         std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(left_after).count()) +
                         " ms left");
        }
    }
    std::string summary;
    for (auto& [f, c] : field_diffs) summary += " " + f + "=" + std::to_string(c);
    for (auto& s : first) summary += "\n  " + s;
    EXPECT_TRUE(field_diffs.empty()) << "query() after reopen differs from before, by field:" << summary;

    // begin answers as before: duplicates replay, processing keys are in progress, released keys
    // are claimed again with a higher fence (and released again when the ticket drops).
    std::atomic<std::size_t> wrong{0};
    std::mutex m;
    std::vector<std::string> wrong_first;
    idem_test::run_on_latch(sync() ? 64 : 2, [&](std::size_t t) {
        const std::size_t step = sync() ? 64 : 2;
        for (std::size_t i = t; i < n; i += step) {
            const auto& a = before[i];
            auto r = g->guard().begin(pay_key(i), fp_of(i));
            bool ok = false;
            switch (a.state) {
                case record_state::succeeded:
                    ok = r.status == begin_status::succeeded && r.outcome == a.outcome && r.fence == a.fence;
                    break;
                case record_state::failed:
                    ok = r.status == begin_status::failed && r.outcome == a.outcome && r.fence == a.fence;
                    break;
                case record_state::absent: ok = r.status == begin_status::acquired && r.fence > a.fence; break;
                case record_state::processing: ok = r.status == begin_status::in_progress && r.fence == a.fence; break;
                default: break;
            }
            if (!ok && wrong.fetch_add(1) < 5) {
                std::lock_guard lock(m);
                wrong_first.push_back(pay_key(i).str() + ": was " + idem::to_string(a.state) + " fence " +
                                      std::to_string(a.fence) + ", begin answered " + idem::to_string(r.status) + " fence " +
                                      std::to_string(r.fence));
            }
        }
    });
    EXPECT_EQ(wrong.load(), 0u) << [&] {
        std::string s;
        for (auto& w : wrong_first) s += "\n  " + w;
        return s;
    }();
    ASSERT_TRUE(g->flush(60s)) << g->last_store_error();
    g.reset();

    idem::sqlite_store st(db_);
    EXPECT_EQ(idem_test::load_all(st).size(), n);
    EXPECT_TRUE(verify_clean(st));
}

// A completed key reused with a different payload is a payload mismatch, before and after a
// restart. The claim and its completion are made while the store is briefly unavailable, so they
// reach SQLite in one batch, as they usually do in async mode.
TEST_P(Durable, ReopenKeepsTheFingerprintOfACompletedClaim) {
    const auto k = idem::key("TX42_TRANSFER_v1");
    const std::uint64_t fp = idem::fingerprint_of("amount=100;to=bob");
    const std::uint64_t other = idem::fingerprint_of("amount=999;to=mallory");
    {
        idem::sqlite_store inner(db_, sync());
        faulty_store* f = nullptr;
        idem::store_options so;
        so.max_backoff = 5ms;
        auto g = open_faulty(inner, &f, mode(), durable_options(), so);
        if (!sync()) f->down = true;  // async: hold the rows until both are queued
        auto r = g->guard().begin(k, fp);
        ASSERT_EQ(r.status, begin_status::acquired);
        ASSERT_FALSE(r.ticket.succeed(7));
        EXPECT_EQ(g->guard().begin(k, other).status, begin_status::payload_mismatch);
        f->down = false;
        ASSERT_TRUE(g->flush(10s)) << g->last_store_error();
    }
    auto g = open_sqlite(db_, mode());
    EXPECT_EQ(g->guard().query(k).fingerprint, fp);
    const auto r = g->guard().begin(k, other);
    EXPECT_EQ(r.status, begin_status::payload_mismatch)
        << "after a restart a different payload for a completed key was answered as a duplicate";
    const auto d = g->guard().begin(k, fp);
    EXPECT_EQ(d.status, begin_status::succeeded);
    EXPECT_EQ(d.outcome, 7u);
}

// ---- (b) recovery and the resolver ------------------------------------------------------------

TEST_P(Durable, RecoverySendsExpiredClaimsToTheResolverAndAuditsTheResolution) {
    const auto live = idem::key("LIVE_PAY_v1");
    const auto ks = idem::key("RS_PAY_v1");  // resolver: succeeded
    const auto kf = idem::key("RF_PAY_v1");  // resolver: failed
    const auto kn = idem::key("RN_PAY_v1");  // resolver: not executed
    const auto ku = idem::key("RU_PAY_v1");  // resolver: unknown, then succeeded on the next pass
    std::map<std::string, std::uint64_t> fence;
    {
        // A claim with an hour's lease, abandoned (its owner "crashed").
        auto o = durable_options();
        o.lease = 1h;
        auto g = open_sqlite(db_, mode(), o);
        auto r = g->guard().begin(live, 11);
        ASSERT_EQ(r.status, begin_status::acquired);
        fence[live.str()] = r.fence;
        idem_test::abandon(std::move(r.ticket));
        ASSERT_TRUE(g->flush());
    }
    std::int64_t lease_until_ms = 0;
    {
        // Four claims with a 1 ms lease, abandoned.
        auto o = durable_options();
        o.lease = 1ms;
        auto g = open_sqlite(db_, mode(), o);
        EXPECT_EQ(g->recovery().compensated, 0u) << "a live claim must not be compensated";
        std::uint64_t fp = 100;
        for (const auto* k : {&ks, &kf, &kn, &ku}) {
            auto r = g->guard().begin(*k, ++fp);
            ASSERT_EQ(r.status, begin_status::acquired);
            fence[k->str()] = r.fence;
            idem_test::abandon(std::move(r.ticket));
        }
        ASSERT_TRUE(g->flush());
    }
    {
        idem::sqlite_store st(db_);
        for (const auto* k : {&ks, &kf, &kn, &ku})
            lease_until_ms = std::max(lease_until_ms, st.get(k->view())->lease_until_ms);
        const auto l = st.get(live.view());
        ASSERT_TRUE(l.has_value());
        EXPECT_GT(l->lease_until_ms, wall_ms_now() + 3'500'000) << "the hour-long lease was stored in the wrong unit";
    }
    ASSERT_TRUE(idem_test::wait_wall_past(lease_until_ms)) << "the 1 ms leases never expired";

    struct call {
        std::string key;
        std::uint64_t fence, fingerprint;
    };
    std::mutex m;
    std::vector<call> calls;
    std::map<std::string, idem::resolver_answer> verdict = {
        {ks.str(), {idem::resolution::succeeded, 77}},
        {kf.str(), {idem::resolution::failed, 5}},
        {kn.str(), {idem::resolution::not_executed, 0}},
        {ku.str(), {idem::resolution::unknown, 0}},
    };
    auto o = durable_options();
    o.resolve = [&](const idem::expired_claim& c) {
        std::lock_guard lock(m);
        calls.push_back({std::string(c.key), c.fence, c.fingerprint});
        auto it = verdict.find(std::string(c.key));
        return it == verdict.end() ? idem::resolver_answer{} : it->second;
    };
    auto g = open_sqlite(db_, mode(), o);
    EXPECT_EQ(g->recovery().records, 5u);
    EXPECT_EQ(g->recovery().processing, 5u);
    EXPECT_EQ(g->recovery().compensated, 3u);
    {
        // The one-call exposition carries the start's figures as gauges (a restart is a series).
        const std::string text = idem::to_prometheus(*g);
        EXPECT_NE(text.find("\nidem_recovery_records 5\n"), std::string::npos) << text;
        EXPECT_NE(text.find("\nidem_recovery_claims_in_flight 5\n"), std::string::npos) << text;
        EXPECT_NE(text.find("\nidem_recovery_claims_compensated 3\n"), std::string::npos) << text;
        EXPECT_NE(text.find("# TYPE idem_recovery_seconds gauge\nidem_recovery_seconds "), std::string::npos) << text;
        EXPECT_NE(text.find("\nidem_acquired_total "), std::string::npos) << "the guard's counters are in the same text";
    }
    {
        std::lock_guard lock(m);
        ASSERT_EQ(calls.size(), 4u) << "the resolver must be asked once per expired claim, never about a live one";
        std::uint64_t fp = 100;
        for (const auto* k : {&ks, &kf, &kn, &ku}) {
            auto it = std::find_if(calls.begin(), calls.end(), [&](const call& c) { return c.key == k->str(); });
            ASSERT_NE(it, calls.end()) << k->str();
            EXPECT_EQ(it->fence, fence[k->str()]);
            EXPECT_EQ(it->fingerprint, ++fp) << "the resolver must see the claim's request fingerprint";
        }
    }
    auto& gd = g->guard();
    EXPECT_EQ(gd.query(ks).state, record_state::succeeded);
    EXPECT_EQ(gd.query(ks).outcome, 77u);
    EXPECT_EQ(gd.query(kf).state, record_state::failed);
    EXPECT_EQ(gd.query(kn).state, record_state::absent);
    EXPECT_EQ(gd.query(ku).state, record_state::processing);
    EXPECT_TRUE(gd.query(ku).in_doubt);
    EXPECT_EQ(gd.query(live).state, record_state::processing);
    EXPECT_FALSE(gd.query(live).in_doubt);

    auto rs = gd.begin(ks, 101);
    EXPECT_EQ(rs.status, begin_status::succeeded);
    EXPECT_EQ(rs.outcome, 77u);
    auto rf = gd.begin(kf, 102);
    EXPECT_EQ(rf.status, begin_status::failed);
    EXPECT_EQ(rf.outcome, 5u);
    EXPECT_EQ(gd.begin(ku, 104).status, begin_status::in_doubt);
    EXPECT_EQ(gd.begin(live, 11).status, begin_status::in_progress);
    {
        auto rn = gd.begin(kn, 103);
        ASSERT_EQ(rn.status, begin_status::acquired) << "not executed: the key is claimable again";
        EXPECT_GT(rn.fence, fence[kn.str()]);
        EXPECT_FALSE(rn.ticket.succeed(9));
    }
    // The next compensation pass asks again about the key in doubt; now the answer is known.
    {
        std::lock_guard lock(m);
        verdict[ku.str()] = {idem::resolution::succeeded, 88};
    }
    EXPECT_EQ(gd.compensate(), 1u);
    EXPECT_EQ(gd.query(ku).state, record_state::succeeded);
    EXPECT_EQ(gd.query(ku).outcome, 88u);
    EXPECT_EQ(gd.query(live).state, record_state::processing) << "the live claim was compensated";
    ASSERT_TRUE(g->flush());
    g.reset();

    idem::sqlite_store st(db_);
    auto last = [&](const idem::key& k) {
        const auto trail = st.audit(k.view());
        return trail.empty() ? idem::audit_entry{} : trail.back();
    };
    EXPECT_EQ(last(ks).to, record_state::succeeded);
    EXPECT_EQ(last(ks).detail, "compensate outcome=77");
    EXPECT_EQ(last(kf).to, record_state::failed);
    EXPECT_EQ(last(kf).detail, "compensate outcome=5");
    const auto kn_trail = st.audit(kn.view());
    ASSERT_EQ(kn_trail.size(), 4u);
    EXPECT_EQ(kn_trail[1].to, record_state::released);
    EXPECT_EQ(kn_trail[1].detail, "compensate outcome=0");
    const auto ku_trail = st.audit(ku.view());
    ASSERT_EQ(ku_trail.size(), 3u);
    EXPECT_EQ(ku_trail[1].from, record_state::processing);
    EXPECT_EQ(ku_trail[1].to, record_state::processing);
    EXPECT_EQ(ku_trail[1].detail.rfind("doubt", 0), 0u) << ku_trail[1].detail;
    EXPECT_EQ(ku_trail[2].detail, "compensate outcome=88");
    EXPECT_EQ(st.audit(live.view()).size(), 1u);
    EXPECT_TRUE(verify_clean(st));
}

// ---- (c) the store is down --------------------------------------------------------------------

/// A workload whose final state per key is known: i%4 = 0,1 succeed (outcome i), 2 fail terminal,
/// 3 released then claimed again and succeeded.
void run_known_workload(idem::durable_guard& g, std::size_t from, std::size_t to) {
    for (std::size_t i = from; i < to; ++i) {
        auto r = g->begin(pay_key(i));
        ASSERT_EQ(r.status, begin_status::acquired) << i;
        switch (i % 4) {
            case 0:
            case 1: ASSERT_FALSE(r.ticket.succeed(i)); break;
            case 2: ASSERT_FALSE(r.ticket.fail(i, idem::failure_policy::terminal)); break;
            default: {
                ASSERT_FALSE(r.ticket.fail(1, idem::failure_policy::retryable));
                auto again = g->begin(pay_key(i));
                ASSERT_EQ(again.status, begin_status::acquired);
                ASSERT_FALSE(again.ticket.succeed(i));
            }
        }
    }
}

void expect_known_workload(idem::store& st, std::size_t from, std::size_t to) {
    std::size_t bad = 0;
    for (std::size_t i = from; i < to; ++i) {
        const auto r = st.get(pay_key(i).view());
        const auto want = i % 4 == 2 ? record_state::failed : record_state::succeeded;
        if (!r || r->state != want || r->outcome != i) {
            if (++bad <= 5)
                ADD_FAILURE() << pay_key(i).str() << ": want " << idem::to_string(want) << " outcome " << i << ", store has "
                              << (r ? std::string(idem::to_string(r->state)) + " outcome " + std::to_string(r->outcome)
                                    : std::string("nothing"));
        }
        const std::size_t rows = i % 4 == 3 ? 4 : 2;
        if (st.audit(pay_key(i).view()).size() != rows && ++bad <= 5)
            ADD_FAILURE() << pay_key(i).str() << ": " << st.audit(pay_key(i).view()).size() << " audit rows, want " << rows
                          << " (a batch written twice, or lost)";
    }
    EXPECT_EQ(bad, 0u);
}

TEST_P(Durable, StoreDownMemoryStoreFailNextIsRetriedWithBackoff) {
    idem::memory_store mem;
    mem.fail_next(5);  // before the flusher exists: no race on the hook
    faulty_store* f = nullptr;
    idem::store_options so;
    so.max_backoff = 10ms;
    {
        auto g = open_faulty(mem, &f, mode(), durable_options(), so);
        run_known_workload(*g, 0, 400);
        ASSERT_TRUE(g->flush(10s)) << g->last_store_error();
        EXPECT_EQ(g->snapshot().store_errors, 5u) << "every failed apply is counted once";
        EXPECT_NE(g->last_store_error().find("injected failure"), std::string::npos) << g->last_store_error();
        EXPECT_EQ(g->snapshot().queue_depth, 0u);
    }
    expect_known_workload(mem, 0, 400);
    EXPECT_TRUE(verify_clean(mem));
}

TEST_P(Durable, StoreDownUnwritableSqliteFileIsRetriedUntilWritableAgain) {
    idem::store_options so;
    so.max_backoff = 20ms;
    so.sync_timeout = 30s;  // sync mode: the callers wait out the outage
    auto g = open_sqlite(db_, mode(), durable_options(), so);
    run_known_workload(*g, 0, 100);
    ASSERT_TRUE(g->flush(10s));
    for (const char* f : {"", "-wal"}) {
        const std::string why = idem_test::set_immutable(db_ + f, true);
        ASSERT_EQ(why, "") << "cannot make the database unwritable (chattr +i needs root and ext4/xfs/btrfs)";
    }
    std::thread worker;
    std::atomic<bool> worker_done{false};
    if (sync()) {
        // Sync callers block until the outage ends: run them on another thread.
        worker = std::thread([&] {
            run_known_workload(*g, 100, 110);
            worker_done = true;
        });
    } else {
        run_known_workload(*g, 100, 200);  // acknowledged at once, durable later
        worker_done = true;
    }
    ASSERT_TRUE(wait_for([&] { return g->snapshot().store_errors > 0; })) << "the store never failed";
    const std::string err = g->last_store_error();
    EXPECT_NE(err.find(db_), std::string::npos) << "the error does not name the file: " << err;
    EXPECT_FALSE(worker_done && sync()) << "a sync caller was answered while nothing could commit";
    for (const char* f : {"", "-wal"}) (void)idem_test::set_immutable(db_ + f, false);
    if (worker.joinable()) worker.join();
    ASSERT_TRUE(g->flush(20s)) << g->last_store_error();
    const std::size_t end = sync() ? 110 : 200;
    g.reset();
    idem::sqlite_store st(db_);
    expect_known_workload(st, 0, end);
    EXPECT_TRUE(verify_clean(st));
}

TEST_P(Durable, CommitUnknownThatCommittedIsResolvedByReadingTheStore) {
    idem::sqlite_store inner(db_, sync());
    faulty_store* f = nullptr;
    idem::store_options so;
    so.max_backoff = 5ms;
    {
        auto g = open_faulty(inner, &f, mode(), durable_options(), so);
        f->unknown_after_commit = 1;
        run_known_workload(*g, 0, 40);
        ASSERT_TRUE(g->flush(10s)) << g->last_store_error();
        EXPECT_EQ(g->snapshot().store_errors, 1u);
        EXPECT_GE(f->committed_calls.load(), 1) << "commit_unknown must be resolved with committed()";
    }
    expect_known_workload(inner, 0, 40);
    EXPECT_TRUE(verify_clean(inner));
}

TEST_P(Durable, CommitUnknownThatDidNotCommitIsRetried) {
    idem::sqlite_store inner(db_, sync());
    faulty_store* f = nullptr;
    idem::store_options so;
    so.max_backoff = 5ms;
    {
        auto g = open_faulty(inner, &f, mode(), durable_options(), so);
        f->unknown_before_commit = 2;
        run_known_workload(*g, 0, 40);
        ASSERT_TRUE(g->flush(10s)) << g->last_store_error();
        EXPECT_GE(f->committed_calls.load(), 2);
    }
    expect_known_workload(inner, 0, 40);
    EXPECT_TRUE(verify_clean(inner));
}

// The commit's outcome is unknown and the store stays unreachable for a while (a failover): the
// flusher must keep asking committed() until it gets an answer, never re-apply the batch blindly
// (docs/stores.md, flush pipeline), or every row of the batch is written twice.
TEST_P(Durable, CommitUnknownIsNeverRetriedBlindlyWhileTheStoreIsUnreachable) {
    idem::sqlite_store inner(db_, sync());
    faulty_store* f = nullptr;
    idem::store_options so;
    so.max_backoff = 5ms;
    {
        auto g = open_faulty(inner, &f, mode(), durable_options(), so);
        f->unknown_after_commit = 1;
        f->fail_committed = 6;  // the outage outlasts a few attempts to ask
        run_known_workload(*g, 0, 40);
        ASSERT_TRUE(g->flush(10s)) << g->last_store_error();
    }
    expect_known_workload(inner, 0, 40);
    EXPECT_TRUE(verify_clean(inner));
}

// ---- (d) sync mode ------------------------------------------------------------------------------

TEST(DurableSync, BeginAndSucceedReturnOnlyAfterTheCommit) {
    temp_dir dir("idem-durable");
    const std::string db = dir.file("idem.db");
    idem::sqlite_store inner(db, true);
    faulty_store* f = nullptr;
    auto g = open_faulty(inner, &f, durability::sync);
    // 16 threads with their own read connection on the same file: what begin acknowledged is in
    // the file, visible to another connection, the moment begin returns.
    std::atomic<int> not_durable{0};
    std::mutex m;
    std::vector<std::string> first;
    auto report = [&](const std::string& s) {
        if (not_durable.fetch_add(1) < 5) {
            std::lock_guard lock(m);
            first.push_back(s);
        }
    };
    idem_test::run_on_latch(16, [&](std::size_t t) {
        idem::sqlite_store reader(db, true);
        for (std::size_t j = 0; j < 15; ++j) {
            const auto k = pay_key(t * 100 + j);
            auto r = g->guard().begin(k);
            if (r.status != begin_status::acquired) {
                report(k.str() + ": begin " + idem::to_string(r.status));
                continue;
            }
            auto seen = reader.get(k.view());
            if (!seen || seen->state != record_state::processing || seen->fence != r.fence)
                report(k.str() + ": begin returned before the claim was committed");
            if (f->acked(k.view()).state != record_state::processing) report(k.str() + ": claim not acknowledged");
            if (r.ticket.succeed(j + 1)) {
                report(k.str() + ": succeed failed");
                continue;
            }
            seen = reader.get(k.view());
            if (!seen || seen->state != record_state::succeeded || seen->outcome != j + 1)
                report(k.str() + ": succeed returned before the success was committed");
        }
    });
    EXPECT_EQ(not_durable.load(), 0) << [&] {
        std::string s;
        for (auto& x : first) s += "\n  " + x;
        return s;
    }();
    ASSERT_TRUE(g->flush());
    // The flusher's CPU clock is reported: it committed 16 x 15 x 2 rows, which took some CPU.
    const auto s = g->snapshot();
    EXPECT_EQ(s.flushed_transitions, 16u * 15u * 2u);
    EXPECT_GT(s.flusher_cpu_ns, 0u);
    g.reset();
    EXPECT_TRUE(verify_clean(inner));
}

// The store stays down: begin answers store_unavailable within sync_timeout (store_options:
// "longest wait for a commit in sync mode"), the key is not granted, and after the store is back
// the withdrawals are on record and the key is claimed with a higher fence.
TEST(DurableSync, StoreDownBeginAnswersStoreUnavailableWithinSyncTimeoutAndDoesNotGrant) {
    temp_dir dir("idem-durable");
    idem::sqlite_store inner(dir.file("idem.db"), true);
    faulty_store* f = nullptr;
    idem::store_options so;
    so.sync_timeout = 500ms;
    so.max_backoff = 5ms;
    auto g = open_faulty(inner, &f, durability::sync, durable_options(), so);
    const auto k = idem::key("TXDOWN_PAY_v1");
    f->down = true;

    const auto t0 = std::chrono::steady_clock::now();
    auto r = g->guard().begin(k);
    const auto waited = std::chrono::steady_clock::now() - t0;
    EXPECT_EQ(r.status, begin_status::store_unavailable);
    EXPECT_FALSE(r.ticket.valid()) << "a claim that is not durable must not be granted";
    EXPECT_EQ(g->guard().query(k).state, record_state::absent);
    EXPECT_LT(waited, so.sync_timeout * 3 / 2)
        << "begin waited " << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()
        << " ms with sync_timeout = 500 ms";
    EXPECT_GT(g->snapshot().store_errors, 0u);
    const std::uint64_t first_fence = r.fence;

    auto r2 = g->guard().begin(k);
    EXPECT_EQ(r2.status, begin_status::store_unavailable);
    EXPECT_FALSE(r2.ticket.valid());

    f->down = false;
    ASSERT_TRUE(g->flush(10s)) << g->last_store_error();
    auto r3 = g->guard().begin(k);
    ASSERT_EQ(r3.status, begin_status::acquired);
    EXPECT_GT(r3.fence, first_fence);
    EXPECT_FALSE(r3.ticket.succeed(1));
    EXPECT_EQ(f->acked(k.view()).state, record_state::succeeded);
    g.reset();
    const auto trail = inner.audit(k.view());
    ASSERT_GE(trail.size(), 2u);
    EXPECT_EQ(trail[1].to, record_state::released);
    EXPECT_EQ(trail[1].detail.rfind("not_durable", 0), 0u) << trail[1].detail;
    EXPECT_EQ(trail.back().to, record_state::succeeded);
    EXPECT_TRUE(verify_clean(inner));
}

// succeed() in sync mode while the store is down: store_unavailable (documented: recorded in
// memory and queued), then durable once the store is back.
TEST(DurableSync, SucceedDuringAnOutageBecomesDurableWhenTheStoreIsBack) {
    temp_dir dir("idem-durable");
    idem::sqlite_store inner(dir.file("idem.db"), true);
    faulty_store* f = nullptr;
    idem::store_options so;
    so.sync_timeout = 200ms;
    so.max_backoff = 5ms;
    auto g = open_faulty(inner, &f, durability::sync, durable_options(), so);
    const auto k = idem::key("TXOUT_PAY_v1");
    auto r = g->guard().begin(k);
    ASSERT_EQ(r.status, begin_status::acquired);
    f->down = true;
    EXPECT_EQ(r.ticket.succeed(5), errc::store_unavailable);
    EXPECT_EQ(f->acked(k.view()).state, record_state::processing);
    f->down = false;
    ASSERT_TRUE(g->flush(10s));
    EXPECT_EQ(f->acked(k.view()).state, record_state::succeeded);
    EXPECT_EQ(f->acked(k.view()).outcome, 5u);
    g.reset();
    EXPECT_TRUE(verify_clean(inner));
}

// ---- (e) backpressure ---------------------------------------------------------------------------

TEST(DurableBackpressure, FullQueueRefusesWithoutChangingMemory) {
    idem::memory_store mem;
    faulty_store* f = nullptr;
    idem::store_options so;
    so.queue_capacity = 8;
    so.max_batch = 1;  // the flusher holds at most one row while the store is down
    so.max_backoff = 2ms;
    auto g = open_faulty(mem, &f, durability::async, durable_options(), so);
    f->down = true;

    std::vector<idem::ticket> held;
    // The first claim goes to the flusher, which takes it as its one-row batch and keeps retrying
    // it. Only once it holds that row is the queue's room fixed: before, a late pop by the
    // flusher could open one more place after the first refusal.
    {
        auto r = g->guard().begin(pay_key(0));
        ASSERT_EQ(r.status, begin_status::acquired);
        held.push_back(std::move(r.ticket));
    }
    ASSERT_TRUE(wait_for([&] { return g->snapshot().store_errors > 0; })) << "the flusher never tried the store";
    std::size_t i = 1;
    begin_status last = begin_status::acquired;
    for (; i < 100; ++i) {
        auto r = g->guard().begin(pay_key(i));
        last = r.status;
        if (r.status != begin_status::acquired) break;
        held.push_back(std::move(r.ticket));
    }
    ASSERT_EQ(last, begin_status::backpressure) << "the queue never filled";
    std::cout << "[ idem    ] queue_capacity 8, max_batch 1: " << held.size()
              << " transitions accepted while the store was down\n";
    EXPECT_GE(held.size(), so.queue_capacity);
    EXPECT_LE(held.size(), so.queue_capacity + so.max_batch);
    const auto refused = pay_key(i);
    const auto v = g->guard().query(refused);
    EXPECT_EQ(v.state, record_state::absent) << "a refused claim changed memory";
    EXPECT_EQ(v.fence, 0u);
    EXPECT_EQ(g->snapshot().backpressure, 1u);
    EXPECT_EQ(g->guard().begin(refused).status, begin_status::backpressure);
    EXPECT_EQ(g->snapshot().backpressure, 2u);
    EXPECT_EQ(g->guard().snapshot().acquired, held.size());

    // A completion under backpressure: refused, the ticket stays valid, the record stays processing.
    EXPECT_EQ(held[0].succeed(1), errc::backpressure);
    EXPECT_TRUE(held[0].valid());
    EXPECT_EQ(g->guard().query(pay_key(0)).state, record_state::processing);
    EXPECT_EQ(g->snapshot().backpressure, 3u);

    // The store is back. The queue is still tiny, so a burst may meet backpressure again: retry,
    // as run() does.
    f->down = false;
    ASSERT_TRUE(g->flush(10s));
    for (std::size_t j = 0; j < held.size(); ++j) {
        std::error_code ec;
        ASSERT_TRUE(wait_for([&] { return (ec = held[j].succeed(j + 1)) != errc::backpressure; }));
        ASSERT_FALSE(ec) << "ticket " << j << ": " << ec.message();
    }
    idem::begin_result r{begin_status::backpressure, {}};
    ASSERT_TRUE(wait_for([&] { return (r = g->guard().begin(refused)).status != begin_status::backpressure; }));
    ASSERT_EQ(r.status, begin_status::acquired);
    std::error_code ec;
    ASSERT_TRUE(wait_for([&] { return (ec = r.ticket.succeed(99)) != errc::backpressure; }));
    ASSERT_FALSE(ec);
    ASSERT_TRUE(g->flush(10s));
    g.reset();
    for (std::size_t j = 0; j < held.size(); ++j) {
        const auto rec = mem.get(pay_key(j).view());
        ASSERT_TRUE(rec.has_value());
        EXPECT_EQ(rec->state, record_state::succeeded);
        EXPECT_EQ(rec->outcome, j + 1);
    }
    EXPECT_EQ(mem.audit(refused.view()).size(), 2u) << "a refused claim reached the store";
    EXPECT_TRUE(verify_clean(mem));
}

TEST(DurableBackpressure, OfferWaitWaitsForRoomInsteadOfRefusing) {
    idem::memory_store mem;
    faulty_store* f = nullptr;
    idem::store_options so;
    so.queue_capacity = 8;
    so.max_batch = 1;
    so.max_backoff = 2ms;
    so.offer_wait = 60s;
    auto g = open_faulty(mem, &f, durability::async, durable_options(), so);
    f->down = true;

    const std::size_t m = so.queue_capacity + so.max_batch + 4;  // more than the pipeline can hold
    std::atomic<std::size_t> returned{0};
    std::vector<begin_status> status(m);
    std::vector<idem::ticket> tickets(m);
    std::thread worker([&] {
        for (std::size_t i = 0; i < m; ++i) {
            auto r = g->guard().begin(pay_key(i));
            status[i] = r.status;
            tickets[i] = std::move(r.ticket);
            returned.store(i + 1);
        }
    });
    // The pipeline holds queue_capacity rows in the queue plus max_batch in the flusher's hands.
    // Once that many begins returned, the next one waits for room before it changes anything:
    // admission is by reservation, so it holds no sequence number (queue_depth is exact).
    const std::size_t room = so.queue_capacity + so.max_batch;
    ASSERT_TRUE(wait_for([&] { return returned.load() >= room && g->snapshot().queue_depth == room; }))
        << "the worker never filled the pipeline (" << returned.load() << " begins returned)";
    EXPECT_EQ(returned.load(), room) << "the pipeline held more than queue_capacity + max_batch rows";
    EXPECT_EQ(g->snapshot().backpressure, 0u);
    f->down = false;
    worker.join();
    for (std::size_t i = 0; i < m; ++i) EXPECT_EQ(status[i], begin_status::acquired) << i;
    EXPECT_EQ(g->snapshot().backpressure, 0u) << "offer_wait must wait, not refuse";
    for (auto& t : tickets) ASSERT_FALSE(t.succeed(3));
    ASSERT_TRUE(g->flush(10s));
    g.reset();
    EXPECT_EQ(idem_test::load_all(mem).size(), m);
    EXPECT_TRUE(verify_clean(mem));
}

// ---- (f) fences ---------------------------------------------------------------------------------

TEST_P(Durable, FencesContinueAboveTheStoresMaximumAcrossReopens) {
    const auto released = idem::key("TXREL_PAY_v1");
    std::uint64_t last_fence = 0;
    std::uint64_t store_max = 0;
    for (int round = 0; round < 5; ++round) {
        SCOPED_TRACE("reopen " + std::to_string(round));
        auto g = open_sqlite(db_, mode());
        auto r = g->guard().begin(released);
        ASSERT_EQ(r.status, begin_status::acquired);
        EXPECT_GT(r.fence, last_fence) << "a released key re-claimed after reopen must get a higher fence";
        last_fence = r.fence;
        ASSERT_FALSE(r.ticket.fail(1, idem::failure_policy::retryable));
        const auto fresh = idem::key("TXFRESH" + std::to_string(round) + "_PAY_v1");
        auto n = g->guard().begin(fresh);
        ASSERT_EQ(n.status, begin_status::acquired);
        EXPECT_GT(n.fence, store_max) << "a new key's fence must start above the store's largest";
        ASSERT_FALSE(n.ticket.succeed(round));
        ASSERT_TRUE(g->flush());
        g.reset();
        idem::sqlite_store st(db_);
        store_max = st.max_fence();
        EXPECT_GE(store_max, std::max(last_fence, n.fence));
        EXPECT_TRUE(verify_clean(st));
    }
}

}  // namespace
