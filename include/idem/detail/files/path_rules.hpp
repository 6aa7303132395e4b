// idem/detail/files/path_rules.hpp: what the file system says about an embedded store's path, for
// both shapes a store takes: one database file with files beside it (SQLite: PATH-wal, PATH-shm,
// PATH.lock) or one database directory (RocksDB). Both stores call these; neither keeps a copy.
//
// Invariant: a configuration fault (a missing parent directory, a directory where a file belongs or
// the reverse, no permission, a read-only file system) is found by looking and named with the path
// and the rule, so the store reports it as invalid_argument (retrying cannot help), never as an
// outage. Access is checked with faccessat(AT_EACCESS), so the answer is what this process can
// really do: root too is refused by a read-only file system or an immutable file.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>

namespace idem::detail::files {

/// The errno of the refusal when this process may not access `path` with `mode` (R_OK, W_OK, X_OK,
/// F_OK), or 0 when it may.
[[nodiscard]] inline int refusal(const std::string& path, int mode) noexcept {
    return ::faccessat(AT_FDCWD, path.c_str(), mode, AT_EACCESS) == 0 ? 0 : errno;
}

/// " (the text of errno e)": how a fault's text ends.
[[nodiscard]] inline std::string because(int e) { return " (" + std::string(std::strerror(e)) + ")"; }

/// Whether `path` holds a NUL byte: the C calls under every store would see the path cut there.
[[nodiscard]] inline bool has_nul(std::string_view path) noexcept { return path.find('\0') != std::string_view::npos; }

/// The directory that holds `path` as written: "." for a bare name, "/" for a name at the root.
[[nodiscard]] inline std::string parent_of(const std::string& path) {
    const std::size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

/// `path` without the slashes that end it ("db/" is the directory "db"); "/" stays "/".
[[nodiscard]] inline std::string without_trailing_slashes(std::string path) {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    return path;
}

/// For a path that stat() did not find (`e`, its errno): what keeps this process from creating it in
/// directory `dir`, or "". `missing_note` follows "directory DIR does not exist"; `cannot_create`
/// comes before DIR when the directory refuses new entries.
[[nodiscard]] inline std::string creation_fault(int e, const std::string& dir, std::string_view missing_note,
                                                std::string_view cannot_create) {
    if (e != ENOENT && e != ENOTDIR) return "the path cannot be reached" + because(e);
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
        const int d = errno;
        return d == ENOENT ? "directory " + dir + " does not exist" + std::string(missing_note)
                           : "directory " + dir + " cannot be reached" + because(d);
    }
    if (!S_ISDIR(st.st_mode)) return dir + " is not a directory";
    if (const int d = refusal(dir, W_OK | X_OK)) return std::string(cannot_create) + dir + because(d);
    return {};
}

/// What keeps this process from opening `path` as a database file read-write, with the files named
/// by `sidecars` (suffixes: "-wal", ".lock", ...) beside it, opened or created; "" when nothing shows.
[[nodiscard]] inline std::string database_file_fault(const std::string& path, std::initializer_list<const char*> sidecars) {
    const std::string dir = parent_of(path);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        const int e = errno;
        return creation_fault(e, dir, "", "no permission to create files in directory ");
    }
    if (S_ISDIR(st.st_mode)) return "the path is a directory, not a database file";
    if (!S_ISREG(st.st_mode)) return "the path is not a regular file";
    if (const int e = refusal(path, R_OK | W_OK)) return "no permission to read and write the file" + because(e);
    bool creates = false;  // a file beside it that must be created
    std::string names;     // "the -wal, -shm and .lock files"
    std::size_t i = 0;
    for (const char* suffix : sidecars) {
        names += (i == 0 ? "the " : i + 1 == sidecars.size() ? " and " : ", ") + std::string(suffix);
        ++i;
        const std::string side = path + suffix;
        if (refusal(side, F_OK) != 0) creates = true;
        else if (const int e = refusal(side, R_OK | W_OK)) return "no permission to read and write " + side + because(e);
    }
    if (const int e = creates ? refusal(dir, W_OK | X_OK) : 0)
        return "no permission to create " + names + " files in directory " + dir + because(e);
    return {};
}

/// What keeps this process from opening `path` as a database directory (reading, writing and
/// creating files in it, or creating it as the last part of the path); "" when nothing shows.
[[nodiscard]] inline std::string database_directory_fault(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        const int e = errno;
        return creation_fault(e, parent_of(without_trailing_slashes(path)),
                              " (the store creates only the last part of the path)",
                              "no permission to create the database directory in ");
    }
    if (!S_ISDIR(st.st_mode))
        return std::string(S_ISREG(st.st_mode) ? "the path is a regular file" : "the path is not a directory") +
               "; a RocksDB store is a directory (name a new or existing database directory)";
    if (const int e = refusal(path, R_OK | W_OK | X_OK))
        return "no permission to read and write in the directory" + because(e);
    return {};
}

}  // namespace idem::detail::files
