// idem/detail/my/connection.hpp: one session with a MySQL or MariaDB server through MariaDB
// Connector/C (Debian libmariadb-dev): the URI it is opened with, the deadline every call keeps,
// how a multi-statement round trip runs and streams its rows, and how a failure is classified
// (the URI itself: uri.hpp).
//
// Invariants
//   * Every wait on the server is bounded: the server's own bounds (innodb_lock_wait_timeout,
//     max_statement_time) are the store's call deadline in whole seconds, rounded up (the unit of
//     both), set in the session's setup (detail/my/sql.hpp); the connector's connect, read and write
//     timeouts are one second more, so a wait the server bounds is answered (and undone) by the
//     server, and a stopped server or a network dropping packets gives CR_SERVER_LOST, never a hang.
//   * A round trip is one text query of several statements (CLIENT_MULTI_STATEMENTS). Every result
//     is drained, so the session is ready for the next query whatever happened; the server stops at
//     the first statement that fails, and `failure::statement` says which one it was.
//   * A session is never reconnected behind its owner's back (MYSQL_OPT_RECONNECT stays off): a
//     broken session stays broken, the store opens a new one and knows every transaction is gone.
//   * The password never reaches a message: stores name the URI without it (uri.hpp, redact()).
#pragma once

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include <sys/socket.h>

#include <errmsg.h>
#include <mysql.h>
#include <mysqld_error.h>

#include "idem/detail/my/uri.hpp"
#include "idem/error.hpp"

namespace idem::detail::my {

/// A deadline in whole seconds, rounded up, at least 1: the unit of the connector's timeouts and of
/// innodb_lock_wait_timeout.
[[nodiscard]] inline unsigned whole_seconds(std::chrono::milliseconds deadline) noexcept {
    return static_cast<unsigned>(std::max<std::int64_t>(1, (deadline.count() + 999) / 1000));
}

/// What went wrong on a session, as the server or the connector said it.
struct failure : std::exception {
    unsigned code = 0;     ///< ER_* (server, < 2000) or CR_* (connector, 2000..2999)
    std::string sqlstate;  ///< five characters
    std::string text;      ///< the message
    int statement = -1;    ///< which statement of the round trip failed (0-based), -1: none ran yet
    [[nodiscard]] const char* what() const noexcept override { return text.c_str(); }
};

/// The kinds of failure the stores tell apart (mysql_store's rethrow_translated says what each
/// becomes).
enum class failure_kind {
    lost,        ///< the session is gone or cannot be had: refused, lost, killed, timed out, shut down
    contention,  ///< a deadlock, a lock wait or a statement past the server's bounds: the session stays, the work is undone
    read_only,   ///< the server refuses writes (read_only, a replica): an outage, not a bad row
    data,        ///< what a row holds: a value its column cannot take
    durability,  ///< the batch's own check refused to commit (SIGNAL 45000 from detail/my/sql.hpp)
    other,       ///< anything else: SQL error, disk full, permissions
};

[[nodiscard]] inline failure_kind classify(const failure& f) noexcept {
    switch (f.code) {
        case CR_SERVER_GONE_ERROR:
        case CR_SERVER_LOST:
        case CR_CONNECTION_ERROR:
        case CR_CONN_HOST_ERROR:
        case CR_UNKNOWN_HOST:
        case CR_SERVER_HANDSHAKE_ERR:
        case CR_COMMANDS_OUT_OF_SYNC:
        case ER_SERVER_SHUTDOWN:
        case ER_CONNECTION_KILLED:
        case ER_CON_COUNT_ERROR:
        case ER_TOO_MANY_USER_CONNECTIONS:
        case ER_NET_READ_ERROR:
        case ER_NET_READ_INTERRUPTED:
        case ER_NET_ERROR_ON_WRITE:
        case ER_NET_WRITE_INTERRUPTED: return failure_kind::lost;
        case ER_LOCK_DEADLOCK:
        case ER_LOCK_WAIT_TIMEOUT:
        case ER_STATEMENT_TIMEOUT:  // max_statement_time: the server stopped the statement, the session stays
        case ER_QUERY_INTERRUPTED: return failure_kind::contention;
        case ER_OPTION_PREVENTS_STATEMENT:
        case ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION: return failure_kind::read_only;
        case ER_DATA_TOO_LONG:
        case ER_WARN_DATA_OUT_OF_RANGE:
        case ER_TRUNCATED_WRONG_VALUE:
        case ER_TRUNCATED_WRONG_VALUE_FOR_FIELD:
        case ER_BAD_NULL_ERROR:
        case ER_DUP_ENTRY:
        case ER_NET_PACKET_TOO_LARGE: return failure_kind::data;
        case ER_SIGNAL_EXCEPTION: return f.sqlstate == "45000" ? failure_kind::durability : failure_kind::other;
        default: break;
    }
    if (f.code >= 2000 && f.code < 3000) return failure_kind::lost;  // the connector's own: the session is unusable
    return failure_kind::other;
}

/// One row of a result, column texts (a NULL reads as an empty view with data() == nullptr).
using row_view = std::span<const std::string_view>;
using row_fn = std::function<void(int statement, row_view)>;

/// One session with the server. Not thread-safe (a store is used by one thread at a time).
class session {
public:
    session() = default;
    session(const session&) = delete;
    session& operator=(const session&) = delete;
    ~session() { close(); }

