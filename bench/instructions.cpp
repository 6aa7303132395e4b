// bench/instructions.cpp: instructions per key on the hot path, counted by callgrind (exact and
// repeatable, unlike time on a shared machine). scripts/count-instructions builds it against two
// trees and prints both counts; run alone it does the work without counting.
//
// fresh: begin() + ticket.succeed(outcome) on 65,536 new keys, no payload.
// duplicate: begin() on each of those keys again (a succeeded record, no payload).
#include <idem/guard.hpp>

#include <valgrind/callgrind.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

constexpr int keys = 65536;

[[gnu::noinline]] long fresh(idem::guard& g, const std::vector<idem::key>& ks) {
    long acquired = 0;
    for (const auto& k : ks) {
        auto r = g.begin(k);
        if (r && !r.ticket.succeed(7)) ++acquired;
    }
    return acquired;
}

[[gnu::noinline]] long duplicate(idem::guard& g, const std::vector<idem::key>& ks) {
    long outcomes = 0;
    for (const auto& k : ks) outcomes += static_cast<long>(g.begin(k).outcome);
    return outcomes;
}

}  // namespace

int main() {
    idem::options o;
    o.capacity = 1 << 18;
    o.maintenance_interval = {};  // no background thread: only this loop runs
    idem::guard g(o);
    std::vector<idem::key> ks;
    ks.reserve(keys);
    for (unsigned i = 0; i < keys; ++i) ks.emplace_back("PAY_" + std::to_string(i * 2654435761u));
    CALLGRIND_START_INSTRUMENTATION;
    const long a = fresh(g, ks);
    const long d = duplicate(g, ks);
    CALLGRIND_STOP_INSTRUMENTATION;
    if (a != keys || d != 7L * keys) {
        std::fprintf(stderr, "unexpected answers: %ld acquired, %ld outcome sum\n", a, d);
        return 1;
    }
    return 0;
}
