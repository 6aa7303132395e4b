// stripe_dso_worker: compiled into two shared objects with hidden visibility (tests/CMakeLists.txt,
// stripe_dso_test), each with its own copy of idem's statics and thread_locals, as two libraries
// of an application that each carry idem privately. IDEM_DSO_ENTRY names this copy's entry point.
#include <idem/idem.hpp>

#include <cstddef>
#include <string>

extern "C" __attribute__((visibility("default"))) std::size_t IDEM_DSO_ENTRY(idem::guard* g, const char* prefix,
                                                                             std::size_t n) {
    std::size_t completed = 0;
    for (std::size_t i = 0; i < n; ++i) {
        auto r = g->begin(idem::key(prefix + std::to_string(i)));
        if (r.status == idem::begin_status::acquired && !r.ticket.succeed(i + 1)) ++completed;
    }
    return completed;
}
