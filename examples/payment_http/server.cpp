// server.cpp: a payment API that charges each Idempotency-Key once, with idem.
//
//   payment_server --port 8080 --db payments.db                    # SQLite, sync mode
//   payment_server --port 8080 --pg postgresql://idem@127.0.0.1/idem --mode async
//   payment_server --port 8080 --db payments.db --processor http://127.0.0.1:9090
//
// POST /payments with a JSON body {"amount": 1250, "currency": "EUR", "card": "4242..."} and an
// Idempotency-Key header charges the card once per key, and answers every request with that key
// the way the IETF draft "The Idempotency-Key HTTP Header Field" says (README.md has the table):
// 400 without a key, 422 for a key reused with another body, 409 while the first request is still
// being processed, and after completion the first response again, byte for byte, with
// `Idempotent-Replayed: true`.
//
// The response (status code and body) is stored by idem with the claim's completion, in the same
// row of the same commit (the completion's payload), so there is no second table to keep in step.
// In sync mode (the default) succeed() returns after that commit, so a response the client may
// have seen is always in the store; a crash before the commit leaves the claim in flight, and the
// resolver asks the processor what happened (resolve_with_processor) before the key is decided.
#include <atomic>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <idem/durable.hpp>
#include <idem/postgres_store.hpp>
#include <idem/sqlite_store.hpp>

#include "idempotency_key.hpp"

namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// The payment processor: the side effect that must happen once. Either a remote service (the
// test's ledger, a real PSP) or, for the demo and the benchmark, a counter in this process.

struct charge_result {
    enum class kind { charged, declined, unknown } result = kind::unknown;
    std::uint64_t charge_id = 0;  ///< charged: the processor's id
    std::string reason;           ///< declined: why; unknown: what went wrong
};

class processor {
public:
    virtual ~processor() = default;
    /// Charges once for this attempt: the claim's fence names the attempt, so the processor can
    /// refuse an attempt the resolver has voided (void_attempt).
    virtual charge_result charge(const std::string& key, std::uint64_t attempt, std::int64_t amount,
                                 const std::string& currency) = 0;
    /// The resolver's question about an attempt whose claim expired: charged (its charge), or
    /// declined, in which case the processor has voided the attempt: a charge request of it that is
    /// still on its way is refused, so the key can be released without risking a second charge.
    virtual charge_result void_attempt(const std::string& key, std::uint64_t attempt) = 0;
};

/// Charges nothing real: ids from a counter. Declines amounts above 1,000,000 (a card limit), so
/// the stored-decline path can be tried without a remote processor.
class local_processor final : public processor {
public:
    charge_result charge(const std::string&, std::uint64_t, std::int64_t amount, const std::string&) override {
        if (amount > 1'000'000) return {charge_result::kind::declined, 0, "amount above the card limit"};
        return {charge_result::kind::charged, next_.fetch_add(1, std::memory_order_relaxed), {}};
    }
    charge_result void_attempt(const std::string&, std::uint64_t) override {
        return {charge_result::kind::unknown, 0, "no remote processor"};
    }

private:
    std::atomic<std::uint64_t> next_{1};
};

/// A processor behind HTTP: POST /charges {"idempotency_key", "attempt", "amount", "currency"}
/// answers 200 {"charge_id": N}, 402 {"reason": "..."} (declined), or 409 (the attempt was voided);
/// POST /charges/void {"idempotency_key", "attempt"} answers 200 {"charge_id": N} when the attempt
/// charged, else voids it and answers 404.
class remote_processor final : public processor {
public:
    explicit remote_processor(const std::string& url) : url_(url) {}

    charge_result charge(const std::string& key, std::uint64_t attempt, std::int64_t amount,
                         const std::string& currency) override {
        httplib::Client cli(url_);
        cli.set_tcp_nodelay(true);
        const json body = {{"idempotency_key", key}, {"attempt", attempt}, {"amount", amount}, {"currency", currency}};
        auto res = cli.Post("/charges", body.dump(), "application/json");
        if (!res) return {charge_result::kind::unknown, 0, "processor unreachable: " + httplib::to_string(res.error())};
        return parse(res->status, res->body);
    }

    charge_result void_attempt(const std::string& key, std::uint64_t attempt) override {
        httplib::Client cli(url_);
        cli.set_tcp_nodelay(true);
        const json body = {{"idempotency_key", key}, {"attempt", attempt}};
        auto res = cli.Post("/charges/void", body.dump(), "application/json");
        if (!res) return {charge_result::kind::unknown, 0, "processor unreachable: " + httplib::to_string(res.error())};
        if (res->status == 404) return {charge_result::kind::declined, 0, "no charge for this attempt; voided"};
        return parse(res->status, res->body);
    }

private:
    static charge_result parse(int status, const std::string& body) {
        const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
        if (status == 200 && j.is_object() && j.contains("charge_id") && j["charge_id"].is_number_unsigned())
            return {charge_result::kind::charged, j["charge_id"].get<std::uint64_t>(), {}};
        if (status == 402 && j.is_object())
            return {charge_result::kind::declined, 0, j.value("reason", std::string("declined"))};
        return {charge_result::kind::unknown, 0, "processor answered " + std::to_string(status)};
    }

