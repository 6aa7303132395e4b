// tools/demo/workload.hpp: what a demo run sends, generated before timing: the unique transfers and
// the stream of sends, duplicates placed to race their original or to come later.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "demo/demo.hpp"

namespace idem::tool::demo {

struct transfer {
    std::uint32_t from;
    std::uint32_t to;
    std::int64_t amount;  // cents
};

/// Everything a run sends, generated before timing.
struct workload {
    std::vector<transfer> requests;     ///< unique requests; index i is TX<i+1>
    std::vector<std::uint32_t> stream;  ///< request index of each send, in dispatch order
    std::uint64_t concurrent = 0;       ///< duplicates placed right after their original
    std::uint64_t later = 0;            ///< duplicates placed further on
};

inline workload make_workload(const demo_config& c, std::uint64_t unique, std::uint64_t duplicates) {
    std::mt19937_64 rng(c.seed);
    workload w;
    w.requests.resize(unique);
    std::uniform_int_distribution<std::uint32_t> account(0, c.accounts - 1);
    std::uniform_int_distribution<std::int64_t> amount(1, max_amount_cents);
    for (transfer& t : w.requests) {
        t.from = account(rng);
        do t.to = account(rng);
        while (t.to == t.from);
        t.amount = amount(rng);
    }

    // Each duplicate is anchored to an original and sent right after the anchor. A racing duplicate
    // is anchored to its own original, so the next free worker takes it while the original is still
    // executing; a later one is anchored `lag` originals further on (at least 64 per thread).
    struct dup {
        std::uint64_t anchor;
        std::uint32_t request;
    };
    std::vector<dup> dups;
    dups.reserve(duplicates);
    std::uniform_int_distribution<std::uint64_t> pick(0, unique - 1);
    std::bernoulli_distribution racing(c.race_share);
    const std::uint64_t min_lag = 64ull * c.threads;
    std::uniform_int_distribution<std::uint64_t> lag(min_lag, std::max(min_lag, unique / 4));
    for (std::uint64_t d = 0; d < duplicates; ++d) {
        const std::uint64_t orig = pick(rng);
        if (racing(rng)) {
            dups.push_back({orig, static_cast<std::uint32_t>(orig)});
            ++w.concurrent;
        } else {
            dups.push_back({std::min(unique - 1, orig + lag(rng)), static_cast<std::uint32_t>(orig)});
            ++w.later;
        }
    }
    std::sort(dups.begin(), dups.end(), [](const dup& a, const dup& b) { return a.anchor < b.anchor; });

    w.stream.reserve(unique + duplicates);
    std::size_t next = 0;
    for (std::uint64_t i = 0; i < unique; ++i) {
        w.stream.push_back(static_cast<std::uint32_t>(i));
        while (next < dups.size() && dups[next].anchor == i) w.stream.push_back(dups[next++].request);
    }
    return w;
}

/// A fresh run id: 8 hex digits from the OS entropy source.
inline std::string random_run_id() {
    std::random_device rd;
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
    return buf;
}

}  // namespace idem::tool::demo
