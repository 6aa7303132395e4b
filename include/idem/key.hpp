// idem/key.hpp: the idempotency key.
//
// A key is 1..128 bytes with no NUL and no control byte (0x00-0x1F, 0x7F). Bytes >= 0x80 are allowed,
// so UTF-8 keys pass through byte for byte. Keys live inline (no allocation), so a key can travel
// through the flush queue by value.
//
// key::compose(txid, operation, version) builds "TXID_OPERATION_vN". The composition is injective:
// '_' is rejected inside txid and operation, and the version is printed in canonical decimal, so
// splitting at the two '_' recovers the triple.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "idem/error.hpp"

namespace idem {

/// The parts of a composed key "TXID_OPERATION_vN" (key::split). The views point into the key.
struct key_parts {
    std::string_view txid;
    std::string_view operation;
    std::uint32_t version = 0;
};

class key {
public:
    static constexpr std::size_t max_size = 128;
    static constexpr char separator = '_';

    /// Validates text; throws idem::error(errc::invalid_key) naming the input and the rule.
    explicit key(std::string_view text) {
        std::string why;
        if (!check(text, "key", &why)) throw error(errc::invalid_key, why);
        assign(text);
    }

    /// Non-throwing validation. On failure returns nullopt and, if why != nullptr, the reason.
    [[nodiscard]] static std::optional<key> parse(std::string_view text, std::string* why = nullptr) {
        if (!check(text, "key", why)) return std::nullopt;
        key k;
        k.assign(text);
        return k;
    }

    /// "TXID_OPERATION_vN". Throws idem::error(errc::invalid_key) naming the component at fault.
    [[nodiscard]] static key compose(std::string_view txid, std::string_view operation, std::uint32_t version) {
        std::string why;
        if (!check_component(txid, "transaction id", &why) || !check_component(operation, "operation", &why))
            throw error(errc::invalid_key, why);
        char digits[16];
        auto [end, ec] = std::to_chars(digits, digits + sizeof digits, version);
        (void)ec;
        std::string text;
        text.reserve(txid.size() + operation.size() + 3 + static_cast<std::size_t>(end - digits));
        text.append(txid).push_back(separator);
        text.append(operation).append("_v").append(digits, end);
        if (text.size() > max_size)
            throw error(errc::invalid_key, "composed key '" + printable(text) + "' is " + std::to_string(text.size()) +
                                               " bytes; the limit is 128");
        return key(text);
    }

