// idem/store_rows.hpp: the rows a store writes and reads back (store.hpp's vocabulary): a
// transition as written, a record, an audit row, and the text of their columns. Each column's text
// has one writer and one reader: status_text / parse_status here, the audit detail in
// detail/rows/audit_detail.hpp (audit_detail() and payload_detail() below are its public face).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "idem/detail/rows/audit_detail.hpp"
#include "idem/transition.hpp"

namespace idem {

/// One transition as the store writes it: the transition plus wall-clock times (Unix milliseconds,
/// so records survive restarts) and the writer's node identity. Trivially copyable: it travels
/// through the lock-free flush queue by value.
struct store_row {
    transition t;
    std::uint64_t seq = 0;            ///< order of offer; rows of one key are applied in seq order
    std::int64_t at_ms = 0;           ///< when the transition happened (system_clock)
    std::int64_t lease_until_ms = 0;  ///< lease deadline (system_clock), for PROCESSING rows
};

/// The `status` column. A retryable failure or a not-executed compensation leaves the row with
/// status RELEASED: claimable again, but its fence is kept so fences keep increasing. ABSENT appears
/// only as the from_status of a key's first audit row; a record never has it.
[[nodiscard]] constexpr const char* status_text(record_state s) noexcept { return to_string(s); }

[[nodiscard]] inline std::optional<record_state> parse_status(std::string_view s) noexcept {
    if (s == "PROCESSING") return record_state::processing;
    if (s == "SUCCESS") return record_state::succeeded;
    if (s == "FAILED") return record_state::failed;
    if (s == "RELEASED") return record_state::released;
    if (s == "ABSENT") return record_state::absent;
    return std::nullopt;
}

/// A row of idempotent_record.
struct stored_record {
    std::string key;
    std::string biz_type;
    record_state state = record_state::absent;
    std::uint64_t fence = 0;
    std::int64_t lease_until_ms = 0;
    std::uint64_t outcome = 0;
    std::uint64_t fingerprint = 0;
    std::int64_t created_ms = 0;
    std::int64_t updated_ms = 0;
    std::string payload;  ///< the response bytes recorded with the outcome (BLOB / BYTEA; empty: none)
    friend bool operator==(const stored_record&, const stored_record&) = default;
};

/// A row of idempotent_audit.
struct audit_entry {
    std::int64_t sequence = 0;
    std::string key;
    record_state from = record_state::absent;
    record_state to = record_state::absent;
    std::uint64_t fence = 0;
    std::string node;
    std::int64_t at_ms = 0;
    std::string detail;  ///< "<cause> outcome=N[ payload=NB fnv=H]" (detail/rows/audit_detail.hpp)
};

/// The biz_type column: the operation part of a composed key (TXID_OPERATION_vN), else "default".
[[nodiscard]] inline std::string biz_type_of(std::string_view key) {
    const auto last = key.rfind('_');
    if (last == std::string_view::npos || last + 2 > key.size() || key[last + 1] != 'v') return "default";
    const auto first = key.rfind('_', last - 1);
    if (first == std::string_view::npos || last == 0) return "default";
    if (last - first == 1) return "default";  // an empty operation part: "A__v1"
    return std::string(key.substr(first + 1, std::min<std::size_t>(last - first - 1, 32)));
}

/// The 64-bit FNV-1a hash of a payload: what the audit trail records of the bytes.
using detail::rows::payload_hash;

/// What an audit row says of a payload: " payload=NB fnv=HHHHHHHHHHHHHHHH" (16 lower-case hex
/// digits), or "" when there is none: the length and a hash, not the bytes
/// (detail/rows/audit_detail.hpp says why, and holds the one formatter and parser of the text).
[[nodiscard]] inline std::string payload_detail(std::string_view payload) {
    return detail::rows::format_payload_part(payload);
}

/// The detail column of an audit row: "<cause> outcome=N" and the payload part, if any.
[[nodiscard]] inline std::string audit_detail(const transition& t) {
    return detail::rows::format_audit_detail(t.cause, t.outcome, t.payload);
}

}  // namespace idem
