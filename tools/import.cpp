// tools/import.cpp: `idem import --from SOURCE_URI [--table NAME] --store STORE_URI [--since MS]
// [--json]`: brings the history of the old design's table (idempotent_record behind a Redis lock)
// into an idem store, so that no key the old system decided runs again under idem. The rules (what
// SUCCESS, FAILED and PROCESSING become, what is skipped, what is a conflict, what is refused) are
// import.hpp's; the sources are import_sources.hpp's; the cut-over order is in docs/operations.md,
// "Migrating from a Redis lock + MySQL table".
//
// Incremental: --since MS reads only rows with updated_time >= MS; the report prints the
// high-water mark (the largest updated_time read) and next_since (the mark minus --margin, so a row
// whose transaction committed after a later-stamped one is read again; a row read again is skipped).
// Running it twice changes nothing.
// Exit codes: 0 imported (conflicts are reported, not failures), 1 some rows were refused (listed;
// the others were imported), 2 bad command line, 3 the source or the store could not be read or
// written (batches committed before stay; run it again).
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "command.hpp"
#include "idem/store.hpp"
#include "import.hpp"
#include "import_sources.hpp"
#include "report.hpp"
#include "store.hpp"

namespace idem::tool {
namespace {

struct import_config {
    std::string from;
    std::string table = "idempotent_record";
    std::string store;
    std::optional<std::int64_t> since;  ///< set from since_value when --since was given
    std::int64_t since_value = 0;
    std::string margin = "1m";
    std::string window = "7d";
    std::uint64_t batch = 500;
    std::uint64_t max_list = 100;
    bool json = false;
};

std::string ms_text(std::optional<std::int64_t> ms) {
    return ms ? iso8601_ms(*ms) + " (" + std::to_string(*ms) + ")" : std::string("none");
}

int run_import(const import_config& c) {
    const store_spec spec = *parse_store(c.store);
    const imports::source_spec source = *imports::parse_source(c.from, nullptr);
    const std::vector<std::string> table_parts = *imports::parse_table_name(c.table, nullptr);
    const auto window = *parse_duration(c.window, true);
    // idem's PostgreSQL store keeps its records in a table named idempotent_record too: in the old
    // table's own database (and schema) it would find the old table and refuse it, or worse.
    const bool same_pg = spec.type == store_spec::kind::postgres && source.type == imports::source_spec::kind::postgres &&
                         imports::same_database(c.from, c.store) && table_parts.back() == "idempotent_record" &&
                         (table_parts.size() == 1 || table_parts[0] == "public");
    // On MySQL a database is the schema: the store's CREATE TABLE IF NOT EXISTS would pass over the
    // old table, add idem's other tables beside it, and fail at the first read of a column.
    const bool same_my = spec.type == store_spec::kind::mysql && source.type == imports::source_spec::kind::mysql &&
                         table_parts.back() == "idempotent_record" &&
                         imports::same_mysql_database(c.from, table_parts, c.store);
    if (same_pg || same_my) {
        std::cerr << "idem import: --store " << display_name(spec)
                  << " is the same database as --from, whose table idempotent_record has the name of idem's own "
                     "record table; put the idem store in another database (docs/operations.md, \"Migrating from a "
                     "Redis lock + MySQL table\")\n";
        return exit_usage;
    }

    imports::options o;
    o.since_ms = c.since;
    o.margin_ms = parse_duration(c.margin, false)->count();
    o.window_ms = window == std::chrono::milliseconds::max() ? INT64_MAX / 2 : window.count();
    o.batch_keys = static_cast<std::size_t>(c.batch);
    o.max_list = static_cast<std::size_t>(c.max_list);

    std::unique_ptr<imports::old_table_source> src = imports::open_source(source, table_parts);
    // The writer: SQLite takes the file's writer lock at open, so a guard cannot write meanwhile.
    std::unique_ptr<idem::store> st = open_store(spec, idem::durability::sync, open_mode::create);
    const auto t0 = std::chrono::steady_clock::now();
    const imports::report r = imports::run(*st, *src, o);
    const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // A decision older than the window would be forgotten by the guards at their first start, and
    // its key run again: the run fails until --window covers it (the rows are imported all the same;
    // a run with the guards' real window passes).
    const bool ok = r.refused_total() == 0 && r.past_window == 0;

    if (c.json) {
        json j = json::object();
        j["command"] = "import";
        j["source"] = src->name();
        j["store"] = display_name(spec);
        j["since_ms"] = c.since ? json(*c.since) : json(nullptr);
        j["ok"] = ok;
        j["read"] = r.read;
        j["imported"] = {
            {"SUCCESS", r.imported_succeeded}, {"FAILED", r.imported_failed}, {"PROCESSING", r.imported_processing}};
        j["imported_total"] = r.imported();
        j["present"] = r.present;
        j["conflicts"] = r.conflicts;
        j["conflicts_claim"] = r.conflicts_claim;
        j["conflict_list"] = r.conflict_list;
        json refused = json::object();
        for (std::size_t i = 0; i < imports::refusal_kinds; ++i)
            refused[imports::to_string(static_cast<imports::refusal>(i))] = r.refused[i];
        j["refused"] = refused;
        j["refused_total"] = r.refused_total();
        j["refused_list"] = r.refused_list;
        j["past_window"] = r.past_window;
        j["high_water_ms"] = r.high_water_ms ? json(*r.high_water_ms) : json(nullptr);
        j["next_since_ms"] = r.next_since_ms ? json(*r.next_since_ms) : json(nullptr);
        j["first_fence"] = r.first_fence;
        j["last_fence"] = r.last_fence;
        j["batches"] = r.batches;
        j["elapsed_s"] = elapsed_s;
        std::cout << json_line(j) << std::endl;
    } else {
        std::cout << "idem import: " << src->name() << " -> " << display_name(spec)
                  << (c.since ? " (rows with updated_time >= " + ms_text(c.since) + ")" : std::string(" (every row)"))
                  << "\n\n";
        table t;
        t.row("read", grouped(r.read), "(rows of the old table)");
        t.row("imported SUCCESS", grouped(r.imported_succeeded), "(a duplicate is answered succeeded, outcome 0)");
        t.row("imported FAILED", grouped(r.imported_failed), "(a duplicate is answered failed, outcome 0)");
        t.row("imported PROCESSING", grouped(r.imported_processing),
              "(claims in doubt: a guard's resolver decides each at its next start)");
        t.row("already present", grouped(r.present), "(skipped: idem holds the same state)");
        t.row("conflicts", grouped(r.conflicts),
              "(idem's record kept; " + grouped(r.conflicts_claim) + " of them claims the old table has decided since)");
        t.row("refused", grouped(r.refused_total()), "(not imported; listed below)");
        t.row("past the window", grouped(r.past_window),
              "(decided rows older than --window " + c.window + ": a guard with that window treats them as new)");
        if (r.first_fence != 0) t.row("fences", grouped(r.first_fence) + " .. " + grouped(r.last_fence));
        t.row("batches", grouped(r.batches), "(store transactions)");
        t.row("high-water mark", r.high_water_ms ? std::to_string(*r.high_water_ms) : std::string("(none)"),
              r.high_water_ms ? "(" + iso8601_ms(*r.high_water_ms) + ": the largest updated_time read)"
                              : std::string("(no row read)"));
        t.row("next --since", r.next_since_ms ? std::to_string(*r.next_since_ms) : std::string("(none)"),
              "(the high-water mark minus --margin " + c.margin + ")");
        t.row("elapsed", fixed(elapsed_s, 2) + " s");
        t.print(std::cout);
        if (!r.conflict_list.empty()) {
            std::cout << "\nConflicts"
                      << (r.conflict_list.size() < r.conflicts ? " (first " + grouped(r.conflict_list.size()) + ")" : "")
                      << ":\n";
            for (const std::string& s : r.conflict_list) std::cout << "  " << s << '\n';
        }
        if (!r.refused_list.empty()) {
            std::cout << "\nRefused"
                      << (r.refused_list.size() < r.refused_total() ? " (first " + grouped(r.refused_list.size()) + ")" : "")
                      << ":\n";
            for (const std::string& s : r.refused_list) std::cout << "  " << s << '\n';
        }
        std::cout << '\n';
        if (ok) std::cout << "PASS: every row read is in idem (imported, already present, or kept as idem has it).\n";
        if (r.refused_total() != 0)
            std::cout << "FAIL: " << grouped(r.refused_total()) << " row(s) refused; the others were imported.\n";
        if (r.past_window != 0)
            std::cout << "FAIL: " << grouped(r.past_window) << " decided row(s) are older than --window " << c.window
                      << ".\n";
    }
    for (const std::string& s : r.refused_list) std::cerr << "idem import: refused: " << s << '\n';
    if (r.past_window != 0)
        std::cerr << "idem import: " << r.past_window << " decided row(s) imported are older than --window " << c.window
                  << ": a guard whose idempotency window is " << c.window
                  << " forgets them at its first start and runs those keys again. Open the guards with a window "
                     "that covers the oldest decision (store_options::window, or idem::forever), and run the import "
                     "again with that --window (it imports nothing twice)\n";
    return ok ? exit_ok : exit_violation;
}

}  // namespace

command add_import(CLI::App& root) {
    auto c = std::make_shared<import_config>();
    CLI::App* app = root.add_subcommand(
        "import", "Bring the old design's idempotent_record table (Redis lock + SQL table) into an idem store");
    app->footer(
        "SUCCESS becomes a succeeded record (outcome 0), FAILED a terminal failure, PROCESSING a claim in doubt "
        "that the resolver decides at a guard's next start. Running it twice changes nothing. Exit codes: 0 "
        "imported, 1 rows refused (listed; the others imported), 2 bad command line, 3 the source or the store "
        "failed (run it again).");
    app->add_option("--from", c->from, std::string("Source URI: ") + imports::accepted_sources)
        ->required()
        ->check(CLI::Validator(
            [](std::string& text) {
                std::string why;
                return imports::parse_source(text, &why) ? std::string{} : why;
            },
            "SOURCE"));
    app->add_option("--table", c->table, "The old table: NAME or SCHEMA.NAME")
        ->check(CLI::Validator(
            [](std::string& text) {
                std::string why;
                return imports::parse_table_name(text, &why) ? std::string{} : why;
            },
            "NAME"))
        ->capture_default_str();
    app->add_option("--store", c->store, std::string("idem store URI: ") + durable_stores)
        ->required()
        ->check(store_check(/*durable_only=*/true));
    CLI::Option* since = app->add_option(
                                "--since", c->since_value,
                                "Read only rows with updated_time >= MS (Unix milliseconds; the next_since of the last run)")
                             ->type_name("MS")
                             ->check(in_range(std::int64_t{0}, std::int64_t{1} << 50, "Unix milliseconds"));
    app->add_option("--margin", c->margin, "next_since is the high-water mark minus this (late commits)")
        ->check(duration_check(false))
        ->capture_default_str();
    app->add_option("--window", c->window,
                    "The idempotency window of the guards that will open the store: decided rows older than it "
                    "would be forgotten by them, so the run fails (exit 1) while any is imported")
        ->check(duration_check(true))
        ->capture_default_str();
    app->add_option("--batch", c->batch, "Keys per store transaction")
        ->check(in_range(std::uint64_t{1}, std::uint64_t{100'000}, "keys per transaction"))
        ->capture_default_str();
    app->add_option("--max-list", c->max_list, "Conflicts and refused rows listed at most (all are counted)")
        ->check(in_range(std::uint64_t{0}, std::uint64_t{1} << 32, "rows listed"))
        ->capture_default_str();
    app->add_flag("--json", c->json, "Print one JSON object on stdout");
    return {app, [c, since] {
                if (since->count() > 0) c->since = c->since_value;
                return run_import(*c);
            }};
}

}  // namespace idem::tool