    std::string url_;
};

// ---------------------------------------------------------------------------------------------
// The stored response: three ASCII digits of status code, then the JSON body. It is what idem
// keeps with the completion and replays to every duplicate, so a duplicate's bytes cannot differ
// from the first response's.

std::string encode_response(int status, const std::string& body) { return std::to_string(status) + body; }

struct response {
    int status = 500;
    std::string body;
};

std::optional<response> decode_response(std::string_view stored) {
    int status = 0;
    if (stored.size() < 3 || std::from_chars(stored.data(), stored.data() + 3, status).ptr != stored.data() + 3)
        return std::nullopt;
    return response{status, std::string(stored.substr(3))};
}

/// A problem detail (RFC 9457), as the draft's examples answer errors.
void problem(httplib::Response& res, int status, const std::string& title, const std::string& detail) {
    res.status = status;
    res.set_content(json{{"type", "about:blank"}, {"title", title}, {"status", status}, {"detail", detail}}.dump(),
                    "application/problem+json");
}

void send_stored(httplib::Response& res, const response& r, bool replayed) {
    res.status = r.status;
    res.set_content(r.body, "application/json");
    if (replayed) res.set_header("Idempotent-Replayed", "true");
}

/// The body of a payment's response. A charge's body names its charge, so a replay can be checked
/// against the processor's ledger.
std::string payment_body(const std::string& key, std::int64_t amount, const std::string& currency,
                         const charge_result& c) {
    json j = {{"idempotency_key", key}, {"amount", amount}, {"currency", currency}};
    if (c.result == charge_result::kind::charged) {
        j["status"] = "succeeded";
        j["charge_id"] = c.charge_id;
    } else {
        j["status"] = "declined";
        j["reason"] = c.reason;
    }
    return j.dump();
}

struct config {
    int port = 0;
    std::string db;
    std::string pg;
    idem::durability mode = idem::durability::sync;
    std::chrono::milliseconds wait{0};   // wait this long for an in-flight first request before 409
    std::chrono::milliseconds lease{10'000};
    std::string processor_url;
    bool use_idem = true;                // --no-idem: the same handler without idem (the benchmark's baseline)
    bool test_hooks = false;             // honour X-Test-Crash (the crash tests)
    unsigned threads = 16;
};

/// --test-hooks only: SIGKILL this process at the named point of the request, so a test can
/// crash it between the charge, its record and the response.
void crash_point(const config& cfg, const httplib::Request& req, std::string_view point) {
    if (cfg.test_hooks && req.get_header_value("X-Test-Crash") == point) std::raise(SIGKILL);
}

struct payment_request {
    std::int64_t amount = 0;
    std::string currency;
};

/// The body's fields, or a 400 naming the one at fault. Validation runs before the key is claimed:
/// a request the API refuses is not an operation, so it is not recorded (as Stripe does).
std::optional<payment_request> parse_payment(const std::string& body, httplib::Response& res) {
    const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
        problem(res, 400, "Invalid request", "the body must be a JSON object");
        return std::nullopt;
    }
    payment_request p;
    if (!j.contains("amount") || !j["amount"].is_number_integer() || j["amount"].get<std::int64_t>() <= 0) {
        problem(res, 400, "Invalid request", "\"amount\" must be a positive integer (minor units)");
        return std::nullopt;
    }
    p.amount = j["amount"].get<std::int64_t>();
    if (!j.contains("currency") || !j["currency"].is_string() || j["currency"].get<std::string>().size() != 3) {
        problem(res, 400, "Invalid request", "\"currency\" must be a three-letter ISO 4217 code");
        return std::nullopt;
    }
    p.currency = j["currency"].get<std::string>();
    return p;
}

class payment_api {
public:
    payment_api(const config& cfg, processor& proc, idem::durable_guard* g) : cfg_(cfg), proc_(proc), g_(g) {}

