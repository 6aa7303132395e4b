// verify/fuzz/fuzz_recovery.cpp: rows read back from the store during recovery.
//
// The input describes a SQLite database: a schema version and rows for idempotent_record and
// idempotent_audit whose every column takes a fuzzed SQLite type and value (integer, real, text,
// blob or NULL). The file is written with the sqlite3 C API under a lax schema (the same tables and
// columns without types or constraints, as a hostile or corrupted file may have them), then opened
// by idem::sqlite_store and read back every way the library reads it: load(), max_fence(), get(),
// audit(), scan_audit(), idem::verify(), and a full durable_guard recovery (restore into the table,
// compensation of expired claims, then a begin on a recovered key and a flush).
//
// The same input is first decoded as a rocksdb_store record value and audit value (include/idem/
// detail/rocks/codec.hpp, no database needed): any bytes must decode, or raise corrupt_record,
// and what decodes must encode and decode again to the same record.
//
// Corrupt or hostile rows must give idem::error (or a clean start); anything else escaping, a
// crash, a leak or undefined behaviour (ASan + UBSan) is a finding.
#include <idem/detail/rocks/codec.hpp>
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>
#include <idem/verify.hpp>

#include <sqlite3.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <unistd.h>

namespace {

struct reader {
    const std::uint8_t* p;
    std::size_t n;
    std::uint8_t byte() { return n ? (--n, *p++) : 0; }
    std::int64_t i64() {
        std::int64_t v = 0;
        const std::size_t k = std::min<std::size_t>(n, 8);
        std::memcpy(&v, p, k);
        p += k;
        n -= k;
        return v;
    }
    std::string bytes(std::size_t max) {
        const std::size_t k = std::min<std::size_t>({n, static_cast<std::size_t>(byte()) % (max + 1), n});
        std::string s(reinterpret_cast<const char*>(p), k);
        p += k;
        n -= k;
        return s;
    }
};

/// Small integers that matter (0, 1, boundaries of the fence and of chrono conversions), or raw.
std::int64_t interesting(reader& r) {
    static constexpr std::int64_t table[] = {0,
                                             1,
                                             -1,
                                             2,
                                             (1ll << 52) - 1,
                                             1ll << 52,
                                             (1ll << 32) | 1,
                                             INT64_MAX,
                                             INT64_MIN,
                                             INT64_MAX / 1000000,
                                             1700000000000,
                                             -1700000000000,
                                             9223372036854};
    const std::uint8_t sel = r.byte();
    if (sel < 64) return table[sel % (sizeof table / sizeof table[0])];
    return r.i64();
}

const char* const statuses[] = {"PROCESSING", "SUCCESS", "FAILED", "RELEASED", "ABSENT", "", "processing", "SUCCESS\0x"};

void bind(sqlite3_stmt* s, int col, reader& r, bool key_column) {
    switch (r.byte() % 8) {
        case 0: sqlite3_bind_null(s, col); break;
        case 1: sqlite3_bind_double(s, col, static_cast<double>(r.i64()) / 7.0); break;
        case 2: {
            const std::string b = r.bytes(200);
            sqlite3_bind_blob(s, col, b.data(), static_cast<int>(b.size()), SQLITE_TRANSIENT);
            break;
        }
        case 3: {
            const std::string t = r.bytes(200);
            sqlite3_bind_text(s, col, t.data(), static_cast<int>(t.size()), SQLITE_TRANSIENT);
            break;
        }
        case 4: {
            const char* st = statuses[r.byte() % (sizeof statuses / sizeof statuses[0])];
            sqlite3_bind_text(s, col, st, -1, SQLITE_STATIC);
            break;
        }
        case 5:
            if (key_column) {
                const std::string k = "TX" + std::to_string(r.byte() % 8) + "_PAY_v1";
                sqlite3_bind_text(s, col, k.data(), static_cast<int>(k.size()), SQLITE_TRANSIENT);
                break;
            }
            [[fallthrough]];
        default: sqlite3_bind_int64(s, col, interesting(r)); break;
    }
}

bool exec(sqlite3* db, const char* sql) { return sqlite3_exec(db, sql, nullptr, nullptr, nullptr) == SQLITE_OK; }

/// Writes the database the input describes. False when SQLite refused the setup itself.
/// Shapes: the library's own schema (made by sqlite_store, then filled with CHECK constraints
/// ignored, as a file edited by hand may be), or a lax schema with the same tables and columns and
/// no types (the upsert still needs its primary key), sometimes without the audit table, without the
/// version row, or with a fuzzed version or audit sequence counter (idem_schema.next_sequence).
bool build(const std::string& path, reader& r) {
    const std::uint8_t shape = r.byte();
    const bool own_schema = shape & 1;
    if (own_schema) {
        try {
            idem::sqlite_store make(path, false);
        } catch (const idem::error&) {
            return false;
        }
    }
    sqlite3* db = nullptr;
    if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
        sqlite3_close(db);
        return false;
    }
    const bool audit_table = own_schema || shape % 8 != 6;
    bool ok = exec(db, "PRAGMA journal_mode=WAL") && exec(db, "PRAGMA synchronous=OFF") &&
              exec(db, "PRAGMA ignore_check_constraints=1") && exec(db, "BEGIN");
    if (own_schema && (shape & 2)) {  // a hostile audit sequence counter in the library's own schema
        sqlite3_stmt* v = nullptr;
        ok = ok && sqlite3_prepare_v2(db, "UPDATE idem_schema SET next_sequence = ?1", -1, &v, nullptr) == SQLITE_OK;
        if (ok) {
            bind(v, 1, r, false);
            sqlite3_step(v);  // a refused value (NOT NULL) leaves the counter as it was
        }
        sqlite3_finalize(v);
    }
    if (!own_schema) {
        ok = ok && exec(db,
                        "CREATE TABLE idem_schema (version, next_sequence);"
                        "CREATE TABLE idempotent_record (idempotent_key PRIMARY KEY, biz_type, status, fencing_token, "
                        "lease_until, outcome, request_fingerprint, created_time, updated_time);"
                        "CREATE TABLE idempotent_batch (batch_id PRIMARY KEY, committed_time);");
        if (audit_table)
            ok = ok && exec(db,
                            "CREATE TABLE idempotent_audit (sequence, idempotent_key, from_status, to_status, "
                            "fencing_token, node, at_time, detail, PRIMARY KEY (idempotent_key, sequence));");
        if (shape % 16 != 4) {  // sometimes the version row is missing; sometimes it is not 1
            sqlite3_stmt* v = nullptr;
            ok = ok && sqlite3_prepare_v2(db, "INSERT INTO idem_schema VALUES (?1, ?2)", -1, &v, nullptr) == SQLITE_OK;
            if (ok) {
                if (shape % 16 == 10) bind(v, 1, r, false);
                else sqlite3_bind_int(v, 1, 1);
                if (shape & 32) bind(v, 2, r, false);
                else sqlite3_bind_int(v, 2, 1);
                ok = sqlite3_step(v) == SQLITE_DONE;
            }
            sqlite3_finalize(v);
        }
    }
    sqlite3_stmt* rec = nullptr;
    sqlite3_stmt* aud = nullptr;
    // The library's own schema is version 2 (a record's last_audit, an audit row's previous: the
    // chain audit() follows, fuzzed like every other column); the lax one is version 1, which the
    // store upgrades in place when it opens the file.
    const char* record_sql = own_schema ? "INSERT INTO idempotent_record (idempotent_key, biz_type, status, "
                                          "fencing_token, lease_until, outcome, request_fingerprint, created_time, "
                                          "updated_time, last_audit) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)"
                                        : "INSERT INTO idempotent_record VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9)";
    const char* audit_sql = own_schema ? "INSERT INTO idempotent_audit (sequence, idempotent_key, from_status, "
                                         "to_status, fencing_token, node, at_time, detail, previous) VALUES "
                                         "(?1,?2,?3,?4,?5,?6,?7,?8,?9)"
                                       : "INSERT INTO idempotent_audit VALUES (?1,?2,?3,?4,?5,?6,?7,?8)";
    ok = ok && sqlite3_prepare_v2(db, record_sql, -1, &rec, nullptr) == SQLITE_OK;
    if (ok && audit_table) ok = sqlite3_prepare_v2(db, audit_sql, -1, &aud, nullptr) == SQLITE_OK;
    for (int rows = 0; ok && r.n > 0 && rows < 64; ++rows) {
        const bool audit = aud != nullptr && (r.byte() & 1);
        sqlite3_stmt* s = audit ? aud : rec;
        sqlite3_reset(s);
        const int cols = (audit ? 8 : 9) + (own_schema ? 1 : 0);
        for (int c = 1; c <= cols; ++c) bind(s, c, r, audit ? c == 2 : c == 1);
        sqlite3_step(s);  // a refused row (duplicate key, ...) is simply not there
    }
    sqlite3_finalize(rec);
    sqlite3_finalize(aud);
    ok = ok && exec(db, "COMMIT");
    sqlite3_close(db);
    return ok;
}

