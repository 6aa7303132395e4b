// idem/sqlite_store.hpp: the embedded default store (target idem::sqlite; links libsqlite3).
//
// One database file in WAL mode. Each flush batch is one BEGIN IMMEDIATE ... COMMIT transaction
// with prepared statements and bound parameters only. synchronous=FULL when the pipeline runs in
// sync mode (a commit survives power loss), NORMAL in async mode (a commit survives a process
// crash; the last commits may roll back on power loss, which async mode already allows).
// Thread-safety: one thread at a time (the flusher); the connection is opened with
// SQLITE_OPEN_NOMUTEX.
#pragma once

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "idem/key.hpp"
#include "idem/store.hpp"

namespace idem {

class sqlite_store final : public store {
public:
    /// Opens (creating if needed) the database at `path` and its schema. Throws idem::error
    /// (store_unavailable) naming the path and SQLite's message.
    explicit sqlite_store(std::string path, bool full_sync = true,
                          std::chrono::milliseconds busy_timeout = std::chrono::milliseconds(5000))
        : path_(std::move(path)), full_sync_(full_sync), busy_timeout_(busy_timeout) {
        open();
    }
    ~sqlite_store() override { close(); }
    sqlite_store(const sqlite_store&) = delete;
    sqlite_store& operator=(const sqlite_store&) = delete;

    static constexpr int schema_version = 1;

    void apply(std::span<const store_row> rows, std::uint64_t batch_id) override {
        ensure_open();
        exec("BEGIN IMMEDIATE", "begin batch");
        std::int64_t sequence = next_sequence_;
        try {
            sqlite3_stmt* b = batch_stmt_;
            sqlite3_reset(b);
            sqlite3_bind_int64(b, 1, static_cast<std::int64_t>(batch_id));
            sqlite3_bind_int64(b, 2, rows.empty() ? 0 : rows.back().at_ms);
            step_done(b, "insert batch id");
            std::size_t first_of_key = 0;        // the key's first row in this batch (created_time)
            const store_row* claim = nullptr;    // the key's last PROCESSING row (lease, fingerprint)
            for (std::size_t i = 0; i < rows.size(); ++i) {
                const store_row& r = rows[i];
                const auto k = r.t.k.view();
                if (i == 0 || rows[i - 1].t.k.view() != k) {
                    first_of_key = i;
                    claim = nullptr;
                }
                if (r.t.to == record_state::processing) claim = &r;
                sqlite3_stmt* a = audit_stmt_;
                sqlite3_reset(a);
                sqlite3_bind_text(a, 1, k.data(), static_cast<int>(k.size()), SQLITE_STATIC);
                sqlite3_bind_text(a, 2, status_text(r.t.from), -1, SQLITE_STATIC);
                sqlite3_bind_text(a, 3, status_text(r.t.to), -1, SQLITE_STATIC);
                sqlite3_bind_int64(a, 4, static_cast<std::int64_t>(r.t.fence));
                sqlite3_bind_text(a, 5, node_.data(), static_cast<int>(node_.size()), SQLITE_STATIC);
                sqlite3_bind_int64(a, 6, r.at_ms);
                char detail[48];
                const int n = std::snprintf(detail, sizeof detail, "%s outcome=%llu", to_string(r.t.cause),
                                            static_cast<unsigned long long>(r.t.outcome));
                sqlite3_bind_text(a, 7, detail, n, SQLITE_TRANSIENT);
                sqlite3_bind_int64(a, 8, sequence++);
                step_done(a, "insert audit row");
                const bool last_of_key = i + 1 == rows.size() || rows[i + 1].t.k.view() != k;
                if (!last_of_key) continue;
                // One upsert per key with the batch's net effect, as if the rows were applied one by
                // one: state, fence and outcome from the last row; lease and fingerprint from the
                // last claim in the batch (else kept); created_time from the first row.
                sqlite3_stmt* u = upsert_stmt_;
                sqlite3_reset(u);
                const std::string biz = biz_type_of(k);
                sqlite3_bind_text(u, 1, k.data(), static_cast<int>(k.size()), SQLITE_STATIC);
                sqlite3_bind_text(u, 2, biz.data(), static_cast<int>(biz.size()), SQLITE_TRANSIENT);
                sqlite3_bind_text(u, 3, status_text(r.t.to), -1, SQLITE_STATIC);
                sqlite3_bind_int64(u, 4, static_cast<std::int64_t>(r.t.fence));
                sqlite3_bind_int64(u, 5, claim ? claim->lease_until_ms : 0);
                sqlite3_bind_int64(u, 6, static_cast<std::int64_t>(r.t.outcome));
                sqlite3_bind_int64(u, 7, static_cast<std::int64_t>(claim ? claim->t.fingerprint : 0));
                sqlite3_bind_int64(u, 8, r.at_ms);
                sqlite3_bind_int(u, 9, claim ? 1 : 0);
                sqlite3_bind_int64(u, 10, rows[first_of_key].at_ms);
                step_done(u, "upsert record");
            }
            sqlite3_reset(sequence_stmt_);
            sqlite3_bind_int64(sequence_stmt_, 1, sequence);
            step_done(sequence_stmt_, "advance audit sequence");
            exec("COMMIT", "commit batch");
            next_sequence_ = sequence;
        } catch (...) {
            sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
            throw;
        }
    }

