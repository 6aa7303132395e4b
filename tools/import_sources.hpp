// tools/import_sources.hpp: the servers `idem import --from URI` reads the old table from, each an
// old_table_source (import.hpp): PostgreSQL through libpqxx (IDEM_HAVE_POSTGRES) and MySQL/MariaDB
// through detail/my/connection.hpp (IDEM_HAVE_MYSQL). The one place a source URI is parsed and opened.
//
// Invariant: a source reads the rows of one consistent snapshot (PostgreSQL: one REPEATABLE READ,
// READ ONLY transaction, through a cursor, so memory holds one fetch of rows; MySQL: one START
// TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY, rows streamed as they come), never writes the old
// table, and splices into its SQL only a table name parse_table_name() accepted (quoted) and a
// number; every failure is an idem::error naming the source (without its password) and the cause.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <system_error>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/detail/my/uri.hpp"  // my::parse_uri, is_mysql_uri: no connector needed
#include "idem/detail/pg/sql.hpp"  // pg::redact, is_uri, add_option: no libpqxx needed
#include "idem/error.hpp"
#include "import.hpp"
#ifdef IDEM_HAVE_POSTGRES
#include <pqxx/pqxx>
#endif
#ifdef IDEM_HAVE_MYSQL
#include "idem/detail/my/connection.hpp"
#endif

namespace idem::tool::imports {

/// The sources this build reads, for messages.
#if defined(IDEM_HAVE_POSTGRES) && defined(IDEM_HAVE_MYSQL)
inline constexpr const char* accepted_sources = "postgresql://USER@HOST:PORT/DB, mysql://USER@HOST:PORT/DB";
#elif defined(IDEM_HAVE_POSTGRES)
inline constexpr const char* accepted_sources = "postgresql://USER@HOST:PORT/DB";
#elif defined(IDEM_HAVE_MYSQL)
inline constexpr const char* accepted_sources = "mysql://USER@HOST:PORT/DB";
#else
inline constexpr const char* accepted_sources = "none (this build has neither libpqxx nor libmariadb)";
#endif

/// A source URI without its password: "scheme://user:secret@host/db" -> "scheme://user@host/db"
/// for any scheme, and PostgreSQL's password= parameters dropped (pg::redact).
[[nodiscard]] inline std::string redact_source(std::string_view uri) {
    if (idem::detail::pg::is_uri(uri)) return idem::detail::pg::redact(uri);
    const std::size_t scheme = uri.find("://");
    if (scheme == std::string_view::npos) return idem::detail::pg::redact(uri);
    const std::size_t auth = scheme + 3;
    const std::size_t auth_end = std::min(uri.find_first_of("/?", auth), uri.size());
    const std::size_t at = uri.substr(auth, auth_end - auth).rfind('@');
    if (at == std::string_view::npos) return std::string(uri);
    const std::string_view user = uri.substr(auth, at);
    return std::string(uri.substr(0, auth)) + std::string(user.substr(0, user.find(':'))) +
           std::string(uri.substr(auth + at));
}

/// Whether two PostgreSQL URIs name the same database: equal once the password and the query
/// (connection options) are left out. A heuristic for a refusal (import.cpp): host aliases are not
/// resolved.
[[nodiscard]] inline bool same_database(std::string_view a, std::string_view b) {
    auto base = [](std::string_view u) {
        std::string r = redact_source(u);
        r = r.substr(0, r.find('?'));
        if (r.starts_with("postgres://")) r.insert(8, "ql");  // postgres:// and postgresql:// alike
        return r;
    };
    return base(a) == base(b);
}

/// Whether a MySQL/MariaDB table named `table` (parse_table_name's parts; without a database part
/// it is in the database of `from`) is in the database that the mysql:// store URI `store` names
/// on the server `from` names: the same host (localhost and 127.0.0.1 alike: the session connects
/// over TCP either way) and port. A heuristic for a refusal (import.cpp): host aliases are not
/// resolved. False when either URI does not parse (the open reports it).
[[nodiscard]] inline bool same_mysql_database(std::string_view from, const std::vector<std::string>& table,
                                              std::string_view store) {
    namespace my = idem::detail::my;
    if (!my::is_mysql_uri(from) || !my::is_mysql_uri(store)) return false;
    try {
        const my::endpoint a = my::parse_uri(from), b = my::parse_uri(store);
        const auto host = [](const std::string& h) { return h == "localhost" ? std::string("127.0.0.1") : h; };
        const std::string& db = table.size() == 2 ? table[0] : a.database;
        return host(a.host) == host(b.host) && a.port == b.port && db == b.database;
    } catch (const error&) {
        return false;
    }
}

struct source_spec {
    enum class kind { postgres, mysql };
    kind type = kind::postgres;
    std::string uri;
};

/// Parses --from. On failure nullopt and *why names the value, the rule and the accepted forms.
inline std::optional<source_spec> parse_source(std::string_view uri, std::string* why) {
    auto refuse = [&](const std::string& reason) -> std::optional<source_spec> {
        if (why) *why = "'" + redact_source(uri) + "' " + reason + "; accepted: " + accepted_sources;
        return std::nullopt;
    };
    if (uri.starts_with("postgresql://") || uri.starts_with("postgres://")) {
#ifdef IDEM_HAVE_POSTGRES
        return source_spec{source_spec::kind::postgres, std::string(uri)};
#else
        return refuse("is a PostgreSQL source, which this build cannot read (it needs libpqxx-dev)");
#endif
    }
    if (uri.starts_with("mysql://") || uri.starts_with("mariadb://")) {
#ifdef IDEM_HAVE_MYSQL
        return source_spec{source_spec::kind::mysql, std::string(uri)};
#else
        return refuse("is a MySQL/MariaDB source, which this build cannot read (it needs libmariadb-dev)");
#endif
    }
    return refuse("is not a source URI");
}

#ifdef IDEM_HAVE_POSTGRES
/// The old table on PostgreSQL (the article's table in its PostgreSQL flavour: status VARCHAR(16)
/// or an enum, TIMESTAMP(3) or TIMESTAMPTZ times). A TIMESTAMP without time zone is read in the
/// session's TimeZone (the server's default, or the URI's options=-c%20TimeZone=...): the zone the
/// old system's CURRENT_TIMESTAMP wrote it in.
class postgres_source final : public old_table_source {
public:
    /// How many rows one FETCH brings: what memory holds of the read at a time.
    static constexpr int fetch_rows = 1000;
    /// statement_timeout of every statement of the read (a FETCH of fetch_rows rows is quick; a
    /// server that stops answering is cut rather than waited for).
    static constexpr int statement_timeout_ms = 60'000;

