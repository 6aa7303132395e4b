// stats_test: the counters after a scripted sequence, and their Prometheus exposition.
#include <idem/global_options.hpp>
#include <idem/idem.hpp>

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/manual_guard.hpp"

namespace {

using idem::begin_status;
using idem::resolution;

TEST(Stats, CountersFollowAScriptedSequence) {
    idem::manual_clock clock;
    auto opts = idem_test::test_options(64);
    opts.lease = std::chrono::seconds(10);
    opts.on_failure = idem::failure_policy::retryable;
    int asked = 0;
    opts.resolve = [&](const idem::expired_claim& c) {
        ++asked;
        return c.key == "E1" ? idem::resolver_answer{resolution::succeeded, 1} : idem::resolver_answer{};
    };
    idem_test::manual_guard g(opts, clock);
    EXPECT_EQ(g.snapshot().acquired, 0u);

    auto a = g.begin(idem::key("A"), 11);                                           // acquired 1
    EXPECT_EQ(g.begin(idem::key("A"), 11).status, begin_status::in_progress);       // in_progress_hits 1
    EXPECT_EQ(g.begin(idem::key("A"), 12).status, begin_status::payload_mismatch);  // payload_mismatches 1
    ASSERT_FALSE(a.ticket.succeed(7));                                              // succeeded 1
    EXPECT_EQ(g.begin(idem::key("A")).status, begin_status::succeeded);             // duplicates 1
    EXPECT_EQ(g.begin(idem::key("A")).status, begin_status::succeeded);             // duplicates 2

    auto b = g.begin(idem::key("B"));                                 // acquired 2
    ASSERT_FALSE(b.ticket.fail(3, idem::failure_policy::terminal));   // failed 1
    EXPECT_EQ(g.begin(idem::key("B")).status, begin_status::failed);  // duplicates 3

    { auto c = g.begin(idem::key("C")); }  // acquired 3, released 1 (dropped)
    auto c = g.begin(idem::key("C"));      // acquired 4
    ASSERT_FALSE(c.ticket.fail(1));        // released 2 (retryable policy)

    auto e1 = g.begin(idem::key("E1"));  // acquired 5
    auto e2 = g.begin(idem::key("E2"));  // acquired 6
    clock.advance(std::chrono::seconds(10));
    EXPECT_EQ(g.compensate(), 1u);  // compensated 1 (E1), in_doubt 1 (E2)
    EXPECT_EQ(asked, 2);
    EXPECT_EQ(e1.ticket.succeed(), idem::errc::stale_ticket);            // stale_tickets 1
    EXPECT_EQ(g.begin(idem::key("E2")).status, begin_status::in_doubt);  // in_progress_hits 2

    const auto s = g.snapshot();
    EXPECT_EQ(s.acquired, 6u);
    EXPECT_EQ(s.in_progress_hits, 2u);
    EXPECT_EQ(s.payload_mismatches, 1u);
    EXPECT_EQ(s.succeeded, 2u) << "A by its owner, E1 by compensation";
    EXPECT_EQ(s.duplicates, 3u);
    EXPECT_EQ(s.failed, 1u);
    EXPECT_EQ(s.released, 2u);
    EXPECT_EQ(s.compensated, 1u);
    EXPECT_EQ(s.in_doubt, 1u);
    EXPECT_EQ(s.stale_tickets, 1u);
    EXPECT_EQ(s.reclaimed, 0u);
    EXPECT_EQ(s.capacity_exhausted, 0u);
    EXPECT_EQ(s.backpressure, 0u);
    EXPECT_EQ(s.evicted, 0u);
    EXPECT_EQ(s.rotations, 0u);
    EXPECT_GE(s.max_probe, 1u);
    EXPECT_EQ(s.flush_batches, 0u) << "memory-only guard";
    EXPECT_EQ(s.store_errors, 0u);

    const std::string text = idem::to_prometheus(s);
    EXPECT_NE(text.find("# TYPE idem_acquired_total counter\nidem_acquired_total 6\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nidem_duplicates_total 3\n"), std::string::npos) << text;
    EXPECT_NE(text.find("\nidem_in_doubt_total 1\n"), std::string::npos) << text;
    EXPECT_NE(text.find("# TYPE idem_max_probe gauge\n"), std::string::npos) << text;
    EXPECT_NE(text.find("# TYPE idem_queue_depth gauge\n"), std::string::npos) << text;
}

TEST(Stats, PrometheusTextIsWellFormed) {
    idem::stats s;
    s.acquired = 12345678901234ull;
    s.evicted = 2;
    s.flush_lag_ns = 1'500'000'042;  // durations are exported in seconds, Prometheus's base unit
    s.flusher_cpu_ns = 7;
    const std::string text = idem::to_prometheus(s);
    EXPECT_NE(text.find("\nidem_acquired_total 12345678901234\n"), std::string::npos) << text;
    EXPECT_NE(text.find("# TYPE idem_flush_lag_seconds gauge\nidem_flush_lag_seconds 1.500000042\n"), std::string::npos)
        << text;
    EXPECT_NE(text.find("# TYPE idem_flusher_cpu_seconds_total counter\nidem_flusher_cpu_seconds_total 0.000000007\n"),
              std::string::npos)
        << text;
    EXPECT_EQ(text.find("x1e9"), std::string::npos) << "a metric named in seconds must hold seconds";
    EXPECT_NE(text.find("\nidem_evicted_total 2\n"), std::string::npos) << text;
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.back(), '\n');
    // Every family opens with "# HELP name text" then "# TYPE name kind", every sample line follows
    // its own TYPE line, and every metric name is unique.
    std::size_t pos = 0, samples = 0;
    std::string last_type, last_help;
    std::set<std::string> names;
    while (pos < text.size()) {
        const auto end = text.find('\n', pos);
        ASSERT_NE(end, std::string::npos);
        const std::string line = text.substr(pos, end - pos);
        pos = end + 1;
        if (line.rfind("# HELP ", 0) == 0) {
            last_help = line.substr(7, line.find(' ', 7) - 7);
            EXPECT_GT(line.size(), 7 + last_help.size() + 1) << "no help text: " << line;
            continue;
        }
        if (line.rfind("# TYPE ", 0) == 0) {
            EXPECT_EQ(line.substr(7, line.find(' ', 7) - 7), last_help) << "a TYPE line without its HELP line: " << line;
            last_type = line.substr(7, line.find(' ', 7) - 7);
            const std::string kind = line.substr(line.rfind(' ') + 1);
            EXPECT_TRUE(kind == "counter" || kind == "gauge") << line;
            EXPECT_TRUE(names.insert(last_type).second) << "duplicate metric " << last_type;
            continue;
        }
        ++samples;
        const std::string name = line.substr(0, line.find(' '));
        EXPECT_EQ(name, last_type) << line;
        EXPECT_EQ(name.rfind("idem_", 0), 0u) << line;
        const std::string value = line.substr(line.find(' ') + 1);
        // An integer, or seconds with nine decimals: digits, at most one '.', digits on both sides.
        const auto dot = value.find('.');
        EXPECT_EQ(value.find_first_not_of("0123456789."), std::string::npos) << line;
        EXPECT_EQ(value.find('.', dot == std::string::npos ? value.size() : dot + 1), std::string::npos) << line;
        EXPECT_TRUE(dot != 0 && (dot == std::string::npos || dot + 10 == value.size())) << line;
    }
    EXPECT_EQ(samples, names.size());
    EXPECT_GE(samples, 20u);
}

