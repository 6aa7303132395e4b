// sqlite_layout_test: the SQLite store's layout, made for keys that arrive in random order
// (docs/stores.md, "Layout"): since version 2 the audit table is appended to in sequence order and a
// key's rows are chained (previous) from its record's last_audit, so audit(key) follows the chain;
// version 3 adds the prune horizon to idem_schema and an updated_time index (docs/stores.md, "Pruning").
//
// * A version 1 file (audit keyed by (key, sequence), a (biz_type, status) index) is upgraded in
//   place at open: every record and audit row is kept, each key's trail reads as before, new
//   batches continue the sequence, and verify passes.
// * The chain holds a row whose record change the fence guard refused (a stale owner's late row).
// * A claim from ABSENT of a key the file holds continues its record and chain (the insert of a new
//   record does nothing there, and the batch falls back to the read and the upsert).
// * A key whose record is gone (deleted by hand, as a prune would) still has its trail, by scan.
// * A broken chain is corrupt_record naming the key and the row, never a short trail.
// * An unknown schema version, or a missing version row, is refused at open.
// * A version 2 file is upgraded to version 4 in place (its records and trails kept) and prunes.
// * A chain cut by a prune (its first rows gone) is a trail's legal start, not a broken chain; a row
//   missing above the pruned sequence is still corrupt_record.
// * A version 3 file from before response payloads (no payload column) gains the column at open,
//   and is upgraded to version 4 (idem_schema.max_fence from its records, the index of claims in
//   flight), every record and trail kept; records read with an empty payload, new completions store
//   theirs, and a second open changes nothing.
#include <idem/stores/sqlite_store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <sqlite3.h>

#include <string>
#include <vector>

#include "support/store_fixtures.hpp"

namespace {

using idem::errc;
using idem::record_state;
using idem::transition_cause;
using idem_test::row;

using idem_test::sqlite_exec;

std::int64_t raw_int(const std::string& db, const std::string& sql) {
    sqlite3* h = nullptr;
    EXPECT_EQ(sqlite3_open(db.c_str(), &h), SQLITE_OK);
    sqlite3_stmt* s = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(h, sql.c_str(), -1, &s, nullptr), SQLITE_OK) << sql << ": " << sqlite3_errmsg(h);
    std::int64_t v = -1;
    if (s && sqlite3_step(s) == SQLITE_ROW) v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(h);
    return v;
}

/// The trail as "FROM>TO@fence" strings, in the order audit() returns it.
std::vector<std::string> trail(idem::store& st, const std::string& k) {
    std::vector<std::string> out;
    for (const auto& a : st.audit(k))
        out.push_back(std::string(idem::status_text(a.from)) + ">" + idem::status_text(a.to) + "@" +
                      std::to_string(a.fence));
    return out;
}