    /// The (txid, operation, version) of a key compose() made, or nullopt for any other key: one
    /// that does not have exactly two '_', empty parts, or a version that is not 'v' and canonical
    /// decimal (no sign, no leading zero, at most 2^32 - 1). The views point into *this.
    [[nodiscard]] std::optional<key_parts> split() const noexcept {
        const std::string_view text = view();
        const std::size_t a = text.find(separator);
        if (a == std::string_view::npos) return std::nullopt;
        const std::size_t b = text.find(separator, a + 1);
        if (b == std::string_view::npos || text.find(separator, b + 1) != std::string_view::npos) return std::nullopt;
        const std::string_view txid = text.substr(0, a), operation = text.substr(a + 1, b - a - 1), v = text.substr(b + 1);
        if (txid.empty() || operation.empty() || v.size() < 2 || v[0] != 'v') return std::nullopt;
        const std::string_view digits = v.substr(1);
        if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
        std::uint32_t version = 0;
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), version);
        if (ec != std::errc{} || end != digits.data() + digits.size()) return std::nullopt;
        return key_parts{txid, operation, version};
    }

    [[nodiscard]] std::string_view view() const noexcept { return {bytes_.data(), size_}; }
    [[nodiscard]] std::string str() const { return std::string(view()); }
    [[nodiscard]] std::size_t size() const noexcept { return size_; }
    /// True only for the placeholder key{} (a valid key has 1 to 128 bytes). Every guard entry point
    /// refuses it with invalid_key.
    [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

    /// True when text is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing
    /// above U+10FFFF). Keys need not be UTF-8; stores whose text type requires it (PostgreSQL)
    /// declare that rule through store::accepts().
    [[nodiscard]] static bool is_utf8(std::string_view text) noexcept {
        const auto* p = reinterpret_cast<const unsigned char*>(text.data());
        const auto* end = p + text.size();
        while (p < end) {
            const unsigned char c = *p;
            if (c < 0x80) {
                ++p;
                continue;
            }
            std::size_t n;
            unsigned char lo = 0x80, hi = 0xbf;  // the range of the second byte
            if (c >= 0xc2 && c <= 0xdf) n = 1;
            else if (c == 0xe0) {
                n = 2;
                lo = 0xa0;
            } else if (c == 0xed) {
                n = 2;
                hi = 0x9f;
            }  // no UTF-16 surrogates
            else if (c >= 0xe1 && c <= 0xef)
                n = 2;
            else if (c == 0xf0) {
                n = 3;
                lo = 0x90;
            } else if (c >= 0xf1 && c <= 0xf3) n = 3;
            else if (c == 0xf4) {
                n = 3;
                hi = 0x8f;
            }  // nothing above U+10FFFF
            else
                return false;
            if (static_cast<std::size_t>(end - p) <= n) return false;
            if (p[1] < lo || p[1] > hi) return false;
            for (std::size_t i = 2; i <= n; ++i)
                if (p[i] < 0x80 || p[i] > 0xbf) return false;
            p += n + 1;
        }
        return true;
    }

    friend bool operator==(const key& a, const key& b) noexcept { return a.view() == b.view(); }

    /// The text with non-printable bytes escaped as \xNN, for error messages.
    [[nodiscard]] static std::string printable(std::string_view text) {
        static constexpr char hex[] = "0123456789abcdef";
        std::string out;
        for (unsigned char c : text.substr(0, 160)) {
            if (c < 0x20 || c == 0x7f || c == '\\') {
                out += "\\x";
                out += hex[c >> 4];
                out += hex[c & 15];
            } else {
                out += static_cast<char>(c);
            }
        }
        if (text.size() > 160) out += "...";
        return out;
    }

    /// True when text is a valid key; otherwise fills *why with "<what> '<text>' <rule>".
    static bool check(std::string_view text, const char* what, std::string* why) {
        auto fail = [&](const std::string& rule) {
            if (why) *why = std::string(what) + " '" + printable(text) + "' " + rule;
            return false;
        };
        if (text.empty()) return fail("is empty; a key needs 1 to 128 bytes");
        if (text.size() > max_size) return fail("is " + std::to_string(text.size()) + " bytes; the limit is 128");
        for (std::size_t i = 0; i < text.size(); ++i) {
            auto c = static_cast<unsigned char>(text[i]);
            if (c == 0) return fail("holds a NUL byte at offset " + std::to_string(i));
            if (c < 0x20 || c == 0x7f)
                return fail("holds control byte 0x" + std::string{"0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]} +
                            " at offset " + std::to_string(i));
        }
        return true;
    }

    /// An empty placeholder (for queues and empty tickets). Not a valid key: guard operations take
    /// keys made by the constructor, parse() or compose().
    key() = default;

private:
    static bool check_component(std::string_view text, const char* what, std::string* why) {
        if (!check(text, what, why)) return false;
        if (text.find(separator) != std::string_view::npos) {
            if (why)
                *why = std::string(what) + " '" + printable(text) +
                       "' contains the separator '_'; composed keys must split back into (txid, operation, version)";
            return false;
        }
        return true;
    }

    void assign(std::string_view text) noexcept {
        size_ = static_cast<std::uint8_t>(text.size());
        std::memcpy(bytes_.data(), text.data(), text.size());
    }

    std::array<char, max_size> bytes_{};  // zero past size_: the key arena copies whole words
    std::uint8_t size_ = 0;
};

}  // namespace idem
