// tools/prune.cpp: `idem prune STORE --window DUR [--audit-window DUR] [--batch N]`: removes what a
// durable store keeps past its windows (store::prune), one bounded transaction at a time until
// nothing past the bounds is left, then prints what it removed and the store's new horizon.
//
// --window: records (never PROCESSING ones) last updated longer ago than this go; a key past the
// window may run again. --audit-window: audit rows older than this go (default: forever, kept).
// DUR is a whole number and a unit: 500ms, 90s, 30m, 36h, 7d; --audit-window also takes "forever".
// The bounds are computed once, at start (now - window), so a prune that takes a while does not
// chase rows written meanwhile. "now" is this machine's wall clock (system_clock): the tool has no
// guard, whose clock (mapped to wall time when it started) is what the stored times and a guard's
// own prune use. After a suspend or a wall-clock step forward the two differ by the step, so a
// --window no longer than the guards' could remove records a guard still holds in its window; give
// it a margin (docs/stores.md, "Which clock judges the window"). SQLite: the store takes the file's
// writer lock, so it is refused (store_unavailable, exit 3) while a guard writes the file; prune
// from that guard (store_options::prune_interval) instead. See docs/stores.md, "Pruning".
// Exit codes: 0 pruned, 2 bad command line, 3 the store could not be pruned.
#include <charconv>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "command.hpp"
#include "idem/store.hpp"
#include "report.hpp"
#include "store.hpp"

namespace idem::tool {
namespace {

struct prune_config {
    std::string store;
    std::string window;
    std::string audit_window = "forever";
    std::uint64_t batch = 10'000;
    bool json = false;
};

int run_prune(const prune_config& c) {
    const store_spec spec = *parse_store(c.store);
    const auto window = *parse_duration(c.window, false);
    const auto audit_window = *parse_duration(c.audit_window, true);
    // The wall clock: there is no guard clock here (top of file).
    const std::int64_t now =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    idem::prune_limits limits;
    limits.records_before_ms = now - window.count();
    limits.audit_before_ms = audit_window == std::chrono::milliseconds::max() ? idem::prune_limits::keep_all
                                                                              : now - audit_window.count();
    limits.max_rows = static_cast<std::size_t>(c.batch);

    std::unique_ptr<idem::store> st = open_store(spec, idem::durability::async, open_mode::existing);
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t records = 0, audit_rows = 0, calls = 0;
    for (idem::prune_result r{.more = true}; r.more; ++calls) {
        r = st->prune(limits);
        records += r.records;
        audit_rows += r.audit_rows;
        if (r.more && r.records == 0 && r.audit_rows == 0)
            throw idem::error(idem::errc::store_error, st->name() +
                                                           ": prune removed nothing but reports more rows "
                                                           "past the bounds; stopped to avoid looping");
    }
    const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const idem::prune_horizon h = st->horizon();
    if (c.json) {
        json j = json::object();
        j["command"] = "prune";
        j["store"] = display_name(spec);
        j["records_before_ms"] = limits.records_before_ms;
        j["records"] = records;
        j["audit_rows"] = audit_rows;
        j["transactions"] = calls;
        if (limits.audit_before_ms == idem::prune_limits::keep_all) j["audit_before_ms"] = nullptr;
        else j["audit_before_ms"] = limits.audit_before_ms;
        add_horizon(j, h);
        j["elapsed_s"] = elapsed_s;
        std::cout << json_line(j) << std::endl;
    } else {
        std::cout << "idem prune: " << display_name(spec) << "\n\n";
        table t;
        t.row("records removed", grouped(records), "(last updated before " + iso8601_ms(limits.records_before_ms) + ")");
        t.row("audit rows removed", grouped(audit_rows),
              limits.audit_before_ms == idem::prune_limits::keep_all
                  ? std::string("(--audit-window forever: kept)")
                  : "(older than " + iso8601_ms(limits.audit_before_ms) + ")");
        t.row("transactions", grouped(calls), "(at most " + grouped(c.batch) + " rows of each kind)");
        t.row("records horizon", horizon_text(h.records_ms));
        t.row("audit horizon", horizon_text(h.audit_ms));
        t.row("elapsed", fixed(elapsed_s, 2) + " s");
        t.print(std::cout);
    }
    return exit_ok;
}

}  // namespace

command add_prune(CLI::App& root) {
    auto c = std::make_shared<prune_config>();
    CLI::App* app = root.add_subcommand(
        "prune", "Remove records past the idempotency window and audit rows past the audit window from a durable store");
    app->footer(
        "Exit codes: 0 pruned, 2 bad command line, 3 the store could not be pruned (a SQLite file another "
        "process writes is refused: prune from that guard instead).");
    app->add_option("store,--store", c->store, std::string("Store URI: ") + durable_stores)
        ->required()
        ->check(store_check(/*durable_only=*/true));
    app->add_option("--window", c->window,
                    "The idempotency window: records last updated longer ago go (never PROCESSING ones)")
        ->required()
        ->check(duration_check(false));
    app->add_option("--audit-window", c->audit_window, "Audit rows older than this go; forever keeps them")
        ->check(duration_check(true))
        ->capture_default_str();
    app->add_option("--batch", c->batch, "Rows of each kind removed per transaction")
        ->check(in_range(std::uint64_t{1}, std::uint64_t{10'000'000}, "rows per transaction"))
        ->capture_default_str();
    app->add_flag("--json", c->json, "Print one JSON object on stdout");
    return {app, [c] { return run_prune(*c); }};
}

}  // namespace idem::tool
