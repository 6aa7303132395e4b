// tools/stats.cpp: `idem stats --store URI`: what a durable store holds.
//
// Records by status (and by biz_type), claims whose lease has expired (in doubt until compensation
// resolves them), audit rows by cause, the largest fence, and per biz_type the claim-to-completion
// p50/p99 read from the audit trail (a claim or reclaim row to the succeed or terminal fail row of
// the same key and fence; releases and compensations are not completions, as in the library's
// adaptive lease) with the lease options.adaptive would set from them: clamp(k x p99, min, max)
// (--lease-k, --lease-min, --lease-max; the library's defaults). These percentiles are exact
// (nearest rank) at the audit trail's millisecond resolution, over every completion the trail
// still holds across all processes; a guard's own (guard.operation_latencies()) come from its
// process's histograms, so the two agree within those histograms' bucket error, not exactly. This is the store's view: a live guard's
// counters (acquired, duplicates, flush lag, ...) live in its process and are exported there with
// idem::to_prometheus(guard.snapshot()). --prometheus prints the store view as gauges instead, since
// its numbers are states of the store, not events counted since a process started.
// Exit codes: 0 read, 2 bad command line, 3 the store could not be read.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "command.hpp"
#include "idem/detail/rows/audit_detail.hpp"
#include "idem/options.hpp"
#include "idem/store.hpp"
#include "report.hpp"
#include "store.hpp"

namespace idem::tool {
namespace {

struct stats_config {
    std::string store;
    bool json = false;
    bool prometheus = false;
    std::string retention = "24h";  // the hot window a guard on this store would use
    std::string window = "7d";      // its idempotency window
    // The adaptive lease policy to evaluate (options.adaptive's defaults).
    double lease_k = idem::adaptive_lease{}.k;
    std::string lease_min = "1s";
    std::string lease_max = "10m";
    std::uint64_t lease_min_samples = idem::adaptive_lease{}.min_samples;
};

/// One biz_type's claim-to-completion times (ms, from the audit trail) and the lease they imply.
struct latency_row {
    std::uint64_t completions = 0;
    std::int64_t p50_ms = 0, p99_ms = 0, max_ms = 0;
    std::int64_t lease_ms = 0;  // clamp(k x p99, min, max)
    bool enough = false;        // completions >= min_samples: the guard would use lease_ms
};

/// The nearest-rank quantile of sorted values (not empty).
std::int64_t nearest_rank(const std::vector<std::int64_t>& sorted, double q) {
    const auto rank = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size()))));
    return sorted[std::min(rank, sorted.size()) - 1];
}

constexpr idem::record_state statuses[] = {idem::record_state::processing, idem::record_state::succeeded,
                                           idem::record_state::failed, idem::record_state::released};

struct store_view {
    std::uint64_t records = 0;
    std::map<std::string, std::uint64_t> by_status;                      // status -> records
    std::map<std::string, std::map<std::string, std::uint64_t>> by_biz;  // biz_type -> status -> records
    std::uint64_t expired = 0;                                           // PROCESSING, lease passed
    std::int64_t oldest_processing_ms = 0;                               // 0: none
    std::uint64_t max_fence = 0;
    idem::prune_horizon horizon;  // what prune removed
    std::uint64_t audit_rows = 0;
    std::map<std::string, std::uint64_t> audit_by_cause;  // claim, succeed, ...
    // How a durable_guard with these windows would recover this store now (durable.hpp, recover):
    std::uint64_t hot = 0;                       // into memory: claims in flight, and records inside the hot window
    std::uint64_t cold = 0;                      // into the cold window's filter only
    std::uint64_t past_window = 0;               // nowhere: a key past the window runs again; prune removes it
    std::map<std::string, latency_row> latency;  // biz_type -> claim-to-completion times
};

/// A Prometheus label value: backslash, double quote and newline escaped.
std::string label_value(std::string_view v) {
    std::string out;
    for (char ch : v) {
        if (ch == '\\') out += "\\\\";
        else if (ch == '"') out += "\\\"";
        else if (ch == '\n') out += "\\n";
        else out += ch;
    }
    return out;
}

/// "# HELP" and "# TYPE" lines once per metric name, then the sample.
class exposition {
public:
    void gauge(const std::string& name, const std::string& help, const std::string& labels, std::uint64_t v) {
        if (name != last_) {
            out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n";
            last_ = name;
        }
        out_ += name + (labels.empty() ? "" : "{" + labels + "}") + " " + std::to_string(v) + "\n";
    }
    [[nodiscard]] const std::string& str() const noexcept { return out_; }

private:
    std::string out_, last_;
};

