// idem/detail/rows/hex.hpp: hex text of bytes, both ways. The SQL stores move payloads (and the
// MySQL store every key) as hex text: PostgreSQL's encode(.., 'hex') / decode(.., 'hex'), MySQL's
// HEX() / X'..' literals. Hex text holds no quote, backslash or NUL, so bytes of any value travel
// inside SQL text without an escaping rule to get wrong.
#pragma once

#include <string>
#include <string_view>

namespace idem::detail::rows {

/// Hex digits of `bytes` (lower case, two per byte, no prefix) appended to `out`.
inline void append_hex(std::string& out, std::string_view bytes) {
    static constexpr char digits[] = "0123456789abcdef";
    for (const char c : bytes) {
        const auto b = static_cast<unsigned char>(c);
        out += digits[b >> 4];
        out += digits[b & 0xf];
    }
}

/// The bytes of hex text (either case); false on an odd length or a character that is not a hex
/// digit.
[[nodiscard]] inline bool from_hex(std::string_view hex, std::string& out) {
    out.clear();
    if (hex.size() % 2 != 0) return false;
    out.reserve(hex.size() / 2);
    const auto digit = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    for (std::size_t i = 0; i < hex.size(); i += 2) {
        const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
        if (hi < 0 || lo < 0) return false;
        out += static_cast<char>(hi * 16 + lo);
    }
    return true;
}

}  // namespace idem::detail::rows
