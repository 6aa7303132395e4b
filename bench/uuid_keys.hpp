// bench/uuid_keys.hpp: random-order idempotency keys as clients send them, for the benchmarks.
//
// A key is UUID-v4-formatted text (xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx, lower-case, 36 bytes) made
// from 128 bits of a seeded std::mt19937_64, so a run replays exactly. Drawn in order, such keys land
// anywhere in a store's index, which sequential keys (TX..., FB<i>_PAY_v1) never do: those append at
// the right edge of a B-tree and keep the pages a store writes in its cache.
#pragma once

#include <cstdint>
#include <random>
#include <string>

namespace idem_bench {

/// 128 random bits with the UUID v4 version and variant bits set. `hi` holds bytes 0-7 (most
/// significant first), so comparing (hi, lo) orders as the formatted text does.
struct uuid {
    std::uint64_t hi = 0, lo = 0;
    friend bool operator<(const uuid& a, const uuid& b) { return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo; }
    friend bool operator==(const uuid&, const uuid&) = default;
};

inline uuid draw_uuid(std::mt19937_64& rng) {
    uuid u{rng(), rng()};
    u.hi = (u.hi & ~0xf000ull) | 0x4000ull;              // version 4: high nibble of byte 6
    u.lo = (u.lo & ~(0xc0ull << 56)) | (0x80ull << 56);  // variant 10xx: byte 8
    return u;
}

inline std::string format_uuid(const uuid& u) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string s(36, '-');
    std::size_t at = 0;
    for (int i = 0; i < 16; ++i) {
        if (at == 8 || at == 13 || at == 18 || at == 23) ++at;
        const std::uint64_t word = i < 8 ? u.hi : u.lo;
        const auto byte = static_cast<unsigned>((word >> (8 * (7 - (i % 8)))) & 0xff);
        s[at++] = hex[byte >> 4];
        s[at++] = hex[byte & 15];
    }
    return s;
}

}  // namespace idem_bench
