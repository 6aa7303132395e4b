// store_config_test: which SQLite store paths are accepted, and which errors mean what.
//
//   SqlitePaths          "" and ":memory:" (temporary databases: nothing survives a reopen) are
//                        refused as invalid_argument naming the path and the rule, in sync and async
//                        mode, unless the caller asks for a temporary database explicitly
//                        (sqlite_store::temporary(), sqlite_options::allow_temporary); "file:" paths
//                        (URIs to SQLite, e.g. mode=memory) and NUL bytes are refused always. A plain
//                        path keeps its records across a reopen.
//   SqliteConfiguration  a missing parent directory, a directory at the path, a parent that is a file,
//                        an unwritable file (immutable: root is refused too) and a read-only file
//                        system are invalid_argument naming the path and the fault, also when found
//                        by reconnect(); a lock held by another connection is still store_unavailable.
//   StoreEnums           operator<< prints every enumerator of durability and sqlite_lock by name,
//                        and a value outside the enum as "durability(9)" (GoogleTest prints them so).
//   ToolStoreUri         the idem tool's sqlite:PATH gives the store's own messages (when CLI11, which
//                        the tool needs, is installed).
// The immutable-file and read-only tests need root (chattr, mount) and an ext4/xfs/btrfs /tmp; they
// FAIL, never skip, without them.
#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <sstream>
#include <fstream>
#include <string>
#include <vector>

#include <sqlite3.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "support/store_fixtures.hpp"

#if __has_include(<CLI/CLI.hpp>)
#include "../tools/store.hpp"
#define IDEM_TEST_TOOL_STORE 1
#endif

namespace {

using idem::errc;
using idem::sqlite_options;
using idem::sqlite_store;

/// `call` throws idem::error of `kind` whose message holds every one of `words`.
template <class Call>
::testing::AssertionResult refused(Call&& call, errc kind, const std::vector<std::string>& words) {
    try {
        call();
    } catch (const idem::error& e) {
        const std::string what = e.what();
        if (e.kind() != kind)
            return ::testing::AssertionFailure() << "errc '" << make_error_code(e.kind()).message() << "', expected '"
                                                 << make_error_code(kind).message() << "': " << what;
        for (const auto& w : words)
            if (what.find(w) == std::string::npos) return ::testing::AssertionFailure() << "no '" << w << "' in: " << what;
        return ::testing::AssertionSuccess() << what;
    }
    return ::testing::AssertionFailure() << "accepted";
}

/// One claim row for `key`, as batch `n` of a test writes it.
std::vector<idem::store_row> claim(const std::string& key, std::uint64_t n) {
    return {idem_test::row({.key = key, .fence = n}, n)};
}

// ---- printing ------------------------------------------------------------------------------------

template <class E>
std::string printed(E e) {
    std::ostringstream os;
    os << e;
    return os.str();
}

TEST(StoreEnums, EveryEnumeratorPrintsItsName) {
    EXPECT_EQ(printed(idem::durability::async), "async");
    EXPECT_EQ(printed(idem::durability::sync), "sync");
    EXPECT_EQ(printed(static_cast<idem::durability>(9)), "durability(9)");
    EXPECT_EQ(printed(idem::sqlite_lock::on_first_write), "on_first_write");
    EXPECT_EQ(printed(idem::sqlite_lock::at_open), "at_open");
    EXPECT_EQ(printed(static_cast<idem::sqlite_lock>(9)), "sqlite_lock(9)");
    EXPECT_EQ(::testing::PrintToString(idem::durability::sync), "sync");  // what a failed EXPECT_EQ shows
}

/// A designated initializer that leaves members out compiles under -Wextra -Werror (the durable.hpp
/// header example): every member has a default member initializer.
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wmissing-field-initializers"
[[maybe_unused]] const idem::store_options designated{.mode = idem::durability::sync, .queue_capacity = 1024};
#pragma GCC diagnostic pop

// ---- paths ---------------------------------------------------------------------------------------

TEST(SqlitePaths, TemporaryPathsAreRefusedWithoutTheExplicitOptIn) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"", "is empty, which makes SQLite create a temporary database"},
        {":memory:", "makes SQLite create an in-memory database"},
    };
    for (const auto& [case_path, rule] : cases) {
        const std::string& path = case_path;  // the lambdas capture it: clang 14 cannot capture a structured binding
        SCOPED_TRACE("path '" + path + "'");
        const std::vector<std::string> words = {"sqlite path '" + path + "' ", rule, "nothing would survive a reopen",
                                                "sqlite_store::temporary()"};
        EXPECT_TRUE(refused([&] { sqlite_store st(path); }, errc::invalid_argument, words)) << "sync (default)";
        EXPECT_TRUE(refused([&] { sqlite_store st(path, false); }, errc::invalid_argument, words)) << "async";
        EXPECT_TRUE(refused([&] { sqlite_store st(path, sqlite_options{}); }, errc::invalid_argument, words));
        EXPECT_TRUE(
            refused([&] { sqlite_store st(path, sqlite_options{.full_sync = false}); }, errc::invalid_argument, words));
    }
}