    void post(const httplib::Request& req, httplib::Response& res) {
        if (!req.has_header("Idempotency-Key"))
            return problem(res, 400, "Idempotency-Key is missing",
                           "POST /payments requires an Idempotency-Key header (a Structured Field String)");
        std::string why;
        const auto text = payment::parse_idempotency_key(req.get_header_value("Idempotency-Key"), &why);
        if (!text) return problem(res, 400, "Invalid Idempotency-Key", "the Idempotency-Key header " + why);
        const auto p = parse_payment(req.body, res);
        if (!p) return;
        if (!cfg_.use_idem) {  // the benchmark's baseline: the same work, no deduplication
            const charge_result c = proc_.charge(*text, 0, p->amount, p->currency);
            return send_stored(res, *decode_response(respond(*text, *p, c)), false);
        }
        const auto k = idem::key::parse(*text, &why);
        if (!k) return problem(res, 400, "Invalid Idempotency-Key", why);
        // The request fingerprint: the draft's "same key, different payload" is the same key with
        // another method, path or body.
        const std::uint64_t fp = idem::fingerprint_of(req.method + ' ' + req.path + '\n' + req.body);
        auto r = cfg_.wait.count() > 0 ? (*g_)->begin_wait(*k, fp, cfg_.wait) : (*g_)->begin(*k, fp);
        switch (r.status) {
            case idem::begin_status::acquired: break;
            case idem::begin_status::succeeded: return replay(res, *text, *p, r.outcome, r.payload);
            case idem::begin_status::failed:  // a declined payment: its 402 is stored with the failure
                if (const auto stored = decode_response(r.payload)) return send_stored(res, *stored, true);
                return problem(res, 500, "Stored response unreadable", "the failed payment has no stored response");
            case idem::begin_status::in_progress:
            case idem::begin_status::in_doubt:
                res.set_header("Retry-After", "1");
                return problem(res, 409, "Request in progress",
                               "a request with this Idempotency-Key is still being processed; retry later");
            case idem::begin_status::payload_mismatch:
                return problem(res, 422, "Idempotency-Key reused",
                               "this Idempotency-Key was used with a different request payload");
            case idem::begin_status::invalid_key:
                return problem(res, 400, "Invalid Idempotency-Key", "the store cannot hold this key");
            default:  // backpressure, store_unavailable, capacity_exhausted: nothing was done
                res.set_header("Retry-After", "1");
                return problem(res, 503, "Try again", std::string("not processed now (") + idem::to_string(r.status) + ")");
        }
        crash_point(cfg_, req, "before-charge");
        const charge_result c = proc_.charge(*text, r.ticket.fence(), p->amount, p->currency);
        if (c.result == charge_result::kind::unknown) {
            // The charge may or may not have happened (or the resolver voided this attempt after
            // its lease ran out): releasing the key could charge twice. Leave the claim to its
            // lease; the resolver asks the processor.
            r.ticket.abandon();
            res.set_header("Retry-After", "1");
            return problem(res, 503, "Payment outcome unknown", c.reason + "; retry with the same Idempotency-Key");
        }
        crash_point(cfg_, req, "after-charge");
        const std::string stored = respond(*text, *p, c);
        // The response is recorded with the completion, in one commit (sync mode: durable when
        // succeed() returns): a charge as a success, a decline as a terminal failure with its 402
        // (the processor voided the attempt: a retry must get the decline, not charge). Retried
        // while the queue is full: the decision was made, so only a recorded one may answer.
        const bool charged = c.result == charge_result::kind::charged;
        const auto record = [&] {
            return charged ? r.ticket.succeed(c.charge_id, stored)
                           : r.ticket.fail(402, idem::failure_policy::terminal, stored);
        };
        std::error_code ec = record();
        for (int i = 0; i < 1000 && (ec == idem::errc::backpressure || ec == idem::errc::busy); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            ec = record();
        }
        if (ec) {
            // The charge happened but its record is not confirmed: a retry is answered from the
            // store once it commits, or after the resolver asked the processor. Never charged again.
            res.set_header("Retry-After", "1");
            return problem(res, 503, "Payment recorded late", ec.message() + "; retry with the same Idempotency-Key");
        }
        crash_point(cfg_, req, "after-record");
        send_stored(res, *decode_response(stored), false);
    }

private:
    static std::string respond(const std::string& key, const payment_request& p, const charge_result& c) {
        return encode_response(c.result == charge_result::kind::charged ? 201 : 402,
                               payment_body(key, p.amount, p.currency, c));
    }

    /// A duplicate of a completed payment: its stored response. A record without one was decided
    /// by the resolver after a crash (the processor had charged): its response is rebuilt from the
    /// charge the record names, since the first one was never sent.
    void replay(httplib::Response& res, const std::string& key, const payment_request& p, std::uint64_t outcome,
                const std::string& stored) {
        if (!stored.empty()) {
            if (const auto r = decode_response(stored)) return send_stored(res, *r, true);
            return problem(res, 500, "Stored response unreadable", "the stored response has no status code");
        }
        send_stored(res, *decode_response(respond(key, p, {charge_result::kind::charged, outcome, {}})), true);
    }

    const config& cfg_;
    processor& proc_;
    idem::durable_guard* g_;
};

