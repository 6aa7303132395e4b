// idempotency_key.hpp: the Idempotency-Key request header, as the IETF draft "The Idempotency-Key
// HTTP Header Field" (draft-ietf-httpapi-idempotency-key-header) defines it: an Item Structured
// Header (RFC 8941) whose value is a String, e.g.
//
//   Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"
//
// RFC 8941 section 3.3.3: a String is zero or more printable ASCII characters (0x20 to 0x7E)
// between double quotes, where '"' and '\' are escaped with '\'. Section 4.2: surrounding spaces
// are discarded. The draft's examples carry no parameters and the draft defines none, so anything
// after the closing quote other than spaces is refused here with the reason, rather than guessed.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace payment {

/// The header's String value, or nullopt with *why saying which RFC 8941 rule the text broke.
inline std::optional<std::string> parse_idempotency_key(std::string_view field, std::string* why) {
    auto fail = [&](std::string rule) -> std::optional<std::string> {
        if (why) *why = std::move(rule);
        return std::nullopt;
    };
    while (!field.empty() && field.front() == ' ') field.remove_prefix(1);
    while (!field.empty() && field.back() == ' ') field.remove_suffix(1);
    if (field.empty() || field.front() != '"')
        return fail("is not a Structured Field String: it must start with '\"' (RFC 8941, 3.3.3)");
    std::string value;
    std::size_t i = 1;
    for (;; ++i) {
        if (i == field.size()) return fail("has no closing '\"' (RFC 8941, 3.3.3)");
        const char c = field[i];
        if (c == '\\') {
            if (++i == field.size()) return fail("ends inside an escape (RFC 8941, 3.3.3)");
            if (field[i] != '"' && field[i] != '\\')
                return fail("escapes a character other than '\"' or '\\' (RFC 8941, 3.3.3)");
            value.push_back(field[i]);
            continue;
        }
        if (c == '"') break;
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e)
            return fail("holds a byte outside printable ASCII at offset " + std::to_string(i) + " (RFC 8941, 3.3.3)");
        value.push_back(c);
    }
    if (i + 1 != field.size()) return fail("has text after the closing '\"'; this server accepts no parameters");
    if (value.empty()) return fail("is an empty string; a key needs at least one character");
    return value;
}

}  // namespace payment