TEST(SqlitePaths, FileUrisAreRefusedEvenWithTheTemporaryOptIn) {
    idem_test::temp_dir dir("idem-config");
    const std::vector<std::string> uris = {
        "file::memory:",
        "file::memory:?cache=shared",
        "file:" + dir.file("a.db") + "?mode=memory",
        "file:" + dir.file("b.db") + "?vfs=memdb",
        "file:" + dir.file("c.db"),
    };
    for (const auto& uri : uris) {
        for (const bool allow : {false, true}) {
            SCOPED_TRACE(uri + (allow ? " with allow_temporary" : ""));
            EXPECT_TRUE(refused([&] { sqlite_store st(uri, sqlite_options{.allow_temporary = allow}); },
                                errc::invalid_argument,
                                {"sqlite path '" + uri + "' ", "begins with 'file:'", "URI", "'./" + uri + "'"}));
        }
    }
    EXPECT_TRUE(std::filesystem::is_empty(dir.path())) << "a refused path created a file";
}

TEST(SqlitePaths, PathWithANulByteIsRefused) {
    idem_test::temp_dir dir("idem-config");
    const std::string path = dir.file("a") + std::string(1, '\0') + "b.db";
    EXPECT_TRUE(refused([&] { sqlite_store st(path); }, errc::invalid_argument,
                        {"sqlite path '" + dir.file("a") + "\\x00b.db'", "holds a NUL byte"}));
    EXPECT_FALSE(std::filesystem::exists(dir.file("a"))) << "the path cut at the NUL byte was opened";
}

TEST(SqlitePaths, PlainPathKeepsItsRecordsAcrossAReopen) {
    idem_test::temp_dir dir("idem-config");
    // The second name begins with "file:" only after the directory: a plain path, not a URI.
    for (const std::string& db : {dir.file("idem.db"), dir.file("file:idem.db")}) {
        SCOPED_TRACE(db);
        {
            sqlite_store st(db);
            st.apply(claim("TX1_PAY_v1", 1), 1);
        }
        ASSERT_TRUE(std::filesystem::is_regular_file(db));
        sqlite_store st(db, sqlite_options{.full_sync = false});
        EXPECT_TRUE(st.get("TX1_PAY_v1").has_value());
        EXPECT_TRUE(st.committed(1));
        EXPECT_EQ(st.name(), "sqlite:" + db);
    }
}