int usage() {
    std::fprintf(stderr,
                 "usage: payment_server --port N (--db PATH | --pg URI) [--mode sync|async] [--wait-ms N]\n"
                 "                      [--lease-ms N] [--processor URL] [--threads N] [--no-idem] [--test-hooks]\n");
    return 2;
}

std::optional<config> parse_args(int argc, char** argv) {
    config c;
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
        const char* v = nullptr;
        if (a == "--no-idem") c.use_idem = false;
        else if (a == "--test-hooks") c.test_hooks = true;
        else if ((v = value()) == nullptr) return std::nullopt;
        else if (a == "--port") c.port = std::atoi(v);
        else if (a == "--db") c.db = v;
        else if (a == "--pg") c.pg = v;
        else if (a == "--mode" && std::string_view(v) == "sync") c.mode = idem::durability::sync;
        else if (a == "--mode" && std::string_view(v) == "async") c.mode = idem::durability::async;
        else if (a == "--wait-ms") c.wait = std::chrono::milliseconds(std::atoi(v));
        else if (a == "--lease-ms") c.lease = std::chrono::milliseconds(std::atoi(v));
        else if (a == "--processor") c.processor_url = v;
        else if (a == "--threads") c.threads = static_cast<unsigned>(std::atoi(v));
        else return std::nullopt;
    }
    if (c.port < 0 || c.threads == 0 || c.lease.count() <= 0 || (c.use_idem && c.db.empty() == c.pg.empty()))
        return std::nullopt;
    return c;
}

httplib::Server* running = nullptr;
extern "C" void on_signal(int) {
    if (running != nullptr) running->stop();  // stop() only sets flags and shuts the listening socket
}

}  // namespace

int main(int argc, char** argv) {
    const auto cfg = parse_args(argc, argv);
    if (!cfg) return usage();
    try {
        std::unique_ptr<processor> proc;
        if (cfg->processor_url.empty()) proc = std::make_unique<local_processor>();
        else proc = std::make_unique<remote_processor>(cfg->processor_url);

        std::unique_ptr<idem::durable_guard> g;
        if (cfg->use_idem) {
            idem::options opts;
            opts.lease = cfg->lease;
            opts.maintenance_interval = std::chrono::milliseconds(200);
            // An expired claim is a request that crashed (or stalled past its lease) between its
            // claim and its recorded response. The processor knows whether that attempt (the
            // claim's fence) charged: record that charge (duplicates then get a response rebuilt
            // from it), or, once the processor has voided the attempt so that a charge request of
            // it still on its way is refused, release the key so a retry charges once.
            opts.resolve = [p = proc.get()](const idem::expired_claim& c) {
                const charge_result r = p->void_attempt(std::string(c.key), c.fence);
                switch (r.result) {
                    case charge_result::kind::charged: return idem::resolver_answer{idem::resolution::succeeded, r.charge_id};
                    case charge_result::kind::declined: return idem::resolver_answer{idem::resolution::not_executed, 0};
                    case charge_result::kind::unknown: break;
                }
                return idem::resolver_answer{idem::resolution::unknown, 0};
            };
            idem::store_options so;
            so.mode = cfg->mode;
            std::unique_ptr<idem::store> st;
            if (!cfg->pg.empty()) st = std::make_unique<idem::postgres_store>(cfg->pg);
            else st = std::make_unique<idem::sqlite_store>(cfg->db, /*full_sync=*/false);
            g = std::make_unique<idem::durable_guard>(std::move(st), opts, so);
        }
        payment_api api(*cfg, *proc, g.get());
        httplib::Server svr;
        svr.new_task_queue = [n = cfg->threads] { return new httplib::ThreadPool(n); };
        // Headers and body leave in separate writes: with Nagle's algorithm on, the body waits for
        // the client's delayed ACK (40 ms on Linux), and every response takes that long.
        svr.set_tcp_nodelay(true);
        svr.Post("/payments", [&api](const httplib::Request& req, httplib::Response& res) { api.post(req, res); });
        const int port = cfg->port == 0 ? svr.bind_to_any_port("127.0.0.1") : (svr.bind_to_port("127.0.0.1", cfg->port) ? cfg->port : -1);
        if (port < 0) throw std::runtime_error("cannot listen on 127.0.0.1:" + std::to_string(cfg->port));
        running = &svr;
        std::signal(SIGINT, on_signal);
        std::signal(SIGTERM, on_signal);
        std::printf("payment_server: listening on 127.0.0.1:%d (%s)\n", port,
                    !cfg->use_idem ? "no idem" : !cfg->pg.empty() ? "postgresql" : "sqlite");
        std::fflush(stdout);
        svr.listen_after_bind();
        running = nullptr;
        if (g) g->flush();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "payment_server: %s\n", e.what());
        return 1;
    }
    return 0;
}