    bool committed(std::uint64_t batch_id) override {
        ensure_open();
        sqlite3_stmt* s = prepare("SELECT 1 FROM idempotent_batch WHERE batch_id = ?1");
        sqlite3_bind_int64(s, 1, static_cast<std::int64_t>(batch_id));
        const int rc = sqlite3_step(s);
        sqlite3_finalize(s);
        if (rc != SQLITE_ROW && rc != SQLITE_DONE) fail(rc, "check batch id");
        return rc == SQLITE_ROW;
    }

    void load(const std::function<void(const stored_record&)>& fn) override {
        ensure_open();
        sqlite3_stmt* s = prepare(
            "SELECT idempotent_key, biz_type, status, fencing_token, lease_until, outcome, request_fingerprint, "
            "created_time, updated_time FROM idempotent_record");
        try {
            int rc;
            while ((rc = sqlite3_step(s)) == SQLITE_ROW) fn(read_record(s));
            if (rc != SQLITE_DONE) fail(rc, "load records");
        } catch (...) {
            sqlite3_finalize(s);
            throw;
        }
        sqlite3_finalize(s);
    }

    std::optional<stored_record> get(std::string_view key) override {
        ensure_open();
        sqlite3_stmt* s = prepare(
            "SELECT idempotent_key, biz_type, status, fencing_token, lease_until, outcome, request_fingerprint, "
            "created_time, updated_time FROM idempotent_record WHERE idempotent_key = ?1");
        sqlite3_bind_text(s, 1, key.data(), static_cast<int>(key.size()), SQLITE_TRANSIENT);
        std::optional<stored_record> out;
        try {
            const int rc = sqlite3_step(s);
            if (rc == SQLITE_ROW) out = read_record(s);
            else if (rc != SQLITE_DONE) fail(rc, "read record");
        } catch (...) {
            sqlite3_finalize(s);
            throw;
        }
        sqlite3_finalize(s);
        return out;
    }

    std::vector<audit_entry> audit(std::string_view key) override {
        ensure_open();
        std::vector<audit_entry> out;
        scan_audit_where("WHERE idempotent_key = ?1 ORDER BY idempotent_key, sequence", key, [&](const audit_entry& a) { out.push_back(a); });
        return out;
    }

    void scan_audit(const std::function<void(const audit_entry&)>& fn) override {
        ensure_open();
        scan_audit_where("ORDER BY idempotent_key, sequence", {}, fn);
    }

    std::uint64_t max_fence() override {
        ensure_open();
        sqlite3_stmt* s = prepare("SELECT COALESCE(MAX(fencing_token), 0) FROM idempotent_record");
        const int rc = sqlite3_step(s);
        const auto v = rc == SQLITE_ROW ? static_cast<std::uint64_t>(sqlite3_column_int64(s, 0)) : 0;
        sqlite3_finalize(s);
        if (rc != SQLITE_ROW) fail(rc, "read max fence");
        return v;
    }

    void reconnect() override {
        close();
        open();
    }

    std::string name() const override { return "sqlite:" + path_; }

private:
    /// After a failed reconnect the handle is gone: reopen, so the caller sees the real cause.
    void ensure_open() {
        if (db_ == nullptr) open();
    }

