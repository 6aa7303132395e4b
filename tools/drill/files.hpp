// tools/drill/files.hpp: the files of a crash drill, shared by `idem drill`, its worker
// (`idem drill-worker`) and tests/crash_test.cpp: the independent ledger, the acknowledgement file,
// and the request list.
//
// Ledger and acknowledgement files hold fixed-size 64-byte lines, each appended with one write() on
// an O_APPEND descriptor (line_appender):
//
//   "E <key, space-padded to 40> <outcome, 20 digits>\n"   ledger: one line per executed effect
//   "A <key, space-padded to 40> <outcome, 20 digits>\n"   acks: success recorded and committed
//
// A line never straddles a page (64 divides 4096 and every line starts at a multiple of 64), so a
// process killed during write() leaves either the whole line or none of it; a reader still counts
// and skips an incomplete tail ("torn") rather than trusting it.
//
// The request list is text, one "KEY AMOUNT" per line. The outcome of a request is its amount (0 is
// a legal amount, so falsy outcomes are replayed and resolved too).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/error.hpp"

namespace idem::tool::drill {

inline constexpr std::size_t line_size = 64;
inline constexpr std::size_t max_key = 40;

/// "E <key> <outcome>\n" padded to line_size. The key must be at most max_key bytes without spaces.
inline std::string make_line(char tag, std::string_view key, std::uint64_t outcome) {
    char buf[line_size + 1];
    const int n = std::snprintf(buf, sizeof buf, "%c %-40.*s %020llu\n", tag, static_cast<int>(key.size()), key.data(),
                                static_cast<unsigned long long>(outcome));
    return std::string(buf, static_cast<std::size_t>(n));
}

/// The home rule of a regions drill (`idem drill --region ...`): a key "<prefix><region>-<serial>..."
/// belongs to <region>. Throws invalid_argument for a key of another shape (a regional guard
/// answers such a key invalid_key).
inline std::string home_of(std::string_view key, std::string_view prefix) {
    const std::size_t dash = key.starts_with(prefix) ? key.find('-', prefix.size()) : std::string_view::npos;
    if (dash == std::string_view::npos || dash == prefix.size())
        throw idem::error(idem::errc::invalid_argument,
                          "key '" + std::string(key) + "' is not '" + std::string(prefix) + "<region>-<serial>'");
    return std::string(key.substr(prefix.size(), dash - prefix.size()));
}

/// A fresh drill directory, $TMPDIR/idem-drill-XXXXXX (ledger, acks, request lists). Throws
/// idem::error(store_error) naming the template when it cannot be made.
inline std::string make_directory() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp != nullptr ? tmp : "/tmp") + "/idem-drill-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
        throw idem::error(idem::errc::store_error,
                          "cannot create a drill directory from '" + tmpl + "': " + std::strerror(errno));
    return tmpl;
}

struct entry {
    char tag = 0;
    std::string key;
    std::uint64_t outcome = 0;
};

struct line_file {
    std::vector<entry> entries;
    std::size_t torn = 0;       ///< bytes of an incomplete last line
    std::size_t malformed = 0;  ///< complete lines that do not parse
};

/// Reads a ledger or acks file. A missing file reads as empty.
inline line_file read_lines(const std::string& path) {
    line_file out;
    std::ifstream in(path, std::ios::binary);
    if (!in) return out;
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::size_t whole = data.size() / line_size;
    out.torn = data.size() % line_size;
    for (std::size_t i = 0; i < whole; ++i) {
        const std::string_view l(data.data() + i * line_size, line_size);
        entry e;
        e.tag = l[0];
        std::string_view k = l.substr(2, max_key);
        while (!k.empty() && k.back() == ' ') k.remove_suffix(1);
        const std::string_view digits = l.substr(2 + max_key + 1, 20);
        const auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), e.outcome);
        if (l[1] != ' ' || l[2 + max_key] != ' ' || l[line_size - 1] != '\n' || k.empty() || ec != std::errc{} ||
            p != digits.data() + digits.size()) {
            ++out.malformed;
            continue;
        }
        e.key = std::string(k);
        out.entries.push_back(std::move(e));
    }
    return out;
}

/// An append-only file of whole lines: each append() is one write() on an O_APPEND descriptor, so
/// lines from several threads or processes never interleave. With `durable` the line is also on disk
/// (fdatasync) when append() returns; without, it is in the page cache, which a SIGKILL of the
/// writer does not lose (crash_test's async run: an fdatasync per payment would throttle the
/// producers below the flusher and hide the loss it measures).
/// Thread-safe: the kernel serialises appends on the descriptor.
class line_appender {
public:
    explicit line_appender(std::string path, bool durable = true) : path_(std::move(path)), durable_(durable) {
        fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0) throw idem::error(idem::errc::store_error, "cannot open '" + path_ + "': " + std::strerror(errno));
    }
    ~line_appender() {
        if (fd_ >= 0) ::close(fd_);
    }
    line_appender(const line_appender&) = delete;
    line_appender& operator=(const line_appender&) = delete;

    void append(const std::string& line) {
        const ssize_t n = ::write(fd_, line.data(), line.size());
        if (n != static_cast<ssize_t>(line.size()))
            throw idem::error(idem::errc::store_error,
                              "write to '" + path_ + "' failed: " + (n < 0 ? std::strerror(errno) : "short write"));
        if (durable_ && ::fdatasync(fd_) != 0)
            throw idem::error(idem::errc::store_error, "fdatasync of '" + path_ + "' failed: " + std::strerror(errno));
    }

private:
    std::string path_;
    bool durable_;
    int fd_ = -1;
};

struct request {
    std::string key;
    std::uint64_t amount = 0;
};

inline void write_requests(const std::string& path, const std::vector<request>& reqs) {
    std::ofstream out(path, std::ios::trunc);
    for (const request& r : reqs) out << r.key << ' ' << r.amount << '\n';
    out.flush();
    if (!out) throw idem::error(idem::errc::store_error, "cannot write the request list '" + path + "'");
}

inline std::vector<request> read_requests(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw idem::error(idem::errc::invalid_argument, "cannot read the request list '" + path + "'");
    std::vector<request> out;
    request r;
    while (in >> r.key >> r.amount) out.push_back(r);
    return out;
}

}  // namespace idem::tool::drill
