// idem/detail/my/connection.hpp: one session with a MySQL or MariaDB server through MariaDB
// Connector/C (Debian libmariadb-dev): the URI it is opened with, the deadline every call keeps,
// how a multi-statement round trip runs and streams its rows, and how a failure is classified.
//
// Invariants
//   * Every wait on the server is bounded: the connector's connect, read and write timeouts are set
//     from the store's call deadline (whole seconds, rounded up: the connector counts seconds), and
//     the server's own bounds (innodb_lock_wait_timeout, max_statement_time) are set from it in the
//     session's setup (detail/my/sql.hpp). A stopped server or a network dropping packets gives
//     CR_SERVER_LOST within the deadline, never a hang.
//   * A round trip is one text query of several statements (CLIENT_MULTI_STATEMENTS). Every result
//     is drained, so the session is ready for the next query whatever happened; the server stops at
//     the first statement that fails, and `failure::statement` says which one it was.
//   * A session is never reconnected behind its owner's back (MYSQL_OPT_RECONNECT stays off): a
//     broken session stays broken, the store opens a new one and knows every transaction is gone.
//   * The password never leaves this file: name() is the URI without it.
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

#include "idem/error.hpp"

namespace idem::detail::my {

/// Where a mysql:// (or mariadb://) URI points: mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE.
/// USER and PASSWORD may hold %XX escapes.
struct endpoint {
    std::string user;
    std::string password;
    std::string host;
    unsigned port = 3306;
    std::string database;
};

[[nodiscard]] inline bool is_mysql_uri(std::string_view uri) noexcept {
    return uri.starts_with("mysql://") || uri.starts_with("mariadb://");
}

/// The URI without its password ("mysql://idem@db:3306/payments"), for messages.
[[nodiscard]] inline std::string redact(std::string_view uri) {
    const auto scheme = uri.find("://");
    if (scheme == std::string_view::npos) return std::string(uri);
    const auto at = uri.find('@', scheme + 3);
    if (at == std::string_view::npos) return std::string(uri);
    const auto colon = uri.substr(0, at).find(':', scheme + 3);
    if (colon == std::string_view::npos) return std::string(uri);
    return std::string(uri.substr(0, colon)) + std::string(uri.substr(at));
}

/// Parses `uri`; throws idem::error(invalid_argument) naming the URI (without password) and the rule.
[[nodiscard]] inline endpoint parse_uri(std::string_view uri) {
    const auto fail = [&](const std::string& rule) -> endpoint {
        throw error(errc::invalid_argument, "mysql store URI '" + redact(uri) + "': " + rule +
                                                " (expected mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE)");
    };
    const auto decode = [&](std::string_view s) {
        std::string out;
        for (std::size_t i = 0; i < s.size(); ++i) {
            if (s[i] == '%' && i + 2 < s.size() + 0 && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
                std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
                out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
                i += 2;
            } else {
                out += s[i];
            }
        }
        return out;
    };
    if (!is_mysql_uri(uri)) return fail("the scheme must be mysql:// or mariadb://");
    std::string_view rest = uri.substr(uri.find("://") + 3);
    endpoint e;
    const auto slash = rest.find('/');
    if (slash == std::string_view::npos || slash + 1 == rest.size()) return fail("no database named after the host");
    e.database = std::string(rest.substr(slash + 1));
    if (e.database.find_first_of("/?#`'\"") != std::string::npos)
        return fail("the database name holds a character out of [/?#`'\"]; options are not taken in the URI");
    rest = rest.substr(0, slash);
    const auto at = rest.rfind('@');
    if (at == std::string_view::npos) return fail("no USER@ before the host");
    const std::string_view who = rest.substr(0, at);
    const auto colon = who.find(':');
    e.user = decode(who.substr(0, colon));
    if (colon != std::string_view::npos) e.password = decode(who.substr(colon + 1));
    if (e.user.empty()) return fail("the user is empty");
    std::string_view hostport = rest.substr(at + 1);
    const auto pcolon = hostport.rfind(':');
    if (pcolon != std::string_view::npos) {
        const std::string_view p = hostport.substr(pcolon + 1);
        unsigned v = 0;
        if (p.empty() || p.size() > 5 || !std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
            (v = static_cast<unsigned>(std::stoul(std::string(p)))) == 0 || v > 65535)
            return fail("port '" + std::string(p) + "' is not 1..65535");
        e.port = v;
        hostport = hostport.substr(0, pcolon);
    }
    if (hostport.empty()) return fail("the host is empty");
    e.host = std::string(hostport);
    return e;
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
    contention,  ///< a deadlock or a lock wait past innodb_lock_wait_timeout: the transaction was undone
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
        case ER_QUERY_INTERRUPTED:
        case ER_STATEMENT_TIMEOUT:
        case ER_CON_COUNT_ERROR:
        case ER_TOO_MANY_USER_CONNECTIONS:
        case ER_NET_READ_ERROR:
        case ER_NET_READ_INTERRUPTED:
        case ER_NET_ERROR_ON_WRITE:
        case ER_NET_WRITE_INTERRUPTED: return failure_kind::lost;
        case ER_LOCK_DEADLOCK:
        case ER_LOCK_WAIT_TIMEOUT: return failure_kind::contention;
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
        const unsigned secs = static_cast<unsigned>(std::max<std::int64_t>(1, (deadline.count() + 999) / 1000));
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
