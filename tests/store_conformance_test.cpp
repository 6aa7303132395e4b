// store_conformance_test: one typed suite run over every store. memory_store is the reference
// semantics (store.hpp); every other store must leave the same records and audit trails for the
// same batches: round trip, last row of a key wins within a batch, the batch fold spelled out for
// several rows of a key (out-of-order fences, claim/release/claim, a stale claim's lease), an older fence never overwrites
// a newer record, a claim's lease and fingerprint survive the rows that follow it, RELEASED rows,
// batch ids, load / max_fence / scan_audit, keys that break naive SQL or encodings, and corrupt
// rows refused by load() with errc::corrupt_record naming the key.
// Pruning (store::prune, store::horizon): exactly the expired rows go (records older than the
// bound and not PROCESSING; audit rows older than the audit bound), max_rows bounds each call and
// `more` says when rows past a bound remain, the horizon persists across a reopen and only moves
// forward, max_fence() still counts pruned records, and verify() passes on a pruned store (a key
// claimed again after its record was pruned is `reopened`) while still reporting a real loss.
// Payloads (the response bytes of a completion): empty, 1 byte, the 1 MiB hard maximum, NUL, 0xFF
// and invalid UTF-8 round-trip exactly through apply, get, load and a reopen; the fold keeps the last
// completion's payload, a stale completion's payload never replaces a newer record's, a claim of a
// new life clears it; the audit row names the payload's length and hash, not its bytes.
//
// Adding a store: write a maker (open() / reopen() / insert_raw(), two flags) and add it to
// store_makers below: one line. rocksdb_store joins when the build defines IDEM_TEST_ROCKSDB (the
// idem::rocksdb target exists). postgres_store joins when the build defines IDEM_TEST_POSTGRES
// (tests/CMakeLists.txt does when the idem::postgres target exists); it reads the server from
// IDEM_TEST_PG_URI and FAILS when that is unset. Each test gets its own database. mysql_store
// likewise with IDEM_TEST_MYSQL and IDEM_TEST_MY_URI (a MariaDB server).
#include <idem/stores/sqlite_store.hpp>
#include <idem/store.hpp>
#include <idem/verify.hpp>

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "support/store_fixtures.hpp"
#include "support/threads.hpp"

#ifdef IDEM_TEST_POSTGRES
#include <idem/stores/postgres_store.hpp>
#endif
#ifdef IDEM_TEST_ROCKSDB
#include <idem/stores/rocksdb_store.hpp>
#endif
#ifdef IDEM_TEST_MYSQL
#include <idem/stores/mysql_store.hpp>

#include "support/my_database.hpp"
#endif

namespace {

using idem::record_state;
using idem::transition_cause;
using idem_test::row;
using idem_test::row_fields;

constexpr std::uint64_t F1 = (std::uint64_t{1} << 32) | 1;  // a first claim's fence, as the engine makes it
constexpr std::int64_t T0 = 1'700'000'000'000;              // Unix ms
const std::string node = "conformance:1";

// ---- makers: one per store ----------------------------------------------------------------------

/// The reference. Reopening gives back the same maps (it has no disk).
struct memory_maker {
    static constexpr bool raw_rows = false;  // holds typed records only: nothing can be corrupt
    static constexpr bool any_bytes = true;  // keys with bytes 0x80-0xff that are not UTF-8
    idem::memory_store store;
    idem::store& open() { return store; }
    idem::store& reopen() { return store; }
    std::string insert_raw(const std::string&, const std::string&, std::int64_t) { return "unsupported"; }
    std::string delete_raw(const std::string&) { return "unsupported"; }
};

struct sqlite_maker {
    static constexpr bool raw_rows = true;
    static constexpr bool any_bytes = true;
    idem_test::temp_dir dir{"idem-conformance"};
    std::string path = dir.file("idem.db");
    std::unique_ptr<idem::sqlite_store> store;
    idem::store& open() {
        store = std::make_unique<idem::sqlite_store>(path);
        return *store;
    }
    idem::store& reopen() {
        store.reset();
        return open();
    }
    /// Writes a record row directly (bypassing the CHECK constraint), as a bad migration or a
    /// hand edit would. Returns "" or SQLite's message.
    std::string insert_raw(const std::string& key, const std::string& status, std::int64_t fence) {
        sqlite3* db = nullptr;
        std::string why;
        if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
            why = sqlite3_errmsg(db);
        } else {
            sqlite3_busy_timeout(db, 5000);
            sqlite3_exec(db, "PRAGMA ignore_check_constraints=ON", nullptr, nullptr, nullptr);
            sqlite3_stmt* s = nullptr;
            sqlite3_prepare_v2(db,
                               "INSERT OR REPLACE INTO idempotent_record (idempotent_key, biz_type, status, "
                               "fencing_token, lease_until, outcome, request_fingerprint, created_time, updated_time) "
                               "VALUES (?1, 'default', ?2, ?3, 0, 0, 0, 1, 1)",
                               -1, &s, nullptr);
            sqlite3_bind_text(s, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
            sqlite3_bind_text(s, 2, status.data(), static_cast<int>(status.size()), SQLITE_TRANSIENT);
            sqlite3_bind_int64(s, 3, fence);
            if (sqlite3_step(s) != SQLITE_DONE) why = sqlite3_errmsg(db);
            sqlite3_finalize(s);
        }
        sqlite3_close_v2(db);
        return why;
    }
    std::string delete_raw(const std::string& key) {
        sqlite3* db = nullptr;
        std::string why;
        if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
            why = sqlite3_errmsg(db);
        } else {
            sqlite3_busy_timeout(db, 5000);
            sqlite3_stmt* s = nullptr;
            sqlite3_prepare_v2(db, "DELETE FROM idempotent_record WHERE idempotent_key = ?1", -1, &s, nullptr);
            sqlite3_bind_text(s, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
            if (sqlite3_step(s) != SQLITE_DONE) why = sqlite3_errmsg(db);
            sqlite3_finalize(s);
        }
        sqlite3_close_v2(db);
        return why;
    }
};

#ifdef IDEM_TEST_POSTGRES
/// A fresh database on the IDEM_TEST_PG_URI server per test, dropped afterwards.
struct postgres_maker {
    static constexpr bool raw_rows = true;
    static constexpr bool any_bytes = false;  // PostgreSQL text holds UTF-8 only (postgres_store.hpp)
    std::string server, db, uri;
    std::unique_ptr<idem::postgres_store> store;

    static std::string with_database(const std::string& base, const std::string& name) {
        if (!idem::detail::pg::is_uri(base)) return base + " dbname=" + name;
        const std::size_t auth = base.find("://") + 3;
        const std::size_t path = base.find_first_of("/?", auth);
        if (path == std::string::npos) return base + "/" + name;
        if (base[path] == '?') return base.substr(0, path) + "/" + name + base.substr(path);
        const std::size_t q = base.find('?', path);
        return base.substr(0, path + 1) + name + (q == std::string::npos ? "" : base.substr(q));
    }
    idem::store& open() {
        if (uri.empty()) {
            const char* u = std::getenv("IDEM_TEST_PG_URI");
            if (u == nullptr || *u == '\0')
                throw std::runtime_error(
                    "IDEM_TEST_PG_URI is unset: the postgres_store conformance tests need a "
                    "PostgreSQL server (scripts/test starts one)");
            server = u;
            std::random_device rd;
            char name[40];
            std::snprintf(name, sizeof name, "idem_conf_%08x%08x", rd(), rd());
            db = name;
            pqxx::connection c(server);
            pqxx::nontransaction n(c);
            n.exec("CREATE DATABASE " + db);  // hex digits only
            uri = with_database(server, db);
        }
        store = std::make_unique<idem::postgres_store>(uri);
        return *store;
    }
    idem::store& reopen() {
        store.reset();
        return open();
    }
    std::string insert_raw(const std::string& key, const std::string& status, std::int64_t fence) {
        try {
            pqxx::connection c(uri);
            pqxx::nontransaction n(c);
            n.exec("ALTER TABLE idempotent_record DROP CONSTRAINT IF EXISTS idempotent_record_status_check");
            n.exec_params(
                "INSERT INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
                "request_fingerprint, created_time, updated_time) VALUES ($1, 'default', $2, $3, 0, 0, 0, 1, 1) "
                "ON CONFLICT (idempotent_key) DO UPDATE SET status = excluded.status, "
                "fencing_token = excluded.fencing_token",
                key, status, fence);
            return {};
        } catch (const std::exception& e) {
            return e.what();
        }
    }
    std::string delete_raw(const std::string& key) {
        try {
            pqxx::connection c(uri);
            pqxx::nontransaction n(c);
            n.exec_params("DELETE FROM idempotent_record WHERE idempotent_key = $1", key);
            return {};
        } catch (const std::exception& e) {
            return e.what();
        }
    }
    ~postgres_maker() {
        store.reset();
        if (db.empty()) return;
        try {
            pqxx::connection c(server);
            pqxx::nontransaction n(c);
            n.exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)");
        } catch (...) {
        }
    }
};
#define IDEM_TEST_PG_MAKER , postgres_maker
#else
#define IDEM_TEST_PG_MAKER
#endif