void remove_db(const std::string& path) {
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) ::unlink((path + suffix).c_str());
}

[[noreturn]] void finding(const char* where, const char* what) {
    std::fprintf(stderr, "fuzz_recovery: %s let a non-idem exception escape: %s\n", where, what);
    std::abort();
}

void read_back(const std::string& path) {
    try {
        idem::sqlite_store st(path, /*full_sync=*/false, std::chrono::milliseconds(10));
        std::string some_key;
        st.load([&](const idem::stored_record& rec) {
            if (!idem::key::parse(rec.key)) std::abort();  // load() promises valid keys
            if (rec.fence == 0 || rec.fence >= (1ull << 52)) std::abort();
            some_key = rec.key;
        });
        (void)st.max_fence();
        if (!some_key.empty()) {
            (void)st.get(some_key);
            (void)st.audit(some_key);
        }
        st.scan_audit([](const idem::audit_entry&) {});
        (void)idem::verify(st);
    } catch (const idem::error&) {
    } catch (const std::exception& e) {
        finding("sqlite_store", e.what());
    }
}

void recover(const std::string& path) {
    try {
        idem::options o;
        o.capacity = 64;
        o.maintenance_interval = {};
        o.lease = std::chrono::seconds(1);
        o.resolve = [](const idem::expired_claim& c) {
            return idem::resolver_answer{c.fence % 2 ? idem::resolution::not_executed : idem::resolution::unknown, 0};
        };
        idem::store_options so;
        so.queue_capacity = 256;
        so.max_batch = 64;
        so.sync_timeout = std::chrono::milliseconds(50);
        so.idle_poll = std::chrono::microseconds(50);
        so.max_backoff = std::chrono::milliseconds(2);
        idem::durable_guard g(std::make_unique<idem::sqlite_store>(path, false, std::chrono::milliseconds(10)), o, so);
        std::string some_key;
        g->for_each([&](std::string k, const idem::record_view&) { some_key = std::move(k); });
        if (!some_key.empty()) {
            const idem::key k(some_key);
            (void)g->query(k);
            auto r = g->begin(k);
            if (r.status == idem::begin_status::acquired) (void)r.ticket.succeed(1);
        }
        (void)g.flush(std::chrono::milliseconds(100));
    } catch (const idem::error&) {
    } catch (const std::exception& e) {
        finding("durable_guard recovery", e.what());
    }
}

}  // namespace