// The layout of version 1, as that release created it.
constexpr const char* version_1_schema = R"SQL(
CREATE TABLE idem_schema (version INTEGER NOT NULL, next_sequence BIGINT NOT NULL DEFAULT 1);
CREATE TABLE idempotent_record (
  idempotent_key VARCHAR(128) PRIMARY KEY, biz_type VARCHAR(32) NOT NULL,
  status VARCHAR(16) NOT NULL CHECK (status IN ('PROCESSING','SUCCESS','FAILED','RELEASED')),
  fencing_token BIGINT NOT NULL, lease_until BIGINT NOT NULL, outcome BIGINT NOT NULL,
  request_fingerprint BIGINT NOT NULL, created_time BIGINT NOT NULL, updated_time BIGINT NOT NULL
) WITHOUT ROWID;
CREATE INDEX idx_idempotent_record_biz_status ON idempotent_record (biz_type, status);
CREATE TABLE idempotent_audit (
  sequence BIGINT NOT NULL, idempotent_key VARCHAR(128) NOT NULL, from_status VARCHAR(16) NOT NULL,
  to_status VARCHAR(16) NOT NULL, fencing_token BIGINT NOT NULL, node VARCHAR(64) NOT NULL,
  at_time BIGINT NOT NULL, detail TEXT NOT NULL, PRIMARY KEY (idempotent_key, sequence)
) WITHOUT ROWID;
CREATE TABLE idempotent_batch (batch_id BIGINT PRIMARY KEY, committed_time BIGINT NOT NULL);
INSERT INTO idem_schema (version, next_sequence) VALUES (1, 6);
INSERT INTO idempotent_record VALUES ('A_PAY_v1', 'PAY', 'SUCCESS', 1, 0, 7, 0, 100, 101);
INSERT INTO idempotent_record VALUES ('B_PAY_v1', 'PAY', 'PROCESSING', 2, 900, 0, 5, 100, 102);
INSERT INTO idempotent_audit VALUES (1, 'A_PAY_v1', 'ABSENT', 'PROCESSING', 1, 'n', 100, 'claim outcome=0');
INSERT INTO idempotent_audit VALUES (2, 'B_PAY_v1', 'ABSENT', 'PROCESSING', 1, 'n', 100, 'claim outcome=0');
INSERT INTO idempotent_audit VALUES (3, 'A_PAY_v1', 'PROCESSING', 'SUCCESS', 1, 'n', 101, 'succeed outcome=7');
INSERT INTO idempotent_audit VALUES (4, 'B_PAY_v1', 'PROCESSING', 'RELEASED', 1, 'n', 101, 'release outcome=0');
INSERT INTO idempotent_audit VALUES (5, 'B_PAY_v1', 'RELEASED', 'PROCESSING', 2, 'n', 102, 'claim outcome=0');
INSERT INTO idempotent_batch VALUES (1, 101);
)SQL";

TEST(SqliteLayout, AVersion1FileIsUpgradedInPlaceKeepingEveryRecordAndTrail) {
    idem_test::temp_dir dir("idem-layout");
    const std::string db = dir.file("v1.db");
    sqlite_exec(db, version_1_schema);
    {
        idem::sqlite_store st(db);
        EXPECT_EQ(raw_int(db, "SELECT version FROM idem_schema"), 4);
        EXPECT_EQ(raw_int(db, "SELECT count(*) FROM sqlite_master WHERE name = 'idx_idempotent_record_biz_status'"), 0);
        EXPECT_EQ(raw_int(db, "SELECT count(*) FROM idempotent_audit"), 5);
        EXPECT_EQ(trail(st, "A_PAY_v1"), (std::vector<std::string>{"ABSENT>PROCESSING@1", "PROCESSING>SUCCESS@1"}));
        EXPECT_EQ(trail(st, "B_PAY_v1"),
                  (std::vector<std::string>{"ABSENT>PROCESSING@1", "PROCESSING>RELEASED@1", "RELEASED>PROCESSING@2"}));
        auto a = st.get("A_PAY_v1");
        ASSERT_TRUE(a);
        EXPECT_EQ(a->state, record_state::succeeded);
        EXPECT_EQ(a->outcome, 7u);
        EXPECT_TRUE(st.committed(1));
        // New batches continue the file's sequence and chain onto the upgraded trail.
        st.apply(std::vector{row({.key = "B_PAY_v1",
                                  .from = record_state::processing,
                                  .to = record_state::succeeded,
                                  .cause = transition_cause::succeed,
                                  .fence = 2,
                                  .outcome = 9},
                                 1)},
                 2);
        EXPECT_EQ(raw_int(db, "SELECT max(sequence) FROM idempotent_audit"), 6);
        EXPECT_EQ(trail(st, "B_PAY_v1").back(), "PROCESSING>SUCCESS@2");
        EXPECT_EQ(trail(st, "B_PAY_v1").size(), 4u);
        EXPECT_TRUE(idem_test::verify_clean(st));
    }
    idem::sqlite_store again(db);  // a second open finds version 4 and changes nothing
    EXPECT_EQ(trail(again, "A_PAY_v1").size(), 2u);
    EXPECT_EQ(raw_int(db, "SELECT count(*) FROM idempotent_audit"), 6);
}

