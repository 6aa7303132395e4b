// idem/detail/pg/row_decoder.hpp: the one decoder of the rows idem reads back from PostgreSQL:
// idempotent_record rows (postgres_store's load() and get(), the global scope's read of claimed
// rows) and idempotent_audit rows (audit(), scan_audit()), whether they arrive as lines of COPY text
// or as a query's result. The queries whose columns it reads are here too, so a column list and the
// code that reads it cannot drift apart.
//
// Invariants
//   * A row that breaks record_rules.hpp's rules (key, status, fence, payload size) is refused as
//     corrupt_record naming the key and the rule, by every reader alike; it is never read as some
//     default.
//   * Text that is not what its column's type prints (an integer column that is not an integer, a
//     payload that is not hex, a COPY line without the right fields) is a protocol surprise, not a
//     corrupt record: store_error naming the step (and, for COPY, the line).
//   * Integers are parsed, never cast from text: BIGINT columns hold uint64 values (fences, outcomes,
//     fingerprints) as the int64 with the same bits (sql.hpp, "Unsigned fences").
#pragma once

#include <array>
#include <charconv>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include <pqxx/pqxx>

#include "idem/detail/assert.hpp"
#include "idem/detail/pg/sql.hpp"
#include "idem/detail/rows/record_rules.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/store_rows.hpp"

namespace idem::detail::pg {

// ---------------------------------------------------------------------------------------------------
// The queries. A record row is record_columns columns in this order: idempotent_key, biz_type,
// status, fencing_token, lease_until, outcome, request_fingerprint, created_time, updated_time,
// encode(payload, 'hex') (the payload travels hex-encoded, as it is written, and from_hex() decodes
// it). An audit row is audit_columns columns: sequence, idempotent_key, from_status, to_status,
// fencing_token, node, at_time, detail.
inline constexpr std::size_t record_columns = 10;
inline constexpr std::size_t audit_columns = 8;

inline constexpr std::string_view get_name = "idem_get";
inline constexpr std::string_view get =
    "SELECT idempotent_key, biz_type, status, fencing_token, lease_until, outcome, request_fingerprint, "
    "created_time, updated_time, encode(payload, 'hex') FROM idempotent_record WHERE idempotent_key = $1";

inline constexpr std::string_view audit_name = "idem_audit";
inline constexpr std::string_view audit =
    "SELECT sequence, idempotent_key, from_status, to_status, fencing_token, node, at_time, detail "
    "FROM idempotent_audit WHERE idempotent_key = $1 ORDER BY sequence";
// COPY (query) TO STDOUT streams rows as the executor produces them; the client reads them one line
// at a time (pqxx::stream_from::get_raw_line) and split_copy_line() below takes each line apart.
inline constexpr std::string_view load_query =
    "(SELECT idempotent_key, biz_type, status, fencing_token, lease_until, outcome, request_fingerprint, "
    "created_time, updated_time, encode(payload, 'hex') FROM idempotent_record)";
inline constexpr std::size_t load_columns = record_columns;
inline constexpr std::string_view scan_audit_query =
    "(SELECT sequence, idempotent_key, from_status, to_status, fencing_token, node, at_time, detail "
    "FROM idempotent_audit ORDER BY idempotent_key, sequence)";
inline constexpr std::size_t scan_audit_columns = audit_columns;

// ---------------------------------------------------------------------------------------------------
// Column text.

/// Takes one line of COPY text output apart into out[0..n), undoing COPY's backslash escapes.
/// Returns false unless the line holds exactly out.size() fields, none of them NULL (\N): no column
/// of the schema is nullable. Splitting bytewise is safe: in UTF-8 no multibyte sequence contains a
/// byte below 0x80. (libpqxx 6.4's stream_from::operator>> is not used: it reads an uninitialised
/// flag, m_retry_line, when constructed with a column list.)
[[nodiscard]] inline bool split_copy_line(std::string_view line, std::span<std::string> out) {
    if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
    std::size_t field = 0;
    std::size_t i = 0;
    auto hex = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
    auto is_hex = [](char c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); };
    while (true) {
        if (field == out.size()) return false;
        std::string& f = out[field];
        f.clear();
        const std::size_t start = i;
        while (i < line.size() && line[i] != '\t') {
            const char c = line[i++];
            if (c != '\\') {
                f += c;
                continue;
            }
            if (i == line.size()) return false;
            const char e = line[i++];
            switch (e) {
                case 'b': f += '\b'; break;
                case 'f': f += '\f'; break;
                case 'n': f += '\n'; break;
                case 'r': f += '\r'; break;
                case 't': f += '\t'; break;
                case 'v': f += '\v'; break;
                case 'N':
                    if (i - start == 2 && (i == line.size() || line[i] == '\t')) return false;  // NULL
                    f += e;
                    break;
                case 'x':
                    if (i < line.size() && is_hex(line[i])) {
                        int v = hex(line[i++]);
                        if (i < line.size() && is_hex(line[i])) v = v * 16 + hex(line[i++]);
                        f += static_cast<char>(v);
                    } else {
                        f += e;
                    }
                    break;
                default:
                    if (e >= '0' && e <= '7') {
                        int v = e - '0';
                        for (int k = 0; k < 2 && i < line.size() && line[i] >= '0' && line[i] <= '7'; ++k)
                            v = v * 8 + (line[i++] - '0');
                        f += static_cast<char>(v);
                    } else {
                        f += e;  // \\ and any other escaped character stand for themselves
                    }
            }
        }
        ++field;
        if (i == line.size()) return field == out.size();
        ++i;  // the tab
    }
}

