// tests/support/printers.hpp: GoogleTest printers for idem's enums, so a failed assertion reads
// "capacity_exhausted" instead of "1-byte object <06>". Found by argument-dependent lookup.
#pragma once

#include <idem/idem.hpp>

#include <ostream>

namespace idem {

inline void PrintTo(begin_status s, std::ostream* os) { *os << to_string(s); }
inline void PrintTo(record_state s, std::ostream* os) { *os << to_string(s); }
inline void PrintTo(resolution r, std::ostream* os) {
    switch (r) {
        case resolution::succeeded: *os << "succeeded"; return;
        case resolution::failed: *os << "failed"; return;
        case resolution::not_executed: *os << "not_executed"; return;
        case resolution::unknown: *os << "unknown"; return;
    }
    *os << "resolution(" << static_cast<int>(r) << ")";
}
inline void PrintTo(failure_policy p, std::ostream* os) {
    *os << (p == failure_policy::terminal ? "terminal" : "retryable");
}

}  // namespace idem