// A file whose idem_schema names a version this library does not know is refused (store_error
// naming it), and one whose version row is gone is damage (corrupt_record): neither is upgraded or
// written over.
TEST(SqliteLayout, AnUnknownVersionOrAMissingVersionRowIsRefusedAtOpen) {
    struct damage {
        const char* sql;
        errc want;
        std::vector<std::string> words;
    };
    for (const damage& d : std::vector<damage>{
             {"UPDATE idem_schema SET version = 7",
              errc::store_error,
              {"schema version 7", "1, 2 and 3, upgraded in place, or 4"}},
             {"DELETE FROM idem_schema", errc::corrupt_record, {"idem_schema has no version row"}},
         }) {
        SCOPED_TRACE(d.sql);
        idem_test::temp_dir dir("idem-layout");
        const std::string db = dir.file("version.db");
        { idem::sqlite_store st(db); }
        sqlite_exec(db, d.sql);
        try {
            idem::sqlite_store st(db);
            ADD_FAILURE() << "the store opened a file whose schema version it cannot read";
        } catch (const idem::error& e) {
            EXPECT_EQ(e.code(), d.want) << e.what();
            for (const auto& w : d.words)
                EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << w << " in " << e.what();
        }
        EXPECT_EQ(raw_int(db, "SELECT count(*) FROM idempotent_audit"), 0) << "the refused file was written";
    }
}

TEST(SqliteLayout, TheChainHoldsARowTheFenceGuardRefused) {
    idem_test::temp_dir dir("idem-layout");
    idem::sqlite_store st(dir.file("chain.db"));
    std::uint64_t seq = 0;
    // Fence 2 claims and succeeds; the fence-1 owner's late release arrives in a later batch. The
    // record keeps SUCCESS at fence 2, and the trail still shows the late row, in order.
    st.apply(std::vector{row({.key = "K_PAY_v1", .fence = 2}, ++seq)}, 1);
    st.apply(std::vector{row({.key = "K_PAY_v1",
                              .from = record_state::processing,
                              .to = record_state::succeeded,
                              .cause = transition_cause::succeed,
                              .fence = 2,
                              .outcome = 3},
                             ++seq)},
             2);
    st.apply(std::vector{row({.key = "K_PAY_v1",
                              .from = record_state::processing,
                              .to = record_state::released,
                              .cause = transition_cause::release,
                              .fence = 1},
                             ++seq),
                         row({.key = "L_PAY_v1"}, ++seq)},
             3);
    auto r = st.get("K_PAY_v1");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->state, record_state::succeeded);
    EXPECT_EQ(r->fence, 2u);
    EXPECT_EQ(r->outcome, 3u);
    EXPECT_EQ(trail(st, "K_PAY_v1"),
              (std::vector<std::string>{"ABSENT>PROCESSING@2", "PROCESSING>SUCCESS@2", "PROCESSING>RELEASED@1"}));
    EXPECT_EQ(trail(st, "L_PAY_v1"), (std::vector<std::string>{"ABSENT>PROCESSING@1"}));
}