TEST(SqlitePaths, ExplicitTemporaryStoreWorksAndKeepsNothingBeyondItself) {
    auto st = sqlite_store::temporary();
    ASSERT_NE(st, nullptr);
    EXPECT_EQ(st->name(), "sqlite::memory:");
    st->apply(claim("TX1_PAY_v1", 1), 1);
    EXPECT_TRUE(st->get("TX1_PAY_v1").has_value());
    EXPECT_TRUE(st->committed(1));
    // The database is the connection: reconnect() keeps it rather than drop every record.
    st->reconnect();
    EXPECT_TRUE(st->get("TX1_PAY_v1").has_value()) << "reconnect() dropped the temporary database";
    // Another temporary store is another database: nothing is shared or kept.
    EXPECT_FALSE(sqlite_store::temporary()->get("TX1_PAY_v1").has_value());

    // The options form accepts both temporary paths.
    for (const std::string path : {"", ":memory:"}) {
        SCOPED_TRACE("path '" + path + "'");
        sqlite_store t(path, sqlite_options{.allow_temporary = true});
        t.apply(claim("TX2_PAY_v1", 7), 7);
        EXPECT_TRUE(t.get("TX2_PAY_v1").has_value());
        EXPECT_TRUE(t.committed(7));
    }

    // A durable guard accepts it in sync mode too, since the caller asked for it by name.
    idem::store_options so;
    so.mode = idem::durability::sync;
    idem::durable_guard g(sqlite_store::temporary(), idem_test::durable_options(), so);
    auto r = g->begin(idem::key("TX3_PAY_v1"));
    ASSERT_EQ(r.status, idem::begin_status::acquired);
    EXPECT_FALSE(r.ticket.succeed(42));
    EXPECT_GT(g.snapshot().flush_batches, 0u);
    EXPECT_EQ(g.snapshot().store_errors, 0u) << g.last_store_error();
}

// ---- configuration faults ------------------------------------------------------------------------

TEST(SqliteConfiguration, MissingDirectoryIsAnInvalidArgument) {
    idem_test::temp_dir dir("idem-config");
    const std::string db = dir.file("no/such/dir/idem.db");
    EXPECT_TRUE(refused([&] { sqlite_store st(db); }, errc::invalid_argument,
                        {"sqlite:" + db + ": ", "directory " + dir.file("no/such/dir") + " does not exist"}));
    EXPECT_FALSE(std::filesystem::exists(dir.file("no")));
}

TEST(SqliteConfiguration, PathThatIsADirectoryIsAnInvalidArgument) {
    idem_test::temp_dir dir("idem-config");
    const std::string db = dir.path().string();
    EXPECT_TRUE(refused([&] { sqlite_store st(db); }, errc::invalid_argument,
                        {"sqlite:" + db + ": ", "the path is a directory, not a database file"}));
}

TEST(SqliteConfiguration, ParentThatIsAFileIsAnInvalidArgument) {
    idem_test::temp_dir dir("idem-config");
    const std::string parent = dir.file("plain");
    std::ofstream(parent) << "not a directory\n";
    const std::string db = parent + "/idem.db";
    EXPECT_TRUE(refused([&] { sqlite_store st(db); }, errc::invalid_argument,
                        {"sqlite:" + db + ": ", parent + " is not a directory"}));
}

// Root passes every permission bit, so the file is made immutable (chattr +i), which refuses
// writes to root too. SQLite would otherwise open it read-only and fail at the first batch.
TEST(SqliteConfiguration, UnwritableFileIsAnInvalidArgumentEvenForRoot) {
    idem_test::temp_dir dir("idem-config");
    const std::string db = dir.file("idem.db");
    { sqlite_store st(db); }
    ASSERT_EQ(idem_test::set_immutable(db, true), "") << "needs root and ext4/xfs/btrfs under /tmp";
    EXPECT_TRUE(refused([&] { sqlite_store st(db); }, errc::invalid_argument,
                        {"sqlite:" + db + ": ", "no permission to read and write the file", std::strerror(EPERM)}));
    ASSERT_EQ(idem_test::set_immutable(db, false), "");
    sqlite_store st(db);  // the flag was the only fault
    st.apply(claim("TX1_PAY_v1", 1), 1);
}

TEST(SqliteConfiguration, ReadOnlyFileSystemIsAnInvalidArgument) {
    idem_test::tmpfs_mount fs("1m");
    ASSERT_TRUE(fs.ok()) << fs.error() << " (this test mounts a tmpfs: run it as root)";
    const std::string dir = fs.path().string();
    ASSERT_EQ(::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "size=1m,mode=0700"), 0)
        << "remount " << dir << " read-only: " << std::strerror(errno);
    const std::string db = fs.file("idem.db");
    EXPECT_TRUE(refused([&] { sqlite_store st(db); }, errc::invalid_argument,
                        {"sqlite:" + db + ": ", "no permission to create files in directory " + dir, std::strerror(EROFS)}));
}

