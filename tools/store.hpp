// tools/store.hpp: the store a subcommand runs against, named by URI on the command line (--store),
// and the one place where a store is opened and a guard is built over it.
//
// URI forms:
//   memory              no durability: a plain idem::guard (demo only; nothing to inspect afterwards)
//   sqlite:PATH         idem::sqlite_store, one database file (WAL); PATH is created when missing,
//                       except by the read-only subcommands (audit, verify, stats). PATH follows the
//                       store's rules (sqlite_store::check_path): ":memory:" and "file:" URIs are
//                       refused, since the tool offers no temporary SQLite store (`memory` is the
//                       store that keeps nothing)
//   rocksdb:DIR         idem::rocksdb_store, one database directory (an LSM tree), when this build
//                       has it (IDEM_HAVE_ROCKSDB, set by tools/CMakeLists.txt when the idem::rocksdb
//                       target exists); created when missing, except by the read-only subcommands.
//                       RocksDB locks DIR/LOCK while a store is open, so audit, verify and stats
//                       are refused while a writer runs
//   postgresql://...    idem::postgres_store (also postgres://...), when this build has it
//                       (IDEM_HAVE_POSTGRES, set by tools/CMakeLists.txt when the idem::postgres
//                       target exists)
//   mysql://...         idem::mysql_store (also mariadb://...), when this build has it (IDEM_HAVE_MYSQL,
//                       set by tools/CMakeLists.txt when the idem::mysql target exists). Global scope
//                       (drill --workers, demo --processes) is PostgreSQL's only
//
// Subcommands only see parse_store(), store_check(), open_store(), count_records(), make_guard()
// and guarded_store. PostgreSQL plugs in at the two places marked "PLUG-IN: postgres" below.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <CLI/CLI.hpp>

#include "idem/detail/my/uri.hpp"  // my::redact, no connector needed
#include "idem/detail/pg/sql.hpp"  // pg::redact, no libpqxx needed
#include "idem/durable.hpp"
#include "idem/guard.hpp"
#include "idem/options.hpp"
#include "idem/stores/sqlite_store.hpp"
#include "idem/stats.hpp"
#include "idem/store.hpp"
#ifdef IDEM_HAVE_POSTGRES
#include "idem/stores/postgres_store.hpp"
#endif
#ifdef IDEM_HAVE_ROCKSDB
#include "idem/stores/rocksdb_store.hpp"
#define IDEM_TOOL_ROCKSDB_URI ", rocksdb:DIR"
#else
#define IDEM_TOOL_ROCKSDB_URI ""
#endif
#ifdef IDEM_HAVE_MYSQL
#include "idem/stores/mysql_store.hpp"
#define IDEM_TOOL_MYSQL_URI ", mysql://USER@HOST:PORT/DB"
#else
#define IDEM_TOOL_MYSQL_URI ""
#endif

