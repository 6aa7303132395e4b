// tools/audit.cpp: `idem audit KEY --store URI`: one key's record and audit trail, read from the store.
//
// Prints the record (status, fence, lease, outcome, payload size and hash, fingerprint, times) and
// every audit row in sequence order (from -> to, fence, node, ISO-8601 time, detail), then checks
// the trail the way `idem verify` does for every key: each step legal, fences increasing per claim,
// the last row matching the record. Exit codes: 0 found and consistent, 1 not found or the trail
// breaks a rule, 2 bad command line (an invalid key), 3 the store could not be read.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "command.hpp"
#include "idem/store.hpp"
#include "idem/verify.hpp"
#include "report.hpp"
#include "store.hpp"

namespace idem::tool {
namespace {

struct audit_config {
    std::string key;
    std::string store;
    bool json = false;
};

std::string hex64(std::uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
    return buf;
}

std::int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

/// The rules of idem::verify, for one key: the trail's steps, then the record against the last row.
std::vector<std::string> check_trail(const std::vector<idem::audit_entry>& trail,
                                     const std::optional<idem::stored_record>& rec, const std::string& key) {
    idem::verify_report report;
    idem::detail::trail_checker checker(report);
    for (const idem::audit_entry& a : trail) checker.row(a);
    std::vector<std::string> out = std::move(report.violations);
    const auto& last = checker.last();
    const auto it = last.find(key);
    if (rec && it == last.end()) out.push_back("the key has a record but no audit trail");
    if (!rec && it != last.end()) out.push_back("the key has an audit trail but no record");
    if (rec && it != last.end() && (it->second.state != rec->state || it->second.fence != rec->fence))
        out.push_back(std::string("the record is ") + idem::to_string(rec->state) + " fence " + std::to_string(rec->fence) +
                      " but the last audit row says " + idem::to_string(it->second.state) + " fence " +
                      std::to_string(it->second.fence));
    return out;
}

int run_audit(const audit_config& c) {
    std::string why;
    if (!idem::key::check(c.key, "KEY", &why)) {
        std::cerr << "idem audit: " << why << '\n';
        return exit_usage;
    }
    const store_spec spec = *parse_store(c.store);
    std::unique_ptr<idem::store> st = open_store(spec, idem::durability::async, open_mode::existing);
    const std::optional<idem::stored_record> rec = st->get(c.key);
    const std::vector<idem::audit_entry> trail = st->audit(c.key);
    const bool found = rec.has_value() || !trail.empty();
    const std::vector<std::string> violations = found ? check_trail(trail, rec, c.key) : std::vector<std::string>{};
    const std::int64_t now = now_ms();
    const bool processing = rec && rec->state == idem::record_state::processing;

    if (c.json) {
        json j = json::object();
        j["command"] = "audit";
        j["store"] = display_name(spec);
        j["key"] = c.key;
        j["found"] = found;
        if (rec) {
            json r = json::object();
            r["status"] = idem::to_string(rec->state);
            r["biz_type"] = rec->biz_type;
            r["fence"] = rec->fence;
            r["outcome"] = rec->outcome;
            // The response payload by its size and hash (what the audit rows record), not its bytes.
            r["payload_bytes"] = std::uint64_t{rec->payload.size()};
            if (!rec->payload.empty()) r["payload_fnv"] = hex64(idem::payload_hash(rec->payload));
            r["fingerprint"] = rec->fingerprint;
            r["created_ms"] = rec->created_ms;
            r["created"] = iso8601_ms(rec->created_ms);
            r["updated_ms"] = rec->updated_ms;
            r["updated"] = iso8601_ms(rec->updated_ms);
            if (processing) {
                r["lease_until_ms"] = rec->lease_until_ms;
                r["lease_until"] = iso8601_ms(rec->lease_until_ms);
                r["lease_expired"] = rec->lease_until_ms <= now;
            }
            j["record"] = r;
        } else {
            j["record"] = nullptr;
        }
        std::vector<json> rows;
        for (const idem::audit_entry& a : trail) {
            json r = json::object();
            r["sequence"] = a.sequence;
            r["from"] = idem::to_string(a.from);
            r["to"] = idem::to_string(a.to);
            r["fence"] = a.fence;
            r["node"] = a.node;
            r["at_ms"] = a.at_ms;
            r["time"] = iso8601_ms(a.at_ms);
            r["detail"] = a.detail;
            rows.push_back(std::move(r));
        }
        j["trail"] = rows;
        j["violations"] = std::uint64_t{violations.size()};
        j["violation_list"] = violations;
        j["ok"] = found && violations.empty();
        std::cout << json_line(j) << std::endl;
    } else if (!found) {
        std::cout << "idem audit: key '" << idem::key::printable(c.key) << "' has no record and no audit trail in "
                  << display_name(spec) << '\n';
    } else {
        std::cout << "key " << idem::key::printable(c.key) << " in " << display_name(spec) << "\n\nrecord\n";
        if (rec) {
            table t;
            t.row("status", idem::to_string(rec->state),
                  rec->state == idem::record_state::released ? "(claim given back: claimable again, fence kept)" : "");
            t.row("biz_type", rec->biz_type);
            t.row("fence", std::to_string(rec->fence));
            if (processing)
                t.row("lease until", iso8601_ms(rec->lease_until_ms),
                      rec->lease_until_ms <= now ? "(expired: compensation asks the resolver)" : "(live)");
            t.row("outcome", std::to_string(rec->outcome));
            t.row("payload", rec->payload.empty() ? std::string("none")
                                                  : std::to_string(rec->payload.size()) + " bytes, fnv " +
                                                        hex64(idem::payload_hash(rec->payload)));
            t.row("fingerprint", rec->fingerprint ? hex64(rec->fingerprint) : "none");
            t.row("created", iso8601_ms(rec->created_ms));
            t.row("updated", iso8601_ms(rec->updated_ms));
            t.print(std::cout);
        } else {
            std::cout << "  (none)\n";
        }
        std::cout << "\naudit trail (" << trail.size() << (trail.size() == 1 ? " row" : " rows") << ")\n";
        std::printf("  %10s  %-10s    %-10s  %20s  %-24s  %-24s  %s\n", "sequence", "from", "to", "fence", "node",
                    "time (UTC)", "detail");
        std::fflush(stdout);
        for (const idem::audit_entry& a : trail)
            std::printf("  %10lld  %-10s -> %-10s  %20llu  %-24s  %-24s  %s\n", static_cast<long long>(a.sequence),
                        idem::to_string(a.from), idem::to_string(a.to), static_cast<unsigned long long>(a.fence),
                        a.node.c_str(), iso8601_ms(a.at_ms).c_str(), a.detail.c_str());
        std::fflush(stdout);
        if (violations.empty()) std::cout << "\ntrail: legal, and its last row matches the record\n";
        else std::cout << "\ntrail: " << violations.size() << " violation(s)\n";
    }
    for (const std::string& v : violations) std::cerr << "idem audit: violation: " << v << '\n';
    return found && violations.empty() ? exit_ok : exit_violation;
}

}  // namespace

command add_audit(CLI::App& root) {
    auto c = std::make_shared<audit_config>();
    CLI::App* app = root.add_subcommand("audit", "Print one key's record and audit trail from a durable store");
    app->footer(
        "Exit codes: 0 found and its trail legal, 1 not found or the trail breaks a rule, 2 bad command "
        "line, 3 the store could not be read.");
    app->add_option("KEY", c->key, "The idempotency key, e.g. TX20230615123456_TRANSFER_v2")->required();
    app->add_option("--store", c->store, std::string("Store URI: ") + durable_stores)
        ->required()
        ->check(store_check(/*durable_only=*/true));
    app->add_flag("--json", c->json, "Print one JSON object on stdout");
    return {app, [c] { return run_audit(*c); }};
}

}  // namespace idem::tool
