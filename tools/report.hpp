// tools/report.hpp: output helpers shared by the subcommands: a two-column summary table for people
// and a one-line JSON object for scripts (nlohmann-json, Debian nlohmann-json3-dev).
#pragma once

#include <algorithm>
#include <cmath>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "idem/store.hpp"

namespace idem::tool {

/// 1234567 -> "1,234,567".
inline std::string grouped(std::uint64_t v) {
    std::string digits = std::to_string(v);
    std::string out;
    for (std::size_t i = 0; i < digits.size(); ++i) {
        if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return out;
}

inline std::string grouped_signed(std::int64_t v) {
    return v < 0 ? "-" + grouped(static_cast<std::uint64_t>(-(v + 1)) + 1) : grouped(static_cast<std::uint64_t>(v));
}

inline std::string fixed(double v, int decimals) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return buf;
}

/// Unix milliseconds -> "2024-06-15T12:34:56.789Z" (ISO-8601, UTC).
inline std::string iso8601_ms(std::int64_t ms) {
    std::int64_t secs = ms / 1000;
    std::int64_t frac = ms % 1000;
    if (frac < 0) {
        frac += 1000;
        --secs;
    }
    const std::time_t t = static_cast<std::time_t>(secs);
    std::tm tm{};
    if (::gmtime_r(&t, &tm) == nullptr) return std::to_string(ms) + "ms";
    char buf[48];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                  tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(frac));
    return buf;
}

/// The p-quantile (0..1) of `v` by the nearest-rank method; 0 for an empty vector. Sorts v.
inline double percentile(std::vector<double>& v, double p) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    std::size_t rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(v.size())));
    rank = std::clamp<std::size_t>(rank, 1, v.size());
    return v[rank - 1];
}

/// Rows of label, value (right-aligned) and an optional note.
class table {
public:
    void row(std::string label, std::string value, std::string note = {}) {
        rows_.push_back({std::move(label), std::move(value), std::move(note)});
    }
    void print(std::ostream& out) const {
        std::size_t lw = 0, vw = 0;
        for (const auto& r : rows_) {
            lw = std::max(lw, r.label.size());
            vw = std::max(vw, r.value.size());
        }
        for (const auto& r : rows_) {
            out << "  " << r.label << std::string(lw - r.label.size() + 2, ' ') << std::string(vw - r.value.size(), ' ')
                << r.value;
            if (!r.note.empty()) out << "   " << r.note;
            out << '\n';
        }
    }

private:
    struct line {
        std::string label, value, note;
    };
    std::vector<line> rows_;
};

/// The tools' JSON: objects keep their keys in insertion order, the order scripts and people expect.
using json = nlohmann::ordered_json;

/// Rounds every float in `j` to six significant digits and turns a whole one into an integer, so that
/// "elapsed_s":2.13457 and "wait_ms":0 read as they always have (C's %.6g), not in nlohmann's
/// round-trip form (2.1345678912345, 0.0). A non-finite float becomes null.
inline void round_floats(json& j) {
    if (j.is_number_float()) {
        const double v = j.get<double>();
        if (!std::isfinite(v)) {
            j = nullptr;
            return;
        }
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.6g", v);
        const double r = std::strtod(buf, nullptr);
        if (r == std::trunc(r) && std::fabs(r) < 1e15) j = static_cast<std::int64_t>(r);
        else j = r;
    } else if (j.is_structured()) {
        for (json& e : j) round_floats(e);
    }
}

/// `j` on one line. Text that is not valid UTF-8 (a store's error message, a key from a damaged
/// row) is printed with U+FFFD in place of the bad bytes rather than failing the whole report.
inline std::string json_line(json j) {
    round_floats(j);
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

/// A prune bound for people: "2024-06-15T12:34:56.789Z (1718454896789)", or "never pruned".
inline std::string horizon_text(std::int64_t ms) {
    return ms == prune_limits::keep_all ? std::string("never pruned") : iso8601_ms(ms) + " (" + std::to_string(ms) + ")";
}

/// The store's prune horizon as two rows of a table (stats, verify, prune), when it was pruned.
inline void horizon_rows(table& t, const prune_horizon& h) {
    if (h == prune_horizon{}) return;
    t.row("records horizon", horizon_text(h.records_ms), "(records last updated before it may be gone)");
    t.row("audit horizon", horizon_text(h.audit_ms), "(audit rows older than it may be gone)");
}

/// The horizon as records_horizon_ms / audit_horizon_ms (null: never pruned).
inline void add_horizon(json& j, const prune_horizon& h) {
    for (auto [name, v] : {std::pair{"records_horizon_ms", h.records_ms}, std::pair{"audit_horizon_ms", h.audit_ms}}) {
        if (v == prune_limits::keep_all) j[name] = nullptr;
        else j[name] = v;
    }
}

}  // namespace idem::tool
