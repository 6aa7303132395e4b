// idem/error.hpp: error codes, their std::error_category, and the one exception type.
//
// The hot path (begin / succeed / fail / query) reports through return values and never throws.
// Constructors, key parsing, run() and the stores throw idem::error, a std::system_error carrying an
// idem::errc, with a message that names the input and the rule it broke.
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <system_error>

#include "idem/detail/enum_print.hpp"

namespace idem {

enum class errc {
    invalid_key = 1,     ///< key empty, longer than 128 bytes, or holding NUL/control bytes
    invalid_argument,    ///< an option or argument outside its allowed range
    capacity_exhausted,  ///< the record table is full and nothing can be evicted
    stale_ticket,        ///< the ticket's fence is no longer the record's fence
    payload_mismatch,    ///< the key was reused with a different request fingerprint
    duplicate_request,   ///< the key already completed (run() with duplicate_policy::raise)
    in_progress,         ///< another caller holds the claim
    in_doubt,            ///< the lease expired and the resolver could not tell what happened
    empty_ticket,        ///< the ticket was moved from or already completed
    timeout,             ///< a wait for an in-flight outcome passed its deadline
    backpressure,        ///< the flush queue is full
    store_unavailable,   ///< the durable store could not be reached within its deadline
    store_error,         ///< the store answered with an error
    corrupt_record,      ///< a row read back from the store breaks the schema's rules
    busy,                ///< compensation or a reclaim holds the record for a moment; retry
    already_failed,      ///< run() of a key whose operation failed terminally: it is not run again
    superseded,          ///< run() of a key whose (txid, operation) has a newer version claimed
};

namespace detail {
/// The enumerator's name ("stale_ticket"); nullptr for a value outside the enum.
[[nodiscard]] constexpr const char* name_of(errc e) noexcept {
    switch (e) {
        case errc::invalid_key: return "invalid_key";
        case errc::invalid_argument: return "invalid_argument";
        case errc::capacity_exhausted: return "capacity_exhausted";
        case errc::stale_ticket: return "stale_ticket";
        case errc::payload_mismatch: return "payload_mismatch";
        case errc::duplicate_request: return "duplicate_request";
        case errc::in_progress: return "in_progress";
        case errc::in_doubt: return "in_doubt";
        case errc::empty_ticket: return "empty_ticket";
        case errc::timeout: return "timeout";
        case errc::backpressure: return "backpressure";
        case errc::store_unavailable: return "store_unavailable";
        case errc::store_error: return "store_error";
        case errc::corrupt_record: return "corrupt_record";
        case errc::busy: return "busy";
        case errc::already_failed: return "already_failed";
        case errc::superseded: return "superseded";
    }
    return nullptr;
}
}  // namespace detail

/// Prints the enumerator's name; a value outside the enum prints as errc(42). GoogleTest and
/// logging use this instead of dumping the object's bytes.
inline std::ostream& operator<<(std::ostream& os, errc e) { return detail::print_enum(os, detail::name_of(e), "errc", e); }

class error_category_impl final : public std::error_category {
public:
    const char* name() const noexcept override { return "idem"; }
    std::string message(int ev) const override {
        switch (static_cast<errc>(ev)) {
            case errc::invalid_key: return "invalid idempotency key";
            case errc::invalid_argument: return "invalid argument";
            case errc::capacity_exhausted: return "record table capacity exhausted";
            case errc::stale_ticket: return "stale ticket: the fence no longer matches the record";
            case errc::payload_mismatch: return "key reused with a different request payload";
            case errc::duplicate_request: return "duplicate request: the key already completed";
            case errc::in_progress: return "another caller is executing this key";
            case errc::in_doubt: return "lease expired and the outcome is unknown";
            case errc::empty_ticket: return "ticket is empty (moved from or already completed)";
            case errc::timeout: return "deadline passed while waiting for an outcome";
            case errc::backpressure: return "flush queue full";
            case errc::store_unavailable: return "durable store unavailable";
            case errc::store_error: return "durable store error";
            case errc::corrupt_record: return "corrupt record read from the store";
            case errc::busy: return "record briefly held by compensation or a reclaim; retry";
            case errc::already_failed: return "the key already failed terminally; the operation is not run again";
            case errc::superseded: return "a newer version of this transaction's operation was claimed; not run";
        }
        return "unknown idem error";
    }
};

/// The category of idem::errc. Thread-safe; a function-local static.
inline const std::error_category& error_category() noexcept {
    static const error_category_impl instance;
    return instance;
}

inline std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), error_category()}; }

/// The one exception type of the library. code() is always in idem::error_category().
class error : public std::system_error {
public:
    error(errc e, const std::string& what) : std::system_error(make_error_code(e), what) {}
    [[nodiscard]] errc kind() const noexcept { return static_cast<errc>(code().value()); }
};

}  // namespace idem

template <>
struct std::is_error_code_enum<idem::errc> : std::true_type {};
