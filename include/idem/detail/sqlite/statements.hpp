// idem/detail/sqlite/statements.hpp: the statements sqlite_store runs, each with its parameters, and
// the readers of the rows they answer.
//
// Invariant: bound parameters only, never SQL built from data. The upsert keeps a record whose
// stored fence is higher than the batch's, and at the same fence keeps a terminal record (SUCCESS,
// FAILED) from going back to PROCESSING or RELEASED (detail/rows/batch_fold.hpp), while last_audit
// follows every audit row, also one whose record change the guard refuses. A row read back breaks
// no rule of detail/rows/record_rules.hpp, or it is corrupt_record naming the path, the key, the
// column and the value.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "idem/detail/assert.hpp"
#include "idem/detail/rows/audit_detail.hpp"
#include "idem/detail/rows/batch_fold.hpp"
#include "idem/detail/rows/record_rules.hpp"
#include "idem/detail/sqlite/connection.hpp"
#include "idem/key.hpp"
#include "idem/store.hpp"

namespace idem::detail::sqlite {

/// The columns read_record() reads, in its order.
inline constexpr const char* select_records =
    "SELECT idempotent_key, biz_type, status, fencing_token, lease_until, outcome, request_fingerprint, "
    "created_time, updated_time, payload FROM idempotent_record";

/// The claims in flight, through the partial index of PROCESSING records (schema version 4).
inline constexpr const char* select_claims =
    "SELECT idempotent_key, biz_type, status, fencing_token, lease_until, outcome, request_fingerprint, "
    "created_time, updated_time, payload FROM idempotent_record INDEXED BY idx_idempotent_record_claims "
    "WHERE status = 'PROCESSING'";

/// The keys of the window (?1: the oldest updated_time in it), from the updated_time index alone:
/// the table is WITHOUT ROWID, so the index holds the key with the time.
inline constexpr const char* select_window_keys =
    "SELECT idempotent_key, updated_time FROM idempotent_record INDEXED BY idx_idempotent_record_updated "
    "WHERE updated_time >= ?1";

/// The record upsert, parameters ?1 .. ?13 as upsert_record() binds them. The fence guard is per
/// column rather than the upsert's WHERE, because last_audit must follow every audit row, also one
/// whose record change the guard refuses: a lower fence never overwrites a higher one, and at the
/// same fence a terminal record (SUCCESS, FAILED) is never taken back to PROCESSING or RELEASED.
[[nodiscard]] inline std::string upsert_sql() {
    static constexpr const char* guard =
        "(idempotent_record.fencing_token < excluded.fencing_token "
        "OR (idempotent_record.fencing_token = excluded.fencing_token "
        "AND (idempotent_record.status NOT IN ('SUCCESS', 'FAILED') "
        "OR excluded.status IN ('SUCCESS', 'FAILED'))))";
    auto guarded = [](const char* column, const std::string& value) {
        return std::string(column) + " = CASE WHEN " + guard + " THEN " + value + " ELSE idempotent_record." + column +
               " END";
    };
    return "INSERT INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
           "request_fingerprint, created_time, updated_time, last_audit, payload) "
           "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?10, ?8, ?11, ?13) ON CONFLICT (idempotent_key) DO UPDATE SET " +
           guarded("status", "excluded.status") + ", " + guarded("fencing_token", "excluded.fencing_token") + ", " +
           guarded("outcome", "excluded.outcome") + ", " + guarded("payload", "excluded.payload") + ", " +
           // The claim's lease and fingerprint only when the claim's own fence (?12) reaches
           // the stored one (detail/rows/batch_fold.hpp).
           guarded("lease_until",
                   "CASE WHEN ?9 AND idempotent_record.fencing_token <= ?12 THEN excluded.lease_until "
                   "ELSE idempotent_record.lease_until END") +
           ", " +
           guarded("request_fingerprint",
                   "CASE WHEN ?9 AND idempotent_record.fencing_token <= ?12 THEN "
                   "excluded.request_fingerprint ELSE idempotent_record.request_fingerprint END") +
           ", " + guarded("updated_time", "excluded.updated_time") + ", last_audit = excluded.last_audit";
}

/// The insert of a record the file does not hold yet: the upsert's VALUES, bound alike
/// (upsert_record), with nothing done when the key is there (sqlite3_changes() then says 0).
[[nodiscard]] inline std::string insert_new_sql() {
    return "INSERT INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
           "request_fingerprint, created_time, updated_time, last_audit, payload) "
           "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?10, ?8, ?11, ?13) ON CONFLICT (idempotent_key) DO NOTHING";
}

/// The statements every batch runs, prepared at each open and finalized before the connection closes.
struct batch_statements {
    sqlite3_stmt* audit = nullptr;       // insert one audit row
    sqlite3_stmt* upsert = nullptr;      // write one key's record (upsert_sql)
    sqlite3_stmt* batch = nullptr;       // record the batch id (committed())
    sqlite3_stmt* sequence = nullptr;    // advance idem_schema.next_sequence, raise max_fence
    sqlite3_stmt* last_audit = nullptr;  // a key's latest audit row
    sqlite3_stmt* insert_new = nullptr;  // a record the file does not hold yet (insert_new_sql)