/// rocksdb_store's value decoders over the raw input: decode or corrupt_record, never a crash.
void rocksdb_values(const std::uint8_t* data, std::size_t size) {
    namespace codec = idem::detail::rocks;
    const std::string_view value(reinterpret_cast<const char*>(data), size);
    try {
        const idem::stored_record r = codec::decode_record("fuzz: ", "TX1_PAY_v1", value);
        if (codec::decode_record("fuzz: ", "TX1_PAY_v1", codec::encode_record(r)) != r) std::abort();
    } catch (const idem::error& e) {
        if (e.kind() != idem::errc::corrupt_record) std::abort();
    }
    try {
        const idem::audit_entry a = codec::decode_audit("fuzz: ", codec::audit_key("TX1_PAY_v1", 7), value);
        if (a.key != "TX1_PAY_v1" || a.sequence != 7) std::abort();
    } catch (const idem::error& e) {
        if (e.kind() != idem::errc::corrupt_record) std::abort();
    }
    try {
        (void)codec::decode_audit("fuzz: ", value, value);  // the input as an audit key, too
    } catch (const idem::error& e) {
        if (e.kind() != idem::errc::corrupt_record) std::abort();
    }
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    rocksdb_values(data, size);
    // tmpfs when there is one: the target writes and reads a fresh database for every input
    static const std::string path = std::string(::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") +
                                    "/idem_fuzz_recovery_" + std::to_string(::getpid()) + ".db";
    remove_db(path);
    reader r{data, size};
    if (build(path, r)) {
        read_back(path);
        recover(path);
    }
    remove_db(path);
    return 0;
}
