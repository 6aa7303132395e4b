// tools/command.hpp: how a subcommand plugs into the `idem` tool, the exit codes, and the flag checks
// the subcommands share.
//
// A subcommand lives in its own file and exposes one function, add_<name>(CLI::App& root), that
// registers it and binds its flags; the returned `command` runs it after parsing. main.cpp lists them.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
#include <string_view>
#include <optional>
#include <cstdint>
#include <climits>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <type_traits>

namespace idem::tool {

/// Process exit codes, the same for every subcommand.
enum exit_code : int {
    exit_ok = 0,         ///< ran, and every check held
    exit_violation = 1,  ///< ran, and a check failed (double execution, money not conserved, ...)
    exit_usage = 2,      ///< bad command line: unknown flag, bad value (the message names the flag and rule)
    exit_runtime = 3,    ///< could not run: the guard or store could not be set up, out of memory, ...
};

struct command {
    CLI::App* app = nullptr;   ///< the subcommand, flags bound
    std::function<int()> run;  ///< runs it once parsing succeeded; returns an exit_code
};

command add_demo(CLI::App& root);          // demo/cli.cpp
command add_drill(CLI::App& root);         // drill/drill.cpp
command add_drill_worker(CLI::App& root);  // drill/worker.cpp (hidden: the drill starts it)
command add_audit(CLI::App& root);         // audit.cpp
command add_verify(CLI::App& root);        // verify.cpp
command add_stats(CLI::App& root);         // stats.cpp
command add_prune(CLI::App& root);         // prune.cpp
command add_import(CLI::App& root);        // import.cpp
command add_regions(CLI::App& root);       // regions.cpp (PostgreSQL builds)

/// Formats a number for messages: whole numbers without a fraction or exponent, others in %g.
template <class T>
std::string show_number(T v) {
    if constexpr (std::is_integral_v<T>) {
        return std::to_string(v);
    } else {
        const double d = static_cast<double>(v);
        char buf[32];
        std::snprintf(buf, sizeof buf, d == std::floor(d) && std::fabs(d) < 1e15 ? "%.0f" : "%g", d);
        return buf;
    }
}

/// A CLI11 check that the value is a number in [lo, hi]. CLI11 prefixes the message with the flag's
/// name, so an error reads "--dup-rate: 1.5 is not a number between 0 and 0.99 (fraction of the
/// requests that are duplicates)". CLI::Range does the same with less readable numbers.
template <class T>
CLI::Validator in_range(T lo, T hi, std::string what) {
    std::string rule = (std::is_integral_v<T> ? "a whole number between " : "a number between ") + show_number(lo) +
                       " and " + show_number(hi);
    if (!what.empty()) rule += " (" + what + ")";
    return CLI::Validator(
        [lo, hi, rule](std::string& text) -> std::string {
            T v{};
            bool ok = false;
            if constexpr (std::is_integral_v<T>) {
                const char* end = text.data() + text.size();
                auto [p, ec] = std::from_chars(text.data(), end, v);
                ok = ec == std::errc{} && p == end;
            } else {
                try {
                    std::size_t used = 0;
                    v = static_cast<T>(std::stod(text, &used));
                    ok = used == text.size() && std::isfinite(static_cast<double>(v));
                } catch (...) {
                    ok = false;
                }
            }
            if (!ok || v < lo || v > hi) return "'" + text + "' is not " + rule;
            return {};
        },
        "in [" + show_number(lo) + ", " + show_number(hi) + "]");
}

inline constexpr const char* duration_rule =
    "a whole number of 1 or more followed by ms, s, m, h or d (500ms, 90s, 30m, 36h, 7d)";

/// DUR in milliseconds, or nullopt ("forever" when allowed gives milliseconds::max()).
inline std::optional<std::chrono::milliseconds> parse_duration(std::string_view text, bool forever_ok) {
    using namespace std::chrono;
    if (forever_ok && text == "forever") return milliseconds::max();
    std::int64_t n = 0;
    const char* end = text.data() + text.size();
    auto [p, ec] = std::from_chars(text.data(), end, n);
    if (ec != std::errc{} || p == text.data() || n < 1) return std::nullopt;
    const std::string_view unit(p, static_cast<std::size_t>(end - p));
    std::int64_t per = 0;
    if (unit == "ms") per = 1;
    else if (unit == "s") per = 1000;
    else if (unit == "m") per = 60'000;
    else if (unit == "h") per = 3'600'000;
    else if (unit == "d") per = 86'400'000;
    else return std::nullopt;
    if (n > INT64_MAX / per / 2) return std::nullopt;  // past any clock: a typo, not a window
    return milliseconds(n * per);
}

inline CLI::Validator duration_check(bool forever_ok) {
    const std::string rule = std::string(duration_rule) + (forever_ok ? ", or forever" : "");
    return CLI::Validator(
        [forever_ok, rule](std::string& text) -> std::string {
            if (parse_duration(text, forever_ok)) return {};
            return "'" + text + "' is not a duration: " + rule;
        },
        forever_ok ? "DUR|forever" : "DUR");
}

}  // namespace idem::tool
