// tools/regions.cpp: `idem regions setup|status|verify --region NAME=URI ...` (PostgreSQL builds):
// the operator's side of idem/regions.hpp.
//
//   idem regions setup  --region eu=postgresql://... --region us=postgresql://... [--synchronous]
//   idem regions status --region eu=... --region us=... [--json]
//   idem regions verify --region eu=... --region us=... [--home-prefix SEP] [--decided-at SPACE=REGION] [--json]
//   idem regions move   --region eu=... --region us=... --space eu --from eu --to us [--witness w=URI]
//   idem regions leases --region eu=... --region us=... [--witness w=URI] [--lease-ms N] [--margin-ms N]
//                       [--call-deadline-ms N]
//   idem regions takeover --region eu=... --region us=... --space eu --to us [--witness w=URI]
//                         [--lease-ms N] [--margin-ms N] [--call-deadline-ms N] [--timeout-ms N] [--json]
//   idem regions rebuild --region eu=... --region us=... --name eu [--leases [--witness w=URI] [--lease-ms N] ...]
//
// setup: idem::setup_regions (schemas, publications, subscriptions; --synchronous names every
// home's subscriptions in its synchronous_standby_names). status: every cluster's replication
// links (idem::replication_link): exit 1 when one is down. verify: idem::verify_regions; the home
// rule is "the key up to the first SEP names its region" (--home-prefix '-': "eu-PAY-1" is eu's);
// without --home-prefix, which region decided a key is not checked (every other check runs).
// move: idem::move_home, a planned move of a key space's deciding to another region's cluster.
// leases: idem::setup_home_leases (lease stores in every cluster and witness, the lease fence).
// takeover: idem::take_over, after the region deciding a key space is lost: waits until its lease
// ran out at a majority of the lease stores, then takes it (exit 3 when it did not run out in
// --timeout-ms: the old home may still decide). rebuild: idem::rebuild_region, a region whose key
// spaces were taken over (or a new cluster in place of a wiped one) gets every copy again from
// the clusters deciding them. status also lists every lease store's rows.
// Exit codes: 0 done / every link up / no violation, 1 a link down / violations (listed), 2 bad
// command line, 3 a cluster could not be reached or set up.
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "command.hpp"
#include "idem/takeover.hpp"
#include "idem/move_home.hpp"
#include "idem/regions.hpp"
#include "idem/rebuild_region.hpp"
#include "report.hpp"

namespace idem::tool {
namespace {

struct regions_config {
    std::vector<std::string> region_args;  ///< NAME=URI
    bool synchronous = false;
    bool json = false;
    std::string home_prefix;                ///< verify: the separator ending a key's region name; empty: not checked
    std::vector<std::string> decided_at;    ///< SPACE=REGION: key spaces decided by another region after a move
    std::string space, from, to;            ///< move, takeover
    std::vector<std::string> witness_args;  ///< NAME=URI: lease stores without data
    std::string name;                       ///< rebuild
    bool leases = false;                    ///< rebuild: home leases are set up
    std::int64_t lease_ms = 10000, margin_ms = 2000, call_deadline_ms = 2000, timeout_ms = 60000;
};

std::map<std::string, std::string> parse_moves(const std::vector<std::string>& args) {
    std::map<std::string, std::string> m;
    for (const std::string& a : args) m[a.substr(0, a.find('='))] = a.substr(a.find('=') + 1);
    return m;
}

std::vector<idem::region> parse_regions(const std::vector<std::string>& args) {
    std::vector<idem::region> rs;
    for (const std::string& a : args) {
        const auto eq = a.find('=');
        rs.push_back({a.substr(0, eq), a.substr(eq + 1)});
    }
    return rs;
}

CLI::Validator region_check() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            const auto eq = text.find('=');
            if (eq == std::string::npos || eq + 1 == text.size())
                return "'" + text + "' is not NAME=URI (a region's name and its cluster's connection string)";
            if (!idem::detail::regions::valid_name(text.substr(0, eq)))
                return "region name '" + text.substr(0, eq) +
                       "' is not 1 to 24 characters of a-z and 0-9 starting with a letter";
            return {};
        },
        "NAME=URI");
}

int run_setup(const regions_config& c) {
    const auto rs = parse_regions(c.region_args);
    idem::setup_regions(rs, c.synchronous ? idem::replication_mode::synchronous : idem::replication_mode::asynchronous);
    std::cout << "idem regions setup: " << rs.size() << " regions, "
              << (c.synchronous ? "synchronous (each home's commit waits for one other region's subscriber)"
                                : "asynchronous")
              << "; every initial copy done\n";
    return exit_ok;
}

