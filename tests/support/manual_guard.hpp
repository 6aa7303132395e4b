// tests/support/manual_guard.hpp: a guard on a manual clock, with no background thread.
//
// Tests drive time with clock.advance() and run compensate() / collect() / maintain() by hand, so
// no test waits on wall-clock time and every interleaving of maintenance is chosen by the test.
#pragma once

#include <idem/idem.hpp>

#include <cstddef>
#include <string>


namespace idem_test {

using manual_guard = idem::basic_guard<std::atomic, idem::manual_clock>;
using manual_ticket = idem::basic_ticket<std::atomic, idem::manual_clock>;

/// Options for tests: a small table and no maintenance thread.
inline idem::options test_options(std::size_t capacity = 1024) {
    idem::options o;
    o.capacity = capacity;
    o.maintenance_interval = {};
    return o;
}

/// "K<i>" style keys.
inline idem::key key_n(const char* prefix, std::size_t i) { return idem::key(prefix + std::to_string(i)); }

}  // namespace idem_test
