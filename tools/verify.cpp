// tools/verify.cpp: `idem verify --store URI`: idem::verify over a whole durable store.
//
// Every key's audit trail must be a legal path of the state machine (docs/design.md), with
// fences strictly increasing per claim and completions carrying their claim's fence, and must end
// in the state and fence its record holds; no record without a trail, no trail without a record,
// unless the store's prune horizon says those rows were pruned (then they are counted and the
// horizon printed).
// --prometheus FILE: after the report, the run's result as gauges for node-exporter's textfile
// collector (prometheus_file.hpp), written also when violations were found.
// Exit codes: 0 no violation, 1 violations (listed), 2 bad command line, 3 the store could not be read
// (or, with no violation, the --prometheus file could not be written).
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "command.hpp"
#include "idem/verify.hpp"
#include "prometheus_file.hpp"
#include "report.hpp"
#include "store.hpp"

namespace idem::tool {
namespace {

struct verify_config {
    std::string store;
    bool json = false;
    std::uint64_t max_list = 100;
    std::string prometheus;  ///< --prometheus FILE; empty: none
};

int run_verify(const verify_config& c) {
    const store_spec spec = *parse_store(c.store);
    std::unique_ptr<idem::store> st = open_store(spec, idem::durability::async, open_mode::existing);
    const auto t0 = std::chrono::steady_clock::now();
    const idem::verify_report r = idem::verify(*st);
    const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::size_t shown = std::min<std::size_t>(r.violations.size(), c.max_list);
    const std::vector<std::string> listed(r.violations.begin(), r.violations.begin() + static_cast<std::ptrdiff_t>(shown));
    const bool ok = r.violations.empty();
    if (c.json) {
        json j = json::object();
        j["command"] = "verify";
        j["store"] = display_name(spec);
        j["ok"] = ok;
        j["keys"] = r.keys;
        j["transitions"] = r.transitions;
        j["reopened"] = r.reopened;
        j["truncated_trails"] = r.truncated_trails;
        j["records_without_trail"] = r.records_without_trail;
        j["trails_without_record"] = r.trails_without_record;
        j["violations"] = std::uint64_t{r.violations.size()};
        j["violation_list"] = listed;
        j["violation_list_truncated"] = shown < r.violations.size();
        add_horizon(j, r.horizon);
        j["elapsed_s"] = elapsed_s;
        std::cout << json_line(j) << std::endl;
    } else {
        std::cout << "idem verify: " << display_name(spec) << "\n\n";
        table t;
        t.row("keys", grouped(r.keys));
        t.row("transitions", grouped(r.transitions), "(audit rows)");
        t.row("reopened", grouped(r.reopened), "(keys claimed again after eviction from an earlier process)");
        if (r.horizon != idem::prune_horizon{}) {
            horizon_rows(t, r.horizon);
            t.row("pruned history",
                  grouped(r.truncated_trails) + " / " + grouped(r.records_without_trail) + " / " +
                      grouped(r.trails_without_record),
                  "(trails without their start / records without a trail / trails without a record: legal, the "
                  "horizon covers them)");
        }
        t.row("violations", grouped(r.violations.size()));
        t.row("elapsed", fixed(elapsed_s, 2) + " s");
        t.print(std::cout);
        std::cout << '\n'
                  << (ok ? "PASS: every audit trail is a legal path and ends where its record is."
                         : "FAIL: " + grouped(r.violations.size()) + " violation(s):")
                  << '\n';
        for (const std::string& v : listed) std::cout << "  " << v << '\n';
        if (shown < r.violations.size())
            std::cout << "  ... and " << grouped(r.violations.size() - shown) << " more (--max-list)\n";
    }
    if (!c.prometheus.empty()) {
        const std::vector<textfile_gauge> gauges{
            {"idem_verify_last_run_timestamp_seconds", "Unix time the last idem verify run finished.", prometheus_now()},
            {"idem_verify_violations", "Violations the last idem verify run found (0: every audit trail legal).",
             prometheus_integer(r.violations.size())},
            {"idem_verify_records_checked", "Keys the last idem verify run checked (records and audit trails).",
             prometheus_integer(r.keys)},
            {"idem_verify_duration_seconds", "Time the last idem verify run took to check the store.",
             prometheus_decimal(elapsed_s, 6)},
        };
        std::cout.flush();
        if (auto why = write_textfile(c.prometheus, textfile_text(gauges, display_name(spec)))) {
            std::cerr << "idem verify: --prometheus: " << *why << '\n';
            if (ok) return exit_runtime;
        }
    }
    return ok ? exit_ok : exit_violation;
}

}  // namespace

command add_verify(CLI::App& root) {
    auto c = std::make_shared<verify_config>();
    CLI::App* app = root.add_subcommand(
        "verify", "Check that every key's audit trail in a durable store is a legal path matching its record");
    app->footer(
        "Exit codes: 0 no violation, 1 violations found (listed), 2 bad command line, 3 the store could "
        "not be read (or, with no violation, the --prometheus file could not be written).");
    app->add_option("store,--store", c->store, std::string("Store URI: ") + durable_stores)
        ->required()
        ->check(store_check(/*durable_only=*/true));
    app->add_flag("--json", c->json, "Print one JSON object on stdout");
    app->add_option("--max-list", c->max_list, "Violations listed at most (all are counted)")
        ->check(in_range(std::uint64_t{0}, std::uint64_t{1} << 32, "violations listed"))
        ->capture_default_str();
    app->add_option("--prometheus", c->prometheus, prometheus_option_help)->type_name("FILE");
    return {app, [c] { return run_verify(*c); }};
}

}  // namespace idem::tool
