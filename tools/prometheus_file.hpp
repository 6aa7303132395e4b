// tools/prometheus_file.hpp: `--prometheus FILE` of verify and drill: the run's result as gauges in
// the Prometheus text format, for node-exporter's textfile collector (--collector.textfile.directory).
//
// The file is written whole to FILE.tmp and renamed onto FILE, so the collector, which reads *.prom
// files at each scrape, never sees a half-written one (rename is atomic within a directory; the
// collector ignores FILE.tmp, which does not end in .prom). Every gauge carries the label
// store="<the store as the tool prints it>": a PostgreSQL URI without its password.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/stats.hpp"  // detail::prometheus_label

namespace idem::tool {

/// One gauge of a textfile: its full name, its HELP text, its value as printed.
struct textfile_gauge {
    std::string name;
    std::string help;
    std::string value;
};

inline std::string prometheus_integer(std::uint64_t v) { return std::to_string(v); }

/// A float sample value: "%.*f" (Prometheus reads any decimal).
inline std::string prometheus_decimal(double v, int decimals) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return buf;
}

/// Now, in Unix seconds with milliseconds (the *_last_run_timestamp_seconds gauges).
inline std::string prometheus_now() {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    char buf[48];
    std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ms / 1000), static_cast<long long>(ms % 1000));
    return buf;
}

/// The text: per gauge "# HELP", "# TYPE ... gauge" and one sample labelled store="...".
inline std::string textfile_text(const std::vector<textfile_gauge>& gauges, std::string_view store) {
    const std::string label = "{store=\"" + idem::detail::prometheus_label(store) + "\"}";
    std::string out;
    for (const textfile_gauge& g : gauges) {
        out += "# HELP " + g.name + ' ' + g.help + '\n';
        out += "# TYPE " + g.name + " gauge\n";
        out += g.name + label + ' ' + g.value + '\n';
    }
    return out;
}

/// Writes `text` to PATH.tmp, then renames it onto PATH. nullopt on success, else a message naming
/// the file and the cause (PATH.tmp is removed then).
inline std::optional<std::string> write_textfile(const std::string& path, const std::string& text) {
    namespace fs = std::filesystem;
    const fs::path p(path);
    const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
        return "cannot write " + path + ": the directory " + dir.string() +
               (fs::exists(dir, ec) ? " is not a directory" : " does not exist");
    if (fs::is_directory(p, ec))
        return "cannot write " + path + ": it is a directory (name a file, e.g. " + (p / "idem.prom").string() + ")";
    const std::string tmp = path + ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return "cannot create " + tmp + ": " + std::strerror(errno);
    auto fail = [&](const std::string& what) -> std::optional<std::string> {
        const std::string why = std::strerror(errno);
        ::close(fd);
        ::unlink(tmp.c_str());
        return what + ": " + why;
    };
    for (std::size_t done = 0; done < text.size();) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return fail("cannot write " + tmp);
        done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd) != 0) return fail("cannot sync " + tmp);
    if (::close(fd) != 0) {
        const std::string why = std::strerror(errno);
        ::unlink(tmp.c_str());
        return "cannot write " + tmp + ": " + why;
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string why = std::strerror(errno);
        ::unlink(tmp.c_str());
        return "cannot rename " + tmp + " to " + path + ": " + why;
    }
    return std::nullopt;
}

/// `idem drill`'s gauges (the crash drill and the regions drill alike), written to `path`; the
/// reason when the file could not be written.
inline std::optional<std::string> write_drill_metrics(const std::string& path, std::uint64_t failed_checks,
                                                      std::uint64_t checks, double elapsed_s, std::string_view store) {
    const std::vector<textfile_gauge> gauges{
        {"idem_drill_last_run_timestamp_seconds", "Unix time the last idem drill run finished.", prometheus_now()},
        {"idem_drill_failures", "Checks of the last idem drill run that failed (0: the drill passed).",
         prometheus_integer(failed_checks)},
        {"idem_drill_checks", "Checks the last idem drill run made (workers, ledger, acknowledgements, store).",
         prometheus_integer(checks)},
        {"idem_drill_duration_seconds", "Time the last idem drill run took, crash cycles and checks.",
         prometheus_decimal(elapsed_s, 6)},
    };
    return write_textfile(path, textfile_text(gauges, store));
}

inline constexpr const char* prometheus_option_help =
    "After the run, write its result as Prometheus gauges to FILE (via FILE.tmp and a rename), for "
    "node-exporter's textfile collector; written whatever the checks found";

}  // namespace idem::tool
