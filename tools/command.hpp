// tools/command.hpp: how a subcommand plugs into the `idem` tool, the exit codes, and the flag checks
// the subcommands share.
//
// A subcommand lives in its own file and exposes one function, add_<name>(CLI::App& root), that
// registers it and binds its flags; the returned `command` runs it after parsing. main.cpp lists them.
#pragma once

#include <CLI/CLI.hpp>

#include <charconv>
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

command add_demo(CLI::App& root);          // demo.cpp
command add_drill(CLI::App& root);         // drill.cpp
command add_drill_worker(CLI::App& root);  // drill_worker.cpp (hidden: the drill starts it)
command add_audit(CLI::App& root);         // audit.cpp
command add_verify(CLI::App& root);        // verify.cpp
command add_stats(CLI::App& root);         // stats.cpp
command add_prune(CLI::App& root);         // prune.cpp

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

}  // namespace idem::tool