#ifdef IDEM_TEST_ROCKSDB
/// A database directory per test. RocksDB lets one DB handle have the directory (PATH/LOCK), so
/// insert_raw() and delete_raw() close the store first (the suite reopens it after writing).
struct rocksdb_maker {
    static constexpr bool raw_rows = true;
    static constexpr bool any_bytes = true;
    idem_test::temp_dir dir{"idem-conformance"};
    std::string path = dir.file("idem.rocksdb");
    std::unique_ptr<idem::rocksdb_store> store;
    idem::store& open() {
        store = std::make_unique<idem::rocksdb_store>(path);
        return *store;
    }
    idem::store& reopen() {
        store.reset();
        return open();
    }
    /// Writes a record value directly, as a bad migration or a hand edit would: an unknown status
    /// is stored as byte 0xEE, a fence as the varint of its bits. Returns "" or RocksDB's message.
    std::string insert_raw(const std::string& key, const std::string& status, std::int64_t fence) {
        namespace codec = idem::detail::rocks;
        std::string value(1, static_cast<char>(codec::value_version));
        const auto st = idem::parse_status(status);
        value.push_back(static_cast<char>(st ? static_cast<std::uint8_t>(*st) : 0xEE));
        codec::put_varint(value, static_cast<std::uint64_t>(fence));
        for (int i = 0; i < 6; ++i) codec::put_varint(value, 1);  // lease, outcome, fingerprint, created, updated
        return raw([&](rocksdb::DB& db) { return db.Put(rocksdb::WriteOptions(), codec::record_key(key), value); });
    }
    std::string delete_raw(const std::string& key) {
        return raw(
            [&](rocksdb::DB& db) { return db.Delete(rocksdb::WriteOptions(), idem::detail::rocks::record_key(key)); });
    }
    template <class Fn>
    std::string raw(Fn&& fn) {
        store.reset();
        rocksdb::DB* db = nullptr;
        rocksdb::Status s = rocksdb::DB::Open(rocksdb::Options(), path, &db);
        if (s.ok()) s = fn(*db);
        delete db;
        return s.ok() ? "" : s.ToString();
    }
};
#define IDEM_TEST_ROCKSDB_MAKER , rocksdb_maker
#else
#define IDEM_TEST_ROCKSDB_MAKER
#endif

#ifdef IDEM_TEST_MYSQL
/// A fresh database on the IDEM_TEST_MY_URI server (MariaDB) per test, dropped afterwards.
struct mysql_maker {
    static constexpr bool raw_rows = true;
    static constexpr bool any_bytes = true;  // keys are VARBINARY: any bytes
    idem_test::my_database db;
    std::unique_ptr<idem::mysql_store> store;
    idem::store& open() {
        if (db.uri().empty()) {
            std::string why;
            if (!db.create(&why)) throw std::runtime_error(why);
        }
        store = std::make_unique<idem::mysql_store>(db.uri());
        return *store;
    }
    idem::store& reopen() {
        store.reset();
        return open();
    }
    /// Writes a record row directly, as a hand edit would: the columns are widened first (the ENUM
    /// status and the unsigned fence would refuse what the test writes).
    std::string insert_raw(const std::string& key, const std::string& status, std::int64_t fence) {
        namespace my = idem::detail::my;
        return db.exec(
            "ALTER TABLE idempotent_record MODIFY status VARCHAR(16) NOT NULL, MODIFY fencing_token BIGINT NOT NULL;"
            "REPLACE INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
            "request_fingerprint, created_time, updated_time, payload) VALUES (" +
            my::literal(key) + ", 'default', " + my::literal(status) + ", " + std::to_string(fence) +
            ", 0, 0, 0, 1, 1, '')");
    }
    std::string delete_raw(const std::string& key) {
        return db.exec("DELETE FROM idempotent_record WHERE idempotent_key = " + idem::detail::my::literal(key));
    }
};
#define IDEM_TEST_MYSQL_MAKER , mysql_maker
#else
#define IDEM_TEST_MYSQL_MAKER
#endif

using store_makers =
    ::testing::Types<memory_maker, sqlite_maker IDEM_TEST_PG_MAKER IDEM_TEST_ROCKSDB_MAKER IDEM_TEST_MYSQL_MAKER>;

struct maker_names {
    template <class T>
    static std::string GetName(int) {
        if constexpr (std::is_same_v<T, memory_maker>) return "memory";
        else if constexpr (std::is_same_v<T, sqlite_maker>) return "sqlite";
#ifdef IDEM_TEST_ROCKSDB
        else if constexpr (std::is_same_v<T, rocksdb_maker>) return "rocksdb";
#endif
#ifdef IDEM_TEST_MYSQL
        else if constexpr (std::is_same_v<T, mysql_maker>) return "mysql";
#endif
        else return "postgres";
    }
};

// ---- comparison with the reference -----------------------------------------------------------

std::string record_diff(const idem::stored_record& want, const idem::stored_record& got) {
    std::ostringstream o;
    auto field = [&](const char* name, auto a, auto b) {
        if (a != b) o << ' ' << name << ": want " << a << " got " << b << ';';
    };
    field("key", idem::key::printable(want.key), idem::key::printable(got.key));
    field("biz_type", want.biz_type, got.biz_type);
    field("status", std::string(idem::to_string(want.state)), std::string(idem::to_string(got.state)));
    field("fence", want.fence, got.fence);
    field("lease_until", want.lease_until_ms, got.lease_until_ms);
    field("outcome", want.outcome, got.outcome);
    field("fingerprint", want.fingerprint, got.fingerprint);
    field("created_time", want.created_ms, got.created_ms);
    field("updated_time", want.updated_ms, got.updated_ms);
    if (want.payload != got.payload) {
        std::size_t at = 0;
        while (at < want.payload.size() && at < got.payload.size() && want.payload[at] == got.payload[at]) ++at;
        o << " payload: want " << want.payload.size() << " bytes got " << got.payload.size() << " (first difference at byte "
          << at << ");";
    }
    return o.str();
}

/// Audit rows compare on every column but `sequence`, whose values are the store's own; only its
/// order is specified (checked separately).
bool same_audit(const idem::audit_entry& a, const idem::audit_entry& b) {
    return a.key == b.key && a.from == b.from && a.to == b.to && a.fence == b.fence && a.node == b.node &&
           a.at_ms == b.at_ms && a.detail == b.detail;
}

std::string audit_text(const idem::audit_entry& a) {
    std::ostringstream o;
    idem::PrintTo(a, &o);
    return o.str();
}

template <class Maker>
class StoreConformance : public ::testing::Test {
protected:
    void SetUp() override {
        try {
            st_ = &maker_.open();
        } catch (const std::exception& e) {
            FAIL() << "cannot open the store: " << e.what();
        }
        st_->set_node(node);
        ref_.set_node(node);
    }

    idem::store& st() { return *st_; }

    void reopen() {
        st_ = &maker_.reopen();
        st_->set_node(node);
    }

    /// Applies one batch (sorted like the flusher's) to the store under test and to the reference.
    void apply(std::vector<idem::store_row> rows, std::uint64_t batch_id) {
        idem_test::sort_like_flusher(rows);
        st().apply(rows, batch_id);
        ref_.apply(rows, batch_id);
    }
    void apply(const std::vector<row_fields>& fields, std::uint64_t batch_id) {
        std::vector<idem::store_row> rows;
        for (const auto& f : fields) rows.push_back(row(f, ++seq_));
        apply(std::move(rows), batch_id);
    }

