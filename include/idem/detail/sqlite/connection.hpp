// idem/detail/sqlite/connection.hpp: one SQLite connection of sqlite_store, its error rules and its
// column readers.
//
// Invariant: every SQLite failure becomes an idem::error naming the path and the step, classified
// here and only here: a damaged file (SQLITE_CORRUPT, SQLITE_NOTADB) is corrupt_record wherever it
// shows (open, recovery, a read, verify); while the store opens, a failure to open or write the file
// that the file system explains is invalid_argument (a configuration fault: retrying cannot help);
// busy, locked or cannot open is store_unavailable; anything else (disk full, I/O error) is
// store_error. An integer column holds an integer, or its row is corrupt_record naming the row, the
// column and the value: nothing is ever read as 0.
// Thread-safety: one thread at a time (the connection is opened with SQLITE_OPEN_NOMUTEX).
#pragma once

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <type_traits>

#include "idem/detail/assert.hpp"
#include "idem/detail/sqlite/paths.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"

namespace idem::detail::sqlite {

class connection {
public:
    /// `temporary`: "" or ":memory:" (paths.hpp), which has no file to check for faults.
    connection(std::string path, bool temporary) : path_(std::move(path)), temporary_(temporary) {}
    ~connection() { close(); }
    connection(const connection&) = delete;
    connection& operator=(const connection&) = delete;

    /// While one lives (the store's open()), failures are first checked for a configuration fault.
    class opening_scope {
    public:
        explicit opening_scope(connection& c) noexcept : c_(c) { c_.opening_ = true; }
        ~opening_scope() { c_.opening_ = false; }
        opening_scope(const opening_scope&) = delete;
        opening_scope& operator=(const opening_scope&) = delete;

    private:
        connection& c_;
    };

    [[nodiscard]] sqlite3* handle() const noexcept { return db_; }
    [[nodiscard]] bool is_open() const noexcept { return db_ != nullptr; }
    [[nodiscard]] std::string where() const { return sqlite::where(path_); }

    /// Opens the handle read-write; `create` lets SQLite create a missing file (only a store's first
    /// open may: a reopen that found nothing at the path would start a new, empty history there).
    void open(bool create) {
        const int rc = sqlite3_open_v2(
            path_.c_str(), &db_, SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX, nullptr);
        if (rc != SQLITE_OK) {
            std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
            close();
            raise(rc, "cannot open database: " + msg);
        }
    }

    /// The settings of an open handle: WAL, synchronous FULL or NORMAL, the busy timeout.
    void configure(bool full_sync, std::chrono::milliseconds busy_timeout) {
        // SQLite falls back to read-only when it cannot open the file for writing; every batch
        // would then fail. Refuse here, where the cause can still be named.
        if (sqlite3_db_readonly(db_, "main") == 1)
            raise(SQLITE_READONLY, std::string("cannot open database for writing: ") + sqlite3_errstr(SQLITE_READONLY));
        sqlite3_busy_timeout(db_, static_cast<int>(busy_timeout.count()));
        sqlite3_extended_result_codes(db_, 1);
        exec("PRAGMA journal_mode=WAL", "enable WAL");
        exec(full_sync ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL", "set synchronous");
        exec("PRAGMA cache_size=-65536", "set cache size");
        // With random keys a batch dirties more pages than the default 1,000-page checkpoint
        // threshold, which then checkpointed (and fsynced) after every batch.
        exec("PRAGMA wal_autocheckpoint=16384", "set checkpoint threshold");
    }

    /// Closes the handle. Statements still prepared on it must be finalized first.
    void close() noexcept {
        if (db_) sqlite3_close_v2(db_);
        db_ = nullptr;
    }

    void exec(const char* sql, const char* step) {
        IDEM_ASSERT(db_ != nullptr, "a statement runs only on an open connection (the store's ensure_open)");
        const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
        if (rc != SQLITE_OK) fail(rc, step);
    }

    /// Ends a failed transaction; its own failure is not news (the first one is being thrown).
    void rollback() noexcept { sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr); }

    [[nodiscard]] sqlite3_stmt* prepare(const char* sql) {
        IDEM_ASSERT(db_ != nullptr, "a statement is prepared only on an open connection (the store's ensure_open)");
        sqlite3_stmt* s = nullptr;
        const int rc = sqlite3_prepare_v2(db_, sql, -1, &s, nullptr);
        if (rc != SQLITE_OK) fail(rc, "prepare statement");
        return s;
    }

