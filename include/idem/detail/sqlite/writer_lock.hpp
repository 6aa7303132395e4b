// idem/detail/sqlite/writer_lock.hpp: the one writer of a SQLite database file, marked by an
// exclusive flock() on the sidecar file PATH.lock.
//
// Invariant: a database file has one writer at a time: two would run the same keys twice and
// overwrite each other's records. The lock belongs to the open file, so a second store in the same
// process is refused like one in another process, and the kernel drops it when the holder exits,
// however it exits (SIGKILL included), so a crashed writer never blocks its successor. The file
// locked is the one the path names (checked after each lock and before and after each batch): one
// deleted or replaced would let another process lock the new file and write beside this one. The
// holder records itself in the file ("pid N on host H"), which also tells a later open that a
// database once lived at the path.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "idem/detail/files/identity.hpp"
#include "idem/detail/sqlite/paths.hpp"
#include "idem/error.hpp"

namespace idem::detail::sqlite {

class writer_lock {
public:
    /// The lock of the database at `db_path` (the file PATH.lock); nothing is opened yet.
    explicit writer_lock(std::string db_path) : db_path_(std::move(db_path)), path_(lock_path(db_path_)) {}
    writer_lock(const writer_lock&) = delete;
    writer_lock& operator=(const writer_lock&) = delete;

    [[nodiscard]] const std::string& path() const noexcept { return path_; }
    [[nodiscard]] bool file_open() const noexcept { return fd_ >= 0; }
    /// Whether this store holds the lock (take() succeeded and nothing released it).
    [[nodiscard]] bool held() const noexcept { return held_; }

    /// Opens (creating it when missing) PATH.lock. The store opens it at its first open even when it
    /// may only read, so that a directory where it cannot be created is refused at open, not at the
    /// first write.
    void open_file() {
        fd_.reset(::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
        if (fd_ >= 0) return;
        const int e = errno;
        const std::string fault = configuration_fault(db_path_);
        throw error(fault.empty() ? errc::store_error : errc::invalid_argument,
                    where(db_path_) + (fault.empty() ? "" : fault + "; ") + "cannot open the writer lock file " + path_ +
                        " (" + std::strerror(e) + ")");
    }

    /// A first open that finds no database file but a PATH.lock in which a writer recorded itself:
    /// the database this path held was deleted or moved (`rm PATH`). Creating a new one would start
    /// an empty history in which every key the old one recorded runs again, so this is refused,
    /// naming both files. Deleting PATH.lock as well starts a new history on purpose.
    void refuse_lost_database() const {
        struct stat st {};
        if (::stat(db_path_.c_str(), &st) == 0 || errno != ENOENT) return;
        const std::string who = holder();
        if (who.empty()) return;  // no writer ever wrote here: a new database is expected
        throw error(errc::invalid_argument,
                    where(db_path_) + "the database file is missing, but " + path_ + " records a writer (" + who +
                        "): the database this path held was deleted or moved, and a new, empty one would let every "
                        "key it recorded run again. Put the file back, or delete " +
                        path_ + " too to start a new, empty history on purpose");
    }

    /// Who holds the lock, as the holder wrote it into PATH.lock ("pid N on host H"), or "".
    [[nodiscard]] std::string holder() const {
        char buf[160] = {};
        const auto n = ::pread(fd_, buf, sizeof buf - 1, 0);
        std::string h(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
        h = h.substr(0, h.find('\n'));
        for (char& c : h)
            if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
        return h;
    }

    /// Takes the lock (flock, exclusive, non-blocking) or throws store_unavailable naming the
    /// holder. The descriptor is close-on-exec: a program the holder runs does not inherit it.
    void take() {
        for (int attempt = 0;; ++attempt) {
            if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
                const int e = errno;
                if (e != EWOULDBLOCK && e != EINTR)
                    throw error(errc::store_error, where(db_path_) + "cannot lock " + path_ + " (" + std::strerror(e) + ")");
                const std::string who = holder();
                throw error(errc::store_unavailable,
                            where(db_path_) + "another store holds the writer lock " + path_ + " (" +
                                (who.empty() ? std::string("holder not recorded") : who) +
                                "); a database file has one writer at a time: two would run the same keys twice and "
                                "overwrite each other's records. Stop the other writer, or read with a store that "
                                "does not write (idem verify, idem stats)");
            }
            // The file locked must still be the one at the path: one deleted or replaced in between
            // would let another process lock the new file too.
            if (files::still_named(fd_, path_)) break;
            fd_.reset();
            if (attempt == 3)
                throw error(errc::store_unavailable,
                            where(db_path_) + "the writer lock file " + path_ + " keeps being replaced while it is locked");
            open_file();
        }
        char host[64] = {};
        if (::gethostname(host, sizeof host - 1) != 0) host[0] = '?';
        const std::string me = "pid " + std::to_string(::getpid()) + " on host " + host + "\n";
        if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, me.data(), me.size(), 0);
        held_ = true;
    }

    /// Gives the lock back (the file stays open): the store found it may not write after all.
    void release() noexcept {
        held_ = false;
        ::flock(fd_, LOCK_UN);
    }

    /// While held: "" when PATH.lock is still the file locked, else the fault, which is final (a
    /// later call cannot see it heal: another process may have locked the new file meanwhile).
    [[nodiscard]] std::string fault() const {
        if (!held_ || files::still_named(fd_, path_)) return {};
        return "the writer lock file " + path_ +
               " was deleted or replaced under the running process: another process could now lock the new "
               "file and write beside this one, so this store acknowledges nothing more; restart it";
    }

private:
    /// A descriptor closed with its owner.
    struct owned_fd {
        int fd = -1;
        owned_fd() = default;
        owned_fd(const owned_fd&) = delete;
        owned_fd& operator=(const owned_fd&) = delete;
        ~owned_fd() { reset(); }
        void reset(int to = -1) noexcept {
            if (fd >= 0) ::close(fd);
            fd = to;
        }
        operator int() const noexcept { return fd; }  // NOLINT: reads like the descriptor it is
    };

    std::string db_path_;
    std::string path_;  // PATH.lock
    owned_fd fd_;       // open from the store's first open to its destructor
    bool held_ = false;
};

}  // namespace idem::detail::sqlite