    /// Everything the store answers equals what the reference answers; at most 8 differences shown.
    ::testing::AssertionResult same_as_reference() {
        std::vector<std::string> diffs;
        auto diff = [&](std::string d) {
            if (diffs.size() < 8) diffs.push_back(std::move(d));
            else if (diffs.size() == 8) diffs.push_back("...");
        };
        const auto want = idem_test::load_all(ref_);
        const auto got = idem_test::load_all(st());
        if (want.size() != got.size())
            diff("load(): " + std::to_string(got.size()) + " records, the reference has " + std::to_string(want.size()));
        std::size_t record_diffs = 0;
        for (const auto& [k, w] : want) {
            auto it = got.find(k);
            if (it == got.end()) {
                diff("load(): no record for '" + idem::key::printable(k) + "'");
                continue;
            }
            if (it->second != w) {
                ++record_diffs;
                diff("load() '" + idem::key::printable(k) + "':" + record_diff(w, it->second));
            }
            const auto one = st().get(k);
            if (!one || *one != w) diff("get('" + idem::key::printable(k) + "') differs from the reference");
            const auto wa = ref_.audit(k);
            const auto ga = st().audit(k);
            bool same = wa.size() == ga.size();
            for (std::size_t i = 0; same && i < wa.size(); ++i) same = same_audit(wa[i], ga[i]);
            for (std::size_t i = 1; i < ga.size(); ++i)
                if (ga[i].sequence <= ga[i - 1].sequence) same = false;
            if (!same)
                diff("audit('" + idem::key::printable(k) + "'): " + std::to_string(ga.size()) + " rows, want " +
                     std::to_string(wa.size()) + (ga.empty() ? "" : "; first " + audit_text(ga.front())));
        }
        const auto ws = idem_test::scan_all(ref_);
        const auto gs = idem_test::scan_all(st());
        bool same_scan = ws.size() == gs.size();
        for (std::size_t i = 0; same_scan && i < ws.size(); ++i) same_scan = same_audit(ws[i], gs[i]);
        if (!same_scan) diff("scan_audit(): order or content differs from the reference");
        if (st().max_fence() != ref_.max_fence())
            diff("max_fence(): " + std::to_string(st().max_fence()) + ", want " + std::to_string(ref_.max_fence()));
        if (diffs.empty()) return ::testing::AssertionSuccess();
        auto out = ::testing::AssertionFailure();
        out << st().name() << " differs from memory_store (" << record_diffs << " record(s) differ):";
        for (auto& d : diffs) out << "\n  " << d;
        return out;
    }

    /// Prunes the store under test and the reference with the same limits; both must report the
    /// same counts (checked by the caller through the result) and the same `more`.
    idem::prune_result prune(const idem::prune_limits& limits) {
        const idem::prune_result got = st().prune(limits);
        const idem::prune_result want = ref_.prune(limits);
        EXPECT_EQ(got.records, want.records) << "records pruned";
        EXPECT_EQ(got.audit_rows, want.audit_rows) << "audit rows pruned";
        EXPECT_EQ(got.more, want.more) << "more";
        return got;
    }

    Maker maker_;
    idem::store* st_ = nullptr;
    idem::memory_store ref_;
    std::uint64_t seq_ = 0;
};

TYPED_TEST_SUITE(StoreConformance, store_makers, maker_names);

// ---- cases --------------------------------------------------------------------------------------

