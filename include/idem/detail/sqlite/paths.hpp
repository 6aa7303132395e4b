// idem/detail/sqlite/paths.hpp: which paths sqlite_store opens, and the files one database uses.
//
// Invariant: the store opens a plain path that names one durable database file, or, asked
// explicitly, a temporary database; never a path SQLite would read otherwise:
//   ""            SQLite makes a temporary on-disk database, deleted when the connection closes
//   ":memory:"    SQLite makes an in-memory database, gone when the connection closes
//   "file:..."    SQLite builds with URI filenames enabled read it as a URI, whose parameters
//                 (mode=memory, vfs=memdb, nolock=1, immutable=1, ...) drop durability or locking
//   a NUL byte    SQLite would open the path cut at that byte
// The database PATH has three files beside it: PATH-wal and PATH-shm (SQLite's, in WAL mode) and
// PATH.lock (the writer lock, writer_lock.hpp); the configuration checks cover all four.
#pragma once

#include <string>
#include <string_view>

#include "idem/detail/files/path_rules.hpp"
#include "idem/key.hpp"

namespace idem::detail::sqlite {

/// True for the paths SQLite turns into a temporary database: "" and ":memory:".
[[nodiscard]] inline bool is_temporary_path(std::string_view path) noexcept { return path.empty() || path == ":memory:"; }

/// Whether `path` may name a database (the rules above; the file system is not consulted). On
/// refusal fills *why (if given) with the path and the rule.
inline bool check_path(std::string_view path, bool allow_temporary, std::string* why = nullptr) {
    const bool nul = files::has_nul(path);
    auto refuse = [&](const std::string& rule) {
        if (why) *why = "sqlite path '" + (nul ? key::printable(path) : std::string(path)) + "' " + rule;
        return false;
    };
    if (nul) return refuse("holds a NUL byte; SQLite would open the path cut at that byte");
    if (path.starts_with("file:"))
        return refuse(
            "begins with 'file:', so SQLite may read it as a URI, whose parameters (mode=memory, vfs=memdb, "
            "nolock=1, immutable=1, ...) drop durability or locking; this store opens plain paths only (write "
            "'./" +
            std::string(path) + "' for a file of that name)");
    if (allow_temporary) return true;
    if (path.empty())
        return refuse(
            "is empty, which makes SQLite create a temporary database that it deletes when the store "
            "closes: nothing would survive a reopen; name a database file");
    if (path == ":memory:")
        return refuse(
            "makes SQLite create an in-memory database that is gone when the store closes: nothing "
            "would survive a reopen; name a database file");
    return true;
}

/// "sqlite:PATH: ", how every message of the store begins.
[[nodiscard]] inline std::string where(const std::string& path) { return "sqlite:" + path + ": "; }
[[nodiscard]] inline std::string wal_path(const std::string& path) { return path + "-wal"; }
[[nodiscard]] inline std::string lock_path(const std::string& path) { return path + ".lock"; }

/// What in the file system keeps this process from opening `path` read-write in WAL mode (SQLite
/// creates PATH-wal and PATH-shm beside it; the store, PATH.lock), or "" when nothing shows.
[[nodiscard]] inline std::string configuration_fault(const std::string& path) {
    return files::database_file_fault(path, {"-wal", "-shm", ".lock"});
}

}  // namespace idem::detail::sqlite