int run_stats(const stats_config& c) {
    if (*parse_duration(c.lease_max, false) < *parse_duration(c.lease_min, false)) {
        std::cerr << "idem stats: --lease-max " << c.lease_max << " is below --lease-min " << c.lease_min << "\n";
        return exit_usage;
    }
    const store_spec spec = *parse_store(c.store);
    std::unique_ptr<idem::store> st = open_store(spec, idem::durability::async, open_mode::existing);
    const auto t0 = std::chrono::steady_clock::now();
    const std::int64_t now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    store_view v;
    const std::string failover = failover_exposure(*st);
    for (idem::record_state s : statuses) v.by_status[idem::to_string(s)] = 0;
    const auto retention = *parse_duration(c.retention, false);
    const auto window = *parse_duration(c.window, true);
    st->load([&](const idem::stored_record& r) {
        ++v.records;
        const bool claim = r.state == idem::record_state::processing;
        if (claim || r.updated_ms >= now_ms - retention.count()) ++v.hot;
        else if (window == idem::forever || r.updated_ms >= now_ms - window.count()) ++v.cold;
        else ++v.past_window;
        ++v.by_status[idem::to_string(r.state)];
        ++v.by_biz[r.biz_type][idem::to_string(r.state)];
        v.max_fence = std::max(v.max_fence, r.fence);
        if (r.state == idem::record_state::processing) {
            if (r.lease_until_ms <= now_ms) ++v.expired;
            if (v.oldest_processing_ms == 0 || r.updated_ms < v.oldest_processing_ms) v.oldest_processing_ms = r.updated_ms;
        }
    });
    // Claim times of claims not yet matched, by key and fence (the stores scan the trail by key,
    // so this holds about one key's claims at a time).
    std::unordered_map<std::string, std::int64_t> claimed_at;
    std::map<std::string, std::vector<std::int64_t>> took;  // biz_type -> claim-to-completion ms
    st->scan_audit([&](const idem::audit_entry& a) {
        ++v.audit_rows;
        // The one parser of the detail text (the one verify uses); a text it does not know counts
        // under its first word.
        const auto parsed = idem::detail::rows::parse_audit_detail(a.detail);
        const std::string cause(parsed.status == idem::detail::rows::detail_parse::foreign
                                    ? std::string_view(a.detail).substr(0, a.detail.find(' '))
                                    : parsed.fields.cause);
        ++v.audit_by_cause[cause];
        std::string id = a.key;
        id += '\0';
        id += std::to_string(a.fence);
        if (cause == "claim" || cause == "reclaim") {
            claimed_at[std::move(id)] = a.at_ms;
        } else if (cause == "succeed" || cause == "fail" || cause == "release" || cause == "compensate" ||
                   cause == "not_durable") {
            const auto it = claimed_at.find(id);
            if (it == claimed_at.end()) return;
            if (cause == "succeed" || cause == "fail")
                took[idem::biz_type_of(a.key)].push_back(std::max<std::int64_t>(0, a.at_ms - it->second));
            claimed_at.erase(it);
        }
    });
    const auto lease_min = parse_duration(c.lease_min, false)->count(),
               lease_max = parse_duration(c.lease_max, false)->count();
    for (auto& [biz, ms] : took) {
        std::sort(ms.begin(), ms.end());
        latency_row& r = v.latency[biz];
        r.completions = ms.size();
        r.p50_ms = nearest_rank(ms, 0.50);
        r.p99_ms = nearest_rank(ms, 0.99);
        r.max_ms = ms.back();
        const double want = c.lease_k * static_cast<double>(r.p99_ms);
        r.lease_ms = want >= static_cast<double>(lease_max)
                         ? lease_max
                         : std::clamp(static_cast<std::int64_t>(want), lease_min, lease_max);
        r.enough = r.completions >= c.lease_min_samples;
    }
    v.horizon = st->horizon();
    v.max_fence = std::max(v.max_fence, st->max_fence());  // pruned records count too
    const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    if (c.prometheus) {
        exposition e;
        for (const auto& [status, n] : v.by_status)
            e.gauge("idem_store_records", "Records in idempotent_record by status.", "status=\"" + status + "\"", n);
        for (const auto& [biz, counts] : v.by_biz)
            for (const auto& [status, n] : counts)
                e.gauge("idem_store_records_by_biz_type", "Records by biz_type and status.",
                        "biz_type=\"" + label_value(biz) + "\",status=\"" + status + "\"", n);
        e.gauge("idem_store_expired_claims", "PROCESSING records whose lease has passed (in doubt until compensated).", "",
                v.expired);
        e.gauge("idem_store_audit_rows", "Rows in idempotent_audit.", "", v.audit_rows);
        for (const auto& [cause, n] : v.audit_by_cause)
            e.gauge("idem_store_audit_rows_by_cause", "Audit rows by cause (detail column).", "cause=\"" + cause + "\"", n);
        e.gauge("idem_store_max_fence", "Largest fencing_token in idempotent_record.", "", v.max_fence);
        e.gauge("idem_store_records_by_window", "Records by where a restart would put them (--retention, --window).",
                "window=\"hot\"", v.hot);
        e.gauge("idem_store_records_by_window", "", "window=\"cold\"", v.cold);
        e.gauge("idem_store_records_by_window", "", "window=\"past\"", v.past_window);
        for (const auto& [biz, r] : v.latency)
            e.gauge("idem_store_completions", "Claims completed (succeed or terminal fail) in the audit trail, by biz_type.",
                    "biz_type=\"" + label_value(biz) + "\"", r.completions);
        for (const auto& [biz, r] : v.latency) {
            const std::string b = "biz_type=\"" + label_value(biz) + "\"";
            e.gauge("idem_store_completion_milliseconds", "Claim-to-completion time from the audit trail (nearest rank).",
                    b + ",quantile=\"0.5\"", static_cast<std::uint64_t>(r.p50_ms));
            e.gauge("idem_store_completion_milliseconds", "", b + ",quantile=\"0.99\"",
                    static_cast<std::uint64_t>(r.p99_ms));
        }
        for (const auto& [biz, r] : v.latency)
            e.gauge("idem_store_adaptive_lease_milliseconds",
                    "The lease options.adaptive would set: clamp(k x p99, min, max) (--lease-k/-min/-max).",
                    "biz_type=\"" + label_value(biz) + "\"", static_cast<std::uint64_t>(r.lease_ms));
        std::cout << e.str();
    } else if (c.json) {
        json status = json::object(), biz = json::object(), causes = json::object();
        for (const auto& [s, n] : v.by_status) status[s] = n;
        for (const auto& [b, counts] : v.by_biz) {
            json o = json::object();
            for (const auto& [s, n] : counts) o[s] = n;
            biz[b] = o;
        }
        for (const auto& [cause, n] : v.audit_by_cause) causes[cause] = n;
        json j = json::object();
        j["command"] = "stats";
        j["store"] = display_name(spec);
        j["records"] = v.records;
        j["by_status"] = status;
        j["by_biz_type"] = biz;
        j["processing_expired"] = v.expired;
        if (v.oldest_processing_ms) j["oldest_processing"] = iso8601_ms(v.oldest_processing_ms);
        else j["oldest_processing"] = nullptr;
        j["audit_rows"] = v.audit_rows;
        j["audit_by_cause"] = causes;
        j["max_fence"] = v.max_fence;
        json windows = json::object();
        windows["retention"] = c.retention;
        windows["window"] = c.window;
        windows["hot"] = v.hot;
        windows["cold"] = v.cold;
        windows["past_window"] = v.past_window;
        j["at_restart"] = windows;
        json lat = json::object();
        for (const auto& [biz, r] : v.latency) {
            json o = json::object();
            o["completions"] = r.completions;
            o["p50_ms"] = r.p50_ms;
            o["p99_ms"] = r.p99_ms;
            o["max_ms"] = r.max_ms;
            o["lease_ms"] = r.lease_ms;
            o["lease_in_force"] = r.enough ? "adaptive" : "static";
            lat[biz] = o;
        }
        j["latency_by_biz_type"] = lat;
        json policy = json::object();
        policy["k"] = c.lease_k;
        policy["min"] = c.lease_min;
        policy["max"] = c.lease_max;
        policy["min_samples"] = c.lease_min_samples;
        j["lease_policy"] = policy;
        add_horizon(j, v.horizon);
        if (!failover.empty()) j["failover_exposure"] = failover;
        j["elapsed_s"] = elapsed_s;
        std::cout << json_line(j) << std::endl;
    } else {
        std::cout << "idem stats: " << display_name(spec) << "\n\n";
        table t;
        t.row("records", grouped(v.records));
        for (idem::record_state s : statuses) {
            const std::string name = idem::to_string(s);
            std::string note;
            if (s == idem::record_state::processing && v.by_status[name])
                note = "(" + grouped(v.expired) + " with an expired lease; oldest claimed " +
                       iso8601_ms(v.oldest_processing_ms) + ")";
            if (s == idem::record_state::released) note = "(claims given back: claimable again)";
            t.row("  " + name, grouped(v.by_status[name]), note);
        }
        t.row("audit rows", grouped(v.audit_rows));
        for (const auto& [cause, n] : v.audit_by_cause) t.row("  " + cause, grouped(n));
        t.row("max fence", std::to_string(v.max_fence));
        t.row("at a restart", "", "(retention " + c.retention + ", window " + c.window + ")");
        t.row("  into memory", grouped(v.hot), "(claims in flight, and records inside the hot window)");
        t.row("  cold window", grouped(v.cold), "(in the filter only; a duplicate reads the store)");
        t.row("  past the window", grouped(v.past_window), "(forgotten: the key runs again; idem prune removes them)");
        horizon_rows(t, v.horizon);
        if (!failover.empty()) t.row("failover", "", "(" + failover + ")");
        t.row("read in", fixed(elapsed_s, 2) + " s");
        t.print(std::cout);
        if (v.by_biz.size() > 1) {
            std::cout << "\nby biz_type\n";
            table b;
            for (const auto& [biz, counts] : v.by_biz) {
                std::string parts;
                std::uint64_t total = 0;
                for (const auto& [s, n] : counts) {
                    parts += (parts.empty() ? "" : ", ") + s + " " + grouped(n);
                    total += n;
                }
                b.row("  " + biz, grouped(total), "(" + parts + ")");
            }
            b.print(std::cout);
        }
        if (!v.latency.empty()) {
            std::cout << "\nclaim to completion by biz_type (audit trail), and the adaptive lease: clamp("
                      << fixed(c.lease_k, 2) << " x p99, " << c.lease_min << ", " << c.lease_max << "), after "
                      << grouped(c.lease_min_samples) << " completions\n";
            table b;
            for (const auto& [biz, r] : v.latency)
                b.row("  " + biz, grouped(r.completions) + " completions",
                      "p50 " + grouped_signed(r.p50_ms) + " ms, p99 " + grouped_signed(r.p99_ms) + " ms, lease " +
                          grouped_signed(r.lease_ms) + " ms" +
                          (r.enough ? "" : " (too few completions: options.lease applies)"));
            b.print(std::cout);
        }
    }
    return exit_ok;
}

}  // namespace