idem::lease_options lease_opts(const regions_config& c) {
    idem::lease_options lo;
    lo.lease = std::chrono::milliseconds(c.lease_ms);
    lo.margin = std::chrono::milliseconds(c.margin_ms);
    lo.call_deadline = std::chrono::milliseconds(c.call_deadline_ms);
    lo.witnesses = parse_regions(c.witness_args);
    return lo;
}

int run_leases(const regions_config& c) {
    const auto rs = parse_regions(c.region_args);
    idem::setup_home_leases(rs, lease_opts(c));
    std::cout << "idem regions leases: " << rs.size() << " regions and " << c.witness_args.size()
              << " witnesses hold home leases; every key space is decided only while its home's keepers hold its "
                 "lease (give every regional_guard regional_options::leases)\n";
    return exit_ok;
}

int run_takeover(const regions_config& c) {
    const auto rs = parse_regions(c.region_args);
    const auto r = idem::take_over(rs, c.space, c.to, lease_opts(c), std::chrono::milliseconds(c.timeout_ms));
    auto list = [](const std::vector<std::string>& v) {
        std::string out;
        for (const auto& x : v) out += (out.empty() ? "" : ", ") + x;
        return out.empty() ? std::string("none") : out;
    };
    if (c.json) {
        json j = json::object();
        j["command"] = "regions takeover";
        j["space"] = c.space;
        j["from"] = r.from;
        j["to"] = c.to;
        j["epoch"] = r.epoch;
        j["accepted"] = r.accepted;
        j["merged"] = r.merged;
        j["fenced"] = r.fenced;
        j["skipped"] = r.skipped;
        j["rebuild"] = r.rebuild;
        j["records"] = r.records;
        std::cout << json_line(j) << std::endl;
    } else {
        std::cout << "idem regions takeover: key space '" << c.space << "' taken from region '" << r.from << "' to '" << c.to
                  << "' at epoch " << r.epoch << "\n\n";
        table t;
        t.row("lease stores that accepted", list(r.accepted));
        t.row("copies merged into " + c.to, list(r.merged));
        t.row("copies fenced from " + r.from, list(r.fenced));
        t.row("regions not reached", list(r.skipped));
        t.row("copies to rebuild", list(r.rebuild), "(idem regions rebuild, before they serve)");
        t.row("records at " + c.to, grouped(r.records));
        t.print(std::cout);
        std::cout << "\nGive every process decided_at['" << c.space << "'] = '" << c.to << "'.\n";
    }
    return exit_ok;
}

int run_rebuild(const regions_config& c) {
    const auto rs = parse_regions(c.region_args);
    std::optional<idem::lease_options> lo;
    if (c.leases) lo = lease_opts(c);
    const auto r = idem::rebuild_region(rs, c.name, lo);
    std::cout << "idem regions rebuild: region '" << c.name << "' holds " << r.copied.size()
              << " copies again, following the clusters that decide them (" << grouped(r.records)
              << " records); it decides nothing until a key space is moved to it\n";
    return exit_ok;
}

int run_move(const regions_config& c) {
    const auto rs = parse_regions(c.region_args);
    idem::move_home(rs, c.space, c.from, c.to, std::chrono::seconds(60), std::chrono::seconds(5),
                    parse_regions(c.witness_args));
    std::cout << "idem regions move: key space '" << c.space << "' is decided by region '" << c.to << "' now; region '"
              << c.from << "' refuses it (fenced). Give every process decided_at['" << c.space << "'] = '" << c.to
              << "' (idem regions verify --decided-at " << c.space << "=" << c.to << ")\n";
    return exit_ok;
}