/// The sample lines of an exposition as (series, value): the series is the metric name with its
/// label set exactly as printed (two lines with the same series are one series written twice).
/// Checks each line's label syntax on the way: name{k="v",...}, escapes only \\ \" \n, and the
/// whole line well-formed UTF-8 (a scraper rejects the exposition otherwise).
std::vector<std::pair<std::string, std::string>> samples_of(const std::string& text) {
    std::vector<std::pair<std::string, std::string>> out;
    std::size_t pos = 0;
    while (pos < text.size()) {
        const auto end = text.find('\n', pos);
        EXPECT_NE(end, std::string::npos);
        if (end == std::string::npos) break;
        const std::string line = text.substr(pos, end - pos);
        pos = end + 1;
        EXPECT_TRUE(idem::key::is_utf8(line)) << idem::key::printable(line);
        if (line.rfind('#', 0) == 0) continue;
        const auto space = line.rfind(' ');  // a value has no space; a label value may
        EXPECT_NE(space, std::string::npos) << line;
        const std::string series = line.substr(0, space);
        if (const auto brace = series.find('{'); brace != std::string::npos) {
            EXPECT_EQ(series.back(), '}') << line;
            std::size_t i = brace + 1;
            while (i < series.size() - 1) {
                const auto eq = series.find("=\"", i);
                EXPECT_NE(eq, std::string::npos) << line;
                if (eq == std::string::npos) break;
                std::size_t j = eq + 2;
                for (; j < series.size() && series[j] != '"'; ++j) {
                    if (series[j] != '\\') continue;
                    ++j;
                    EXPECT_TRUE(j < series.size() && (series[j] == '\\' || series[j] == '"' || series[j] == 'n'))
                        << "a bad escape in " << line;
                }
                EXPECT_LT(j, series.size()) << "an unterminated label value in " << line;
                i = j + 1;
                if (i < series.size() && series[i] == ',') ++i;
            }
        }
        out.emplace_back(series, line.substr(space + 1));
    }
    return out;
}

