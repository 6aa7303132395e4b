// idem/detail/files/identity.hpp: which file a path names (device and inode), so an embedded store
// can tell that the database file or directory it opened is still the one at its path.
//
// Invariant: a store commits only into the file (SQLite) or directory (RocksDB) that its first open
// found at the path. One deleted, moved away or replaced under the running process would take every
// later commit where no restart finds it, so the store notes the identity at its first open,
// compares it with stat() before and after each batch and at each reopen, and acknowledges nothing
// while they differ. The fault texts are shared here so both stores name the fault alike.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <string>
#include <string_view>

namespace idem::detail::files {

/// A file's identity: its device and inode.
struct identity {
    dev_t dev = 0;
    ino_t ino = 0;
    [[nodiscard]] static identity of(const struct stat& st) noexcept { return {st.st_dev, st.st_ino}; }
    /// Whether `st` (from stat or fstat) describes this file.
    [[nodiscard]] bool names(const struct stat& st) const noexcept { return st.st_dev == dev && st.st_ino == ino; }
};

/// What stat() found at a path: the entry, or the errno of the failure.
struct entry {
    int err = 0;  ///< 0: found
    struct stat st {};
    [[nodiscard]] bool found() const noexcept { return err == 0; }
    /// Nothing at the path (deleted, or moved away): as opposed to a path that cannot be reached.
    [[nodiscard]] bool gone() const noexcept { return err == ENOENT || err == ENOTDIR; }
    [[nodiscard]] bool regular() const noexcept { return found() && S_ISREG(st.st_mode); }
    [[nodiscard]] bool directory() const noexcept { return found() && S_ISDIR(st.st_mode); }
    [[nodiscard]] identity id() const noexcept { return identity::of(st); }
};

[[nodiscard]] inline entry look(const std::string& path) noexcept {
    entry e;
    if (::stat(path.c_str(), &e.st) != 0) e.err = errno;
    return e;
}

/// Whether the file open as `fd` is the one `path` names now (both found, same identity).
[[nodiscard]] inline bool still_named(int fd, const std::string& path) noexcept {
    struct stat held {
    }, now{};
    return ::fstat(fd, &held) == 0 && ::stat(path.c_str(), &now) == 0 && identity::of(held).names(now);
}

/// The text of a replaced database `thing` ("file", "directory"), found `when`; `consequence`
/// follows "so a commit would go ".
[[nodiscard]] inline std::string replaced_message(std::string_view thing, const std::string& when,
                                                  std::string_view consequence) {
    return "the database " + std::string(thing) + " was deleted or replaced under the running process (" + when +
           "): the path no longer names the " + std::string(thing) + " this store opened, so a commit would go " +
           std::string(consequence);
}

}  // namespace idem::detail::files