TYPED_TEST(StoreConformance, ApplyGetAuditRoundTrip) {
    const std::string k = "TX20230615123456_TRANSFER_v2";
    this->apply({{.key = k, .fence = F1, .fingerprint = 0xfeedull, .at_ms = T0, .lease_until_ms = T0 + 30'000}}, 11);

    const idem::stored_record want{k, "TRANSFER", record_state::processing, F1, T0 + 30'000, 0, 0xfeed, T0, T0, {}};
    const auto got = this->st().get(k);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, want) << record_diff(want, *got);
    const auto all = idem_test::load_all(this->st());
    ASSERT_EQ(all.size(), 1u);
    EXPECT_EQ(all.begin()->second, want);

    const auto trail = this->st().audit(k);
    ASSERT_EQ(trail.size(), 1u);
    EXPECT_EQ(trail[0].key, k);
    EXPECT_EQ(trail[0].from, record_state::absent);
    EXPECT_EQ(trail[0].to, record_state::processing);
    EXPECT_EQ(trail[0].fence, F1);
    EXPECT_EQ(trail[0].node, node);
    EXPECT_EQ(trail[0].at_ms, T0);
    EXPECT_EQ(trail[0].detail, "claim outcome=0");

    EXPECT_FALSE(this->st().get("TX_unknown_v1").has_value());
    EXPECT_TRUE(this->st().audit("TX_unknown_v1").empty());
    EXPECT_TRUE(this->same_as_reference());
}

TYPED_TEST(StoreConformance, LastRowOfAKeyWinsWithinABatch) {
    this->apply({{.key = "A", .fence = F1, .at_ms = T0, .lease_until_ms = T0 + 1000},
                 {.key = "A",
                  .from = record_state::processing,
                  .to = record_state::succeeded,
                  .cause = transition_cause::succeed,
                  .fence = F1,
                  .outcome = 42,
                  .at_ms = T0 + 1},
                 {.key = "B", .fence = F1, .at_ms = T0, .lease_until_ms = T0 + 1000},
                 {.key = "B",
                  .from = record_state::processing,
                  .to = record_state::released,
                  .cause = transition_cause::release,
                  .fence = F1,
                  .outcome = 7,
                  .at_ms = T0 + 1},
                 {.key = "B", .from = record_state::released, .fence = F1 + 1, .at_ms = T0 + 2, .lease_until_ms = T0 + 2000},
                 {.key = "B",
                  .from = record_state::processing,
                  .to = record_state::failed,
                  .cause = transition_cause::fail,
                  .fence = F1 + 1,
                  .outcome = 9,
                  .at_ms = T0 + 3}},
                1);
    const auto a = this->st().get("A");
    const auto b = this->st().get("B");
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->state, record_state::succeeded);
    EXPECT_EQ(a->fence, F1);
    EXPECT_EQ(a->outcome, 42u);
    EXPECT_EQ(a->updated_ms, T0 + 1);
    EXPECT_EQ(b->state, record_state::failed);
    EXPECT_EQ(b->fence, F1 + 1);
    EXPECT_EQ(b->outcome, 9u);
    const auto trail = this->st().audit("B");
    ASSERT_EQ(trail.size(), 4u);
    EXPECT_EQ(trail[1].to, record_state::released);
    EXPECT_EQ(trail[2].from, record_state::released);
    EXPECT_EQ(trail[3].detail, "fail outcome=9");
    ASSERT_EQ(this->st().audit("A").size(), 2u);
    EXPECT_EQ(this->st().audit("A")[1].detail, "succeed outcome=42");
    // The claim's lease and creation time are checked by the next test, which isolates them.
}

// A claim's lease, fingerprint and creation time belong to the record even when its completion
// lands in the same batch (the common case in async mode: claim and succeed are microseconds
// apart). Losing the fingerprint makes a restarted guard replay a reused key with a different
// payload instead of answering payload_mismatch.
TYPED_TEST(StoreConformance, CompletionInTheClaimsBatchKeepsLeaseFingerprintAndCreatedTime) {
    this->apply({{.key = "TX9_PAY_v1", .fence = F1, .fingerprint = 0xabcdef, .at_ms = T0, .lease_until_ms = T0 + 30'000},
                 {.key = "TX9_PAY_v1",
                  .from = record_state::processing,
                  .to = record_state::succeeded,
                  .cause = transition_cause::succeed,
                  .fence = F1,
                  .outcome = 5,
                  .fingerprint = 0xabcdef,
                  .at_ms = T0 + 4}},
                1);
    const idem::stored_record want{"TX9_PAY_v1", "PAY", record_state::succeeded, F1, T0 + 30'000, 5, 0xabcdef, T0,
                                   T0 + 4,       {}};
    const auto got = this->st().get("TX9_PAY_v1");
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(*got, want) << record_diff(want, *got);
    EXPECT_TRUE(this->same_as_reference());
}

// A second writer replaying a claim, or a row of this key's claim batch arriving after its
// completion, must not take a terminal record back: at the same fence SUCCESS / FAILED stay.
TYPED_TEST(StoreConformance, ATerminalRecordNeverRegressesAtItsOwnFence) {
    this->apply({{.key = "K", .fence = F1, .fingerprint = 3, .at_ms = T0, .lease_until_ms = T0 + 500}}, 1);
    this->apply({{.key = "K",
                  .from = record_state::processing,
                  .to = record_state::succeeded,
                  .cause = transition_cause::succeed,
                  .fence = F1,
                  .outcome = 100,
                  .at_ms = T0 + 1}},
                2);
    this->apply({{.key = "K", .fence = F1, .fingerprint = 3, .at_ms = T0 + 2, .lease_until_ms = T0 + 900}}, 3);
    this->apply({{.key = "K",
                  .from = record_state::processing,
                  .to = record_state::released,
                  .cause = transition_cause::release,
                  .fence = F1,
                  .at_ms = T0 + 3}},
                4);
    const auto got = this->st().get("K");
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->state, record_state::succeeded);
    EXPECT_EQ(got->fence, F1);
    EXPECT_EQ(got->outcome, 100u);
    EXPECT_EQ(got->updated_ms, T0 + 1);
    EXPECT_EQ(this->st().audit("K").size(), 4u);
    EXPECT_TRUE(this->same_as_reference());
}

// The batch fold (detail/rows/batch_fold.hpp) in general, with each record spelled out rather than taken
// from the reference: several transitions of one key, a claim, a release and a claim again, a stale
// row after a newer claim of the same key in one batch, keys interleaved, and a claim below the
// stored fence whose lease must not reach the record that a later row of the batch overwrites.
TYPED_TEST(StoreConformance, TheBatchFoldIsExactForAnyRowsOfAKey) {
    using rs = record_state;
    using tc = transition_cause;
    this->apply(
        {{.key = "A", .fence = F1, .fingerprint = 11, .at_ms = T0, .lease_until_ms = T0 + 100},
         {.key = "B", .fence = F1, .fingerprint = 21, .at_ms = T0, .lease_until_ms = T0 + 100},
         {.key = "C", .fence = F1 + 3, .fingerprint = 31, .at_ms = T0, .lease_until_ms = T0 + 300},
         {.key = "D", .fence = F1 + 2, .fingerprint = 41, .at_ms = T0, .lease_until_ms = T0 + 400},
         {.key = "A",
          .from = rs::processing,
          .to = rs::succeeded,
          .cause = tc::succeed,
          .fence = F1,
          .outcome = 5,
          .at_ms = T0 + 1},
         {.key = "B", .from = rs::processing, .to = rs::released, .cause = tc::release, .fence = F1, .at_ms = T0 + 1},
         {.key = "C",
          .from = rs::processing,
          .to = rs::failed,
          .cause = tc::fail,
          .fence = F1,
          .outcome = 9,
          .at_ms = T0 + 1},
         {.key = "D",
          .from = rs::processing,
          .to = rs::succeeded,
          .cause = tc::succeed,
          .fence = F1 + 2,
          .outcome = 3,
          .at_ms = T0 + 1},
         {.key = "B",
          .from = rs::released,
          .fence = F1 + 1,
          .fingerprint = 22,
          .at_ms = T0 + 2,
          .lease_until_ms = T0 + 200}},
        1);
    this->apply(
        {{.key = "D", .from = rs::released, .fence = F1 + 1, .fingerprint = 42, .at_ms = T0 + 5, .lease_until_ms = T0 + 900},
         {.key = "D", .from = rs::processing, .to = rs::released, .cause = tc::release, .fence = F1 + 4, .at_ms = T0 + 6}},
        2);
    const std::vector<idem::stored_record> want = {
        {"A", "default", rs::succeeded, F1, T0 + 100, 5, 11, T0, T0 + 1, {}},
        {"B", "default", rs::processing, F1 + 1, T0 + 200, 0, 22, T0, T0 + 2, {}},
        {"C", "default", rs::processing, F1 + 3, T0 + 300, 0, 31, T0, T0, {}},    // the stale FAILED row: audited only
        {"D", "default", rs::released, F1 + 4, T0 + 400, 0, 41, T0, T0 + 6, {}},  // the stale claim's lease: never
    };
    for (const auto& w : want) {
        SCOPED_TRACE(w.key);
        const auto got = this->st().get(w.key);
        ASSERT_TRUE(got.has_value());
        EXPECT_EQ(*got, w) << record_diff(w, *got);
    }
    EXPECT_EQ(this->st().audit("A").size(), 2u);
    EXPECT_EQ(this->st().audit("B").size(), 3u);
    EXPECT_EQ(this->st().audit("C").size(), 2u);
    EXPECT_EQ(this->st().audit("D").size(), 4u);
    EXPECT_EQ(this->st().max_fence(), F1 + 4);
    EXPECT_TRUE(this->same_as_reference());
}

TYPED_TEST(StoreConformance, OlderFenceDoesNotOverwriteANewerRecord) {
    const std::uint64_t newer = F1 + 5;
    this->apply({{.key = "K", .fence = newer, .fingerprint = 3, .at_ms = T0, .lease_until_ms = T0 + 500}}, 1);
    this->apply({{.key = "K",
                  .from = record_state::processing,
                  .to = record_state::succeeded,
                  .cause = transition_cause::succeed,
                  .fence = newer,
                  .outcome = 100,
                  .at_ms = T0 + 1}},
                2);
    // A stale owner's completion (older fence), arriving later: audited, but the record keeps the newer claim.
    this->apply({{.key = "K",
                  .from = record_state::processing,
                  .to = record_state::failed,
                  .cause = transition_cause::fail,
                  .fence = F1,
                  .outcome = 1,
                  .at_ms = T0 + 2}},
                3);
    // And a stale claim with an older fence.
    this->apply({{.key = "K",
                  .from = record_state::released,
                  .fence = F1 + 1,
                  .fingerprint = 9,
                  .at_ms = T0 + 3,
                  .lease_until_ms = T0 + 9000}},
                4);
    const auto got = this->st().get("K");
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->state, record_state::succeeded);
    EXPECT_EQ(got->fence, newer);
    EXPECT_EQ(got->outcome, 100u);
    EXPECT_EQ(got->fingerprint, 3u);
    EXPECT_EQ(got->lease_until_ms, T0 + 500);
    EXPECT_EQ(got->updated_ms, T0 + 1);
    EXPECT_EQ(this->st().audit("K").size(), 4u);
    EXPECT_EQ(this->st().max_fence(), newer);
    EXPECT_TRUE(this->same_as_reference());
}

TYPED_TEST(StoreConformance, LeaseAndFingerprintKeptWhenALaterNonProcessingRowArrives) {
    this->apply({{.key = "S", .fence = F1, .fingerprint = 77, .at_ms = T0, .lease_until_ms = T0 + 30'000},
                 {.key = "D", .fence = F1, .fingerprint = 88, .at_ms = T0, .lease_until_ms = T0 + 30'000}},
                1);
    // Completions carry no lease; the claim's lease and fingerprint stay in the record.
    this->apply({{.key = "S",
                  .from = record_state::processing,
                  .to = record_state::succeeded,
                  .cause = transition_cause::succeed,
                  .fence = F1,
                  .outcome = 1,
                  .fingerprint = 0,
                  .at_ms = T0 + 10}},
                2);
    // A doubt mark is a PROCESSING row: its (cleared) lease replaces the claim's.
    this->apply({{.key = "D",
                  .from = record_state::processing,
                  .to = record_state::processing,
                  .cause = transition_cause::doubt,
                  .fence = F1,
                  .fingerprint = 88,
                  .at_ms = T0 + 10,
                  .lease_until_ms = -5}},
                3);
    const auto s = this->st().get("S");
    const auto d = this->st().get("D");
    ASSERT_TRUE(s && d);
    EXPECT_EQ(s->lease_until_ms, T0 + 30'000);
    EXPECT_EQ(s->fingerprint, 77u);
    EXPECT_EQ(s->created_ms, T0);
    EXPECT_EQ(s->updated_ms, T0 + 10);
    EXPECT_EQ(d->state, record_state::processing);
    EXPECT_EQ(d->lease_until_ms, -5);
    EXPECT_EQ(d->fingerprint, 88u);
    EXPECT_TRUE(this->same_as_reference());
}

TYPED_TEST(StoreConformance, ReleasedRowsKeepTheirFenceAndCanBeClaimedAgain) {
    this->apply({{.key = "R", .fence = F1, .at_ms = T0, .lease_until_ms = T0 + 10}}, 1);
    this->apply({{.key = "R",
                  .from = record_state::processing,
                  .to = record_state::released,
                  .cause = transition_cause::release,
                  .fence = F1,
                  .outcome = 3,
                  .at_ms = T0 + 1}},
                2);
    auto r = this->st().get("R");
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->state, record_state::released);
    EXPECT_EQ(r->fence, F1);
    EXPECT_EQ(r->outcome, 3u);
    this->apply({{.key = "R",
                  .from = record_state::released,
                  .fence = F1 + 1,
                  .fingerprint = 4,
                  .at_ms = T0 + 2,
                  .lease_until_ms = T0 + 20}},
                3);
    r = this->st().get("R");
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->state, record_state::processing);
    EXPECT_EQ(r->fence, F1 + 1);
    EXPECT_EQ(r->lease_until_ms, T0 + 20);
    EXPECT_EQ(this->st().max_fence(), F1 + 1);
    const auto trail = this->st().audit("R");
    ASSERT_EQ(trail.size(), 3u);
    EXPECT_EQ(trail[1].detail, "release outcome=3");
    EXPECT_TRUE(this->same_as_reference());
}

TYPED_TEST(StoreConformance, CommittedAnswersForBatchIds) {
    const std::uint64_t big = (std::uint64_t{0x7fffffff} << 32) | 12345;  // the flusher's id shape
    this->apply({{.key = "C1", .fence = F1, .at_ms = T0}}, big);
    this->apply(std::vector<idem::store_row>{}, 77);  // an empty batch still records its id
    EXPECT_TRUE(this->st().committed(big));
    EXPECT_TRUE(this->st().committed(77));
    EXPECT_FALSE(this->st().committed(big + 1));
    EXPECT_FALSE(this->st().committed(1));
    this->reopen();
    EXPECT_TRUE(this->st().committed(big));
    EXPECT_FALSE(this->st().committed(78));
}

TYPED_TEST(StoreConformance, LoadReturnsEveryRecord) {
    for (int b = 0; b < 10; ++b) {
        std::vector<row_fields> rows;
        for (int i = 0; i < 200; ++i)
            rows.push_back({.key = "L" + std::to_string(b) + "_" + std::to_string(i),
                            .fence = F1 + b,
                            .at_ms = T0 + b,
                            .lease_until_ms = T0 + 1000});
        this->apply(rows, 100 + b);
    }
    this->reopen();
    const auto all = idem_test::load_all(this->st());
    EXPECT_EQ(all.size(), 2000u);
    std::size_t calls = 0;
    this->st().load([&](const idem::stored_record&) { ++calls; });
    EXPECT_EQ(calls, 2000u) << "load() must call back once per record";
    EXPECT_TRUE(this->same_as_reference());
}

TYPED_TEST(StoreConformance, MaxFenceIsTheLargestStoredFence) {
    EXPECT_EQ(this->st().max_fence(), 0u);
    const std::uint64_t high = (std::uint64_t{9} << 32) | 3;
    this->apply({{.key = "M1", .fence = F1, .at_ms = T0},
                 {.key = "M2", .fence = high, .at_ms = T0},
                 {.key = "M3", .fence = F1 + 7, .at_ms = T0}},
                1);
    EXPECT_EQ(this->st().max_fence(), high);
    this->apply({{.key = "M2",
                  .from = record_state::processing,
                  .to = record_state::failed,
                  .cause = transition_cause::fail,
                  .fence = F1,
                  .at_ms = T0 + 1}},
                2);  // stale: must not lower it
    EXPECT_EQ(this->st().max_fence(), high);
    this->reopen();
    EXPECT_EQ(this->st().max_fence(), high);
    EXPECT_TRUE(this->same_as_reference());
}

TYPED_TEST(StoreConformance, ScanAuditOrdersByKeyBytesThenSequence) {
    std::vector<std::string> keys = {"b", "a", "B", "ab", "a\x7e", "\xc3\xa9t\xc3\xa9", "z", "aa", "\xe2\x82\xac"};
    if (TypeParam::any_bytes) keys.push_back("\xff\xfe");
    std::mt19937_64 rng(7);
    for (int round = 0; round < 3; ++round) {
        std::shuffle(keys.begin(), keys.end(), rng);
        std::vector<row_fields> rows;
        for (const auto& k : keys) {
            const auto from = round == 0 ? record_state::absent : record_state::released;
            rows.push_back({.key = k, .from = from, .fence = F1 + 2 * round, .at_ms = T0 + round});
            rows.push_back({.key = k,
                            .from = record_state::processing,
                            .to = record_state::released,
                            .cause = transition_cause::release,
                            .fence = F1 + 2 * round,
                            .at_ms = T0 + round});
        }
        this->apply(rows, 10 + round);
        // The next round's fence must exceed this one's: claim fences are F1, F1+2, F1+4.
    }
    const auto scan = idem_test::scan_all(this->st());
    ASSERT_EQ(scan.size(), keys.size() * 6);
    for (std::size_t i = 1; i < scan.size(); ++i) {
        const auto& p = scan[i - 1];
        const auto& c = scan[i];
        const bool ordered = p.key < c.key || (p.key == c.key && p.sequence < c.sequence);
        EXPECT_TRUE(ordered) << "row " << i << ": " << audit_text(p) << " before " << audit_text(c)
                             << " (want byte order of keys, 0x80-0xff after ASCII, then sequence)";
    }
    EXPECT_TRUE(this->same_as_reference());
}

TYPED_TEST(StoreConformance, HostileKeysRoundTripByteForByte) {
    std::vector<std::string> keys;
    std::vector<std::string> refused;
    for (auto& k : idem_test::hostile_keys())
        (TypeParam::any_bytes || idem_test::valid_utf8(k) ? keys : refused).push_back(k);
    std::vector<row_fields> claims, completions;
    for (const auto& k : keys) {
        claims.push_back({.key = k, .fence = F1, .fingerprint = 5, .at_ms = T0, .lease_until_ms = T0 + 9});
        completions.push_back({.key = k,
                               .from = record_state::processing,
                               .to = record_state::succeeded,
                               .cause = transition_cause::succeed,
                               .fence = F1,
                               .outcome = k.size(),
                               .at_ms = T0 + 1});
    }
    this->apply(claims, 1);
    this->apply(completions, 2);
    this->reopen();
    for (const auto& k : keys) {
        const auto r = this->st().get(k);
        ASSERT_TRUE(r.has_value()) << "get('" << idem::key::printable(k) << "')";
        EXPECT_EQ(r->key, k) << "key bytes changed: '" << idem::key::printable(r->key) << "'";
        EXPECT_EQ(r->state, record_state::succeeded);
        EXPECT_EQ(r->outcome, k.size());
        const auto trail = this->st().audit(k);
        ASSERT_EQ(trail.size(), 2u) << idem::key::printable(k);
        for (const auto& a : trail) EXPECT_EQ(a.key, k);
    }
    std::set<std::string> loaded;
    for (auto& [k, r] : idem_test::load_all(this->st())) loaded.insert(k);
    EXPECT_EQ(loaded, std::set<std::string>(keys.begin(), keys.end()));
    // The tables survived: the store still takes batches.
    this->apply({{.key = "after_hostile", .fence = F1, .at_ms = T0 + 2}}, 3);
    EXPECT_TRUE(this->st().get("after_hostile").has_value());
    EXPECT_TRUE(this->same_as_reference());

    // A store that cannot hold some bytes refuses the batch with store_error naming the key.
    for (const auto& k : refused) {
        std::vector<idem::store_row> rows{row({.key = k, .fence = F1, .at_ms = T0}, ++this->seq_)};
        try {
            this->st().apply(rows, 1000 + this->seq_);
            ADD_FAILURE() << "apply() accepted key '" << idem::key::printable(k) << "' it cannot store";
        } catch (const idem::error& e) {
            EXPECT_EQ(e.kind(), idem::errc::store_error) << e.what();
            EXPECT_NE(std::string(e.what()).find(idem::key::printable(k)), std::string::npos) << e.what();
        }
        EXPECT_FALSE(this->st().get(k).has_value());
    }
}

TYPED_TEST(StoreConformance, CorruptRowsAreRefusedByLoadNamingTheKey) {
    if constexpr (!TypeParam::raw_rows) {
        // memory_store holds typed records, so no raw row can be corrupt: check that a good
        // record loads, which is the other half of this test for the SQL stores.
        this->apply({{.key = "good_key", .fence = F1, .at_ms = T0}}, 1);
        std::size_t loaded = 0;
        this->st().load([&](const idem::stored_record& r) {
            ++loaded;
            EXPECT_EQ(r.key, "good_key");
        });
        EXPECT_EQ(loaded, 1u);
    } else {
        this->apply({{.key = "good_key", .fence = F1, .at_ms = T0}}, 1);
        struct bad {
            std::string key, status;
            std::int64_t fence;
            const char* rule;  // a word the message must contain
        };
        const std::vector<bad> cases = {
            {"bad_status_key", "DONE", static_cast<std::int64_t>(F1), "status"},
            {"absent_status_key", "ABSENT", static_cast<std::int64_t>(F1), "status"},
            {"zero_fence_key", "SUCCESS", 0, "fencing_token"},
            {"huge_fence_key", "SUCCESS", std::int64_t{1} << 53, "fencing_token"},
            {"negative_fence_key", "FAILED", -1, "fencing_token"},
            {std::string("ctl\x01key"), "SUCCESS", static_cast<std::int64_t>(F1), "control byte"},
        };
        for (const auto& c : cases) {
            SCOPED_TRACE(idem::key::printable(c.key));
            const std::string why = this->maker_.insert_raw(c.key, c.status, c.fence);
            ASSERT_EQ(why, "") << "cannot write the corrupt row";
            this->reopen();
            try {
                this->st().load([](const idem::stored_record&) {});
                ADD_FAILURE() << "load() accepted a corrupt row";
            } catch (const idem::error& e) {
                EXPECT_EQ(e.kind(), idem::errc::corrupt_record) << e.what();
                EXPECT_NE(std::string(e.what()).find(idem::key::printable(c.key)), std::string::npos)
                    << "the message does not name the key: " << e.what();
                EXPECT_NE(std::string(e.what()).find(c.rule), std::string::npos)
                    << "the message does not name the rule (" << c.rule << "): " << e.what();
            } catch (const std::exception& e) {
                ADD_FAILURE() << "load() threw something other than idem::error: " << e.what();
            }
            // Remove the row for the next case.
            ASSERT_EQ(this->maker_.delete_raw(c.key), "");
        }
    }
}

// Seeded batches that follow the state machine, applied to the store and to memory_store; with a
// reopen in the middle (sequences, fences and records must continue). Replay: IDEM_SEED.
TYPED_TEST(StoreConformance, GeneratedBatchesMatchMemoryStore) {
    const std::uint64_t seed = idem_test::test_seed();
    std::vector<std::string> extra;
    for (auto& k : idem_test::hostile_keys())
        if (TypeParam::any_bytes || idem_test::valid_utf8(k)) extra.push_back(k);
    idem_test::batch_model model(seed, extra);
    std::vector<std::uint64_t> ids;
    for (int b = 0; b < 40; ++b) {
        const std::uint64_t id = model.next_batch_id();
        this->apply(model.next(40), id);
        ids.push_back(id);
        if (b == 20) {
            this->reopen();
            ASSERT_TRUE(this->same_as_reference()) << "after reopen, seed " << seed;
        }
    }
    for (auto id : ids) EXPECT_TRUE(this->st().committed(id)) << id;
    EXPECT_FALSE(this->st().committed(model.next_batch_id()));
    EXPECT_TRUE(this->same_as_reference()) << "seed " << seed;
    EXPECT_TRUE(idem_test::verify_clean(this->st())) << "seed " << seed;
}

// ---- pruning ------------------------------------------------------------------------------------

constexpr std::int64_t T_NEW = T0 + 10'000;  // rows at T0 and T0 + 1 are "old", at T_NEW and T_NEW + 1 "new"
constexpr std::int64_t CUT = T0 + 5'000;     // a bound between them
constexpr std::uint64_t F_OLD = F1 + 7;      // the old keys' fence: the largest, so max_fence() must keep it

/// Per tag: a SUCCESS, a FAILED, a RELEASED and a PROCESSING key, each claimed at `at`, the first
/// three completed at at + 1 (7 audit rows in all).
std::vector<row_fields> four_keys(const std::string& tag, std::int64_t at, std::uint64_t fence) {
    std::vector<row_fields> f;
    for (auto [name, to, cause] : {std::tuple{"_ok", record_state::succeeded, transition_cause::succeed},
                                   std::tuple{"_failed", record_state::failed, transition_cause::fail},
                                   std::tuple{"_released", record_state::released, transition_cause::release}}) {
        f.push_back({.key = tag + name, .fence = fence, .at_ms = at, .lease_until_ms = at + 30'000});
        f.push_back({.key = tag + name,
                     .from = record_state::processing,
                     .to = to,
                     .cause = cause,
                     .fence = fence,
                     .outcome = 5,
                     .at_ms = at + 1});
    }
    f.push_back({.key = tag + "_processing", .fence = fence, .at_ms = at, .lease_until_ms = at + 30'000});
    return f;
}

// ---- payloads ------------------------------------------------------------------------------------

/// A row carrying `payload` (the view must outlive the apply: as the engine's arena does).
idem::store_row payload_row(const row_fields& f, std::string_view payload, std::uint64_t seq) {
    idem::store_row r = row(f, seq);
    r.t.payload = payload;
    return r;
}

/// Bytes no text column or C string would keep: NUL, 0xFF, a lone continuation byte, a truncated
/// sequence, an encoded surrogate, an overlong '/', and CR LF.
const std::string hostile_payload = std::string("\0\xff\x80{\"a\":1}\xc3\x28\xed\xa0\x80\xc0\xaf\r\n\0", 21);

TYPED_TEST(StoreConformance, PayloadsOfAnySizeAndAnyBytesRoundTripExactly) {
    using rs = record_state;
    std::string max(idem::detail::rows::payload_hard_max, '\0');
    for (std::size_t i = 0; i < max.size(); ++i) max[i] = static_cast<char>((i * 131 + 7) & 0xff);
    const std::vector<std::pair<std::string, std::string>> cases = {{"P_EMPTY_v1", ""},
                                                                    {"P_ONE_v1", std::string(1, '\0')},
                                                                    {"P_FF_v1", "\xff"},
                                                                    {"P_HOSTILE_v1", hostile_payload},
                                                                    {"P_MAX_v1", max}};
    // Claims in one batch, completions in the next (the usual life); one key claims and completes
    // in the same batch.
    std::vector<idem::store_row> claims, done;
    std::uint64_t seq = 0;
    for (const auto& [k, p] : cases)
        claims.push_back(row({.key = k, .fence = F1, .fingerprint = 3, .at_ms = T0, .lease_until_ms = T0 + 1000}, ++seq));
    for (const auto& [k, p] : cases)
        done.push_back(payload_row({.key = k,
                                    .from = rs::processing,
                                    .to = rs::succeeded,
                                    .cause = transition_cause::succeed,
                                    .fence = F1,
                                    .outcome = 9,
                                    .at_ms = T0 + 1},
                                   p, ++seq));
    this->apply(claims, 1);
    this->apply(done, 2);
    const std::string both = "P_BOTH_v1";
    this->apply(std::vector{row({.key = both, .fence = F1, .at_ms = T0}, ++seq),
                            payload_row({.key = both,
                                         .from = rs::processing,
                                         .to = rs::failed,
                                         .cause = transition_cause::fail,
                                         .fence = F1,
                                         .outcome = 4,
                                         .at_ms = T0 + 2},
                                        hostile_payload, ++seq)},
                3);
    EXPECT_TRUE(this->same_as_reference());
    for (int pass = 0; pass < 2; ++pass) {
        SCOPED_TRACE(pass == 0 ? "as written" : "after a reopen");
        for (const auto& [k, p] : cases) {
            const auto got = this->st().get(k);
            ASSERT_TRUE(got.has_value()) << k;
            EXPECT_EQ(got->state, rs::succeeded) << k;
            EXPECT_EQ(got->payload.size(), p.size()) << k;
            EXPECT_TRUE(got->payload == p) << k << ": the bytes differ";
        }
        const auto b = this->st().get(both);
        ASSERT_TRUE(b.has_value());
        EXPECT_TRUE(b->payload == hostile_payload);
        std::map<std::string, std::string> loaded;
        this->st().load([&](const idem::stored_record& r) { loaded[r.key] = r.payload; });
        for (const auto& [k, p] : cases) EXPECT_TRUE(loaded[k] == p) << "load() " << k;
        if (pass == 0) this->reopen();
    }
    // The audit trail keeps the payload's length and hash, not its bytes.
    const auto trail = this->st().audit("P_MAX_v1");
    ASSERT_EQ(trail.size(), 2u);
    EXPECT_EQ(trail[1].detail, "succeed outcome=9" + idem::payload_detail(max));
    EXPECT_NE(trail[1].detail.find(" payload=1048576B fnv="), std::string::npos) << trail[1].detail;
    EXPECT_EQ(this->st().audit("P_EMPTY_v1")[1].detail, "succeed outcome=9");
    EXPECT_TRUE(this->same_as_reference());
}

TYPED_TEST(StoreConformance, TheFoldKeepsTheLastCompletionsPayload) {
    using rs = record_state;
    using tc = transition_cause;
    const std::string a = "first", b = "second", stale = "stale";
    std::uint64_t seq = 0;
    // K1: claim and complete at F1, then a new life at F1 + 1 completes with b, all in one batch.
    // K2: completes with a; a late release of the same claim (same fence, next batch) is audited
    //     only, and the payload stays.
    // K3: completes with a at F1 + 1; a stale owner's completion at F1 arrives later: refused.
    // K4: completes with a; then claimed again at a higher fence: the new claim carries none.
    this->apply(
        std::vector{
            row({.key = "K1", .fence = F1, .at_ms = T0}, ++seq),
            payload_row({.key = "K1",
                         .from = rs::processing,
                         .to = rs::succeeded,
                         .cause = tc::succeed,
                         .fence = F1,
                         .outcome = 1,
                         .at_ms = T0 + 1},
                        a, ++seq),
            row({.key = "K1", .from = rs::succeeded, .to = rs::processing, .fence = F1 + 1, .at_ms = T0 + 2}, ++seq),
            payload_row({.key = "K1",
                         .from = rs::processing,
                         .to = rs::succeeded,
                         .cause = tc::succeed,
                         .fence = F1 + 1,
                         .outcome = 2,
                         .at_ms = T0 + 3},
                        b, ++seq),
            row({.key = "K2", .fence = F1, .at_ms = T0}, ++seq),
            payload_row({.key = "K2",
                         .from = rs::processing,
                         .to = rs::succeeded,
                         .cause = tc::succeed,
                         .fence = F1,
                         .outcome = 1,
                         .at_ms = T0 + 1},
                        a, ++seq),
            row({.key = "K3", .fence = F1 + 1, .at_ms = T0}, ++seq),
            payload_row({.key = "K3",
                         .from = rs::processing,
                         .to = rs::succeeded,
                         .cause = tc::succeed,
                         .fence = F1 + 1,
                         .outcome = 1,
                         .at_ms = T0 + 1},
                        a, ++seq),
            row({.key = "K4", .fence = F1, .at_ms = T0}, ++seq),
            payload_row({.key = "K4",
                         .from = rs::processing,
                         .to = rs::succeeded,
                         .cause = tc::succeed,
                         .fence = F1,
                         .outcome = 1,
                         .at_ms = T0 + 1},
                        a, ++seq),
        },
        1);
    this->apply(
        std::vector{
            row({.key = "K2",
                 .from = rs::processing,
                 .to = rs::released,
                 .cause = tc::release,
                 .fence = F1,
                 .at_ms = T0 + 5},
                ++seq),
            payload_row({.key = "K3",
                         .from = rs::processing,
                         .to = rs::succeeded,
                         .cause = tc::succeed,
                         .fence = F1,
                         .outcome = 7,
                         .at_ms = T0 + 5},
                        stale, ++seq),
            row({.key = "K4", .from = rs::succeeded, .to = rs::processing, .fence = F1 + 1, .at_ms = T0 + 5}, ++seq),
        },
        2);
    const std::map<std::string, std::string> want = {{"K1", b}, {"K2", a}, {"K3", a}, {"K4", ""}};
    for (const auto& [k, p] : want) {
        const auto got = this->st().get(k);
        ASSERT_TRUE(got.has_value()) << k;
        EXPECT_EQ(got->payload, p) << k;
    }
    EXPECT_TRUE(this->same_as_reference());
}


TYPED_TEST(StoreConformance, PruneRemovesExactlyTheExpiredRowsAndNothingElse) {
    this->apply(four_keys("old", T0, F_OLD), 1);
    this->apply(four_keys("new", T_NEW, F1), 2);
    EXPECT_EQ(this->st().horizon(), idem::prune_horizon{}) << "a store never pruned has no horizon";

    // Records first: the old finished ones go, old_processing and every new record stay, and every
    // audit row stays.
    auto r = this->prune({.records_before_ms = CUT});
    EXPECT_EQ(r.records, 3u);
    EXPECT_EQ(r.audit_rows, 0u);
    EXPECT_FALSE(r.more);
    for (const char* k : {"old_ok", "old_failed", "old_released"}) EXPECT_FALSE(this->st().get(k)) << k;
    EXPECT_TRUE(this->st().get("old_processing")) << "a PROCESSING record was pruned";
    EXPECT_EQ(idem_test::load_all(this->st()).size(), 5u);
    EXPECT_EQ(idem_test::scan_all(this->st()).size(), 14u) << "audit rows went with a records-only prune";
    EXPECT_EQ(this->st().max_fence(), F_OLD) << "max_fence() forgot the fence of a pruned record";
    EXPECT_EQ(this->st().horizon(), (idem::prune_horizon{CUT, idem::prune_limits::keep_all}));
    EXPECT_TRUE(this->same_as_reference());
    const auto v1 = idem::verify(this->st());
    EXPECT_TRUE(v1.violations.empty()) << (v1.violations.empty() ? "" : v1.violations.front());
    EXPECT_EQ(v1.trails_without_record, 3u);

    // Then audit rows: exactly the 7 old ones, whatever their key's record.
    r = this->prune({.audit_before_ms = CUT});
    EXPECT_EQ(r.records, 0u);
    EXPECT_EQ(r.audit_rows, 7u);
    EXPECT_FALSE(r.more);
    for (const auto& a : idem_test::scan_all(this->st())) EXPECT_GE(a.at_ms, T_NEW) << idem::key::printable(a.key);
    EXPECT_EQ(idem_test::scan_all(this->st()).size(), 7u);
    EXPECT_EQ(this->st().audit("new_ok").size(), 2u);
    EXPECT_TRUE(this->st().audit("old_ok").empty());
    EXPECT_TRUE(this->st().audit("old_processing").empty());
    EXPECT_EQ(this->st().horizon(), (idem::prune_horizon{CUT, CUT}));
    EXPECT_TRUE(this->same_as_reference());
    const auto v2 = idem::verify(this->st());
    EXPECT_TRUE(v2.violations.empty()) << (v2.violations.empty() ? "" : v2.violations.front());
    EXPECT_EQ(v2.records_without_trail, 1u) << "old_processing: its record stays, its trail is past the window";

    // Nothing more past these bounds.
    r = this->prune({.records_before_ms = CUT, .audit_before_ms = CUT});
    EXPECT_EQ(r.records + r.audit_rows, 0u);
    EXPECT_FALSE(r.more);

    // A restart finds the same store: records, trails, horizon, fences.
    this->reopen();
    EXPECT_EQ(this->st().horizon(), (idem::prune_horizon{CUT, CUT}));
    EXPECT_EQ(this->st().max_fence(), F_OLD);
    EXPECT_TRUE(this->same_as_reference());
    EXPECT_TRUE(idem_test::verify_clean(this->st()));
}

// Records and audit rows pruned in one call (both bounds), then a key whose record was pruned is
// claimed again, above every earlier fence: verify counts it reopened, and its trail holds both lives.
TYPED_TEST(StoreConformance, AKeyClaimedAgainAfterItsRecordWasPrunedHasOneTrail) {
    this->apply(four_keys("old", T0, F_OLD), 1);
    this->apply(four_keys("new", T_NEW, F1), 2);
    auto r = this->prune({.records_before_ms = CUT});
    ASSERT_EQ(r.records, 3u);
    const std::uint64_t next = this->st().max_fence() + 1;
    ASSERT_GT(next, F_OLD);
    this->apply({{.key = "old_ok", .fence = next, .at_ms = T_NEW + 5, .lease_until_ms = T_NEW + 30'000}}, 3);
    EXPECT_EQ(this->st().audit("old_ok").size(), 3u) << "the trail lost the key's first life";
    EXPECT_TRUE(this->same_as_reference());
    const auto v = idem::verify(this->st());
    EXPECT_TRUE(v.violations.empty()) << (v.violations.empty() ? "" : v.violations.front());
    EXPECT_EQ(v.reopened, 1u);

    r = this->prune({.records_before_ms = T_NEW + 100, .audit_before_ms = T_NEW + 3});
    EXPECT_EQ(r.records, 3u) << "new_ok, new_failed, new_released (old_ok is PROCESSING again)";
    EXPECT_EQ(r.audit_rows, 14u);
    EXPECT_FALSE(r.more);
    EXPECT_EQ(this->st().audit("old_ok").size(), 1u);
    EXPECT_TRUE(this->same_as_reference());
    this->reopen();
    EXPECT_TRUE(this->same_as_reference());
    EXPECT_TRUE(idem_test::verify_clean(this->st()));
}

TYPED_TEST(StoreConformance, MaxRowsBoundsEachPruneAndMoreSaysWhenRowsRemain) {
    std::vector<row_fields> old, fresh;
    for (int i = 0; i < 10; ++i) {
        const std::string k = "bulk" + std::to_string(i);
        const std::int64_t at = T0 + i * 10;  // older keys first: the same order by time and by sequence
        old.push_back({.key = k, .fence = F1, .at_ms = at, .lease_until_ms = at + 30'000});
        old.push_back({.key = k,
                       .from = record_state::processing,
                       .to = record_state::succeeded,
                       .cause = transition_cause::succeed,
                       .fence = F1,
                       .at_ms = at + 1});
        this->apply(std::vector<row_fields>(old.end() - 2, old.end()), 10 + static_cast<std::uint64_t>(i));
    }
    this->apply({{.key = "young", .fence = F1, .at_ms = T_NEW, .lease_until_ms = T_NEW + 30'000},
                 {.key = "young",
                  .from = record_state::processing,
                  .to = record_state::succeeded,
                  .cause = transition_cause::succeed,
                  .fence = F1,
                  .at_ms = T_NEW + 1}},
                99);
    std::size_t records = 0, audit = 0, calls = 0;
    for (idem::prune_result r{.more = true}; r.more; ++calls) {
        ASSERT_LT(calls, 10u) << "prune keeps saying more";
        r = this->prune({.records_before_ms = CUT, .audit_before_ms = CUT, .max_rows = 4});
        EXPECT_LE(r.records, 4u);
        EXPECT_LE(r.audit_rows, 4u);
        // Until the last call a bound had rows past it: a full call of 4 of each kind.
        if (r.more) {
            EXPECT_EQ(r.audit_rows, 4u) << "call " << calls;
        }
        records += r.records;
        audit += r.audit_rows;
    }
    EXPECT_EQ(records, 10u);
    EXPECT_EQ(audit, 20u);
    EXPECT_EQ(calls, 5u) << "20 audit rows, 4 a call";
    EXPECT_TRUE(this->st().get("young"));
    EXPECT_EQ(this->st().audit("young").size(), 2u);
    EXPECT_TRUE(this->same_as_reference());
    EXPECT_TRUE(idem_test::verify_clean(this->st()));
}

TYPED_TEST(StoreConformance, TheHorizonSurvivesAReopenAndOnlyMovesForward) {
    this->apply(four_keys("old", T0, F1), 1);
    (void)this->prune({.records_before_ms = CUT, .audit_before_ms = T0 - 5});
    this->reopen();
    EXPECT_EQ(this->st().horizon(), (idem::prune_horizon{CUT, T0 - 5}));
    (void)this->prune({.records_before_ms = T0 - 100, .audit_before_ms = T0 - 1});  // an older records bound
    EXPECT_EQ(this->st().horizon(), (idem::prune_horizon{CUT, T0 - 1}));
    (void)this->prune({});  // keep_all, keep_all: nothing changes
    this->reopen();
    EXPECT_EQ(this->st().horizon(), (idem::prune_horizon{CUT, T0 - 1}));
    EXPECT_TRUE(this->same_as_reference());
    // The store still takes batches after a restart of a pruned store.
    this->apply({{.key = "after", .fence = this->st().max_fence() + 1, .at_ms = T_NEW}}, 2);
    EXPECT_TRUE(this->same_as_reference());
    EXPECT_TRUE(idem_test::verify_clean(this->st()));
}

/// The store under test with some of its rows hidden from verify (what a lost row looks like) and,
/// optionally, another horizon.
class hiding_store final : public idem_test::forwarding_store {
public:
    using forwarding_store::forwarding_store;
    std::function<bool(const idem::audit_entry&)> hide_audit = [](const idem::audit_entry&) { return false; };
    std::function<bool(const idem::stored_record&)> hide_record = [](const idem::stored_record&) { return false; };
    std::optional<idem::prune_horizon> horizon_override;

    void load(const std::function<void(const idem::stored_record&)>& fn) override {
        inner_.load([&](const idem::stored_record& r) {
            if (!hide_record(r)) fn(r);
        });
    }
    void scan_audit(const std::function<void(const idem::audit_entry&)>& fn) override {
        inner_.scan_audit([&](const idem::audit_entry& a) {
            if (!hide_audit(a)) fn(a);
        });
    }
    idem::prune_horizon horizon() override { return horizon_override ? *horizon_override : inner_.horizon(); }
};

bool names(const idem::verify_report& r, const std::string& key, const std::string& rule) {
    for (const auto& v : r.violations)
        if (v.find("'" + key + "'") != std::string::npos && v.find(rule) != std::string::npos) return true;
    return false;
}

// Pruned history is legal only where the horizon says rows may be gone: verify still reports a
// record without a trail, a trail without a record, or a trail without its start, when the horizon
// does not cover it.
TYPED_TEST(StoreConformance, VerifyOnAPrunedStoreStillReportsWhatThePruneCannotExplain) {
    this->apply(four_keys("old", T0, F1), 1);
    this->apply(four_keys("new", T_NEW, F1), 2);
    (void)this->prune({.records_before_ms = CUT, .audit_before_ms = CUT});
    ASSERT_TRUE(idem_test::verify_clean(this->st()));

    hiding_store view(this->st());
    // A record newer than the audit horizon whose trail is gone.
    view.hide_audit = [](const idem::audit_entry& a) { return a.key == "new_ok"; };
    auto r = idem::verify(view);
    EXPECT_TRUE(names(r, "new_ok", "has a record but no audit trail")) << r.violations.size();
    EXPECT_EQ(r.violations.size(), 1u);

    // A trail newer than the records horizon whose record is gone; a PROCESSING one whatever its age.
    view.hide_audit = [](const idem::audit_entry&) { return false; };
    view.hide_record = [](const idem::stored_record& rec) { return rec.key == "new_failed" || rec.key == "new_processing"; };
    r = idem::verify(view);
    EXPECT_TRUE(names(r, "new_failed", "has an audit trail but no record"));
    EXPECT_TRUE(names(r, "new_processing", "PROCESSING"));
    EXPECT_EQ(r.violations.size(), 2u);
    view.horizon_override = idem::prune_horizon{T_NEW + 100, CUT};  // the same rows, a later records horizon
    r = idem::verify(view);
    EXPECT_EQ(r.trails_without_record, 1u) << "new_failed is now older than the records horizon";
    EXPECT_TRUE(names(r, "new_processing", "PROCESSING")) << "prune never removes a PROCESSING record";
    EXPECT_EQ(r.violations.size(), 1u);

    // A trail without its first row is legal only when audit rows were pruned.
    view.hide_record = [](const idem::stored_record&) { return false; };
    view.hide_audit = [](const idem::audit_entry& a) { return a.key == "new_ok" && a.from == record_state::absent; };
    view.horizon_override = idem::prune_horizon{CUT, idem::prune_limits::keep_all};
    r = idem::verify(view);
    EXPECT_TRUE(names(r, "new_ok", "from PROCESSING but the previous state was ABSENT"));
    view.horizon_override = idem::prune_horizon{CUT, CUT};
    r = idem::verify(view);
    EXPECT_TRUE(r.violations.empty()) << (r.violations.empty() ? "" : r.violations.front());
    EXPECT_EQ(r.truncated_trails, 1u);

    // ...and a store never pruned explains nothing.
    view.hide_audit = [](const idem::audit_entry& a) { return a.key == "new_ok"; };
    view.horizon_override = idem::prune_horizon{};
    r = idem::verify(view);
    EXPECT_TRUE(names(r, "new_ok", "has a record but no audit trail"));
}

}  // namespace