/// Every series of the exposition appears once.
void expect_unique_series(const std::string& text) {
    std::map<std::string, int> seen;
    for (const auto& [series, value] : samples_of(text)) ++seen[series];
    for (const auto& [series, n] : seen) EXPECT_EQ(n, 1) << series << " is printed " << n << " times in\n" << text;
}

// Operation names are kept cut at 32 bytes (detail/table/lease_histogram.hpp), so two operations that
// share their first 32 bytes come back as two rows with one name. Their series must still differ:
// a scraper rejects an exposition that repeats a series, and two leases under one label set would
// be indistinguishable.
TEST(Stats, OperationsSharingTheirFirst32BytesGetDistinctSeries) {
    idem::manual_clock clock;
    auto opts = idem_test::test_options(64);
    opts.adaptive.enabled = true;
    opts.adaptive.min_samples = 1;
    opts.adaptive.window = 0;
    idem_test::manual_guard g(opts, clock);
    const std::string prefix(32, 'P');  // what both names show
    const std::string op_a = prefix + "AUTHORIZE", op_b = prefix + "CAPTURE";
    for (const std::string& op : {op_a, op_b}) {
        auto r = g.begin(idem::key::compose("TX1", op, 1));
        ASSERT_EQ(r.status, begin_status::acquired) << op;
        clock.advance(std::chrono::milliseconds(op == op_a ? 5 : 50));
        ASSERT_FALSE(r.ticket.succeed(1));
    }
    g.maintain();
    const auto rows = g.operation_latencies();
    ASSERT_EQ(rows.size(), 2u);
    ASSERT_EQ(rows[0].operation, rows[1].operation) << "the cause: both names are shown cut";
    ASSERT_EQ(rows[0].operation, prefix);

    const std::string text = idem::to_prometheus(g.snapshot(), rows);
    expect_unique_series(text);
    std::set<std::string> lease_series;
    for (const auto& [series, value] : samples_of(text))
        if (series.rfind("idem_operation_lease_seconds{", 0) == 0) lease_series.insert(series);
    EXPECT_EQ(lease_series.size(), 2u) << text;
    // The first keeps the cut name; the quantiles, count and lease of one row share one label set.
    EXPECT_EQ(lease_series.count("idem_operation_lease_seconds{operation=\"" + prefix + "\"}"), 1u) << text;
    for (const std::string& label : {"{operation=\"" + prefix + "\"", "{operation=\"" + prefix + "_2\""}) {
        EXPECT_NE(text.find("idem_operation_latency_seconds" + label + ",quantile=\"0.99\"} "), std::string::npos) << text;
        EXPECT_NE(text.find("idem_operation_latency_seconds_count" + label + "} 1\n"), std::string::npos) << text;
        EXPECT_NE(text.find("idem_operation_lease_seconds" + label + "} "), std::string::npos) << text;
    }
}

// to_prometheus takes any rows: equal names, a name equal to another's disambiguated form, names
// needing every escape of the text format, and bytes that are not UTF-8 (a cut in the middle of a
// character, or a key that is not text) all give an exposition with each series once.
TEST(Stats, OperationLabelsAreEscapedAndUniqueForAnyRows) {
    auto row = [](std::string name, std::uint64_t samples) {
        idem::operation_latency o;
        o.operation = std::move(name);
        o.samples = samples;
        o.p50 = std::chrono::milliseconds(1);
        o.p99 = std::chrono::milliseconds(2);
        o.lease = std::chrono::seconds(1);
        return o;
    };
    const std::string cut_e_acute = std::string(31, 'e') + "\xc3";  // "...é" cut after its first byte
    const std::vector<idem::operation_latency> rows{row("PAY", 3),       row("PAY", 0),        row("PAY_2", 1),
                                                    row("PAY", 2),       row("a\"b\\c\nd", 1), row("a\"b\\c\nd", 1),
                                                    row(cut_e_acute, 1), row("\xff\xfe", 1),   row("", 4)};
    const std::string text = idem::to_prometheus(idem::stats{}, rows);
    expect_unique_series(text);
    std::size_t leases = 0;
    for (const auto& [series, value] : samples_of(text))
        if (series.rfind("idem_operation_lease_seconds{", 0) == 0) ++leases;
    EXPECT_EQ(leases, rows.size()) << "one lease series per row\n" << text;
    // Backslash, double quote and newline are escaped as the text format says.
    EXPECT_NE(text.find("idem_operation_lease_seconds{operation=\"a\\\"b\\\\c\\nd\"} 1.000000000\n"), std::string::npos)
        << text;
    EXPECT_NE(text.find("idem_operation_lease_seconds{operation=\"PAY\"} 1.000000000\n"), std::string::npos) << text;
    EXPECT_NE(text.find("idem_operation_lease_seconds{operation=\"PAY_2\"} 1.000000000\n"), std::string::npos) << text;
    // A byte that is not UTF-8 is shown as the text \xHH (its backslash escaped).
    EXPECT_NE(text.find("{operation=\"" + std::string(31, 'e') + "\\\\xc3\"}"), std::string::npos) << text;
    EXPECT_NE(text.find("{operation=\"\\\\xff\\\\xfe\"}"), std::string::npos) << text;
    EXPECT_NE(text.find("idem_operation_lease_seconds{operation=\"\"} 1.000000000\n"), std::string::npos) << text;
}

