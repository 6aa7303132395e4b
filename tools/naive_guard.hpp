// tools/naive_guard.hpp: the broken guard idem replaces, kept to show the failure it prevents.
//
// The naive guard every idempotency layer starts from: `if (!store.exists(id)) { execute(id); store.set(id, DONE); }`. exists() and
// set_done() are each thread-safe (striped mutexes over hash sets, like a Redis GET and SET), but the
// sequence is not atomic: two callers can both see "absent" and both execute. `idem demo --naive`
// runs the workload through this so the demo's independent checks can be seen to catch it.
#pragma once

#include <array>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

namespace idem::tool {

class naive_guard {
public:
    [[nodiscard]] bool exists(std::string_view k) const {
        const stripe& s = of(k);
        std::lock_guard lock(s.m);
        return s.keys.contains(std::string(k));
    }
    void set_done(std::string_view k) {
        stripe& s = of(k);
        std::lock_guard lock(s.m);
        s.keys.emplace(k);
    }

private:
    struct alignas(64) stripe {
        mutable std::mutex m;
        std::unordered_set<std::string> keys;
    };
    static constexpr std::size_t stripes = 64;

    stripe& of(std::string_view k) { return stripes_[std::hash<std::string_view>{}(k) % stripes]; }
    const stripe& of(std::string_view k) const { return stripes_[std::hash<std::string_view>{}(k) % stripes]; }

    std::array<stripe, stripes> stripes_;
};

}  // namespace idem::tool
