// tools/main.cpp: the `idem` command-line tool. Parses the command line and runs one subcommand.
// Subcommands live one per file (audit.cpp, ...; demo/ and drill/ are folders) and register
// themselves through command.hpp.
#include <exception>
#include <iostream>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "command.hpp"
#include "idem/error.hpp"

namespace {

/// The subcommand word the user typed when it names none of the tool's subcommands, else nullptr.
/// The root takes no option with a value, so the first argument that is not a flag is that word.
const char* unknown_subcommand(CLI::App& app, int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg.starts_with('-')) continue;
        try {
            app.get_subcommand(std::string(arg));
            return nullptr;
        } catch (const CLI::OptionNotFound&) {
            return argv[i];
        }
    }
    return nullptr;
}

/// "demo, drill, ..." in the order --help lists them (hidden ones left out).
std::string subcommand_names(CLI::App& app) {
    std::string names;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App* s) { return !s->get_group().empty(); }))
        names += (names.empty() ? "" : ", ") + sub->get_name();
    return names;
}

}  // namespace

int main(int argc, char** argv) {
    using namespace idem::tool;
    CLI::App app{"idem: at-most-once execution per idempotency key. Subcommands exercise and inspect the guard.", "idem"};
    app.set_version_flag("--version", "idem 0.1.0");
    app.require_subcommand(1);
    app.fallthrough(false);

    std::vector<command> commands;
    commands.push_back(add_demo(app));
    commands.push_back(add_drill(app));
    commands.push_back(add_audit(app));
    commands.push_back(add_verify(app));
    commands.push_back(add_stats(app));
    commands.push_back(add_prune(app));
    commands.push_back(add_import(app));
#ifdef IDEM_HAVE_POSTGRES
    commands.push_back(add_regions(app));
#endif
    commands.push_back(add_drill_worker(app));

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        // CLI11 checks require_subcommand before it complains about the word it could not place,
        // so a mistyped subcommand would only read "A subcommand is required". (Exit code 0: --help
        // or --version, which go on as CLI11 prints them.)
        const char* typed = e.get_exit_code() != 0 ? unknown_subcommand(app, argc, argv) : nullptr;
        if (typed != nullptr) {
            std::cerr << "idem: unknown subcommand '" << typed << "'; the subcommands are " << subcommand_names(app)
                      << " (idem --help)\n";
            return exit_usage;
        }
        const int code = app.exit(e);  // prints help/version to stdout, errors to stderr
        return code == 0 ? exit_ok : exit_usage;
    }

    try {
        for (const command& c : commands)
            if (c.app->parsed()) return c.run();
    } catch (const idem::error& e) {
        std::cerr << "idem: " << e.what() << '\n';
        return exit_runtime;
    } catch (const std::bad_alloc&) {
        std::cerr << "idem: out of memory (the guard allocates its whole table up front; try fewer --requests)\n";
        return exit_runtime;
    } catch (const std::exception& e) {
        std::cerr << "idem: " << e.what() << '\n';
        return exit_runtime;
    }
    return exit_usage;  // unreachable: require_subcommand(1)
}
