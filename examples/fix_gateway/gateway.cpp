// gateway.cpp: a FIX 4.4 order gateway that accepts each NewOrderSingle once, with idem.
//
//   fix_gateway --port 9878 --db gateway.db --fix-store fix-store/ [--metrics-port 9879]
//
// The order's idempotency key is (SenderCompID, ClOrdID); its fingerprint is (symbol, side,
// quantity, price, order type), so a ClOrdID reused for another order is told apart from a resend
// of the same one. The gateway assigns each accepted order an OrderID (order_ids) and records it
// as the claim's outcome, so a resend is answered with the original OrderID. The store is SQLite in
// sync mode: begin() and succeed() return after their commit, so every order acknowledged before a
// crash is in the store.
// With --metrics-port, a cpp-httplib server on its own thread answers GET /metrics: the guard's
// series (idem::to_prometheus) and the gateway's own, fix_gateway_* (gateway_metrics).
// README.md explains each answer against the FIX 4.4 specification.
#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>

#include <httplib.h>

#include <idem/durable.hpp>
#include <idem/stores/sqlite_store.hpp>

#include "fix_acceptor.hpp"

namespace {

volatile std::sig_atomic_t stop_requested = 0;
extern "C" void on_signal(int) { stop_requested = 1; }

/// "<len(sender)>:<sender><clordid>": the length prefix makes the composition injective whatever
/// bytes either part holds (idem::key::compose reserves '_', which ClOrdIDs commonly contain).
/// Empty when the pair cannot be a key; *why then says why (a key is 1..128 bytes with no control
/// byte: key.hpp).
std::optional<idem::key> order_key(const fixgw::new_order& o, std::string* why) {
    std::string text = std::to_string(o.sender.size());
    text.append(":").append(o.sender).append(o.clordid);
    return idem::key::parse(text, why);
}

std::uint64_t order_fingerprint(const fixgw::new_order& o) {
    std::string p;
    for (const std::string* f : {&o.symbol, &o.side, &o.quantity, &o.price, &o.ord_type}) p.append(*f).push_back('\x01');
    return idem::fingerprint_of(p);
}

fixgw::order_answer reject(int reason, std::string text) {
    fixgw::order_answer a;
    a.kind = fixgw::answer_kind::rejected;
    a.rej_reason = reason;
    a.text = std::move(text);
    return a;
}

/// OrderIDs: this process's start time in milliseconds in the high 44 bits, a counter in the low
/// 20, so IDs stay distinct across restarts (a restart takes longer than a millisecond) as long as
/// one process accepts fewer than 2^20 orders. (The claim's fence is no OrderID: fences are per key.)
class order_ids {
public:
    order_ids()
        : base_(static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                               std::chrono::system_clock::now().time_since_epoch())
                                               .count())
                << 20) {}
    /// 0 once the counter is spent.
    std::uint64_t next() noexcept { return next_ < (1u << 20) ? base_ | next_++ : 0; }

private:
    std::uint64_t base_;
    std::uint64_t next_ = 1;  // the session thread is the only caller
};

/// The gateway's own counters, served by GET /metrics after the guard's. Relaxed atomics: each is
/// a tally a scrape reads, ordering nothing else. Counted on the session thread before the answer is
/// returned, so a client that has an order's ExecutionReport finds the order counted.
struct gateway_metrics {
    std::atomic<std::uint64_t> orders{0};      ///< NewOrderSingle messages handed to the gateway
    std::atomic<std::uint64_t> duplicates{0};  ///< answered from the key's record, not executed: Order Status
                                               ///< (resend) or Duplicate Order reject (reused ClOrdID)
    std::atomic<std::uint64_t> executions{0};  ///< orders executed: claimed and their OrderID recorded (New)

    static void add(std::atomic<std::uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }

    /// The Prometheus text exposition (format 0.0.4) of these counters, prefixed fix_gateway_.
    std::string exposition() const {
        std::string out;
        auto put = [&](const char* name, const char* help, const std::atomic<std::uint64_t>& c) {
            out.append("# HELP fix_gateway_").append(name).append(" ").append(help).append("\n");
            out.append("# TYPE fix_gateway_").append(name).append(" counter\n");
            out.append("fix_gateway_").append(name).append(" ").append(std::to_string(c.load(std::memory_order_relaxed)));
            out.append("\n");
        };
        put("orders_total", "NewOrderSingle (35=D) messages received by the gateway's application.", orders);
        put("duplicates_total",
            "Orders whose ClOrdID was accepted before, answered without executing (Order Status for a resend, "
            "Duplicate Order reject for a reuse).",
            duplicates);
        put("executions_total", "Orders executed: accepted with a new OrderID (ExecType New).", executions);
        return out;
    }
};

/// GET /metrics on its own thread, from construction to destruction (which stops it).
class metrics_server {
public:
    metrics_server(const std::string& host, int port, idem::durable_guard& g, const gateway_metrics& m) {
        svr_.new_task_queue = [] { return new httplib::ThreadPool(2); };  // a scraper or two, not a crowd
        svr_.Get("/metrics", [&g, &m](const httplib::Request&, httplib::Response& res) {
            std::string text = idem::to_prometheus(g.snapshot(), g.guard().operation_latencies());
            text += m.exposition();
            res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
        });
        port_ = port == 0 ? svr_.bind_to_any_port(host) : (svr_.bind_to_port(host, port) ? port : -1);
        if (port_ <= 0)
            throw std::runtime_error("--metrics-host/--metrics-port: cannot listen on " + host + ":" + std::to_string(port));
        thread_ = std::thread([this] {
            svr_.listen_after_bind();
            exited_.store(true);
        });
        // httplib's stop() does nothing until listen_after_bind() has marked the server running, so
        // a stop issued before that would be lost and the join would hang: wait for it here.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!svr_.is_running() && !exited_.load() && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (exited_.load()) {  // listen_after_bind() failed
            thread_.join();
            throw std::runtime_error("the metrics server on " + host + ":" + std::to_string(port_) + " stopped at once");
        }
        if (!svr_.is_running()) {  // a thread that has not run for 10 s, which could not be stopped: give up
            std::fprintf(stderr, "fix_gateway: the metrics server thread did not start in 10 s\n");
            std::_Exit(1);
        }
    }
    ~metrics_server() {
        svr_.stop();
        thread_.join();
    }
    metrics_server(const metrics_server&) = delete;
    metrics_server& operator=(const metrics_server&) = delete;
    int port() const { return port_; }

private:
    httplib::Server svr_;
    std::thread thread_;
    std::atomic<bool> exited_{false};
    int port_ = -1;
};

/// A TCP port number: all of the text is decimal digits, and the value fits in [min, 65535].
std::optional<int> parse_port(std::string_view text, int min) {
    int v = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < min || v > 65535) return std::nullopt;
    return v;
}

fixgw::order_answer on_order(idem::durable_guard& g, order_ids& ids, gateway_metrics& m, const fixgw::new_order& o) {
    gateway_metrics::add(m.orders);
    std::string why;
    const auto k = order_key(o, &why);
    if (!k) return reject(99, "ClOrdID '" + o.clordid + "' cannot be deduplicated: " + why);
    // begin_wait: a claim left in flight by a crash answers in_progress until its lease expires
    // and the resolver releases it (not_executed: no report was sent for it); then it is claimed.
    auto r = g->begin_wait(*k, order_fingerprint(o), std::chrono::seconds(10));
    switch (r.status) {
        case idem::begin_status::acquired: {
            const std::uint64_t order_id = ids.next();
            if (order_id == 0) return reject(99, "order " + o.clordid + " not accepted: restart the gateway");
            if (auto ec = r.ticket.succeed(order_id))
                return reject(99, "order " + o.clordid + " not recorded (" + ec.message() + "); resend it");
            gateway_metrics::add(m.executions);
            fixgw::order_answer a;
            a.kind = fixgw::answer_kind::accepted;
            a.order_id = std::to_string(order_id);
            return a;
        }
        case idem::begin_status::succeeded: {
            gateway_metrics::add(m.duplicates);
            if (!o.poss_dup &&
                !o.poss_resend)  // a new order reusing a ClOrdID (FIX 4.4 Vol 6, ClOrdID (11): unique per day)
                return reject(6, "Duplicate ClOrdID " + o.clordid + ": already accepted as OrderID " +
                                     std::to_string(r.outcome));
            fixgw::order_answer a;
            a.kind = fixgw::answer_kind::status;
            a.order_id = std::to_string(r.outcome);
            a.text = "possible resend of ClOrdID " + o.clordid;
            return a;
        }
        case idem::begin_status::payload_mismatch:
            gateway_metrics::add(m.duplicates);
            return reject(6, "Duplicate ClOrdID " + o.clordid + ": used before for a different order");
        default: {
            std::string s = idem::to_string(r.status);
            return reject(99, "order " + o.clordid + " not accepted now (" + s + "); resend it with PossResend=Y");
        }
    }
}