// A claim from ABSENT is written as a new record first (one B-tree descent); when the file holds
// the key after all (a record past the window, not pruned yet, claimed again), nothing is inserted
// and the batch reads the key's latest audit row and upserts, as for any other row: the record
// moves to the new claim and the chain goes on from the old trail. A stale fence from ABSENT (a
// lower one than stored) changes nothing but is audited, and a new key in the same batch is
// inserted with its chain starting there.
TEST(SqliteLayout, AClaimFromAbsentOfAKeyTheFileHoldsContinuesItsRecordAndChain) {
    idem_test::temp_dir dir("idem-layout");
    const std::string db = dir.file("again.db");
    idem::sqlite_store st(db);
    std::uint64_t seq = 0;
    st.apply(std::vector{row({.key = "K_PAY_v1", .fence = 1, .at_ms = 100}, ++seq), row({.key = "K_PAY_v1",
                                                                                         .from = record_state::processing,
                                                                                         .to = record_state::succeeded,
                                                                                         .cause = transition_cause::succeed,
                                                                                         .fence = 1,
                                                                                         .outcome = 3,
                                                                                         .at_ms = 101},
                                                                                        ++seq)},
             1);
    std::vector<idem::store_row> again{row({.key = "K_PAY_v1", .fence = 5, .at_ms = 900}, ++seq),
                                       row({.key = "N_PAY_v1", .fence = 5, .at_ms = 900}, ++seq)};
    st.apply(again, 2);
    auto k = st.get("K_PAY_v1");
    ASSERT_TRUE(k);
    EXPECT_EQ(k->state, record_state::processing) << "the claim from ABSENT reached the record the file held";
    EXPECT_EQ(k->fence, 5u);
    EXPECT_EQ(k->updated_ms, 900);
    EXPECT_EQ(trail(st, "K_PAY_v1"),
              (std::vector<std::string>{"ABSENT>PROCESSING@1", "PROCESSING>SUCCESS@1", "ABSENT>PROCESSING@5"}));
    EXPECT_EQ(trail(st, "N_PAY_v1"), (std::vector<std::string>{"ABSENT>PROCESSING@5"}));
    EXPECT_EQ(raw_int(db, "SELECT previous FROM idempotent_audit WHERE idempotent_key = 'N_PAY_v1'"), 0);
    EXPECT_EQ(raw_int(db, "SELECT last_audit FROM idempotent_record WHERE idempotent_key = 'N_PAY_v1'"),
              raw_int(db, "SELECT sequence FROM idempotent_audit WHERE idempotent_key = 'N_PAY_v1'"));
    EXPECT_TRUE(idem_test::verify_clean(st));
    // A stale claim from ABSENT (fence 2 < 5), which no guard sends (verify names it): audited,
    // chained, and the record kept by the fence guard of the upsert.
    st.apply(std::vector{row({.key = "K_PAY_v1", .fence = 2, .at_ms = 950}, ++seq)}, 3);
    EXPECT_EQ(st.get("K_PAY_v1")->fence, 5u);
    EXPECT_EQ(trail(st, "K_PAY_v1").size(), 4u);
}

TEST(SqliteLayout, AKeyWithoutItsRecordStillHasItsTrail) {
    idem_test::temp_dir dir("idem-layout");
    const std::string db = dir.file("pruned.db");
    {
        idem::sqlite_store st(db);
        st.apply(std::vector{row({.key = "P_PAY_v1"}, 1), row({.key = "Q_PAY_v1"}, 2)}, 1);
    }
    sqlite_exec(db, "DELETE FROM idempotent_record WHERE idempotent_key = 'P_PAY_v1'");
    idem::sqlite_store st(db);
    EXPECT_EQ(trail(st, "P_PAY_v1"), (std::vector<std::string>{"ABSENT>PROCESSING@1"}));
    EXPECT_TRUE(trail(st, "NEVER_PAY_v1").empty());
}

