// tools/drill.hpp: what `idem drill` and its worker (`idem drill-worker`) share: the file formats of
// the independent ledger, the acknowledgement file and the request list, and the worker's report.
//
// Ledger and acknowledgement files hold fixed-size 64-byte lines, appended with one write() on an
// O_APPEND descriptor and made durable with fdatasync() before the caller goes on:
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
//
// The worker reports on its stdout, one line each:
//   "ready recovery_ns=N records=N processing=N compensated_at_open=N compensated_after_wait=N
//    waited_ms=N pending=N"                      after recovery and compensation, before any request
//   "done requests=N executed=N acked=N replayed=N busy=N in_doubt=N unavailable=N unacked=N
//    unexpected=N replay_mismatches=N"           after the last request (a run that was not killed)
//   "refused <message>"                          the store would not open (another writer holds the
//                                                file, ...): the worker exits 3
// and with --stop-on-unavailable (`idem drill --delete-file`):
//   "claim_ok t=N", "ack_ok t=N"                 a confirmed claim or acknowledgement; N is the
//                                                steady clock (ns) when its call was made
//   "error <message>"                            after "done": the store's last error
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
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

/// An append-only file whose every line is durable when append() returns.
class durable_appender {
public:
    explicit durable_appender(std::string path) : path_(std::move(path)) {
        fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0) throw idem::error(idem::errc::store_error, "cannot open '" + path_ + "': " + std::strerror(errno));
    }
    ~durable_appender() {
        if (fd_ >= 0) ::close(fd_);
    }
    durable_appender(const durable_appender&) = delete;
    durable_appender& operator=(const durable_appender&) = delete;

    /// One write() of the whole line (O_APPEND: atomic against other appenders), then fdatasync.
    /// Thread-safe: the kernel serialises appends on the descriptor.
    void append(const std::string& line) {
        const ssize_t n = ::write(fd_, line.data(), line.size());
        if (n != static_cast<ssize_t>(line.size()))
            throw idem::error(idem::errc::store_error, "write to '" + path_ + "' failed: " +
                                                           (n < 0 ? std::strerror(errno) : "short write"));
        if (::fdatasync(fd_) != 0)
            throw idem::error(idem::errc::store_error, "fdatasync of '" + path_ + "' failed: " + std::strerror(errno));
    }

private:
    std::string path_;
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

/// Parses "word k1=v1 k2=v2 ..." into the word and its numeric fields.
struct report_line {
    std::string word;
    std::map<std::string, std::int64_t> fields;
    [[nodiscard]] std::int64_t get(const std::string& k) const {
        const auto it = fields.find(k);
        return it == fields.end() ? 0 : it->second;
    }
};

inline report_line parse_report(std::string_view line) {
    report_line r;
    std::size_t pos = 0;
    bool first = true;
    while (pos < line.size()) {
        const std::size_t end = std::min(line.find(' ', pos), line.size());
        const std::string_view tok = line.substr(pos, end - pos);
        if (first) {
            r.word = std::string(tok);
            first = false;
        } else if (const auto eq = tok.find('='); eq != std::string_view::npos) {
            std::int64_t v = 0;
            const std::string_view num = tok.substr(eq + 1);
            std::from_chars(num.data(), num.data() + num.size(), v);
            r.fields[std::string(tok.substr(0, eq))] = v;
        }
        pos = end + 1;
    }
    return r;
}

}  // namespace idem::tool::drill