int run_status(const regions_config& c) {
    const auto rs = parse_regions(c.region_args);
    idem::detail::regions::check_regions(rs);
    std::vector<idem::replication_link> all;
    for (const idem::region& r : rs) {
        try {
            const auto conn = idem::detail::regions::connect(r.uri, std::chrono::seconds(10), "idem-regions-status");
            const auto links = idem::detail::regions::read_links(*conn, r.name);
            for (const auto& l : links)  // each link once: as its home sees it (the lag), plus the subscriber's view
                all.push_back(l);
        } catch (const std::exception& e) {
            throw idem::error(errc::store_unavailable, "region '" + r.name + "': " + e.what());
        }
    }
    bool ok = true;
    for (const auto& l : all) ok = ok && l.up;
    std::vector<idem::lease_row> leases;
    for (const idem::region& r : rs) {
        const auto part = idem::read_leases(r);
        leases.insert(leases.end(), part.begin(), part.end());
    }
    for (const idem::region& w : parse_regions(c.witness_args)) {
        const auto part = idem::read_leases(w);
        leases.insert(leases.end(), part.begin(), part.end());
    }
    if (c.json) {
        json j = json::object();
        j["command"] = "regions status";
        json ls = json::array();
        for (const auto& l : leases)
            ls.push_back({{"store", l.store},
                          {"space", l.space},
                          {"owner", l.owner},
                          {"epoch", l.epoch},
                          {"valid_ms", l.valid_ms},
                          {"held_ms", l.held_ms}});
        j["leases"] = ls;
        j["ok"] = ok;
        json links = json::array();
        for (const auto& l : all)
            links.push_back({{"from", l.from},
                             {"to", l.to},
                             {"side", l.lag_bytes >= 0 ? "outgoing" : "incoming"},
                             {"up", l.up},
                             {"lag_bytes", l.lag_bytes},
                             {"lag_ms", l.lag_ms},
                             {"heard_ms", l.heard_ms},
                             {"synchronous", l.synchronous}});
        j["links"] = links;
        std::cout << json_line(j) << std::endl;
    } else {
        std::cout << "idem regions status: " << rs.size() << " regions\n\n";
        table t;
        for (const auto& l : all) {
            const bool out = l.lag_bytes >= 0;
            t.row(l.from + " -> " + l.to + (out ? " (at " + l.from + ")" : " (at " + l.to + ")"), l.up ? "up" : "DOWN",
                  out ? "lag " + grouped(static_cast<std::uint64_t>(l.lag_bytes)) + " bytes, " + std::to_string(l.lag_ms) +
                            " ms" + (l.synchronous ? ", synchronous" : "")
                      : (l.heard_ms >= 0 ? "last heard " + std::to_string(l.heard_ms) + " ms ago" : "not running"));
        }
        for (const auto& l : leases)
            t.row("lease " + l.space + " (at " + l.store + ")", "owner " + l.owner + ", epoch " + std::to_string(l.epoch),
                  (l.valid_ms > 0 ? "valid " + std::to_string(l.valid_ms) + " ms more" : std::string("ran out")) +
                      (l.held_ms > 0 ? "; decided here " + std::to_string(l.held_ms) + " ms more" : ""));
        t.print(std::cout);
        std::cout << '\n' << (ok ? "PASS: every replication link is up." : "FAIL: a replication link is down.") << '\n';
    }
    return ok ? exit_ok : exit_violation;
}

int run_verify_regions(const regions_config& c) {
    const auto rs = parse_regions(c.region_args);
    std::function<std::string(std::string_view)> home;
    if (!c.home_prefix.empty()) {
        home = [sep = c.home_prefix](std::string_view k) { return std::string(k.substr(0, k.find(sep))); };
    }
    // Without a rule, which key space a key was decided in is not checked.
    const auto r = idem::verify_regions(rs, home, parse_moves(c.decided_at));
    std::vector<std::string> all = r.violations;
    std::uint64_t keys = 0;
    for (const auto& [name, h] : r.homes) {
        keys += h.keys;
        for (const auto& v : h.violations) all.push_back("region '" + name + "': " + v);
    }
    const bool ok = all.empty();
    if (c.json) {
        json j = json::object();
        j["command"] = "regions verify";
        j["ok"] = ok;
        j["keys"] = keys;
        j["records"] = r.records;
        j["replica_rows"] = r.replica_rows;
        j["violations"] = std::uint64_t{all.size()};
        j["violation_list"] = all;
        std::cout << json_line(j) << std::endl;
    } else {
        std::cout << "idem regions verify: " << rs.size() << " regions\n\n";
        table t;
        t.row("keys", grouped(keys), "(audit trails, in their homes)");
        t.row("records", grouped(r.records));
        t.row("replica rows", grouped(r.replica_rows), "(audit rows of the replicas compared with their homes')");
        t.row("violations", grouped(all.size()));
        t.print(std::cout);
        std::cout << '\n' << (ok ? "PASS: every key has one trail, in its home region." : "FAIL:") << '\n';
        for (const auto& v : all) std::cout << "  " << v << '\n';
    }
    return ok ? exit_ok : exit_violation;
}

}  // namespace