TEST(SqliteLayout, ABrokenChainIsCorruptRecordNamingTheKeyAndRow) {
    idem_test::temp_dir dir("idem-layout");
    const std::string db = dir.file("broken.db");
    {
        idem::sqlite_store st(db);
        st.apply(std::vector{row({.key = "C_PAY_v1"}, 1), row({.key = "D_PAY_v1"}, 2)}, 1);
        st.apply(std::vector{row({.key = "C_PAY_v1",
                                  .from = record_state::processing,
                                  .to = record_state::succeeded,
                                  .cause = transition_cause::succeed},
                                 3)},
                 2);
    }
    struct damage {
        const char* sql;
        std::vector<std::string> words;
    };
    for (const damage& d : std::vector<damage>{
             {"DELETE FROM idempotent_audit WHERE sequence = 1", {"C_PAY_v1", "audit row 1", "missing"}},
             {"UPDATE idempotent_audit SET previous = 2 WHERE sequence = 3", {"C_PAY_v1", "belongs to key", "D_PAY_v1"}},
             {"UPDATE idempotent_audit SET previous = 3 WHERE sequence = 3", {"C_PAY_v1", "previous = 3", "earlier"}},
         }) {
        SCOPED_TRACE(d.sql);
        idem_test::temp_dir copy_dir("idem-layout");
        const std::string copy = copy_dir.file("copy.db");
        sqlite_exec(db, "VACUUM INTO '" + copy + "'");
        sqlite_exec(copy, d.sql);
        idem::sqlite_store st(copy);
        try {
            (void)st.audit("C_PAY_v1");
            ADD_FAILURE() << "audit() returned a trail from a broken chain";
        } catch (const idem::error& e) {
            EXPECT_EQ(e.code(), errc::corrupt_record) << e.what();
            for (const auto& w : d.words)
                EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << w << " in " << e.what();
        }
    }
}

TEST(SqliteLayout, AVersion2FileIsUpgradedToVersion4InPlaceAndPrunes) {
    idem_test::temp_dir dir("idem-layout");
    const std::string db = dir.file("v2.db");
    {
        idem::sqlite_store st(db);
        st.apply(std::vector{row({.key = "E_PAY_v1", .at_ms = 100}, 1), row({.key = "F_PAY_v1", .at_ms = 100}, 2)}, 1);
        st.apply(std::vector{row({.key = "E_PAY_v1",
                                  .from = record_state::processing,
                                  .to = record_state::succeeded,
                                  .cause = transition_cause::succeed,
                                  .at_ms = 101},
                                 3)},
                 2);
    }
    // Back to version 2 as that release created it: no prune columns, no updated_time index, and
    // none of version 4 (max_fence, the index of claims in flight).
    sqlite_exec(db,
                "ALTER TABLE idem_schema DROP COLUMN records_horizon; ALTER TABLE idem_schema DROP COLUMN "
                "audit_horizon; ALTER TABLE idem_schema DROP COLUMN pruned_sequence; ALTER TABLE idem_schema "
                "DROP COLUMN pruned_fence; DROP INDEX idx_idempotent_record_updated; ALTER TABLE idem_schema DROP "
                "COLUMN max_fence; DROP INDEX idx_idempotent_record_claims; UPDATE idem_schema SET version = 2");
    idem::sqlite_store st(db);
    EXPECT_EQ(raw_int(db, "SELECT version FROM idem_schema"), 4);
    EXPECT_EQ(raw_int(db, "SELECT count(*) FROM sqlite_master WHERE name = 'idx_idempotent_record_updated'"), 1);
    EXPECT_EQ(raw_int(db, "SELECT count(*) FROM sqlite_master WHERE name = 'idx_idempotent_record_claims'"), 1);
    EXPECT_EQ(trail(st, "E_PAY_v1"), (std::vector<std::string>{"ABSENT>PROCESSING@1", "PROCESSING>SUCCESS@1"}));
    EXPECT_EQ(st.horizon(), idem::prune_horizon{});
    const auto r = st.prune({.records_before_ms = 200, .audit_before_ms = 101});
    EXPECT_EQ(r.records, 1u);     // E (F is PROCESSING)
    EXPECT_EQ(r.audit_rows, 2u);  // the two claims at 100; E's completion at 101 stays
    EXPECT_EQ(st.horizon(), (idem::prune_horizon{200, 101}));
    EXPECT_EQ(st.max_fence(), 1u);
    EXPECT_TRUE(idem_test::verify_clean(st));
}

