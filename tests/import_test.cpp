// import_test: `idem import`'s logic (tools/import.hpp) over memory_store and sqlite_store with an
// in-memory source, no server:
//
//   MapsEachOldStateToItsRecordAndTrail   SUCCESS, FAILED, PROCESSING -> records, fences above the
//                                         store's max_fence, trails of `imported` rows; verify passes
//   ASecondImportChangesNothing           the same records and the same audit rows after a second run
//   DifferentStatesAreConflictsAndIdemWins  SUCCESS vs FAILED, and a claim the old table decided since
//   OneKeyNamedTwiceInAPass               the first row wins, a second state is a conflict
//   BadRowsAreRefusedByRuleTheRestImported  NULL key/status/times, a long key, an unknown status, a
//                                         time 200 years out: counted by rule and named
//   SinceReadsOnlyNewerRowsAndReportsTheHighWaterMark  incremental passes
//   ImportedDecisionsAreDuplicatesInADurableGuard   SUCCESS/FAILED answered, never acquired, across
//                                         two starts; verify passes on the store
//   ImportedClaimGoesToTheResolverOnceAtStart   resolver asked exactly once over two starts; the key
//                                         is never acquired; an unknown verdict leaves it in doubt
//   TableNamesAndSourceUris               what --table and --from accept and refuse
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "../tools/import.hpp"
#include "../tools/import_sources.hpp"
#include "support/store_fixtures.hpp"

