// idem/detail/my/uri.hpp: mysql:// and mariadb:// URIs: what they name (parse_uri), how they are
// shown (redact: never with the password). No connector needed, so the idem tool recognises the
// URI even in a build without the MySQL store.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>

#include "idem/error.hpp"

namespace idem::detail::my {

/// Where a mysql:// (or mariadb://) URI points: mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE.
/// USER and PASSWORD may hold %XX escapes.
struct endpoint {
    std::string user;
    std::string password;
    std::string host;
    unsigned port = 3306;
    std::string database;
};

[[nodiscard]] inline bool is_mysql_uri(std::string_view uri) noexcept {
    return uri.starts_with("mysql://") || uri.starts_with("mariadb://");
}

/// The URI without its password ("mysql://idem@db:3306/payments"), for messages.
[[nodiscard]] inline std::string redact(std::string_view uri) {
    const auto scheme = uri.find("://");
    if (scheme == std::string_view::npos) return std::string(uri);
    const auto at = uri.find('@', scheme + 3);
    if (at == std::string_view::npos) return std::string(uri);
    const auto colon = uri.substr(0, at).find(':', scheme + 3);
    if (colon == std::string_view::npos) return std::string(uri);
    return std::string(uri.substr(0, colon)) + std::string(uri.substr(at));
}

/// Parses `uri`; throws idem::error(invalid_argument) naming the URI (without password) and the rule.
[[nodiscard]] inline endpoint parse_uri(std::string_view uri) {
    const auto fail = [&](const std::string& rule) -> endpoint {
        throw error(errc::invalid_argument, "mysql store URI '" + redact(uri) + "': " + rule +
                                                " (expected mysql://USER[:PASSWORD]@HOST[:PORT]/DATABASE)");
    };
    const auto decode = [&](std::string_view s) {
        std::string out;
        for (std::size_t i = 0; i < s.size(); ++i) {
            if (s[i] == '%' && i + 2 < s.size() + 0 && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
                std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
                out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
                i += 2;
            } else {
                out += s[i];
            }
        }
        return out;
    };
    if (!is_mysql_uri(uri)) return fail("the scheme must be mysql:// or mariadb://");
    std::string_view rest = uri.substr(uri.find("://") + 3);
    endpoint e;
    const auto slash = rest.find('/');
    if (slash == std::string_view::npos || slash + 1 == rest.size()) return fail("no database named after the host");
    e.database = std::string(rest.substr(slash + 1));
    if (e.database.find_first_of("/?#`'\"") != std::string::npos)
        return fail("the database name holds a character out of [/?#`'\"]; options are not taken in the URI");
    rest = rest.substr(0, slash);
    const auto at = rest.rfind('@');
    if (at == std::string_view::npos) return fail("no USER@ before the host");
    const std::string_view who = rest.substr(0, at);
    const auto colon = who.find(':');
    e.user = decode(who.substr(0, colon));
    if (colon != std::string_view::npos) e.password = decode(who.substr(colon + 1));
    if (e.user.empty()) return fail("the user is empty");
    std::string_view hostport = rest.substr(at + 1);
    const auto pcolon = hostport.rfind(':');
    if (pcolon != std::string_view::npos) {
        const std::string_view p = hostport.substr(pcolon + 1);
        unsigned v = 0;
        if (p.empty() || p.size() > 5 || !std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
            (v = static_cast<unsigned>(std::stoul(std::string(p)))) == 0 || v > 65535)
            return fail("port '" + std::string(p) + "' is not 1..65535");
        e.port = v;
        hostport = hostport.substr(0, pcolon);
    }
    if (hostport.empty()) return fail("the host is empty");
    e.host = std::string(hostport);
    return e;
}

}  // namespace idem::detail::my
