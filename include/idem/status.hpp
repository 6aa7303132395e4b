// idem/status.hpp: what begin() answers, and the view of a record that query() returns.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>

#include "idem/detail/enum_print.hpp"
#include "idem/transition.hpp"

namespace idem {

/// What begin() found. `acquired` carries a ticket; the other values describe the existing record.
enum class begin_status : std::uint8_t {
    acquired,            ///< the caller owns the claim and must execute, then succeed() or fail()
    in_progress,         ///< another caller holds a live claim
    succeeded,           ///< already completed; `outcome` is the recorded outcome
    failed,              ///< already failed terminally; `outcome` is the recorded failure code
    in_doubt,            ///< the claim's lease expired and its outcome is unknown (not re-executed)
    payload_mismatch,    ///< the key was used with a different request fingerprint
    capacity_exhausted,  ///< no free slot within the probe bound
    backpressure,        ///< the flush queue is full; nothing changed
    store_unavailable,   ///< sync mode: the claim could not be made durable; do not execute
    invalid_key,         ///< the key is empty (key{}), or the store declared it cannot hold it
                         ///< (PostgreSQL: not valid UTF-8); nothing changed, retrying cannot help
    superseded,          ///< ordered versions (options.ordered_versions): a newer version of the key's
                         ///< (txid, operation) was claimed; `outcome` is that newest version. Not run.
};

namespace detail {
/// The enumerator's name, or nullptr for a value begin_status does not name.
[[nodiscard]] constexpr const char* name_of(begin_status s) noexcept {
    switch (s) {
        case begin_status::acquired: return "acquired";
        case begin_status::in_progress: return "in_progress";
        case begin_status::succeeded: return "succeeded";
        case begin_status::failed: return "failed";
        case begin_status::in_doubt: return "in_doubt";
        case begin_status::payload_mismatch: return "payload_mismatch";
        case begin_status::capacity_exhausted: return "capacity_exhausted";
        case begin_status::backpressure: return "backpressure";
        case begin_status::store_unavailable: return "store_unavailable";
        case begin_status::invalid_key: return "invalid_key";
        case begin_status::superseded: return "superseded";
    }
    return nullptr;
}
}  // namespace detail

[[nodiscard]] constexpr const char* to_string(begin_status s) noexcept {
    const char* name = detail::name_of(s);
    return name != nullptr ? name : "?";
}

/// Prints the enumerator's name (`acquired`), or `begin_status(n)` for a value it does not name.
template <class CharT, class Traits>
std::basic_ostream<CharT, Traits>& operator<<(std::basic_ostream<CharT, Traits>& os, begin_status s) {
    return detail::print_enum(os, detail::name_of(s), "begin_status", s);
}

/// A consistent view of one record, as returned by query().
struct record_view {
    record_state state = record_state::absent;
    std::uint64_t fence = 0;
    std::uint64_t outcome = 0;
    std::uint64_t fingerprint = 0;
    bool in_doubt = false;
    std::chrono::nanoseconds lease_until{0};
    /// The response payload of a succeeded or failed record that has one (query() and for_each()
    /// copy it; empty otherwise, and hidden like the outcome in sync mode until durable). Global
    /// scope's query() answers from this process's table, so it has the payload of a record that
    /// table holds; global_guard::lookup() reads the store's row, payload included.
    std::string payload{};
};

}  // namespace idem
