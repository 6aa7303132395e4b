// tests/support/lib_shell.hpp: runs a line of bash with one of scripts/lib/*.sh sourced and returns
// its standard output (private_pg.hpp, private_mysql.hpp drive their servers through it). The test
// target defines IDEM_SOURCE_DIR.
#pragma once

#include <cstdio>
#include <string>

namespace idem_test {

/// The shell command line that runs `cmd` in `bash -c` with `set -e` and scripts/lib/`lib` sourced
/// (for a program that runs it itself, such as `idem drill --failover-command`).
inline std::string lib_shell_command(const char* lib, const std::string& cmd) {
    const std::string script = "set -e; source '" IDEM_SOURCE_DIR "/scripts/lib/" + std::string(lib) + "'; " + cmd;
    std::string quoted = "'";
    for (char ch : script) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    quoted += "'";
    return "bash -c " + quoted;
}

/// Runs `cmd` in `bash -c` with `set -e` and scripts/lib/`lib` sourced; returns its standard output.
inline std::string lib_shell(const char* lib, const std::string& cmd) {
    std::string out;
    if (FILE* f = ::popen((lib_shell_command(lib, cmd) + " </dev/null").c_str(), "r")) {
        char b[512];
        while (std::fgets(b, sizeof b, f)) out += b;
        ::pclose(f);
    }
    return out;
}

}  // namespace idem_test