command add_stats(CLI::App& root) {
    auto c = std::make_shared<stats_config>();
    CLI::App* app = root.add_subcommand("stats", "Records by status, expired claims and audit rows of a durable store");
    app->footer("Exit codes: 0 read, 2 bad command line, 3 the store could not be read.");
    app->add_option("--store", c->store, std::string("Store URI: ") + durable_stores)
        ->required()
        ->check(store_check(/*durable_only=*/true));
    auto* json = app->add_flag("--json", c->json, "Print one JSON object on stdout");
    app->add_flag("--prometheus", c->prometheus, "Print the store view in Prometheus text format (gauges)")->excludes(json);
    app->add_option("--retention", c->retention, "Hot window of the guard that will open this store (default 24h)")
        ->check(duration_check(false));
    app->add_option("--window", c->window, "Its idempotency window (default 7d; forever)")->check(duration_check(true));
    app->add_option("--lease-k", c->lease_k, "Adaptive lease: k in clamp(k x p99, min, max) (default 3, at least 1)")
        ->check(CLI::Range(1.0, 1e9));
    app->add_option("--lease-min", c->lease_min, "Adaptive lease floor (default 1s)")->check(duration_check(false));
    app->add_option("--lease-max", c->lease_max, "Adaptive lease ceiling (default 10m)")->check(duration_check(false));
    app->add_option("--lease-min-samples", c->lease_min_samples,
                    "Completions an operation needs before its adaptive lease applies (default 1000)")
        ->check(CLI::Range(std::uint64_t{1}, std::numeric_limits<std::uint64_t>::max()));
    return {app, [c] { return run_stats(*c); }};
}

}  // namespace idem::tool