int usage() {
    std::fprintf(stderr,
                 "usage: fix_gateway --port N --db PATH --fix-store DIR [--sender ID] [--target ID]\n"
                 "                   [--metrics-port N (0: any free port)] [--metrics-host ADDR (127.0.0.1)]\n");
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    fixgw::acceptor_config cfg;
    cfg.sender_comp_id = "GATEWAY";
    cfg.target_comp_id = "CLIENT";
    std::string db;
    std::optional<int> metrics_port;  // none: no metrics server
    std::string metrics_host = "127.0.0.1";
    for (int i = 1; i < argc; i += 2) {
        const std::string_view a = argv[i];
        if (i + 1 == argc) {
            std::fprintf(stderr, "fix_gateway: %s needs a value\n", argv[i]);
            return usage();
        }
        if (a == "--port") cfg.port = std::atoi(argv[i + 1]);
        else if (a == "--metrics-port") {
            metrics_port = parse_port(argv[i + 1], 0);
            if (!metrics_port) {
                std::fprintf(stderr,
                             "fix_gateway: --metrics-port '%s' is not a port number (0 to 65535; 0 picks a free one)\n",
                             argv[i + 1]);
                return 2;
            }
        } else if (a == "--metrics-host") {
            metrics_host = argv[i + 1];
            if (metrics_host.empty()) {
                std::fprintf(stderr, "fix_gateway: --metrics-host is empty\n");
                return 2;
            }
        } else if (a == "--db") db = argv[i + 1];
        else if (a == "--fix-store") cfg.store_dir = argv[i + 1];
        else if (a == "--sender") cfg.sender_comp_id = argv[i + 1];
        else if (a == "--target") cfg.target_comp_id = argv[i + 1];
        else return usage();
    }
    if (cfg.port <= 0 || db.empty() || cfg.store_dir.empty()) return usage();
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    try {
        idem::options opts;
        opts.capacity = 1 << 16;
        opts.lease = std::chrono::seconds(5);  // far above one commit, even on a loaded host
        opts.maintenance_interval = std::chrono::milliseconds(200);
        // A claim whose lease expired was never completed, so no ExecutionReport carried its
        // OrderID (the report is sent after succeed() commits): release it for the resend.
        opts.resolve = [](const idem::expired_claim&) { return idem::resolver_answer{idem::resolution::not_executed, 0}; };
        idem::store_options so;
        so.mode = idem::durability::sync;
        // synchronous=NORMAL: a commit survives a process crash (the SIGKILL of the test), not a
        // power loss; use the default full_sync=true where the host may lose power.
        idem::durable_guard g(std::make_unique<idem::sqlite_store>(db, /*full_sync=*/false), opts, so);
        order_ids ids;
        gateway_metrics metrics;
        std::optional<metrics_server> scrape;  // destroyed (stopped) before the guard it reads
        if (metrics_port) {
            scrape.emplace(metrics_host, *metrics_port, g, metrics);
            std::printf("fix_gateway: metrics listening on %s:%d\n", metrics_host.c_str(), scrape->port());
        }
        std::printf("fix_gateway: port %d, %zu records recovered from %s\n", cfg.port, g.recovery().records, db.c_str());
        std::fflush(stdout);
        fixgw::run_acceptor(
            cfg, [&g, &ids, &metrics](const fixgw::new_order& o) { return on_order(g, ids, metrics, o); },
            [] { return stop_requested != 0; });
        scrape.reset();
        g.flush();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fix_gateway: %s\n", e.what());
        return 1;
    }
    return 0;
}
