// idem/detail/pg/row_decoder.hpp: the one decoder of the rows idem reads back from PostgreSQL:
// idempotent_record rows (postgres_store's load() and get(), the global scope's read of claimed
// rows) and idempotent_audit rows (audit(), scan_audit()), whether they arrive as lines of COPY text
// or as a query's result. The queries whose columns it reads are here too, so a column list and the
// code that reads it cannot drift apart.
//
// The rules every row is checked by (corrupt_record for a broken rule, store_error for text its
// column's type cannot print) are detail/rows/text_decoder.hpp's, shared with the MySQL store.
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
#include "idem/detail/rows/text_decoder.hpp"
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
using rows::audit_columns;
using rows::record_columns;

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

using rows::parse_int;

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
// The decoder: detail/rows/text_decoder.hpp's rules (shared with the MySQL store), plus the two
// shapes rows arrive in from PostgreSQL: a query's result row, and a line of COPY text.

/// Decodes rows by rows::text_decoder's rules. Cheap to make: it holds views only, which must
/// outlive it.
class row_decoder : public rows::text_decoder {
public:
    using rows::text_decoder::audit;
    using rows::text_decoder::record;
    using rows::text_decoder::text_decoder;

    void record(const pqxx::row& row, stored_record& out) const { record(texts<record_columns>(row), out); }
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
    /// The same decoder reading one COPY line: its protocol surprises name the line.
    [[nodiscard]] rows::text_decoder on_line(std::string_view line) const noexcept {
        return in_context("unexpected COPY line", line);
    }
    template <std::size_t N>
    std::array<std::string_view, N> split(std::string_view line, std::array<std::string, N>& fields) const {
        if (!split_copy_line(line, fields)) on_line(line).surprise({});
        std::array<std::string_view, N> out;
        for (std::size_t i = 0; i < N; ++i) out[i] = fields[i];
        return out;
    }
};

}  // namespace idem::detail::pg