    postgres_source(std::string uri, std::vector<std::string> table) : uri_(std::move(uri)), table_(std::move(table)) {}

    /// The SELECT of a read: the five columns, times as Unix ms (rounded: TIMESTAMP(3) is exact).
    [[nodiscard]] std::string query(std::optional<std::int64_t> since_ms) const {
        std::string q =
            "SELECT idempotent_key::text, biz_type::text, status::text, "
            "round(extract(epoch FROM created_time::timestamptz) * 1000)::bigint, "
            "round(extract(epoch FROM updated_time::timestamptz) * 1000)::bigint FROM " +
            quoted_table(table_, '"');
        if (since_ms)
            q += " WHERE updated_time IS NULL OR updated_time >= 'epoch'::timestamptz + " + std::to_string(*since_ms) +
                 " * interval '1 millisecond'";
        return q;
    }

    void read(std::optional<std::int64_t> since_ms, const std::function<void(const old_row&)>& fn) override {
        // Only libpqxx's failures become a source error here: what fn throws (the idem store's
        // errors) passes through as it is.
        try {
            std::string conninfo = uri_;
            namespace pg = idem::detail::pg;
            pg::add_option(conninfo, "connect_timeout", "10");
            pg::add_option(conninfo, "client_encoding", "UTF8");
            pg::add_option(conninfo, "application_name", "idem_import");
            pqxx::connection c(conninfo);
            pqxx::work tx(c);
            tx.exec("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY");
            tx.exec("SET LOCAL statement_timeout = " + std::to_string(statement_timeout_ms));
            tx.exec("DECLARE idem_import NO SCROLL CURSOR FOR " + query(since_ms));
            while (true) {
                const pqxx::result rows = tx.exec("FETCH " + std::to_string(fetch_rows) + " FROM idem_import");
                if (rows.empty()) break;
                for (const auto& row : rows) {
                    old_row r;
                    if (!row[0].is_null()) r.key = row[0].as<std::string>();
                    if (!row[1].is_null()) r.biz_type = row[1].as<std::string>();
                    if (!row[2].is_null()) r.status = row[2].as<std::string>();
                    if (!row[3].is_null()) r.created_ms = row[3].as<std::int64_t>();
                    if (!row[4].is_null()) r.updated_ms = row[4].as<std::int64_t>();
                    fn(r);
                }
            }
            tx.commit();
        } catch (const pqxx::sql_error& e) {
            throw error(errc::store_error, name() + ": the read failed (SQLSTATE " + e.sqlstate() +
                                               "): " + trimmed(e.what()) +
                                               "; the table needs the columns idempotent_key, biz_type, status, "
                                               "created_time, updated_time");
        } catch (const pqxx::broken_connection& e) {
            throw error(errc::store_unavailable, name() + ": cannot read: " + trimmed(e.what()));
        } catch (const pqxx::failure& e) {
            throw error(errc::store_error, name() + ": " + trimmed(e.what()));
        } catch (const pqxx::conversion_error& e) {
            throw error(errc::store_error, name() + ": a column did not read as its type: " + trimmed(e.what()));
        }
    }