    /// Opens a session to `e` with every wait bounded by `deadline` (rounded up to seconds).
    /// Throws failure when the server cannot be reached or refuses.
    void open(const endpoint& e, std::chrono::milliseconds deadline) {
        close();
        MYSQL* m = mysql_init(nullptr);
        if (m == nullptr) throw failure_of(nullptr, "mysql_init: out of memory");
        my_.reset(m);
        // One second more than the server's own bounds (whole_seconds(deadline), set in the session's
        // setup): a lock wait or a statement past them is answered by the server, which undoes it,
        // rather than cut by the client, which could not tell what happened.
        const unsigned secs = whole_seconds(deadline) + 1;
        mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &secs);
        mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &secs);
        mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &secs);
        const my_bool no = 0;
        mysql_options(m, MYSQL_OPT_RECONNECT, &no);
        mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
        // A hostname of "localhost" would make the connector use the Unix socket; a URI names TCP.
        const std::string host = e.host == "localhost" ? "127.0.0.1" : e.host;
        if (mysql_real_connect(m, host.c_str(), e.user.c_str(), e.password.empty() ? nullptr : e.password.c_str(),
                               e.database.c_str(), e.port, nullptr,
                               CLIENT_MULTI_STATEMENTS | CLIENT_FOUND_ROWS) == nullptr) {
            failure f = failure_of(m, "connect");
            my_.reset();
            throw f;
        }
    }

    [[nodiscard]] bool is_open() const noexcept { return my_ != nullptr; }
    void close() noexcept { my_.reset(); }
    /// The server's id for this session (CONNECTION_ID()), 0 when closed: for KILL and for tests.
    [[nodiscard]] unsigned long id() const noexcept { return my_ ? mysql_thread_id(my_.get()) : 0; }

    /// Runs `sql` (one statement or several separated by ';') in one round trip and drains every
    /// result; each row goes to `on_row` with the index of its statement. Rows are buffered per
    /// result (mysql_store_result): for small answers. Throws failure (its `statement` set).
    void run(std::string_view sql, const row_fn& on_row = {}) { exec(sql, on_row, /*stream=*/false); }

    /// Like run() for one statement whose rows are read as they arrive (mysql_use_result): a scan
    /// of a whole table, each wait for the next row bounded by the read timeout.
    void stream(std::string_view sql, const row_fn& on_row) { exec(sql, on_row, /*stream=*/true); }

private:
    struct closer {
        void operator()(MYSQL* m) const noexcept { mysql_close(m); }
    };
    struct result_free {
        void operator()(MYSQL_RES* r) const noexcept { mysql_free_result(r); }
    };

    static failure failure_of(MYSQL* m, std::string_view step) {
        failure f;
        if (m != nullptr) {
            f.code = mysql_errno(m);
            f.sqlstate = mysql_sqlstate(m);
            f.text = std::string(mysql_error(m));
        } else {
            f.code = CR_OUT_OF_MEMORY;
            f.sqlstate = "HY000";
            f.text = std::string(step);
        }
        if (f.text.empty()) f.text = std::string(step);
        f.text += " (error " + std::to_string(f.code) + ", SQLSTATE " + f.sqlstate + ")";
        return f;
    }

    void exec(std::string_view sql, const row_fn& on_row, bool stream) {
        if (!my_) {
            failure f;
            f.code = CR_SERVER_GONE_ERROR;
            f.sqlstate = "HY000";
            f.text = "the session is closed";
            throw f;
        }
        MYSQL* m = my_.get();
        int statement = 0;
        if (mysql_real_query(m, sql.data(), static_cast<unsigned long>(sql.size())) != 0) {
            failure f = failure_of(m, "query");
            f.statement = 0;
            throw f;
        }
        std::array<std::string_view, 16> cols{};
        for (;;) {
            std::unique_ptr<MYSQL_RES, result_free> res(stream ? mysql_use_result(m) : mysql_store_result(m));
            if (res) {
                const unsigned n = std::min<unsigned>(mysql_num_fields(res.get()), cols.size());
                while (MYSQL_ROW row = mysql_fetch_row(res.get())) {
                    const unsigned long* len = mysql_fetch_lengths(res.get());
                    for (unsigned i = 0; i < n; ++i)
                        cols[i] = row[i] == nullptr ? std::string_view() : std::string_view(row[i], len[i]);
                    if (!on_row) continue;
                    try {
                        on_row(statement, row_view(cols.data(), n));
                    } catch (...) {
                        // The caller stops reading: cut the socket so that freeing the result does
                        // not read the rest of a streamed table, and drop the session.
                        ::shutdown(static_cast<int>(mysql_get_socket(m)), SHUT_RDWR);
                        res.reset();
                        my_.reset();
                        throw;
                    }
                }
                if (mysql_errno(m) != 0) {  // the stream broke between rows
                    failure f = failure_of(m, "fetch");
                    f.statement = statement;
                    throw f;
                }
            } else if (mysql_field_count(m) != 0) {
                failure f = failure_of(m, "store result");
                f.statement = statement;
                throw f;
            }
            const int more = mysql_next_result(m);
            if (more == -1) return;
            ++statement;
            if (more > 0) {
                failure f = failure_of(m, "next result");
                f.statement = statement;
                throw f;
            }
        }
    }

    std::unique_ptr<MYSQL, closer> my_;
};

}  // namespace idem::detail::my