// scope::global's exposition: every field of a hand-filled global_stats under its own name with the
// value the test put there, each series once, and no name shared with a process-scope guard's
// exposition, so the two can be served in one scrape.
TEST(Stats, GlobalStatsExpositionCarriesEveryField) {
    idem::global_stats g;
    // Distinct values, none a prefix of another's digits at a line end, so a field printed under
    // the wrong name is caught.
    g.answered_locally = 1001;
    g.claims_sent = 1002;
    g.claims_won = 1003;
    g.claims_lost = 1004;
    g.superseded = 1005;
    g.claim_batches = 1006;
    g.completions = 1007;
    g.stale_completions = 1008;
    g.completion_batches = 1009;
    g.compensated = 1010;
    g.doubt_marks = 1011;
    g.withdrawn = 1012;
    g.commits_in_doubt = 1013;
    g.store_errors = 1014;
    g.timeouts = 1015;
    g.pruned_records = 1016;
    g.pruned_audit_rows = 1017;
    g.local.acquired = 2001;
    g.local.duplicates = 2002;
    g.local.superseded = 2003;  // a name global_stats has too: must stay a series of its own
    g.local.compensated = 2004;
    g.local.store_errors = 2005;
    g.local.max_probe = 2006;
    g.local.flush_lag_ns = 3'000'000'007;

    const std::map<std::string, std::string> expected = {
        {"idem_global_answered_locally_total", "1001"},   {"idem_global_claims_sent_total", "1002"},
        {"idem_global_claims_won_total", "1003"},         {"idem_global_claims_lost_total", "1004"},
        {"idem_global_superseded_total", "1005"},         {"idem_global_claim_batches_total", "1006"},
        {"idem_global_completions_total", "1007"},        {"idem_global_stale_completions_total", "1008"},
        {"idem_global_completion_batches_total", "1009"}, {"idem_global_compensated_total", "1010"},
        {"idem_global_doubt_marks_total", "1011"},        {"idem_global_withdrawn_total", "1012"},
        {"idem_global_commits_in_doubt_total", "1013"},   {"idem_global_store_errors_total", "1014"},
        {"idem_global_timeouts_total", "1015"},           {"idem_global_pruned_records_total", "1016"},
        {"idem_global_pruned_audit_rows_total", "1017"},  {"idem_global_local_acquired_total", "2001"},
        {"idem_global_local_duplicates_total", "2002"},   {"idem_global_local_superseded_total", "2003"},
        {"idem_global_local_compensated_total", "2004"},  {"idem_global_local_store_errors_total", "2005"},
        {"idem_global_local_max_probe", "2006"},          {"idem_global_local_flush_lag_seconds", "3.000000007"},
        {"idem_global_local_succeeded_total", "0"},
    };
    const std::string text = idem::to_prometheus(g);
    expect_unique_series(text);
    std::map<std::string, std::string> got;
    for (const auto& [series, value] : samples_of(text)) got[series] = value;
    for (const auto& [name, value] : expected) {
        const auto it = got.find(name);
        ASSERT_NE(it, got.end()) << name << " is missing from\n" << text;
        EXPECT_EQ(it->second, value) << name;
        // Its TYPE line: counters end in _total, the rest are gauges.
        const bool counter = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
        EXPECT_NE(text.find("# TYPE " + name + (counter ? " counter\n" : " gauge\n")), std::string::npos) << name;
    }
    // Every global_stats field (17) and every stats field of the local table (as in to_prometheus(stats)).
    const std::size_t local_series = samples_of(idem::to_prometheus(idem::stats{})).size();
    EXPECT_EQ(got.size(), 17 + local_series) << text;
    for (const auto& [series, value] : got) EXPECT_EQ(series.rfind("idem_global_", 0), 0u) << series;

    // Served beside a process-scope guard's exposition: still one TYPE line per metric, one series each.
    const std::string both = idem::to_prometheus(idem::stats{}) + text;
    expect_unique_series(both);
    std::set<std::string> types;
    for (std::size_t pos = both.find("# TYPE "); pos != std::string::npos; pos = both.find("# TYPE ", pos + 1)) {
        const std::string name = both.substr(pos + 7, both.find(' ', pos + 7) - pos - 7);
        EXPECT_TRUE(types.insert(name).second) << "two TYPE lines for " << name;
    }
}

}  // namespace