    void open() {
        const int rc = sqlite3_open_v2(path_.c_str(), &db_,
                                       SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
        if (rc != SQLITE_OK) {
            std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
            close();
            throw error(errc::store_unavailable, "sqlite:" + path_ + ": cannot open database: " + msg);
        }
        try {
            sqlite3_busy_timeout(db_, static_cast<int>(busy_timeout_.count()));
            sqlite3_extended_result_codes(db_, 1);
            exec("PRAGMA journal_mode=WAL", "enable WAL");
            exec(full_sync_ ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL", "set synchronous");
            exec("PRAGMA cache_size=-65536", "set cache size");
            exec("BEGIN IMMEDIATE", "begin schema");
            exec(R"SQL(
CREATE TABLE IF NOT EXISTS idem_schema (version INTEGER NOT NULL, next_sequence BIGINT NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS idempotent_record (
  idempotent_key      VARCHAR(128) PRIMARY KEY,
  biz_type            VARCHAR(32)  NOT NULL,
  status              VARCHAR(16)  NOT NULL CHECK (status IN ('PROCESSING','SUCCESS','FAILED','RELEASED')),
  fencing_token       BIGINT       NOT NULL,
  lease_until         BIGINT       NOT NULL,
  outcome             BIGINT       NOT NULL,
  request_fingerprint BIGINT       NOT NULL,
  created_time        BIGINT       NOT NULL,
  updated_time        BIGINT       NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idx_idempotent_record_biz_status ON idempotent_record (biz_type, status);
CREATE TABLE IF NOT EXISTS idempotent_audit (
  sequence       BIGINT       NOT NULL,
  idempotent_key VARCHAR(128) NOT NULL,
  from_status    VARCHAR(16)  NOT NULL,
  to_status      VARCHAR(16)  NOT NULL,
  fencing_token  BIGINT       NOT NULL,
  node           VARCHAR(64)  NOT NULL,
  at_time        BIGINT       NOT NULL,
  detail         TEXT         NOT NULL,
  PRIMARY KEY (idempotent_key, sequence)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotent_batch (batch_id BIGINT PRIMARY KEY, committed_time BIGINT NOT NULL);
)SQL",
                 "create schema");
            sqlite3_stmt* v = prepare("SELECT version FROM idem_schema");
            int rc2 = sqlite3_step(v);
            const int version = rc2 == SQLITE_ROW ? sqlite3_column_int(v, 0) : 0;
            sqlite3_finalize(v);
            if (rc2 == SQLITE_DONE) exec("INSERT INTO idem_schema (version) VALUES (1)", "record schema version");
            else if (version != schema_version)
                throw error(errc::store_error, "sqlite:" + path_ + ": schema version " + std::to_string(version) +
                                                   " is not the supported version 1");
            exec("COMMIT", "commit schema");
            audit_stmt_ = prepare(
                "INSERT INTO idempotent_audit (idempotent_key, from_status, to_status, fencing_token, node, at_time, "
                "detail, sequence) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
            // The audit table is keyed by (key, sequence), so MAX(sequence) would scan it: the next
            // sequence is kept in idem_schema and advanced in each batch's transaction.
            sqlite3_stmt* m = prepare("SELECT next_sequence FROM idem_schema");
            rc2 = sqlite3_step(m);
            next_sequence_ = rc2 == SQLITE_ROW ? sqlite3_column_int64(m, 0) : 1;
            sqlite3_finalize(m);
            // Each batch numbers its audit rows from here with ++: a counter no real history reaches
            // (2^62 transitions) can only come from a damaged file, and would overflow.
            if (next_sequence_ < 1 || next_sequence_ > (std::int64_t{1} << 62))
                throw error(errc::corrupt_record, "sqlite:" + path_ + ": idem_schema.next_sequence is " +
                                                      std::to_string(next_sequence_) +
                                                      "; it must be between 1 and 2^62 (damaged file?)");
            sequence_stmt_ = prepare("UPDATE idem_schema SET next_sequence = ?1");
            upsert_stmt_ = prepare(
                "INSERT INTO idempotent_record (idempotent_key, biz_type, status, fencing_token, lease_until, outcome, "
                "request_fingerprint, created_time, updated_time) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?10, ?8) "
                "ON CONFLICT (idempotent_key) DO UPDATE SET status = excluded.status, "
                "fencing_token = excluded.fencing_token, outcome = excluded.outcome, "
                "lease_until = CASE WHEN ?9 THEN excluded.lease_until ELSE idempotent_record.lease_until END, "
                "request_fingerprint = CASE WHEN ?9 THEN excluded.request_fingerprint "
                "ELSE idempotent_record.request_fingerprint END, updated_time = excluded.updated_time "
                "WHERE idempotent_record.fencing_token <= excluded.fencing_token");
            batch_stmt_ = prepare("INSERT INTO idempotent_batch (batch_id, committed_time) VALUES (?1, ?2)");
        } catch (...) {
            sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
            close();
            throw;
        }
    }

    void close() noexcept {
        for (sqlite3_stmt** s : {&audit_stmt_, &upsert_stmt_, &batch_stmt_, &sequence_stmt_}) {
            sqlite3_finalize(*s);
            *s = nullptr;
        }
        if (db_) sqlite3_close_v2(db_);
        db_ = nullptr;
    }

    [[noreturn]] void fail(int rc, const char* step) const {
        const int primary = rc & 0xff;
        const std::string msg = "sqlite:" + path_ + ": " + step + " failed: " + (db_ ? sqlite3_errmsg(db_) : "") +
                                " (" + sqlite3_errstr(rc) + ")";
        if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED || primary == SQLITE_CANTOPEN)
            throw error(errc::store_unavailable, msg);
        throw error(errc::store_error, msg);  // SQLITE_FULL (disk full), SQLITE_IOERR, ...
    }

    void exec(const char* sql, const char* step) {
        const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
        if (rc != SQLITE_OK) fail(rc, step);
    }

    sqlite3_stmt* prepare(const char* sql) {
        sqlite3_stmt* s = nullptr;
        const int rc = sqlite3_prepare_v2(db_, sql, -1, &s, nullptr);
        if (rc != SQLITE_OK) fail(rc, "prepare statement");
        return s;
    }

    void step_done(sqlite3_stmt* s, const char* step) {
        const int rc = sqlite3_step(s);
        if (rc != SQLITE_DONE) fail(rc, step);
    }

    static std::string text(sqlite3_stmt* s, int col) {
        const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, col));
        return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(s, col))) : std::string();
    }

