// idem/detail/rows/text_decoder.hpp: the one decoder of record and audit rows that a SQL store
// reads back as column texts (PostgreSQL's result rows and COPY lines, MySQL's text-protocol rows).
// A record row is record_columns texts in this order: idempotent_key, biz_type, status,
// fencing_token, lease_until, outcome, request_fingerprint, created_time, updated_time, and the
// payload as hex text; an audit row is audit_columns texts: sequence, idempotent_key, from_status,
// to_status, fencing_token, node, at_time, detail.
//
// Invariants
//   * A row that breaks record_rules.hpp's rules (key, status, fence, payload size) is refused as
//     corrupt_record naming the key and the rule, by every reader alike; it is never read as some
//     default.
//   * Text that is not what its column's type prints (an integer column that is not an integer, a
//     payload that is not hex) is a protocol surprise, not a corrupt record: store_error naming the
//     step (and the context the caller gave, such as a COPY line).
//   * Integers are parsed, never cast from text. A uint64 column (fence, outcome, fingerprint)
//     reads either as its unsigned value (MySQL's BIGINT UNSIGNED) or as the int64 with the same
//     bits (PostgreSQL's BIGINT, detail/pg/sql.hpp, "Unsigned fences").
#pragma once

#include <charconv>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include "idem/detail/rows/hex.hpp"
#include "idem/detail/rows/record_rules.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/store_rows.hpp"

namespace idem::detail::rows {

inline constexpr std::size_t record_columns = 10;
inline constexpr std::size_t audit_columns = 8;

/// An integer column's text; false when it is not one (a protocol surprise, not a corrupt record).
[[nodiscard]] inline bool parse_int(std::string_view text, std::int64_t& v) noexcept {
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

/// A uint64 column's text: its unsigned value, or the int64 with the same bits.
[[nodiscard]] inline bool parse_uint64_bits(std::string_view text, std::uint64_t& v) noexcept {
    std::int64_t s = 0;
    if (parse_int(text, s)) {
        v = static_cast<std::uint64_t>(s);
        return true;
    }
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

/// Decodes rows and columns by the rules above. Every message begins "<who> <name>: " (for example
/// "postgres store postgresql://idem@db/payments"); store_error messages then name `step` (left out
/// when empty). Cheap to make: it holds views only, which must outlive it.
class text_decoder {
public:
    text_decoder(std::string_view who, std::string_view name, std::string_view step) noexcept
        : who_(who), name_(name), step_(step) {}

    // ---- columns -------------------------------------------------------------------------------

    /// A stored key, by key::check's rules.
    void key(std::string_view k) const {
        if (std::string why = key_fault(k); !why.empty()) corrupt(k, why);
    }
    /// A status column. `of_record`: a record's status (ABSENT is for audit rows only).
    [[nodiscard]] record_state state(std::string_view k, std::string_view text, bool of_record,
                                     const char* column = "status") const {
        std::string why;
        const auto s = checked_status(text, of_record, &why, column);
        if (!s) corrupt(k, why);
        return *s;
    }
    /// An integer column holding an int64.
    [[nodiscard]] std::int64_t int64(std::string_view k, std::string_view text, const char* column) const {
        std::int64_t v = 0;
        if (!parse_int(text, v)) not_integer(k, text, column);
        return v;
    }
    /// An integer column holding a uint64 (outcome, request_fingerprint).
    [[nodiscard]] std::uint64_t uint64(std::string_view k, std::string_view text, const char* column) const {
        std::uint64_t v = 0;
        if (!parse_uint64_bits(text, v)) not_integer(k, text, column);
        return v;
    }
    /// fencing_token: an integer, then record_rules.hpp's fence range.
    [[nodiscard]] std::uint64_t fence(std::string_view k, std::string_view text) const {
        std::int64_t s = 0;
        if (parse_int(text, s)) {
            if (std::string why = fence_fault(s); !why.empty()) corrupt(k, why);
            return static_cast<std::uint64_t>(s);
        }
        const std::uint64_t v = uint64(k, text, "fencing_token");
        if (std::string why = fence_fault(v); !why.empty()) corrupt(k, why);
        return v;
    }
    /// The payload column's hex text into `out`: a payload above the hard maximum is a corrupt row
    /// naming the key, text that is not hex a protocol surprise.
    void payload(std::string_view k, std::string_view hex, std::string& out) const {
        if (std::string why = payload_fault(hex.size() / 2); !why.empty()) corrupt(k, why);
        if (!from_hex(hex, out))
            surprise("the payload of key '" + key::printable(k) + "' came back as text that is not hex");
    }

    // ---- rows ----------------------------------------------------------------------------------

    /// One idempotent_record row (record_columns texts, in the order above) into `out`, checked:
    /// key, status, fence, then the payload's size. `out` may be reused row after row (its strings
    /// keep their capacity).
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

    /// Text its column's type cannot print. In a context (in_context()) the context's text is what
    /// went wrong and `what` is not used.
    [[noreturn]] void surprise(const std::string& what) const {
        std::string msg = std::string(who_) + " " + std::string(name_) + ": ";
        if (!step_.empty()) msg.append(step_).append(": ");
        if (context_.data() != nullptr) msg += std::string(label_) + " '" + key::printable(context_) + "'";
        else msg += what;
        throw error(errc::store_error, msg);
    }

protected:
    /// The same decoder reading `context` (a COPY line, ...): its protocol surprises name it as
    /// "<label> '<context>'".
    [[nodiscard]] text_decoder in_context(std::string_view label, std::string_view context) const noexcept {
        text_decoder d = *this;
        d.label_ = label;
        d.context_ = context;
        return d;
    }

private:
    [[noreturn]] void corrupt(std::string_view k, const std::string& rule) const {
        throw error(errc::corrupt_record, std::string(who_) + " " + std::string(name_) + ": corrupt row for key '" +
                                              key::printable(k) + "': " + rule);
    }
    [[noreturn]] void not_integer(std::string_view k, std::string_view text, const char* column) const {
        surprise("column " + std::string(column) + " of key '" + key::printable(k) + "' came back as '" +
                 key::printable(text) + "', not an integer");
    }

    std::string_view who_;
    std::string_view name_;
    std::string_view step_;
    std::string_view label_;
    std::string_view context_;  // what is being read (a COPY line); data() is null outside one
};

}  // namespace idem::detail::rows