    void step_done(sqlite3_stmt* s, const char* step) {
        const int rc = sqlite3_step(s);
        if (rc != SQLITE_DONE) fail(rc, step);
    }

    [[noreturn]] void fail(int rc, const char* step) const {
        raise(rc, std::string(step) + " failed: " + (db_ ? sqlite3_errmsg(db_) : "") + " (" + sqlite3_errstr(rc) + ")");
    }

    /// Throws the error for SQLite result `rc`, with `cause` after the path. While opening, a
    /// failure to open or write the file is first checked against the file system: a
    /// configuration fault found there is invalid_argument (retrying cannot help), not an outage.
    [[noreturn]] void raise(int rc, const std::string& cause) const {
        const int primary = rc & 0xff;
        const std::string where = this->where();
        if (opening_ && !temporary_ &&
            (primary == SQLITE_CANTOPEN || primary == SQLITE_READONLY || primary == SQLITE_PERM ||
             primary == SQLITE_IOERR)) {
            const std::string fault = configuration_fault(path_);
            if (!fault.empty()) throw error(errc::invalid_argument, where + fault + " (SQLite: " + cause + ")");
        }
        // A damaged file is the same fault wherever it shows (open, recovery, a read, verify): data
        // the store cannot trust, not an outage a retry could end.
        if (primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB)
            throw error(errc::corrupt_record,
                        where + "the database file is damaged or is not a SQLite database (" + cause + ")");
        if (primary == SQLITE_BUSY || primary == SQLITE_LOCKED || primary == SQLITE_CANTOPEN)
            throw error(errc::store_unavailable, where + cause);
        throw error(errc::store_error, where + cause);  // SQLITE_FULL (disk full), SQLITE_IOERR, ...
    }

    /// Text column `col` of the current row ("" for NULL).
    [[nodiscard]] static std::string text(sqlite3_stmt* s, int col) {
        const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, col));
        return p ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(s, col))) : std::string();
    }

    /// Integer column `col` of a row of `table`. The columns are declared BIGINT (integer affinity),
    /// so a value SQLite could not store as an integer (text such as 'abc', a real, a blob) stays
    /// what it is: reading it as 0 would hide the damage, so it is refused as corrupt_record naming
    /// the row, the column and the value.
    [[nodiscard]] std::int64_t integer(sqlite3_stmt* s, int col, const std::string& row) const {
        return integer(s, col, [&] { return row; });
    }
    /// The same, naming the row only when it is refused (`row()` builds the name: recovery reads
    /// millions of rows and names none of them).
    template <class RowName>
    requires std::is_invocable_r_v<std::string, RowName>
    [[nodiscard]] std::int64_t integer(sqlite3_stmt* s, int col, RowName&& row_name) const {
        const int type = sqlite3_column_type(s, col);
        if (type == SQLITE_INTEGER) [[likely]]
            return sqlite3_column_int64(s, col);
        const std::string row = row_name();
        const char* kind = type == SQLITE_TEXT    ? "text"
                           : type == SQLITE_FLOAT ? "a real number"
                           : type == SQLITE_BLOB  ? "a blob"
                                                  : "NULL";
        std::string value = type == SQLITE_NULL ? std::string("NULL") : "'" + key::printable(text(s, col)) + "'";
        if (value.size() > 80) value = value.substr(0, 77) + "...";
        throw error(errc::corrupt_record, where() + row + " has " + sqlite3_column_name(s, col) + " = " + value + " (" +
                                              kind + "); the column holds integers only");
    }

private:
    std::string path_;
    bool temporary_;        // "" or ":memory:": no file to check for a configuration fault
    bool opening_ = false;  // inside the store's open(): failures are checked for a configuration fault
    sqlite3* db_ = nullptr;
};

/// A prepared statement, finalized at scope exit.
struct statement {
    const connection& c;
    sqlite3_stmt* s;
    statement(connection& conn, const std::string& sql) : c(conn), s(conn.prepare(sql.c_str())) {}
    ~statement() { sqlite3_finalize(s); }
    statement(const statement&) = delete;
    statement& operator=(const statement&) = delete;
    /// Steps to the one row the statement answers.
    void row(const char* step) const {
        if (const int rc = sqlite3_step(s); rc != SQLITE_ROW) c.fail(rc, step);
    }
};

}  // namespace idem::detail::sqlite