namespace idem::tool {

/// Whether this build can open postgresql:// URIs.
#ifdef IDEM_HAVE_POSTGRES
inline constexpr bool have_postgres = true;
inline constexpr const char* accepted_stores = "memory, sqlite:PATH" IDEM_TOOL_ROCKSDB_URI
                                               ", postgresql://USER@HOST:PORT/DB" IDEM_TOOL_MYSQL_URI;
inline constexpr const char* durable_stores = "sqlite:PATH" IDEM_TOOL_ROCKSDB_URI
                                              ", postgresql://USER@HOST:PORT/DB" IDEM_TOOL_MYSQL_URI;
#else
inline constexpr bool have_postgres = false;
inline constexpr const char* accepted_stores = "memory, sqlite:PATH" IDEM_TOOL_ROCKSDB_URI IDEM_TOOL_MYSQL_URI;
inline constexpr const char* durable_stores = "sqlite:PATH" IDEM_TOOL_ROCKSDB_URI IDEM_TOOL_MYSQL_URI;
#endif
/// Whether this build can open mysql:// URIs.
#ifdef IDEM_HAVE_MYSQL
inline constexpr bool have_mysql = true;
#else
inline constexpr bool have_mysql = false;
#endif
/// Whether this build can open rocksdb: URIs.
#ifdef IDEM_HAVE_ROCKSDB
inline constexpr bool have_rocksdb = true;
#else
inline constexpr bool have_rocksdb = false;
#endif

/// Deadline of every PostgreSQL and MySQL call (connect, batch, read); a paused server would block
/// forever.
inline constexpr std::chrono::milliseconds postgres_call_deadline{5000};

struct store_spec {
    enum class kind { memory, sqlite, postgres, rocksdb, mysql };
    kind type = kind::memory;
    std::string uri;   ///< as given, for reports
    std::string path;  ///< sqlite: the database file; rocksdb: the database directory
    [[nodiscard]] bool durable() const noexcept { return type != kind::memory; }
};

/// Parses a store URI. On failure returns nullopt and, if why != nullptr, a message naming the value
/// and listing the accepted forms (for a SQLite path the store refuses: the store's own message).
inline std::optional<store_spec> parse_store(std::string_view uri, std::string* why = nullptr) {
    auto refuse = [&](const std::string& reason) -> std::optional<store_spec> {
        if (why) *why = "'" + std::string(uri) + "' " + reason + "; accepted: " + accepted_stores;
        return std::nullopt;
    };
    if (uri == "memory") return store_spec{store_spec::kind::memory, std::string(uri), {}};
    if (uri.starts_with("sqlite:")) {
        std::string_view path = uri.substr(7);
        if (path.starts_with("//")) path.remove_prefix(2);  // sqlite://PATH is accepted too
        if (path.empty()) return refuse("names no database file (write sqlite:PATH)");
        if (path.find('\0') != std::string_view::npos) return refuse("holds a NUL byte");
        std::string rule;
        if (!idem::sqlite_store::check_path(path, false, &rule)) {
            if (why)
                *why = rule + (idem::sqlite_store::is_temporary_path(path)
                                   ? "; the tool has no temporary SQLite store: use --store memory for a run that "
                                     "keeps nothing"
                                   : "");
            return std::nullopt;
        }
        return store_spec{store_spec::kind::sqlite, std::string(uri), std::string(path)};
    }
    if (uri.starts_with("rocksdb:")) {
        std::string_view path = uri.substr(8);
        if (path.starts_with("//")) path.remove_prefix(2);  // rocksdb://PATH is accepted too
        if (!have_rocksdb)
            return refuse(
                "is a RocksDB store, which this build does not include (it needs librocksdb-dev, so that "
                "the idem::rocksdb CMake target exists when the tool is configured)");
        if (path.empty()) return refuse("names no database directory (write rocksdb:DIR)");
        if (path.find('\0') != std::string_view::npos) return refuse("holds a NUL byte");
        return store_spec{store_spec::kind::rocksdb, std::string(uri), std::string(path)};
    }
    if (uri.starts_with("postgresql://") || uri.starts_with("postgres://")) {
        // PLUG-IN: postgres (1 of 2): the URI is accepted only when the store is built in.
        if (!have_postgres)
            return refuse(
                "is a PostgreSQL store, which this build does not include (it needs libpqxx-dev, so that "
                "the idem::postgres CMake target exists when the tool is configured)");
        return store_spec{store_spec::kind::postgres, std::string(uri), {}};
    }
    if (idem::detail::my::is_mysql_uri(uri)) {
        if (!have_mysql)
            return refuse(
                "is a MySQL/MariaDB store, which this build does not include (it needs libmariadb-dev, so "
                "that the idem::mysql CMake target exists when the tool is configured)");
        return store_spec{store_spec::kind::mysql, std::string(uri), {}};
    }
    return refuse("is not a store URI this build accepts");
}

/// A CLI11 check for a --store flag; the error reads "--store: 'x' is not a store URI ...".
/// With durable_only, `memory` is refused (there is nothing to inspect or recover in it).
inline CLI::Validator store_check(bool durable_only = false) {
    return CLI::Validator(
        [durable_only](std::string& text) {
            std::string why;
            const auto spec = parse_store(text, &why);
            if (!spec) return why;
            if (durable_only && !spec->durable())
                return "'" + text +
                       "' keeps nothing after the process exits; this subcommand needs a durable store: " + durable_stores;
            return std::string{};
        },
        "STORE");
}

/// A user-facing name of the store (a PostgreSQL or MySQL URI without its password).
inline std::string display_name(const store_spec& spec) {
    if (spec.type == store_spec::kind::mysql) return idem::detail::my::redact(spec.uri);
    if (spec.type != store_spec::kind::postgres) return spec.uri;
    return idem::detail::pg::redact(spec.uri);  // the store's own: user:secret@, ?password=, key=value
}

/// Whether global scope (several processes sharing one key space: `demo --processes`,
/// `drill --workers`) can run on the store: PostgreSQL or MySQL/MariaDB, when this build has it.
inline bool arbitrates(const store_spec& spec) {
#ifdef IDEM_HAVE_POSTGRES
    if (spec.type == store_spec::kind::postgres) return true;
#endif
#ifdef IDEM_HAVE_MYSQL
    if (spec.type == store_spec::kind::mysql) return true;
#endif
    (void)spec;
    return false;
}

enum class open_mode {
    create,    ///< create the database and schema when missing (demo, drill)
    existing,  ///< refuse a missing sqlite file instead of creating an empty one (audit, verify, stats)
};

/// Opens a durable store. `mode` selects the SQLite synchronous level (FULL for sync durability, so a
/// commit survives power loss; NORMAL for async) and RocksDB's WAL fsync per batch (sync only). Throws idem::error naming the store and the cause.
inline std::unique_ptr<idem::store> open_store(const store_spec& spec, idem::durability mode = idem::durability::sync,
                                               open_mode how = open_mode::create) {
    switch (spec.type) {
        case store_spec::kind::memory:
            throw idem::error(idem::errc::invalid_argument,
                              "store 'memory' keeps nothing to open; name a durable store: " + std::string(durable_stores));
        case store_spec::kind::sqlite:
            if (how == open_mode::existing && ::access(spec.path.c_str(), F_OK) != 0)
                throw idem::error(idem::errc::invalid_argument,
                                  "sqlite:" + spec.path + ": no such database file (nothing to read; check the path)");
            {
                idem::sqlite_options so;
                so.full_sync = mode == idem::durability::sync;
                // Writers (demo, drill) hold the file from the start, so a second writer is refused
                // before it reads anything; readers (audit, verify, stats) never take the lock.
                if (how == open_mode::create) so.writer_lock = idem::sqlite_lock::at_open;
                return std::make_unique<idem::sqlite_store>(spec.path, so);
            }
        case store_spec::kind::rocksdb:
#ifdef IDEM_HAVE_ROCKSDB
            if (how == open_mode::existing && ::access((spec.path + "/CURRENT").c_str(), F_OK) != 0)
                throw idem::error(idem::errc::invalid_argument,
                                  "rocksdb:" + spec.path +
                                      ": no RocksDB database in this directory (nothing to read; "
                                      "check the path)");
            return std::make_unique<idem::rocksdb_store>(spec.path, mode == idem::durability::sync);
#else
            break;
#endif
        case store_spec::kind::postgres:
            // PLUG-IN: postgres (2 of 2): the one place a PostgreSQL store is opened.
#ifdef IDEM_HAVE_POSTGRES
            return std::make_unique<idem::postgres_store>(spec.uri, postgres_call_deadline);
#else
            break;
#endif
        case store_spec::kind::mysql:
#ifdef IDEM_HAVE_MYSQL
            return std::make_unique<idem::mysql_store>(spec.uri, postgres_call_deadline);
#else
            break;
#endif
    }
    throw idem::error(idem::errc::invalid_argument, "store '" + display_name(spec) + "' is not built into this idem");
}

/// What a failover of the store's server can lose, in words (postgres_store::failover_exposure());
/// empty for a store without a standby to fail over to (one file or directory, or MySQL, whose
/// replication idem does not inspect).
inline std::string failover_exposure([[maybe_unused]] idem::store& st) {
#ifdef IDEM_HAVE_POSTGRES
    if (auto* pg = dynamic_cast<idem::postgres_store*>(&st)) return pg->failover_exposure();
#endif
    return {};
}

/// How many records the store holds (one pass of store::load). Used to size options.capacity, since
/// recovery loads every record into the table.
inline std::size_t count_records(idem::store& st) {
    std::size_t n = 0;
    st.load([&](const idem::stored_record&) { ++n; });
    return n;
}

/// A guard over a store, with everything that must live exactly as long as the guard. Subcommands
/// use guard() for the hot path and snapshot() for counters (a durable guard adds its flush counters).
class guarded_store {
public:
    guarded_store(store_spec spec, std::unique_ptr<idem::guard> memory)
        : spec_(std::move(spec)), memory_(std::move(memory)) {}
    guarded_store(store_spec spec, std::unique_ptr<idem::durable_guard> durable, std::size_t found)
        : spec_(std::move(spec)), durable_(std::move(durable)), found_(found) {}