/// A BIGINT column's text; false when it is not one (a protocol surprise, not a corrupt record).
[[nodiscard]] inline bool parse_int(std::string_view text, std::int64_t& v) noexcept {
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

/// A result field's text, as it came from the server (a NULL reads as "").
[[nodiscard]] inline std::string_view text(const pqxx::field& f) noexcept { return {f.c_str(), f.size()}; }

/// The texts of a result row's first N columns.
template <std::size_t N>
[[nodiscard]] std::array<std::string_view, N> texts(const pqxx::row& row) {
    IDEM_ASSERT(row.size() == N, "a query read by the row decoder selects exactly the decoder's columns");
    std::array<std::string_view, N> out;
    for (std::size_t i = 0; i < N; ++i) out[i] = text(row[static_cast<pqxx::row::size_type>(i)]);
    return out;
}

// ---------------------------------------------------------------------------------------------------
// The decoder.

/// Decodes rows and columns by the rules above. Every message begins "<who> <name>: " (for example
/// "postgres store postgresql://idem@db/payments"); store_error messages then name `step` (left out
/// when empty). Cheap to make: it holds views only, which must outlive it.
class row_decoder {
public:
    row_decoder(std::string_view who, std::string_view name, std::string_view step) noexcept
        : who_(who), name_(name), step_(step) {}

    /// The same decoder reading one COPY line: its protocol surprises name the line.
    [[nodiscard]] row_decoder on_line(std::string_view line) const noexcept {
        row_decoder d = *this;
        d.line_ = line;
        return d;
    }

    // ---- columns -------------------------------------------------------------------------------

    /// A stored key, by key::check's rules.
    void key(std::string_view k) const {
        if (std::string why = rows::key_fault(k); !why.empty()) corrupt(k, why);
    }
    /// A status column. `of_record`: a record's status (ABSENT is for audit rows only).
    [[nodiscard]] record_state state(std::string_view k, std::string_view text, bool of_record,
                                     const char* column = "status") const {
        std::string why;
        const auto s = rows::checked_status(text, of_record, &why, column);
        if (!s) corrupt(k, why);
        return *s;
    }
    /// A BIGINT column holding an int64.
    [[nodiscard]] std::int64_t int64(std::string_view k, std::string_view text, const char* column) const {
        std::int64_t v = 0;
        if (!parse_int(text, v))
            surprise("column " + std::string(column) + " of key '" + key::printable(k) + "' came back as '" +
                     key::printable(text) + "', not an integer");
        return v;
    }
    /// A BIGINT column holding a uint64's bits (outcome, request_fingerprint).
    [[nodiscard]] std::uint64_t uint64(std::string_view k, std::string_view text, const char* column) const {
        return static_cast<std::uint64_t>(int64(k, text, column));
    }
    /// fencing_token: an integer, then record_rules.hpp's fence range.
    [[nodiscard]] std::uint64_t fence(std::string_view k, std::string_view text) const {
        const std::int64_t v = int64(k, text, "fencing_token");
        if (std::string why = rows::fence_fault(v); !why.empty()) corrupt(k, why);
        return static_cast<std::uint64_t>(v);
    }
    /// The payload column's hex text (encode(payload, 'hex')) into `out`: a payload above the hard
    /// maximum is a corrupt row naming the key, text that is not hex a protocol surprise.
    void payload(std::string_view k, std::string_view hex, std::string& out) const {
        if (std::string why = rows::payload_fault(hex.size() / 2); !why.empty()) corrupt(k, why);
        if (!from_hex(hex, out))
            surprise("the payload of key '" + key::printable(k) + "' came back as text that is not hex");
    }

    // ---- rows ----------------------------------------------------------------------------------

    /// One idempotent_record row (record_columns texts, in the order of the queries above) into
    /// `out`, checked: key, status, fence, then the payload's size. `out` may be reused row after
    /// row (its strings keep their capacity).
    void record(std::span<const std::string_view, record_columns> c, stored_record& out) const {
        out.key.assign(c[0]);
        key(out.key);
        out.biz_type.assign(c[1]);
        out.state = state(out.key, c[2], /*of_record=*/true);
        out.fence = fence(out.key, c[3]);
        out.lease_until_ms = int64(out.key, c[4], "lease_until");
        out.outcome = uint64(out.key, c[5], "outcome");
        out.fingerprint = uint64(out.key, c[6], "request_fingerprint");
        out.created_ms = int64(out.key, c[7], "created_time");
        out.updated_ms = int64(out.key, c[8], "updated_time");
        payload(out.key, c[9], out.payload);
    }
    void record(const pqxx::row& row, stored_record& out) const { record(texts<record_columns>(row), out); }

    /// One idempotent_audit row (audit_columns texts) into `out`: its statuses checked (ABSENT is
    /// allowed), the rest read as written.
    void audit(std::span<const std::string_view, audit_columns> c, audit_entry& out) const {
        out.key.assign(c[1]);
        out.sequence = int64(out.key, c[0], "sequence");
        out.from = state(out.key, c[2], /*of_record=*/false, "from_status");
        out.to = state(out.key, c[3], /*of_record=*/false, "to_status");
        out.fence = uint64(out.key, c[4], "fencing_token");
        out.node.assign(c[5]);
        out.at_ms = int64(out.key, c[6], "at_time");
        out.detail.assign(c[7]);
    }
    void audit(const pqxx::row& row, audit_entry& out) const { audit(texts<audit_columns>(row), out); }

    /// One COPY line of load_query (`fields`: its buffers, reused line after line) into `out`.
    void record_line(std::string_view line, std::array<std::string, record_columns>& fields, stored_record& out) const {
        on_line(line).record(split(line, fields), out);
    }
    /// One COPY line of scan_audit_query into `out`.
    void audit_line(std::string_view line, std::array<std::string, audit_columns>& fields, audit_entry& out) const {
        on_line(line).audit(split(line, fields), out);
    }

private:
    template <std::size_t N>
    std::array<std::string_view, N> split(std::string_view line, std::array<std::string, N>& fields) const {
        if (!split_copy_line(line, fields)) on_line(line).surprise({});
        std::array<std::string_view, N> out;
        for (std::size_t i = 0; i < N; ++i) out[i] = fields[i];
        return out;
    }

    [[noreturn]] void corrupt(std::string_view k, const std::string& rule) const {
        throw error(errc::corrupt_record, std::string(who_) + " " + std::string(name_) + ": corrupt row for key '" +
                                              key::printable(k) + "': " + rule);
    }
    /// Text its column's type cannot print. Inside a COPY the line is what went wrong (`what` is
    /// then not used: the line shows it).
    [[noreturn]] void surprise(const std::string& what) const {
        std::string msg = std::string(who_) + " " + std::string(name_) + ": ";
        if (!step_.empty()) msg.append(step_).append(": ");
        if (line_.data() != nullptr) msg += "unexpected COPY line '" + key::printable(line_) + "'";
        else msg += what;
        throw error(errc::store_error, msg);
    }

    std::string_view who_;
    std::string_view name_;
    std::string_view step_;
    std::string_view line_;  // the COPY line being read; data() is null outside one
};

}  // namespace idem::detail::pg