namespace {

using idem::begin_status;
using idem::record_state;
namespace imports = idem::tool::imports;

std::int64_t wall_now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

imports::old_row row(std::string k, std::string status, std::int64_t created, std::int64_t updated) {
    return {std::move(k), std::string("PAY"), std::move(status), created, updated};
}

/// Every record, by key.
std::map<std::string, idem::stored_record> records(idem::store& st) {
    std::map<std::string, idem::stored_record> out;
    st.load([&](const idem::stored_record& r) { out[r.key] = r; });
    return out;
}

std::vector<idem::audit_entry> audit_rows(idem::store& st) {
    std::vector<idem::audit_entry> out;
    st.scan_audit([&](const idem::audit_entry& a) { out.push_back(a); });
    return out;
}

/// A claim of `k` at `fence` written as a guard would, so the store holds a fence of its own.
void guard_claim(idem::store& st, const std::string& k, std::uint64_t fence, std::int64_t at_ms, std::uint64_t batch) {
    idem::store_row r;
    r.t.k = idem::key(k);
    r.t.from = record_state::absent;
    r.t.to = record_state::processing;
    r.t.cause = idem::transition_cause::claim;
    r.t.fence = fence;
    r.seq = 1;
    r.at_ms = at_ms;
    r.lease_until_ms = at_ms + 30'000;
    st.apply(std::span(&r, 1), batch);
}

void expect_verified(idem::store& st) {
    const idem::verify_report v = idem::verify(st);
    EXPECT_TRUE(v.violations.empty()) << [&] {
        std::string s;
        for (const auto& x : v.violations) s += x + "\n";
        return s;
    }();
}

TEST(Import, MapsEachOldStateToItsRecordAndTrail) {
    idem::memory_store st;
    const std::int64_t now = wall_now_ms();
    guard_claim(st, "EARLIER_PAY_v1", 1000, now - 10'000, 1);  // max_fence 1000: imports start above
    imports::memory_source src;
    src.rows = {row("T1_PAY_v1", "SUCCESS", now - 5000, now - 4000), row("T2_PAY_v1", "FAILED", now - 3000, now - 2500),
                row("T3_PAY_v1", "PROCESSING", now - 2000, now - 1500)};
    imports::options o;
    o.now_ms = now;
    const imports::report r = imports::run(st, src, o);

    EXPECT_EQ(r.read, 3u);
    EXPECT_EQ(r.imported_succeeded, 1u);
    EXPECT_EQ(r.imported_failed, 1u);
    EXPECT_EQ(r.imported_processing, 1u);
    EXPECT_EQ(r.present, 0u);
    EXPECT_EQ(r.conflicts, 0u);
    EXPECT_EQ(r.refused_total(), 0u);
    EXPECT_EQ(r.batches, 1u);
    EXPECT_EQ(r.first_fence, 1001u);
    EXPECT_EQ(r.last_fence, 1003u);

    auto recs = records(st);
    ASSERT_EQ(recs.size(), 4u);
    const auto& s = recs.at("T1_PAY_v1");
    EXPECT_EQ(s.state, record_state::succeeded);
    EXPECT_EQ(s.outcome, 0u);
    EXPECT_TRUE(s.payload.empty());
    EXPECT_EQ(s.created_ms, now - 5000);
    EXPECT_EQ(s.updated_ms, now - 4000);
    EXPECT_GT(s.fence, 1000u);
    EXPECT_EQ(s.biz_type, "PAY");
    const auto& f = recs.at("T2_PAY_v1");
    EXPECT_EQ(f.state, record_state::failed);
    EXPECT_EQ(f.outcome, 0u);
    EXPECT_GT(f.fence, 1000u);
    const auto& p = recs.at("T3_PAY_v1");
    EXPECT_EQ(p.state, record_state::processing);
    EXPECT_GT(p.fence, 1000u);
    EXPECT_LT(p.lease_until_ms, now) << "an imported claim's lease has expired before any guard starts";
    EXPECT_NE(s.fence, f.fence);
    EXPECT_NE(f.fence, p.fence);
    EXPECT_NE(s.fence, p.fence);

    const auto trail = st.audit("T1_PAY_v1");
    ASSERT_EQ(trail.size(), 2u);
    EXPECT_EQ(trail[0].from, record_state::absent);
    EXPECT_EQ(trail[0].to, record_state::processing);
    EXPECT_EQ(trail[1].from, record_state::processing);
    EXPECT_EQ(trail[1].to, record_state::succeeded);
    EXPECT_EQ(trail[0].fence, trail[1].fence);
    EXPECT_EQ(trail[0].detail, "imported outcome=0");
    EXPECT_EQ(trail[1].detail, "imported outcome=0");
    EXPECT_EQ(trail[0].at_ms, now - 5000);
    EXPECT_EQ(trail[1].at_ms, now - 4000);
    const auto claim_trail = st.audit("T3_PAY_v1");
    ASSERT_EQ(claim_trail.size(), 1u);
    EXPECT_EQ(claim_trail[0].to, record_state::processing);
    EXPECT_EQ(claim_trail[0].detail, "imported outcome=0");
    expect_verified(st);
}

TEST(Import, ASecondImportChangesNothing) {
    idem::memory_store st;
    const std::int64_t now = wall_now_ms();
    imports::memory_source src;
    for (int i = 0; i < 30; ++i)
        src.rows.push_back(row("K" + std::to_string(i) + "_PAY_v1",
                               i % 3 == 0   ? "SUCCESS"
                               : i % 3 == 1 ? "FAILED"
                                            : "PROCESSING",
                               now - 9000 + i, now - 8000 + i));
    imports::options o;
    o.now_ms = now;
    o.batch_keys = 7;  // several transactions
    const imports::report first = imports::run(st, src, o);
    EXPECT_EQ(first.imported(), 30u);
    EXPECT_EQ(first.batches, 5u);
    const auto recs = records(st);
    const auto trail = audit_rows(st);
    const auto fence = st.max_fence();

    o.now_ms = now + 1000;
    const imports::report second = imports::run(st, src, o);
    EXPECT_EQ(second.read, 30u);
    EXPECT_EQ(second.imported(), 0u);
    EXPECT_EQ(second.present, 30u);
    EXPECT_EQ(second.conflicts, 0u);
    EXPECT_EQ(second.batches, 0u);
    EXPECT_EQ(records(st), recs);
    EXPECT_EQ(audit_rows(st).size(), trail.size());
    EXPECT_EQ(st.max_fence(), fence);
    expect_verified(st);
}

TEST(Import, DifferentStatesAreConflictsAndIdemWins) {
    idem::memory_store st;
    const std::int64_t now = wall_now_ms();
    imports::memory_source src;
    src.rows = {row("A_PAY_v1", "SUCCESS", now - 100, now - 90), row("B_PAY_v1", "PROCESSING", now - 100, now - 90)};
    imports::options o;
    o.now_ms = now;
    ASSERT_EQ(imports::run(st, src, o).imported(), 2u);
    const auto before = records(st);
    const auto trail = audit_rows(st);

    // The old table changed its mind about A (idem says SUCCESS), and decided B (idem holds a claim).
    src.rows = {row("A_PAY_v1", "FAILED", now - 100, now - 50), row("B_PAY_v1", "SUCCESS", now - 100, now - 40)};
    const imports::report r = imports::run(st, src, o);
    EXPECT_EQ(r.conflicts, 2u);
    EXPECT_EQ(r.conflicts_claim, 1u);
    EXPECT_EQ(r.imported(), 0u);
    ASSERT_EQ(r.conflict_list.size(), 2u);
    EXPECT_NE(r.conflict_list[0].find("'A_PAY_v1'"), std::string::npos) << r.conflict_list[0];
    EXPECT_NE(r.conflict_list[0].find("idem holds SUCCESS"), std::string::npos) << r.conflict_list[0];
    EXPECT_NE(r.conflict_list[1].find("'B_PAY_v1'"), std::string::npos) << r.conflict_list[1];
    EXPECT_NE(r.conflict_list[1].find("resolver"), std::string::npos) << r.conflict_list[1];
    EXPECT_EQ(records(st), before) << "idem's records are never overwritten";
    EXPECT_EQ(audit_rows(st).size(), trail.size());
}

TEST(Import, OneKeyNamedTwiceInAPass) {
    idem::memory_store st;
    const std::int64_t now = wall_now_ms();
    imports::memory_source src;
    src.rows = {row("D_PAY_v1", "SUCCESS", now - 100, now - 90), row("D_PAY_v1", "SUCCESS", now - 100, now - 90),
                row("D_PAY_v1", "FAILED", now - 100, now - 80)};
    imports::options o;
    o.now_ms = now;
    const imports::report r = imports::run(st, src, o);
    EXPECT_EQ(r.imported_succeeded, 1u);
    EXPECT_EQ(r.present, 1u);
    EXPECT_EQ(r.conflicts, 1u);
    EXPECT_EQ(st.get("D_PAY_v1")->state, record_state::succeeded);
    EXPECT_EQ(st.audit("D_PAY_v1").size(), 2u);
    expect_verified(st);
}

TEST(Import, BadRowsAreRefusedByRuleTheRestImported) {
    idem::memory_store st;
    const std::int64_t now = wall_now_ms();
    const std::int64_t century_ms = 200LL * 365 * 24 * 3600 * 1000;
    imports::memory_source src;
    src.rows = {
        row("GOOD1_PAY_v1", "SUCCESS", now - 10, now - 5),
        row(std::string(129, 'x'), "SUCCESS", now - 10, now - 5),  // 129 bytes: the limit is 128
        row("CTRL\x01KEY", "SUCCESS", now - 10, now - 5),          // a control byte
        {std::nullopt, std::string("PAY"), std::string("SUCCESS"), now - 10, now - 5},
        row("DONE_PAY_v1", "DONE", now - 10, now - 5),
        row("LOWER_PAY_v1", "success", now - 10, now - 5),
        {std::string("NOSTATUS_PAY_v1"), std::string("PAY"), std::nullopt, now - 10, now - 5},
        {std::string("NOCREATED_PAY_v1"), std::nullopt, std::string("FAILED"), std::nullopt, now - 5},
        {std::string("NOUPDATED_PAY_v1"), std::string("PAY"), std::string("FAILED"), now - 10, std::nullopt},
        row("FUTURE_PAY_v1", "SUCCESS", now - 10, now + century_ms),
        row("GOOD2_PAY_v1", "FAILED", now - 10, now - 5),
    };
    imports::options o;
    o.now_ms = now;
    const imports::report r = imports::run(st, src, o);
    EXPECT_EQ(r.read, 11u);
    EXPECT_EQ(r.imported(), 2u);
    EXPECT_EQ(r.refused[static_cast<int>(imports::refusal::invalid_key)], 3u);
    EXPECT_EQ(r.refused[static_cast<int>(imports::refusal::unknown_status)], 2u);
    EXPECT_EQ(r.refused[static_cast<int>(imports::refusal::null_column)], 3u);
    EXPECT_EQ(r.refused[static_cast<int>(imports::refusal::bad_time)], 1u);
    ASSERT_EQ(r.refused_list.size(), 9u);
    const auto listed = [&](const std::string& a, const std::string& b) {
        for (const auto& s : r.refused_list)
            if (s.find(a) != std::string::npos && s.find(b) != std::string::npos) return true;
        return false;
    };
    EXPECT_TRUE(listed("129 bytes", "the limit is 128"));
    EXPECT_TRUE(listed("CTRL\\x01KEY", "key"));
    EXPECT_TRUE(listed("row 4 of the read", "idempotent_key is NULL"));
    EXPECT_TRUE(listed("'DONE_PAY_v1'", "status 'DONE' is not a state of the old table"));
    EXPECT_TRUE(listed("'LOWER_PAY_v1'", "status 'success'"));
    EXPECT_TRUE(listed("'NOSTATUS_PAY_v1'", "status is NULL"));
    EXPECT_TRUE(listed("'NOCREATED_PAY_v1'", "created_time is NULL"));
    EXPECT_TRUE(listed("'NOUPDATED_PAY_v1'", "updated_time is NULL"));
    EXPECT_TRUE(listed("'FUTURE_PAY_v1'", "more than 100 years from now"));
    EXPECT_EQ(records(st).size(), 2u);
    EXPECT_TRUE(st.get("GOOD1_PAY_v1").has_value());
    EXPECT_TRUE(st.get("GOOD2_PAY_v1").has_value());

    o.max_list = 2;  // everything is counted, two are listed
    idem::memory_store other;
    const imports::report capped = imports::run(other, src, o);
    EXPECT_EQ(capped.refused_total(), 9u);
    EXPECT_EQ(capped.refused_list.size(), 2u);
}

TEST(Import, SinceReadsOnlyNewerRowsAndReportsTheHighWaterMark) {
    idem::memory_store st;
    const std::int64_t now = wall_now_ms();
    imports::memory_source src;
    src.rows = {row("E1_PAY_v1", "SUCCESS", now - 900, now - 800), row("E2_PAY_v1", "PROCESSING", now - 700, now - 600)};
    imports::options o;
    o.now_ms = now;
    o.margin_ms = 100;
    const imports::report first = imports::run(st, src, o);
    EXPECT_EQ(first.imported(), 2u);
    ASSERT_TRUE(first.high_water_ms.has_value());
    EXPECT_EQ(*first.high_water_ms, now - 600);
    ASSERT_TRUE(first.next_since_ms.has_value());
    EXPECT_EQ(*first.next_since_ms, now - 700);

    // The old system goes on: E2 completes (its updated_time moves), E3 and E4 arrive.
    src.rows[1] = row("E2_PAY_v1", "SUCCESS", now - 700, now - 300);
    src.rows.push_back(row("E3_PAY_v1", "SUCCESS", now - 400, now - 350));
    src.rows.push_back(row("E4_PAY_v1", "FAILED", now - 650, now - 650));  // committed late, inside the margin
    o.since_ms = first.next_since_ms;
    const imports::report second = imports::run(st, src, o);
    EXPECT_EQ(second.read, 3u) << "E1 is older than --since";
    EXPECT_EQ(second.imported(), 2u);
    EXPECT_EQ(second.conflicts_claim, 1u) << "E2: idem's claim stays, the resolver decides it";
    EXPECT_EQ(*second.high_water_ms, now - 300);
    EXPECT_EQ(*second.next_since_ms, now - 400);

    o.since_ms = second.next_since_ms;  // nothing new: the mark stays where it was
    src.rows.resize(1);
    const imports::report third = imports::run(st, src, o);
    EXPECT_EQ(third.read, 0u);
    EXPECT_FALSE(third.high_water_ms.has_value());
    EXPECT_EQ(third.next_since_ms, second.next_since_ms);
    EXPECT_EQ(records(st).size(), 4u);
    expect_verified(st);
}

// ---- a durable guard over the imported store ----------------------------------------------------

idem::options guard_options(std::vector<std::string>* asked, idem::resolution verdict) {
    idem::options opts;
    opts.capacity = 1024;
    opts.maintenance_interval = std::chrono::nanoseconds(0);  // compensation only at start: counted exactly
    opts.resolve = [asked, verdict](const idem::expired_claim& c) {
        asked->emplace_back(c.key);
        return idem::resolver_answer{verdict, 7, {}};
    };
    return opts;
}

std::vector<imports::old_row> three_states(std::int64_t now) {
    return {row("S_PAY_v1", "SUCCESS", now - 60'000, now - 59'000), row("F_PAY_v1", "FAILED", now - 58'000, now - 57'000),
            row("P_PAY_v1", "PROCESSING", now - 56'000, now - 55'000)};
}

TEST(Import, ImportedDecisionsAreDuplicatesInADurableGuard) {
    idem_test::temp_dir dir("idem-import");
    const std::string db = (dir.path() / "idem.db").string();
    {
        idem::sqlite_store st(db);
        imports::memory_source src;
        src.rows = three_states(wall_now_ms());
        ASSERT_EQ(imports::run(st, src).imported(), 3u);
    }
    std::vector<std::string> asked;
    for (int start = 0; start < 2; ++start) {
        idem::durable_guard g(std::make_unique<idem::sqlite_store>(db), guard_options(&asked, idem::resolution::succeeded));
        const auto s = g->begin(idem::key("S_PAY_v1"));
        EXPECT_EQ(s.status, begin_status::succeeded) << "start " << start;
        EXPECT_EQ(s.outcome, 0u);
        EXPECT_TRUE(s.payload.empty());
        const auto f = g->begin(idem::key("F_PAY_v1"));
        EXPECT_EQ(f.status, begin_status::failed) << "start " << start;
        EXPECT_EQ(f.outcome, 0u);
        // A fingerprint does not make it a mismatch: the old table recorded none.
        EXPECT_EQ(g->begin(idem::key("S_PAY_v1"), 12345).status, begin_status::succeeded);
        auto fresh = g->begin(idem::key("NEW_PAY_v1"));
        if (start == 0) {
            ASSERT_EQ(fresh.status, begin_status::acquired) << "a key the old table never had is free";
            EXPECT_FALSE(fresh.ticket.succeed(1)) << "the new key's claim completes";
        } else {
            EXPECT_EQ(fresh.status, begin_status::succeeded);
        }
        ASSERT_TRUE(g.flush());
    }
    EXPECT_EQ(asked, std::vector<std::string>{"P_PAY_v1"});
    idem::sqlite_store st(db);
    expect_verified(st);
    // The imported claim, then the resolver's decision at the first start, on the same fence.
    const auto trail = st.audit("P_PAY_v1");
    ASSERT_EQ(trail.size(), 2u);
    EXPECT_EQ(trail[0].detail, "imported outcome=0");
    EXPECT_EQ(trail[1].detail, "compensate outcome=7");
    EXPECT_EQ(trail[1].fence, trail[0].fence);
    // Fences of the guard's own claims start above the imported ones.
    EXPECT_GT(st.get("NEW_PAY_v1")->fence, st.get("P_PAY_v1")->fence);
}

TEST(Import, ImportedClaimGoesToTheResolverOnceAtStart) {
    idem_test::temp_dir dir("idem-import");
    const std::string db = (dir.path() / "idem.db").string();
    {
        idem::sqlite_store st(db);
        imports::memory_source src;
        src.rows = three_states(wall_now_ms());
        ASSERT_EQ(imports::run(st, src).imported_processing, 1u);
    }
    {
        // A resolver that cannot tell: the claim stays in doubt and is never granted.
        std::vector<std::string> asked;
        idem::durable_guard g(std::make_unique<idem::sqlite_store>(db), guard_options(&asked, idem::resolution::unknown));
        EXPECT_EQ(g.recovery().processing, 1u);
        EXPECT_EQ(asked, std::vector<std::string>{"P_PAY_v1"});
        for (int i = 0; i < 3; ++i) EXPECT_EQ(g->begin(idem::key("P_PAY_v1")).status, begin_status::in_doubt);
        EXPECT_EQ(asked.size(), 1u) << "a begin does not ask the resolver";
        ASSERT_TRUE(g.flush());
    }
    std::vector<std::string> asked;
    for (int start = 0; start < 2; ++start) {
        idem::durable_guard g(std::make_unique<idem::sqlite_store>(db), guard_options(&asked, idem::resolution::succeeded));
        const auto p = g->begin(idem::key("P_PAY_v1"));
        EXPECT_EQ(p.status, begin_status::succeeded) << "start " << start;
        EXPECT_EQ(p.outcome, 7u) << "the resolver's outcome";
        EXPECT_EQ(g.recovery().compensated, start == 0 ? 1u : 0u);
        ASSERT_TRUE(g.flush());
    }
    EXPECT_EQ(asked, std::vector<std::string>{"P_PAY_v1"}) << "asked once, at the first start that could decide it";
    idem::sqlite_store st(db);
    expect_verified(st);
    EXPECT_EQ(st.get("P_PAY_v1")->state, record_state::succeeded);
    // A later import of the old table changes nothing: idem holds the key decided.
    imports::memory_source src;
    src.rows = three_states(wall_now_ms());
    const imports::report again = imports::run(st, src);
    EXPECT_EQ(again.present, 2u);
    EXPECT_EQ(again.conflicts, 1u) << "P: idem SUCCESS (resolver), old table PROCESSING";
    EXPECT_EQ(again.imported(), 0u);
}

TEST(Import, JudgeIsTheIdempotencyTable) {
    using imports::judge;
    using imports::verdict;
    for (const record_state old : {record_state::processing, record_state::succeeded, record_state::failed}) {
        EXPECT_EQ(judge(old, record_state::absent), verdict::new_key);
        EXPECT_EQ(judge(old, old), verdict::present);
        EXPECT_EQ(judge(old, record_state::released), verdict::conflict);
    }
    EXPECT_EQ(judge(record_state::succeeded, record_state::processing), verdict::conflict_claim);
    EXPECT_EQ(judge(record_state::failed, record_state::processing), verdict::conflict_claim);
    EXPECT_EQ(judge(record_state::processing, record_state::succeeded), verdict::conflict);
    EXPECT_EQ(judge(record_state::failed, record_state::succeeded), verdict::conflict);
}

TEST(Import, TableNamesAndSourceUris) {
    std::string why;
    EXPECT_EQ(imports::parse_table_name("idempotent_record", &why), (std::vector<std::string>{"idempotent_record"}));
    EXPECT_EQ(imports::parse_table_name("pay.Idem_2", &why), (std::vector<std::string>{"pay", "Idem_2"}));
    EXPECT_EQ(imports::quoted_table({"pay", "t"}, '"'), "\"pay\".\"t\"");
    for (const char* bad : {"", "a;drop table x", "a.b.c", "1abc", "a.", ".a", "t\"x", "a b"}) {
        why.clear();
        EXPECT_FALSE(imports::parse_table_name(bad, &why)) << bad;
        EXPECT_NE(why.find("is not a table name"), std::string::npos) << why;
    }
    EXPECT_FALSE(imports::parse_table_name(std::string(65, 'a'), &why));

    why.clear();
    EXPECT_FALSE(imports::parse_source("mysql://u:secret@db:3306/pay", &why));
    EXPECT_NE(why.find("MySQL"), std::string::npos) << why;
    EXPECT_EQ(why.find("secret"), std::string::npos) << "the password is never shown: " << why;
    EXPECT_FALSE(imports::parse_source("redis://db", &why));
    EXPECT_NE(why.find("is not a source URI"), std::string::npos) << why;
    EXPECT_EQ(imports::redact_source("mysql://u:secret@db:3306/pay"), "mysql://u@db:3306/pay");
}

}  // namespace
