// tools/report.hpp: output helpers shared by the subcommands: a two-column summary table for people
// and a one-line JSON object for scripts.
#pragma once

#include <algorithm>
#include <cmath>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

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

/// A JSON object built in insertion order and printed on one line.
class json_object {
public:
    json_object& add(std::string_view name, std::uint64_t v) { return raw(name, std::to_string(v)); }
    json_object& add(std::string_view name, std::int64_t v) { return raw(name, std::to_string(v)); }
    json_object& add(std::string_view name, unsigned v) { return raw(name, std::to_string(v)); }
    json_object& add(std::string_view name, double v) {
        if (!std::isfinite(v)) return raw(name, "null");
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.6g", v);
        return raw(name, buf);
    }
    json_object& add(std::string_view name, bool v) { return raw(name, v ? "true" : "false"); }
    json_object& add(std::string_view name, std::string_view v) { return raw(name, quote(v)); }
    json_object& add(std::string_view name, const char* v) { return add(name, std::string_view(v)); }
    json_object& add(std::string_view name, const json_object& v) { return raw(name, v.str()); }
    json_object& add(std::string_view name, const std::vector<json_object>& v) {
        std::string a = "[";
        for (std::size_t i = 0; i < v.size(); ++i) a += (i ? "," : "") + v[i].str();
        return raw(name, a + "]");
    }
    json_object& add_null(std::string_view name) { return raw(name, "null"); }
    json_object& add(std::string_view name, const std::vector<std::string>& v) {
        std::string a = "[";
        for (std::size_t i = 0; i < v.size(); ++i) a += (i ? "," : "") + quote(v[i]);
        return raw(name, a + "]");
    }

    [[nodiscard]] std::string str() const { return "{" + body_ + "}"; }

    static std::string quote(std::string_view s) {
        std::string out = "\"";
        for (unsigned char c : s) {
            switch (c) {
                case '"': out += "\\\""; break;
                case '\\': out += "\\\\"; break;
                case '\n': out += "\\n"; break;
                case '\t': out += "\\t"; break;
                default:
                    if (c < 0x20) {
                        char buf[8];
                        std::snprintf(buf, sizeof buf, "\\u%04x", c);
                        out += buf;
                    } else {
                        out += static_cast<char>(c);
                    }
            }
        }
        return out + "\"";
    }

private:
    json_object& raw(std::string_view name, std::string_view value) {
        if (!body_.empty()) body_ += ',';
        body_ += quote(name);
        body_ += ':';
        body_ += value;
        return *this;
    }
    std::string body_;
};

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
inline void add_horizon(json_object& j, const prune_horizon& h) {
    for (auto [name, v] : {std::pair{"records_horizon_ms", h.records_ms}, std::pair{"audit_horizon_ms", h.audit_ms}}) {
        if (v == prune_limits::keep_all) j.add_null(name);
        else j.add(name, v);
    }
}

}  // namespace idem::tool