    batch_statements() = default;
    batch_statements(const batch_statements&) = delete;
    batch_statements& operator=(const batch_statements&) = delete;
    ~batch_statements() { finalize(); }

    void prepare(connection& c) {
        audit = c.prepare(
            "INSERT INTO idempotent_audit (idempotent_key, from_status, to_status, fencing_token, node, at_time, "
            "detail, sequence, previous) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
        last_audit = c.prepare("SELECT last_audit FROM idempotent_record WHERE idempotent_key = ?1");
        // The next sequence is kept in idem_schema and advanced in each batch's transaction
        // (MAX(sequence) would do as well now that sequence is the rowid; version 1 needed it).
        // With it, the largest fence written (version 4: max_fence() reads one row).
        sequence = c.prepare("UPDATE idem_schema SET next_sequence = ?1, max_fence = MAX(max_fence, ?2)");
        upsert = c.prepare(upsert_sql().c_str());
        insert_new = c.prepare(insert_new_sql().c_str());
        batch = c.prepare("INSERT INTO idempotent_batch (batch_id, committed_time) VALUES (?1, ?2)");
    }
    void finalize() noexcept {
        for (sqlite3_stmt** s : {&audit, &upsert, &batch, &sequence, &last_audit, &insert_new}) {
            sqlite3_finalize(*s);
            *s = nullptr;
        }
    }
};

/// Inserts the audit row of `r`: number `sequence`, chained to the key's `previous` row.
inline void insert_audit(connection& c, sqlite3_stmt* a, const store_row& r, std::string_view node, std::int64_t sequence,
                         std::int64_t previous) {
    const auto k = r.t.k.view();
    sqlite3_reset(a);
    sqlite3_bind_text(a, 1, k.data(), static_cast<int>(k.size()), SQLITE_STATIC);
    sqlite3_bind_text(a, 2, status_text(r.t.from), -1, SQLITE_STATIC);
    sqlite3_bind_text(a, 3, status_text(r.t.to), -1, SQLITE_STATIC);
    sqlite3_bind_int64(a, 4, static_cast<std::int64_t>(r.t.fence));
    sqlite3_bind_text(a, 5, node.data(), static_cast<int>(node.size()), SQLITE_STATIC);
    sqlite3_bind_int64(a, 6, r.at_ms);
    // The payload's length and hash, not its bytes, formatted in place (detail/rows/audit_detail.hpp).
    const rows::detail_text detail(r.t.cause, r.t.outcome, r.t.payload);
    sqlite3_bind_text(a, 7, detail.data(), static_cast<int>(detail.size()), SQLITE_TRANSIENT);
    sqlite3_bind_int64(a, 8, sequence);
    sqlite3_bind_int64(a, 9, previous);
    c.step_done(a, "insert audit row");
}

/// Binds the fold `kf` of one key to `u` (upsert_sql or insert_new_sql, parameters ?1 .. ?13) and
/// steps it; `last_audit` is the key's latest audit row, written in this batch. Returns how many
/// rows it changed (insert_new: 0 when the file holds the key).
inline int write_record(connection& c, sqlite3_stmt* u, const rows::key_fold& kf, std::int64_t last_audit,
                        const char* step) {
    IDEM_ASSERT(last_audit > 0, "a folded key's record points at the audit row its batch wrote last");
    const store_row& last = *kf.last;
    const store_row* claim = kf.proc;
    const auto k = kf.key();
    sqlite3_reset(u);
    const std::string biz = biz_type_of(k);
    sqlite3_bind_text(u, 1, k.data(), static_cast<int>(k.size()), SQLITE_STATIC);
    sqlite3_bind_text(u, 2, biz.data(), static_cast<int>(biz.size()), SQLITE_TRANSIENT);
    sqlite3_bind_text(u, 3, status_text(last.t.to), -1, SQLITE_STATIC);
    sqlite3_bind_int64(u, 4, static_cast<std::int64_t>(last.t.fence));
    sqlite3_bind_int64(u, 5, claim ? claim->lease_until_ms : 0);
    sqlite3_bind_int64(u, 6, static_cast<std::int64_t>(last.t.outcome));
    sqlite3_bind_int64(u, 7, static_cast<std::int64_t>(claim ? claim->t.fingerprint : 0));
    sqlite3_bind_int64(u, 8, last.at_ms);
    sqlite3_bind_int(u, 9, claim ? 1 : 0);
    sqlite3_bind_int64(u, 10, kf.first->at_ms);
    sqlite3_bind_int64(u, 11, last_audit);
    sqlite3_bind_int64(u, 12, claim ? static_cast<std::int64_t>(claim->t.fence) : 0);
    // A blob with its length, never text: NUL and invalid UTF-8 round-trip byte for byte.
    // (A null pointer would bind NULL, which the NOT NULL column refuses: none is x''.)
    const std::string_view payload = last.t.payload;
    if (payload.empty()) sqlite3_bind_zeroblob(u, 13, 0);
    else sqlite3_bind_blob64(u, 13, payload.data(), payload.size(), SQLITE_STATIC);
    c.step_done(u, step);
    return sqlite3_changes(c.handle());
}

/// Writes the fold `kf` of one key (its guard is in the statement: the stored record is in the
/// file); `last_audit` is the key's latest audit row, written in this batch.
inline void upsert_record(connection& c, sqlite3_stmt* u, const rows::key_fold& kf, std::int64_t last_audit) {
    (void)write_record(c, u, kf, last_audit, "upsert record");
}

/// Inserts the fold `kf` of a key the file does not hold (the guard has nothing to compare it
/// with): true when it was inserted, false when the file holds the key (nothing changed).
[[nodiscard]] inline bool insert_new_record(connection& c, sqlite3_stmt* u, const rows::key_fold& kf,
                                            std::int64_t last_audit) {
    return write_record(c, u, kf, last_audit, "insert new record") == 1;
}

/// The key's latest audit row (its record's last_audit), 0 when it has no record.
[[nodiscard]] inline std::int64_t last_audit(connection& c, sqlite3_stmt* s, std::string_view key) {
    sqlite3_reset(s);
    sqlite3_bind_text(s, 1, key.data(), static_cast<int>(key.size()), SQLITE_STATIC);
    const int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) return 0;
    if (rc != SQLITE_ROW) c.fail(rc, "read the key's latest audit row");
    const std::int64_t at = c.integer(s, 0, "record '" + key::printable(key) + "'");
    sqlite3_reset(s);
    return at;
}

/// The record in the current row of a statement that selects select_records' columns.
[[nodiscard]] inline stored_record read_record(const connection& c, sqlite3_stmt* s) {
    IDEM_ASSERT(sqlite3_column_count(s) == 10, "read_record reads the ten columns of select_records, in order");
    stored_record r;
    r.key = connection::text(s, 0);
    r.biz_type = connection::text(s, 1);
    if (std::string why = rows::key_fault(r.key); !why.empty()) throw error(errc::corrupt_record, c.where() + why);
    const auto corrupt = [&](const std::string& rule) {
        return error(errc::corrupt_record, c.where() + "record '" + key::printable(r.key) + "': " + rule);
    };
    std::string why;
    const auto st = rows::checked_status(connection::text(s, 2), true, &why);
    if (!st) throw corrupt(why);
    r.state = *st;
    const auto row = [&r] { return "record '" + key::printable(r.key) + "'"; };
    const std::int64_t fence = c.integer(s, 3, row);
    if (std::string bad = rows::fence_fault(fence); !bad.empty()) throw corrupt(bad);
    r.fence = static_cast<std::uint64_t>(fence);
    r.lease_until_ms = c.integer(s, 4, row);
    r.outcome = static_cast<std::uint64_t>(c.integer(s, 5, row));
    r.fingerprint = static_cast<std::uint64_t>(c.integer(s, 6, row));
    r.created_ms = c.integer(s, 7, row);
    r.updated_ms = c.integer(s, 8, row);
    // Read as a blob whatever its type (a text written by hand is its bytes); NULL, which no
    // writer of the NOT NULL column produces, is damage.
    if (sqlite3_column_type(s, 9) == SQLITE_NULL) throw corrupt("payload is NULL; the column holds bytes (x'' for none)");
    const auto* bytes = static_cast<const char*>(sqlite3_column_blob(s, 9));
    const auto size = static_cast<std::size_t>(sqlite3_column_bytes(s, 9));
    if (std::string bad = rows::payload_fault(size); !bad.empty()) throw corrupt(bad);
    if (size > 0) r.payload.assign(bytes, size);
    return r;
}

/// Calls fn(row, previous) for each audit row `clause` selects; ?1 is bound to `key` or, without
/// one, to `sequence` (when not 0).
template <class Fn>
void scan_audit_rows(connection& c, std::string_view clause, std::optional<std::string_view> key, Fn&& fn,
                     std::int64_t sequence = 0) {
    const std::string sql = std::string(
                                "SELECT sequence, idempotent_key, from_status, to_status, fencing_token, node, "
                                "at_time, detail, previous FROM idempotent_audit ") +
                            std::string(clause);
    statement s(c, sql);
    if (key) sqlite3_bind_text(s.s, 1, key->data(), static_cast<int>(key->size()), SQLITE_TRANSIENT);
    else if (sequence != 0) sqlite3_bind_int64(s.s, 1, sequence);
    int rc;
    while ((rc = sqlite3_step(s.s)) == SQLITE_ROW) {
        audit_entry a;
        a.key = connection::text(s.s, 1);
        a.sequence = c.integer(s.s, 0, "an audit row of key '" + key::printable(a.key) + "'");
        const std::string row = "audit row " + std::to_string(a.sequence) + " (key '" + key::printable(a.key) + "')";
        std::string why;
        const auto from = rows::checked_status(connection::text(s.s, 2), false, &why, "from_status");
        const auto to = from ? rows::checked_status(connection::text(s.s, 3), false, &why, "to_status") : from;
        if (!from || !to) throw error(errc::corrupt_record, c.where() + row + " has an unknown status: " + why);
        a.from = *from;
        a.to = *to;
        a.fence = static_cast<std::uint64_t>(c.integer(s.s, 4, row));
        a.node = connection::text(s.s, 5);
        a.at_ms = c.integer(s.s, 6, row);
        a.detail = connection::text(s.s, 7);
        fn(a, c.integer(s.s, 8, row));
    }
    if (rc != SQLITE_DONE) c.fail(rc, "read audit trail");
}

}  // namespace idem::detail::sqlite