    [[nodiscard]] const store_spec& spec() const noexcept { return spec_; }
    [[nodiscard]] idem::guard& guard() noexcept { return durable_ ? durable_->guard() : *memory_; }
    [[nodiscard]] idem::stats snapshot() const { return durable_ ? durable_->snapshot() : memory_->snapshot(); }
    /// Null for `memory`.
    [[nodiscard]] idem::durable_guard* durable() noexcept { return durable_.get(); }
    /// Records the store held before the guard opened (what recovery had to load).
    [[nodiscard]] std::size_t records_found() const noexcept { return found_; }

private:
    store_spec spec_;
    std::unique_ptr<idem::durable_guard> durable_;  // owns the store, the flush pipeline and its guard
    std::unique_ptr<idem::guard> memory_;
    std::size_t found_ = 0;
};

/// Opens the store and builds a guard over it. For a durable store, `opts.capacity` is the room for
/// new keys: the records the store already holds are counted and added, because recovery loads them
/// all into the table. Throws idem::error naming the store or the option at fault; std::bad_alloc
/// when the table does not fit in memory.
inline std::unique_ptr<guarded_store> make_guard(const store_spec& spec, idem::options opts, idem::store_options so = {}) {
    if (!spec.durable()) return std::make_unique<guarded_store>(spec, std::make_unique<idem::guard>(std::move(opts)));
    std::unique_ptr<idem::store> st = open_store(spec, so.mode, open_mode::create);
    const std::size_t found = count_records(*st);
    opts.capacity += found;
    auto g = std::make_unique<idem::durable_guard>(std::move(st), std::move(opts), std::move(so));
    return std::make_unique<guarded_store>(spec, std::move(g), found);
}

}  // namespace idem::tool
