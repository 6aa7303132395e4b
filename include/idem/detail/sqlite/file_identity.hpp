// idem/detail/sqlite/file_identity.hpp: the files under a running sqlite_store, watched.
//
// Invariant: the store commits only into the database file its first open found at the path, with
// the write-ahead log of its latest open, and (a writer) holding the lock on the PATH.lock the path
// names. It notes their identities (device, inode: detail/files/identity.hpp) and checks them with
// stat() before and after each batch. A database file deleted, moved away or replaced under the
// running process would take every later commit to a file no restart finds, so the store then
// acknowledges nothing (store_error naming the path) until the path names that file again; a reopen
// opens only that same file, never a new, empty database where the old one was. A lost write-ahead
// log or lock file cannot be seen to heal, so it is final for the store.
#pragma once

#include <sqlite3.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "idem/detail/files/identity.hpp"
#include "idem/detail/sqlite/paths.hpp"
#include "idem/detail/sqlite/writer_lock.hpp"
#include "idem/error.hpp"

namespace idem::detail::sqlite {

/// The text of a database file no longer at the path, found `when`.
[[nodiscard]] inline std::string replaced_message(const std::string& when) {
    return files::replaced_message("file", when,
                                   "to a file that no restart finds; this store acknowledges nothing until the path "
                                   "names that file again");
}

class file_watch {
public:
    explicit file_watch(std::string path) : path_(std::move(path)) {}

    /// Whether the first open noted the database file (later opens are reopens).
    [[nodiscard]] bool known() const noexcept { return known_; }

    /// Notes, at each open, the identity of the database file (the first open's is kept for the
    /// store's life) and of its write-ahead log (SQLite makes a new one when the last connection
    /// closes and the next opens, so it is noted again).
    void note(bool first) {
        const files::entry db = files::look(path_);
        if (!db.regular())
            throw error(errc::store_error, where(path_) + "the database file vanished while it was being opened");
        if (first) {
            file_ = db.id();
            known_ = true;
        } else if (!file_.names(db.st)) {
            throw error(errc::store_error, where(path_) + replaced_message("while it was being reopened"));
        }
        const files::entry wal = files::look(wal_path(path_));
        wal_known_ = wal.found();
        wal_ = wal.id();
    }

    /// Throws the fault that ended this store's writing for good, if one did.
    void refuse_if_lost() const {
        if (!lost_.empty()) throw error(errc::store_error, lost_);
    }

    /// A reopen (reconnect, or the next call after a failed one) must find the file it opened
    /// first. A missing file is not created again, and another file at the path is not used: either
    /// would put an empty or foreign history in place of the one the guard's memory reflects.
    /// Something that is not a regular file is left to SQLite's open and the configuration checks,
    /// which name it (a directory at the path, ...).
    void check_reopen() const {
        const files::entry db = files::look(path_);
        if (!db.found()) {
            if (db.gone())
                throw error(errc::store_error,
                            where(path_) + replaced_message(std::string("found at reconnect: ") + std::strerror(db.err)) +
                                "; refusing to create a new, empty database in its place (that would drop the "
                                "history of every key)");
            return;  // unreachable for now: SQLite's open and the configuration checks say why
        }
        if (db.regular() && !file_.names(db.st))
            throw error(errc::store_error, where(path_) +
                                               replaced_message("found at reconnect: another file is at the path") +
                                               "; refusing to use it in place of the history this store opened");
    }

    /// What is wrong with the files under a writer, or "" when the path still names the database
    /// file it opened, its write-ahead log is the one it opened, and (for the writer) PATH.lock is
    /// the file it locked. Cheap: a few stat() calls, once before and once after each batch.
    /// `sticky` is set for faults that a later call cannot see heal (see check).
    [[nodiscard]] std::string fault(sqlite3* db, const writer_lock& lock, bool& sticky) const {
        sticky = false;
        const files::entry file = files::look(path_);
        if (!file.found()) {
            if (file.gone()) return replaced_message(std::strerror(file.err));
            return "the database file cannot be reached (" + std::string(std::strerror(file.err)) + ")";
        }
        if (!file_.names(file.st)) return replaced_message("another file is at the path");
        int moved = 0;
        if (db && sqlite3_file_control(db, "main", SQLITE_FCNTL_HAS_MOVED, &moved) == SQLITE_OK && moved != 0)
            return replaced_message("SQLite reports the file moved");
        if (wal_known_) {
            const std::string wal = wal_path(path_);
            const files::entry now = files::look(wal);
            if (!now.found() || !wal_.names(now.st)) {
                sticky = true;
                return "the write-ahead log " + wal +
                       " was deleted or replaced under the running process: the commits it held since the last "
                       "checkpoint are no longer reachable by the path, so this store acknowledges nothing more; "
                       "close it (its connection checkpoints the log it still holds into the database file when it "
                       "is the last one) and restart";
            }
        }
        if (std::string lost = lock.fault(); !lost.empty()) {
            sticky = true;
            return lost;
        }
        return {};
    }

    /// Throws store_error when fault() finds something: the batch is not acknowledged. A missing or
    /// replaced database file is checked again at every call, so putting the file back (renaming it
    /// to the path) resumes; a lost write-ahead log or lock file is final for this store.
    void check(const char* when, sqlite3* db, const writer_lock& lock) {
        refuse_if_lost();
        bool sticky = false;
        const std::string fault = this->fault(db, lock, sticky);
        if (fault.empty()) return;
        const std::string msg = where(path_) + fault + " [" + when + "]";
        if (sticky) lost_ = msg;
        throw error(errc::store_error, msg);
    }

private:
    std::string path_;
    bool known_ = false;  // the first open noted file_
    files::identity file_;
    bool wal_known_ = false;
    files::identity wal_;
    std::string lost_;  // set once a lost log or lock file is found: every write and reopen refuses
};

}  // namespace idem::detail::sqlite