// A configuration fault that appears while the store runs is named the same way by reconnect()
// and by the next call (the flusher retries either way, so it recovers once the path is fixed).
TEST(SqliteConfiguration, FaultFoundByReconnectIsAnInvalidArgument) {
    idem_test::temp_dir dir("idem-config");
    const std::string db = dir.file("idem.db");
    sqlite_store st(db);
    st.apply(claim("TX1_PAY_v1", 1), 1);
    ASSERT_EQ(::rename(db.c_str(), (db + ".moved").c_str()), 0);
    ASSERT_EQ(::mkdir(db.c_str(), 0700), 0);
    const std::vector<std::string> words = {"sqlite:" + db + ": ", "the path is a directory, not a database file"};
    EXPECT_TRUE(refused([&] { st.reconnect(); }, errc::invalid_argument, words));
    EXPECT_TRUE(refused([&] { (void)st.committed(1); }, errc::invalid_argument, words));
    ASSERT_EQ(::rmdir(db.c_str()), 0);
    ASSERT_EQ(::rename((db + ".moved").c_str(), db.c_str()), 0);
    st.reconnect();
    EXPECT_TRUE(st.committed(1));
}

// The classification must not turn outages into configuration errors: a write lock held by another
// connection is still store_unavailable (retry later).
TEST(SqliteConfiguration, LockHeldByAnotherConnectionIsStillAnOutage) {
    idem_test::temp_dir dir("idem-config");
    const std::string db = dir.file("idem.db");
    { sqlite_store st(db); }
    sqlite3* other = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &other), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(other);
    EXPECT_TRUE(refused([&] { sqlite_store st(db, true, std::chrono::milliseconds(1)); }, errc::store_unavailable,
                        {"sqlite:" + db + ": ", "locked"}));
    sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close(other);
    sqlite_store st(db);  // the lock was the only fault
}

// ---- the idem tool ---------------------------------------------------------------------------------

#ifdef IDEM_TEST_TOOL_STORE
TEST(ToolStoreUri, TemporaryAndUriSqlitePathsGiveTheStoresMessage) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"sqlite::memory:", ":memory:"},
        {"sqlite://:memory:", ":memory:"},
        {"sqlite:file::memory:", "file::memory:"},
        {"sqlite:file:idem.db?mode=memory", "file:idem.db?mode=memory"},
    };
    for (const auto& [uri, path] : cases) {
        SCOPED_TRACE(uri);
        std::string why, rule;
        EXPECT_FALSE(idem::tool::parse_store(uri, &why).has_value());
        ASSERT_FALSE(sqlite_store::check_path(path, false, &rule));
        EXPECT_EQ(why.substr(0, rule.size()), rule) << why;
        EXPECT_NE(why.find("sqlite path '" + path + "' "), std::string::npos) << why;
        if (sqlite_store::is_temporary_path(path)) {
            EXPECT_NE(why.find("use --store memory"), std::string::npos) << why;
        }
    }
}

TEST(ToolStoreUri, ConfigurationFaultsAreInvalidArguments) {
    idem_test::temp_dir dir("idem-config");
    const std::string missing_dir = dir.file("no/such/dir/idem.db");
    const auto spec = idem::tool::parse_store("sqlite:" + missing_dir);
    ASSERT_TRUE(spec.has_value());
    EXPECT_TRUE(refused([&] { (void)idem::tool::open_store(*spec); }, errc::invalid_argument,
                        {"sqlite:" + missing_dir + ": ", "directory " + dir.file("no/such/dir") + " does not exist"}));

    const std::string missing_file = dir.file("missing.db");
    const auto existing = idem::tool::parse_store("sqlite:" + missing_file);
    ASSERT_TRUE(existing.has_value());
    EXPECT_TRUE(
        refused([&] { (void)idem::tool::open_store(*existing, idem::durability::sync, idem::tool::open_mode::existing); },
                errc::invalid_argument, {"sqlite:" + missing_file + ": ", "no such database file"}));
    EXPECT_NE(idem::tool::open_store(*existing), nullptr);  // created on request: a plain path works
}
#endif

}  // namespace
