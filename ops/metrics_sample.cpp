// idem-metrics-sample: prints the Prometheus exposition of a durable SQLite guard that has seen
// claims, successes, a terminal failure, a duplicate, an in-progress hit and a payload mismatch,
// with per-operation latencies (options.adaptive). ctest `ops_metrics_check` lints the output with
// `promtool check metrics`, so a name, type or label the library exports that a Prometheus
// scraper would flag fails the build (ops/CMakeLists.txt).
//
//   idem-metrics-sample            # the exposition on stdout; exit 1 when an answer was unexpected
#include <idem/durable.hpp>
#include <idem/idem.hpp>
#include <idem/stores/sqlite_store.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

namespace {

/// A fresh directory under $TMPDIR (or /tmp), removed at exit.
class temp_dir {
public:
    temp_dir() {
        const char* base = std::getenv("TMPDIR");
        std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/idem-metrics.XXXXXX";
        if (::mkdtemp(pattern.data()) == nullptr) {
            std::fprintf(stderr, "idem-metrics-sample: mkdtemp(%s): %s\n", pattern.c_str(), std::strerror(errno));
            std::exit(1);
        }
        path_ = pattern;
    }
    ~temp_dir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    temp_dir(const temp_dir&) = delete;
    temp_dir& operator=(const temp_dir&) = delete;
    [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

private:
    std::filesystem::path path_;
};

int failures = 0;

void expect(bool ok, const char* what) {
    if (!ok) {
        std::fprintf(stderr, "idem-metrics-sample: unexpected: %s\n", what);
        ++failures;
    }
}

}  // namespace

int main() {
    try {
        temp_dir dir;
        idem::options o;
        o.capacity = 1024;
        o.adaptive.enabled = true;  // per-operation latencies: idem_operation_latency_seconds, _lease_seconds
        idem::store_options so;
        so.mode = idem::durability::sync;
        idem::durable_guard g(std::make_unique<idem::sqlite_store>((dir.path() / "metrics.db").string()), o, so);

        // Claims and successes over two operations.
        for (int i = 0; i < 20; ++i) {
            auto r = g->begin(idem::key::compose("TX" + std::to_string(i), i % 2 == 0 ? "PAY" : "REFUND", 1));
            expect(r.status == idem::begin_status::acquired, "a fresh key is acquired");
            if (r.status == idem::begin_status::acquired)
                expect(!r.ticket.succeed(static_cast<std::uint64_t>(i)), "succeed() commits");
        }
        // A duplicate of a completed key: answered with its outcome, not run again.
        auto dup = g->begin(idem::key::compose("TX0", "PAY", 1));
        expect(dup.status == idem::begin_status::succeeded, "a duplicate answers succeeded");

        // A terminal failure.
        auto f = g->begin(idem::key::compose("TXF", "PAY", 1));
        expect(f.status == idem::begin_status::acquired, "the failing key is acquired");
        if (f.status == idem::begin_status::acquired)
            expect(!f.ticket.fail(7, idem::failure_policy::terminal), "fail() commits");

        // Refused: a key someone holds (in_progress), and the same key with another payload.
        auto held = g->begin(idem::key::compose("TXH", "PAY", 1), 11);
        expect(held.status == idem::begin_status::acquired, "the held key is acquired");
        auto busy = g->begin(idem::key::compose("TXH", "PAY", 1), 11);
        expect(busy.status == idem::begin_status::in_progress, "a held key answers in_progress");
        if (held.status == idem::begin_status::acquired) expect(!held.ticket.succeed(1), "the held key succeeds");
        auto other = g->begin(idem::key::compose("TXH", "PAY", 1), 12);
        expect(other.status == idem::begin_status::payload_mismatch, "another payload answers payload_mismatch");

        expect(g.flush(), "the flusher drains");
        const idem::stats s = g.snapshot();
        expect(s.acquired == 22 && s.duplicates == 1 && s.in_progress_hits == 1 && s.payload_mismatches == 1,
               "the counters match the requests");
        expect(s.succeeded == 21 && s.failed == 1, "the completions are counted");
        std::cout << idem::to_prometheus(g);  // what a service serves: counters, latencies, recovery
    } catch (const std::exception& e) {
        std::fprintf(stderr, "idem-metrics-sample: %s\n", e.what());
        return 1;
    }
    return failures == 0 ? 0 : 1;
}
