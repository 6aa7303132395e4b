// idem/detail/rows/record_rules.hpp: the rules a row read back from a store must keep, for every store.
//
// A store reads data, not what it wrote: a file edited by hand, a damaged disk, another program
// writing the tables. Whatever breaks these rules is refused as corrupt_record, naming the key and
// the rule (each store adds its own name), and is never read as some default:
//   key          key::check's rules (length, no control byte, ...): the guard could not hold it
//   status       PROCESSING, SUCCESS, FAILED or RELEASED; ABSENT only as an audit row's from_status
//   fence        1 .. 2^52-1: the guard packs fences into 52 bits of its slot word
//   wall time    within 100 years of now: further is a damaged row, and would overflow the guard's
//                nanosecond clock arithmetic
//   payload      at most payload_hard_max bytes (1 MiB): no guard option admits a larger response,
//                so a longer one was not written by this library (its bytes are not checked:
//                a payload is any bytes, NUL and invalid UTF-8 included)
// Each check answers the broken rule as text ("" when kept), so a store builds its own message and
// a check costs no allocation when the row is good.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "idem/key.hpp"
#include "idem/store_rows.hpp"

namespace idem::detail::rows {

/// Fences are below this (the slot word's 52 fence bits).
inline constexpr std::uint64_t fence_limit = std::uint64_t{1} << 52;

/// No payload is longer than this (1 MiB), whatever the guard's options: the stores read a longer
/// one back as corrupt_record.
inline constexpr std::size_t payload_hard_max = std::size_t{1} << 20;

/// The rule a stored payload of `size` bytes breaks, or "".
[[nodiscard]] inline std::string payload_fault(std::size_t size) {
    if (size <= payload_hard_max) return {};
    return "payload is " + std::to_string(size) + " bytes; a payload holds at most " + std::to_string(payload_hard_max) +
           " bytes (the hard maximum)";
}

/// The rule a stored key breaks (key::check's reason, naming the key), or "".
[[nodiscard]] inline std::string key_fault(std::string_view k) {
    std::string why;
    if (!key::check(k, "stored key", &why)) return why;
    return {};
}

/// The rule a `column` holding a fence breaks ("fencing_token is 0; expected 1 .. 2^52-1"), or "".
/// Takes the value as the store holds it (signed in SQL, unsigned in RocksDB), and prints it so.
template <std::integral I>
[[nodiscard]] std::string fence_fault(I stored, const char* column = "fencing_token") {
    const auto f = static_cast<std::uint64_t>(stored);
    if (f != 0 && f < fence_limit) return {};
    return std::string(column) + " is " + std::to_string(stored) + "; expected 1 .. 2^52-1";
}

/// A status column's text parsed; on failure *why names the rule. `of_record`: a record's status
/// (ABSENT is for audit rows only), else an audit row's from_status / to_status.
[[nodiscard]] inline std::optional<record_state> checked_status(std::string_view text, bool of_record, std::string* why,
                                                                const char* column = "status") {
    const auto s = parse_status(text);
    if (!s) {
        *why = std::string(column) + " '" + key::printable(text) +
               "' is not a status (PROCESSING, SUCCESS, FAILED, RELEASED; ABSENT in audit rows)";
        return std::nullopt;
    }
    if (of_record && *s == record_state::absent) {
        *why = std::string(column) + " 'ABSENT' is for audit rows only";
        return std::nullopt;
    }
    return s;
}

/// The rule a stored wall time (Unix ms, `column`) breaks against `now_ms`, or "".
[[nodiscard]] inline std::string wall_time_fault(std::int64_t ms, std::int64_t now_ms, const char* column) {
    constexpr std::int64_t century_ms = 100LL * 366 * 24 * 3600 * 1000;
    if (ms >= now_ms - century_ms && ms <= now_ms + century_ms) return {};
    return std::string(column) + " = " + std::to_string(ms) + " ms, more than 100 years from now: a damaged row";
}

/// The first rule a record breaks (its key, status, fence, payload size), or "": what every store
/// checks after reading a record whose fields it decoded.
[[nodiscard]] inline std::string record_fault(const stored_record& r) {
    if (std::string why = key_fault(r.key); !why.empty()) return why;
    if (r.state == record_state::absent) return "status 'ABSENT' is for audit rows only";
    if (r.state > record_state::released) return "status " + std::to_string(static_cast<int>(r.state)) + " is not a status";
    if (std::string why = fence_fault(r.fence); !why.empty()) return why;
    return payload_fault(r.payload.size());
}

}  // namespace idem::detail::rows