    [[nodiscard]] std::string name() const override {
        return idem::detail::pg::redact(uri_) + " table " + quoted_table(table_, '"');
    }

private:
    static std::string trimmed(std::string s) {
        while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
        return s;
    }
    std::string uri_;
    std::vector<std::string> table_;
};
#endif

#ifdef IDEM_HAVE_MYSQL
/// The old table on MySQL or MariaDB, the article's own (status ENUM, TIMESTAMP(3) times), through
/// detail/my/connection.hpp (libmariadb's C API). The session's time zone is UTC, so a TIMESTAMP
/// reads as the instant it stores, and --since compares in UTC too.
class mysql_source final : public old_table_source {
public:
    /// Every wait on the server (connect, each row of the stream) is bounded by this.
    static constexpr std::chrono::milliseconds deadline{60'000};

    mysql_source(std::string uri, std::vector<std::string> table) : uri_(std::move(uri)), table_(std::move(table)) {}

    /// The SELECT of a read: the five columns, times as Unix ms.
    [[nodiscard]] std::string query(std::optional<std::int64_t> since_ms) const {
        std::string q =
            "SELECT idempotent_key, biz_type, CAST(status AS CHAR), "
            "CAST(ROUND(UNIX_TIMESTAMP(created_time) * 1000) AS SIGNED), "
            "CAST(ROUND(UNIX_TIMESTAMP(updated_time) * 1000) AS SIGNED) FROM " +
            quoted_table(table_, '`');
        if (since_ms) {
            // Whole seconds plus the milliseconds as an interval: exact whatever div_precision_increment is.
            q += " WHERE updated_time IS NULL OR updated_time >= FROM_UNIXTIME(" + std::to_string(*since_ms / 1000) +
                 ") + INTERVAL " + std::to_string(*since_ms % 1000) + "000 MICROSECOND";
        }
        return q;
    }

    void read(std::optional<std::int64_t> since_ms, const std::function<void(const old_row&)>& fn) override {
        namespace my = idem::detail::my;
        my::session s;
        // Only the session's failures become a source error here: what fn throws passes through.
        try {
            s.open(my::parse_uri(uri_), deadline);
            s.run(
                "SET time_zone = '+00:00'; SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ; "
                "START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY");
        } catch (const my::failure& f) {
            throw error(my::classify(f) == my::failure_kind::lost ? errc::store_unavailable : errc::store_error,
                        name() + ": cannot read: " + f.text);
        }
        const auto number = [&](std::string_view text, const char* column) {
            std::int64_t v = 0;
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
            if (ec != std::errc{} || end != text.data() + text.size())
                throw error(errc::store_error,
                            name() + ": " + column + " read as '" + std::string(text) + "', not a time in milliseconds");
            return v;
        };
        try {
            s.stream(query(since_ms), [&](int, my::row_view cols) {
                old_row r;
                if (cols[0].data() != nullptr) r.key = std::string(cols[0]);
                if (cols[1].data() != nullptr) r.biz_type = std::string(cols[1]);
                if (cols[2].data() != nullptr) r.status = std::string(cols[2]);
                if (cols[3].data() != nullptr) r.created_ms = number(cols[3], "created_time");
                if (cols[4].data() != nullptr) r.updated_ms = number(cols[4], "updated_time");
                fn(r);
            });
            s.run("COMMIT");
        } catch (const my::failure& f) {
            throw error(my::classify(f) == my::failure_kind::lost ? errc::store_unavailable : errc::store_error,
                        name() + ": the read failed: " + f.text +
                            "; the table needs the columns idempotent_key, biz_type, status, created_time, "
                            "updated_time");
        }
    }

    [[nodiscard]] std::string name() const override {
        return idem::detail::my::redact(uri_) + " table " + quoted_table(table_, '`');
    }

private:
    std::string uri_;
    std::vector<std::string> table_;
};
#endif

/// Opens the source a parse_source() result names, reading `table` (parse_table_name's parts).
inline std::unique_ptr<old_table_source> open_source(const source_spec& spec, const std::vector<std::string>& table) {
    switch (spec.type) {
        case source_spec::kind::postgres:
#ifdef IDEM_HAVE_POSTGRES
            return std::make_unique<postgres_source>(spec.uri, table);
#else
            break;
#endif
        case source_spec::kind::mysql:
#ifdef IDEM_HAVE_MYSQL
            return std::make_unique<mysql_source>(spec.uri, table);
#else
            break;
#endif
    }
    (void)table;
    throw error(errc::invalid_argument,
                "source '" + redact_source(spec.uri) + "' is not readable by this build; accepted: " + accepted_sources);
}

}  // namespace idem::tool::imports