TEST(SqliteLayout, AChainCutByAPruneStartsTheTrailButAMissingRowAboveItIsCorrupt) {
    idem_test::temp_dir dir("idem-layout");
    const std::string db = dir.file("cut.db");
    {
        idem::sqlite_store st(db);
        st.apply(std::vector{row({.key = "G_PAY_v1", .at_ms = 100}, 1)}, 1);  // sequence 1
        st.apply(std::vector{row({.key = "H_PAY_v1", .at_ms = 150}, 2)}, 2);  // sequence 2
        st.apply(std::vector{row({.key = "G_PAY_v1",
                                  .from = record_state::processing,
                                  .to = record_state::released,
                                  .cause = transition_cause::release,
                                  .at_ms = 200},
                                 3)},
                 3);  // sequence 3
        st.apply(std::vector{row({.key = "G_PAY_v1", .from = record_state::released, .fence = 2, .at_ms = 300}, 4)},
                 4);                                                   // sequence 4
        EXPECT_EQ(st.prune({.audit_before_ms = 120}).audit_rows, 1u);  // G's claim
        EXPECT_EQ(trail(st, "G_PAY_v1"), (std::vector<std::string>{"PROCESSING>RELEASED@1", "RELEASED>PROCESSING@2"}));
        const auto v = idem::verify(st);
        EXPECT_TRUE(v.violations.empty()) << (v.violations.empty() ? "" : v.violations.front());
        EXPECT_EQ(v.truncated_trails, 1u);
    }
    sqlite_exec(db, "DELETE FROM idempotent_audit WHERE sequence = 3");  // above the pruned sequence (2)
    idem::sqlite_store st(db);
    try {
        (void)st.audit("G_PAY_v1");
        ADD_FAILURE() << "audit() returned a trail from a broken chain";
    } catch (const idem::error& e) {
        EXPECT_EQ(e.code(), errc::corrupt_record) << e.what();
        EXPECT_NE(std::string(e.what()).find("audit row 3"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("only rows below sequence 2 were pruned"), std::string::npos) << e.what();
    }
}

// Version 3 as the release before response payloads created it (no payload column), with a
// finished key, a claim in flight and their audit rows.
constexpr const char* version_3_without_payload = R"SQL(
CREATE TABLE idem_schema (version INTEGER NOT NULL, next_sequence BIGINT NOT NULL DEFAULT 1, records_horizon BIGINT,
  audit_horizon BIGINT, pruned_sequence BIGINT NOT NULL DEFAULT 0, pruned_fence BIGINT NOT NULL DEFAULT 0);
CREATE TABLE idempotent_record (
  idempotent_key VARCHAR(128) PRIMARY KEY, biz_type VARCHAR(32) NOT NULL,
  status VARCHAR(16) NOT NULL CHECK (status IN ('PROCESSING','SUCCESS','FAILED','RELEASED')),
  fencing_token BIGINT NOT NULL, lease_until BIGINT NOT NULL, outcome BIGINT NOT NULL,
  request_fingerprint BIGINT NOT NULL, created_time BIGINT NOT NULL, updated_time BIGINT NOT NULL,
  last_audit BIGINT NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE idempotent_batch (batch_id BIGINT PRIMARY KEY, committed_time BIGINT NOT NULL);
CREATE TABLE idempotent_audit (
  sequence INTEGER PRIMARY KEY, previous BIGINT NOT NULL, idempotent_key VARCHAR(128) NOT NULL,
  from_status VARCHAR(16) NOT NULL, to_status VARCHAR(16) NOT NULL, fencing_token BIGINT NOT NULL,
  node VARCHAR(64) NOT NULL, at_time BIGINT NOT NULL, detail TEXT NOT NULL
);
CREATE INDEX idx_idempotent_record_updated ON idempotent_record (updated_time);
INSERT INTO idem_schema (version, next_sequence) VALUES (3, 4);
INSERT INTO idempotent_record VALUES ('A_PAY_v1', 'PAY', 'SUCCESS', 1, 900, 7, 5, 100, 101, 2);
INSERT INTO idempotent_record VALUES ('B_PAY_v1', 'PAY', 'PROCESSING', 1, 900, 0, 6, 100, 100, 3);
INSERT INTO idempotent_audit VALUES (1, 0, 'A_PAY_v1', 'ABSENT', 'PROCESSING', 1, 'n', 100, 'claim outcome=0');
INSERT INTO idempotent_audit VALUES (2, 1, 'A_PAY_v1', 'PROCESSING', 'SUCCESS', 1, 'n', 101, 'succeed outcome=7');
INSERT INTO idempotent_audit VALUES (3, 0, 'B_PAY_v1', 'ABSENT', 'PROCESSING', 1, 'n', 100, 'claim outcome=0');
INSERT INTO idempotent_batch VALUES (1, 101);
)SQL";

TEST(SqliteLayout, AFileFromBeforePayloadsGainsThePayloadColumnAtOpenKeepingEveryRow) {
    idem_test::temp_dir dir("idem-layout");
    const std::string db = dir.file("v3.db");
    sqlite_exec(db, version_3_without_payload);
    const auto has_column = [&] {
        return raw_int(db, "SELECT count(*) FROM pragma_table_info('idempotent_record') WHERE name = 'payload'");
    };
    ASSERT_EQ(has_column(), 0);
    const std::string bytes("\0\xff\xc3\x28 body", 9);
    {
        idem::sqlite_store st(db);
        EXPECT_EQ(has_column(), 1);
        // Upgraded to version 4 in the same open: the largest fence read once from the records,
        // and the claims in flight found through their index.
        EXPECT_EQ(raw_int(db, "SELECT version FROM idem_schema"), 4);
        EXPECT_EQ(raw_int(db, "SELECT max_fence FROM idem_schema"), 1);
        EXPECT_EQ(st.max_fence(), 1u);
        std::vector<std::string> claims;
        st.load_claims([&](const idem::stored_record& r) { claims.push_back(r.key); });
        EXPECT_EQ(claims, std::vector<std::string>{"B_PAY_v1"});
        const idem::stored_record a{"A_PAY_v1", "PAY", record_state::succeeded, 1, 900, 7, 5, 100, 101, {}};
        EXPECT_EQ(st.get("A_PAY_v1"), a);
        EXPECT_EQ(trail(st, "B_PAY_v1"), (std::vector<std::string>{"ABSENT>PROCESSING@1"}));
        EXPECT_TRUE(st.committed(1));
        // The claim in flight completes with a payload: stored, and its audit row chained on.
        idem::store_row done = row({.key = "B_PAY_v1",
                                    .from = record_state::processing,
                                    .to = record_state::succeeded,
                                    .cause = transition_cause::succeed,
                                    .fence = 1,
                                    .outcome = 8,
                                    .at_ms = 102},
                                   1);
        done.t.payload = bytes;
        st.apply(std::vector{done}, 2);
        const auto b = st.get("B_PAY_v1");
        ASSERT_TRUE(b);
        EXPECT_TRUE(b->payload == bytes);
        EXPECT_EQ(b->fingerprint, 6u);
        EXPECT_EQ(trail(st, "B_PAY_v1").size(), 2u);
        EXPECT_TRUE(idem_test::verify_clean(st));
    }
    idem::sqlite_store again(db);  // the column is there: nothing to do
    EXPECT_EQ(has_column(), 1);
    const auto b = again.get("B_PAY_v1");
    ASSERT_TRUE(b);
    EXPECT_TRUE(b->payload == bytes);
    EXPECT_EQ(again.get("A_PAY_v1")->payload, "");
    EXPECT_EQ(raw_int(db, "SELECT typeof(payload) = 'blob' FROM idempotent_record WHERE idempotent_key = 'B_PAY_v1'"), 1);
}

}  // namespace