    stored_record read_record(sqlite3_stmt* s) const {
        stored_record r;
        r.key = text(s, 0);
        r.biz_type = text(s, 1);
        const std::string status = text(s, 2);
        std::string why;
        if (!key::check(r.key, "stored key", &why))
            throw error(errc::corrupt_record, "sqlite:" + path_ + ": " + why);
        const auto st = parse_status(status);
        if (!st || *st == record_state::absent)
            throw error(errc::corrupt_record, "sqlite:" + path_ + ": record '" + key::printable(r.key) +
                                                  "' has status '" + key::printable(status) +
                                                  "'; expected PROCESSING, SUCCESS, FAILED or RELEASED");
        r.state = *st;
        r.fence = static_cast<std::uint64_t>(sqlite3_column_int64(s, 3));
        if (r.fence == 0 || r.fence >= (1ull << 52))
            throw error(errc::corrupt_record, "sqlite:" + path_ + ": record '" + key::printable(r.key) +
                                                  "' has fencing_token " + std::to_string(r.fence) +
                                                  "; expected 1 .. 2^52-1");
        r.lease_until_ms = sqlite3_column_int64(s, 4);
        r.outcome = static_cast<std::uint64_t>(sqlite3_column_int64(s, 5));
        r.fingerprint = static_cast<std::uint64_t>(sqlite3_column_int64(s, 6));
        r.created_ms = sqlite3_column_int64(s, 7);
        r.updated_ms = sqlite3_column_int64(s, 8);
        return r;
    }

    template <class Fn>
    void scan_audit_where(const char* where, std::optional<std::string_view> key, Fn&& fn) {
        const std::string sql = std::string(
                                    "SELECT sequence, idempotent_key, from_status, to_status, fencing_token, node, "
                                    "at_time, detail FROM idempotent_audit ") +
                                where;
        sqlite3_stmt* s = prepare(sql.c_str());
        if (key) sqlite3_bind_text(s, 1, key->data(), static_cast<int>(key->size()), SQLITE_TRANSIENT);
        try {
            int rc;
            while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
                audit_entry a;
                a.sequence = sqlite3_column_int64(s, 0);
                a.key = text(s, 1);
                const auto from = parse_status(text(s, 2));
                const auto to = parse_status(text(s, 3));
                if (!from || !to)
                    throw error(errc::corrupt_record, "sqlite:" + path_ + ": audit row " + std::to_string(a.sequence) +
                                                          " has an unknown status");
                a.from = *from;
                a.to = *to;
                a.fence = static_cast<std::uint64_t>(sqlite3_column_int64(s, 4));
                a.node = text(s, 5);
                a.at_ms = sqlite3_column_int64(s, 6);
                a.detail = text(s, 7);
                fn(a);
            }
            if (rc != SQLITE_DONE) fail(rc, "read audit trail");
        } catch (...) {
            sqlite3_finalize(s);
            throw;
        }
        sqlite3_finalize(s);
    }

    std::string path_;
    bool full_sync_;
    std::chrono::milliseconds busy_timeout_;
    sqlite3* db_ = nullptr;
    sqlite3_stmt* audit_stmt_ = nullptr;
    sqlite3_stmt* upsert_stmt_ = nullptr;
    sqlite3_stmt* batch_stmt_ = nullptr;
    sqlite3_stmt* sequence_stmt_ = nullptr;
    std::int64_t next_sequence_ = 1;  // audit sequence: this store is the file's only writer
};

}  // namespace idem