command add_regions(CLI::App& root) {
    auto c = std::make_shared<regions_config>();
    CLI::App* app = root.add_subcommand("regions",
                                        "Set up, watch and verify PostgreSQL clusters as regions of one key space");
    app->require_subcommand(1);
    app->footer(
        "Exit codes: 0 done / every link up / no violation, 1 a link down / violations, 2 bad command line, "
        "3 a cluster could not be reached or set up.");
    auto regions = [&](CLI::App* sub) {
        sub->add_option("--region", c->region_args, "A region: NAME=URI (name: a-z and 0-9; at least two)")
            ->required()
            ->check(region_check())
            ->expected(2, 64);
    };
    CLI::App* setup = app->add_subcommand("setup", "Schemas, publications and subscriptions (idempotent)");
    regions(setup);
    setup->add_flag("--synchronous", c->synchronous,
                    "Each home's commit waits for one other region's subscriber (synchronous_standby_names)");
    CLI::App* move = app->add_subcommand("move", "Hand a key space to another region's cluster (planned: both running)");
    regions(move);
    auto region_name = CLI::Validator(
        [](std::string& text) -> std::string {
            return idem::detail::regions::valid_name(text) ? std::string()
                                                           : "'" + text + "' is not a region name (a-z, 0-9)";
        },
        "NAME");
    move->add_option("--space", c->space, "The key space (named by its home region)")->required()->check(region_name);
    move->add_option("--from", c->from, "The region whose cluster decides it now")->required()->check(region_name);
    move->add_option("--to", c->to, "The region whose cluster will decide it")->required()->check(region_name);
    auto witnesses = [&](CLI::App* sub) {
        sub->add_option("--witness", c->witness_args, "A lease store holding no data: NAME=URI")->check(region_check());
    };
    witnesses(move);
    auto lease_flags = [&](CLI::App* sub) {
        sub->add_option("--lease-ms", c->lease_ms, "How long one renewal holds (default 10000)")
            ->check(CLI::Range(100, 3600000));
        sub->add_option("--margin-ms", c->margin_ms, "The bound on clock skew between the servers (default 2000)")
            ->check(CLI::Range(0, 3600000));
        sub->add_option("--call-deadline-ms", c->call_deadline_ms,
                        "Each statement to a lease store is cut after this long; under half the lease (default 2000)")
            ->check(CLI::Range(10, 3600000));
    };
    CLI::App* leases = app->add_subcommand("leases",
                                           "Home leases in every cluster and witness, and the lease fence (idempotent)");
    regions(leases);
    witnesses(leases);
    lease_flags(leases);
    CLI::App* takeover = app->add_subcommand("takeover",
                                             "Take a lost region's key space over, once its lease ran out at a majority");
    regions(takeover);
    witnesses(takeover);
    lease_flags(takeover);
    takeover->add_option("--space", c->space, "The key space (named by its home region)")->required()->check(region_name);
    takeover->add_option("--to", c->to, "The region whose cluster will decide it")->required()->check(region_name);
    takeover->add_option("--timeout-ms", c->timeout_ms, "How long to wait for the lease to run out (default 60000)")
        ->check(CLI::Range(0, 86400000));
    takeover->add_flag("--json", c->json, "Print one JSON object on stdout");
    CLI::App* rebuild = app->add_subcommand(
        "rebuild", "Give a region taken over (or a new cluster in its place) every copy again from their deciders");
    regions(rebuild);
    rebuild->add_option("--name", c->name, "The region to rebuild")->required()->check(region_name);
    rebuild->add_flag("--leases", c->leases, "Home leases are set up: its lease store adopts the newest leases");
    witnesses(rebuild);
    lease_flags(rebuild);
    CLI::App* status = app->add_subcommand("status", "Every replication link: up, lag in bytes and ms");
    regions(status);
    status->add_flag("--json", c->json, "Print one JSON object on stdout");
    witnesses(status);
    CLI::App* verify = app->add_subcommand("verify", "Every key has one trail, decided in its home; replicas agree");
    regions(verify);
    verify->add_option("--home-prefix", c->home_prefix,
                       "The key up to this separator names its home region (without it, not checked)");
    verify->add_option("--decided-at", c->decided_at, "SPACE=REGION: a key space moved to another region's cluster")
        ->check(region_check());
    verify->add_flag("--json", c->json, "Print one JSON object on stdout");
    return {app, [c, setup, move, leases, takeover, rebuild, status, verify] {
                if (setup->parsed()) return run_setup(*c);
                if (move->parsed()) return run_move(*c);
                if (leases->parsed()) return run_leases(*c);
                if (takeover->parsed()) return run_takeover(*c);
                if (rebuild->parsed()) return run_rebuild(*c);
                if (status->parsed()) return run_status(*c);
                if (verify->parsed()) return run_verify_regions(*c);
                return static_cast<int>(exit_usage);
            }};
}

}  // namespace idem::tool
