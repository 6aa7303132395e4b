// server.cpp: a payment API that charges each Idempotency-Key once, with idem.
//
//   payment_server --port 8080 --db payments.db                    # SQLite, sync mode
//   payment_server --port 8080 --pg postgresql://idem@127.0.0.1/idem --ledger charges --mode async
//   payment_server --port 8080 --db payments.db --processor http://127.0.0.1:9090
//
// POST /payments with a JSON body {"amount": 1250, "currency": "EUR", "card": "4242..."} and an
// Idempotency-Key header charges the card once per key, and answers every request with that key
// the way the IETF draft "The Idempotency-Key HTTP Header Field" says (README.md has the table):
// 400 without a key, 422 for a key reused with another body, 409 while the first request is still
// being processed, and after completion the first response again, byte for byte, with
// `Idempotent-Replayed: true`.
//
// GET /metrics answers the guard's counters and the server's own (payment_http_*) in the
// Prometheus text format, for a Prometheus to scrape (README.md, "Metrics").
//
// The response (status code and body) is stored by idem with the claim's completion, in the same
// row of the same commit (the completion's payload), so there is no second table to keep in step.
// In sync mode (the default) succeed() returns after that commit, so a response the client may
// have seen is always in the store; a crash before the commit leaves the claim in flight, and the
// resolver (options.resolve, in main) asks the processor what happened before the key is decided.
// A completion the guard refuses after the charge is treated the same way: the claim is left in
// doubt and answered 503 "may have been made", never released, since a retry would charge again.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <idem/durable.hpp>
#include <idem/stores/postgres_store.hpp>
#include <idem/stores/sqlite_store.hpp>
#include <idem/stats.hpp>

#include "idempotency_key.hpp"

namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// The payment processor: the side effect that must happen once. Either a remote service (the
// test's ledger, a real PSP) or, for the demo and the benchmark, one in this process that keeps
// its books in a file.

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

/// The in-process processor (no --processor): charges nothing real, but keeps its books the way a
/// real processor does, so a crash of this process (even SIGKILL) loses none of them: every charge
/// and every void is appended to a file (--ledger; by default next to the idem store) before it
/// is answered, and read back at start. So after a restart the resolver can still learn that an
/// attempt charged, an attempt it voided stays voided, and charge ids continue where they were
/// (no id is given to two charges). One write() per entry, no fsync: an entry survives a process
/// crash, not a power loss (like the idem store's full_sync=false). Declines amounts above
/// 1,000,000 (a card limit), so the stored-decline path can be tried without a remote processor.
///
/// The file is text, one entry a line, each written by one write() (a process crash cannot leave
/// half a line; a power loss can, and the reader cuts it off). The books are also held in memory,
/// where the resolver's questions are answered:
///   charge <id> <attempt> <amount> <currency> <key>     attempt: the claim's fence (0 without idem)
///   void <attempt> <key>
/// The key is last: it is printable ASCII (an sf-string's content) and may hold spaces.
class local_processor final : public processor {
public:
    /// `temporary`: the file is removed once open (the --no-idem baseline: the same write per
    /// charge, nothing left behind).
    local_processor(const std::string& path, bool temporary) : path_(path) {
        fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd_ < 0) throw std::runtime_error("processor ledger " + path + ": " + std::strerror(errno));
        if (temporary) ::unlink(path.c_str());
        // Two processes appending their own charge ids to one file would give an id twice.
        if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
            ::close(fd_);
            throw std::runtime_error("processor ledger " + path + " is in use by another process (--ledger)");
        }
        load();
    }
    ~local_processor() override { ::close(fd_); }
    local_processor(const local_processor&) = delete;
    local_processor& operator=(const local_processor&) = delete;

    const std::string& path() const noexcept { return path_; }

    charge_result charge(const std::string& key, std::uint64_t attempt, std::int64_t amount,
                         const std::string& currency) override {
        if (amount > 1'000'000) return {charge_result::kind::declined, 0, "amount above the card limit"};
        std::lock_guard lock(mu_);
        // The check and the append are one step against void_attempt: a voided attempt never charges.
        if (voided_.contains(attempt_of(key, attempt)))
            return {charge_result::kind::unknown, 0, "attempt voided by the resolver"};
        const std::uint64_t id = next_id_;
        if (!append("charge " + std::to_string(id) + ' ' + std::to_string(attempt) + ' ' + std::to_string(amount) + ' ' +
                    currency + ' ' + key + '\n'))
            return {charge_result::kind::unknown, 0, std::string("processor ledger: ") + std::strerror(errno)};
        ++next_id_;
        charged_[attempt_of(key, attempt)] = id;
        return {charge_result::kind::charged, id, {}};
    }

    charge_result void_attempt(const std::string& key, std::uint64_t attempt) override {
        std::lock_guard lock(mu_);
        std::string a = attempt_of(key, attempt);
        if (const auto it = charged_.find(a); it != charged_.end()) return {charge_result::kind::charged, it->second, {}};
        if (!voided_.contains(a) && !append("void " + std::to_string(attempt) + ' ' + key + '\n'))
            return {charge_result::kind::unknown, 0, std::string("processor ledger: ") + std::strerror(errno)};
        voided_.insert(std::move(a));
        return {charge_result::kind::declined, 0, "no charge for this attempt; voided"};
    }

private:
    static std::string attempt_of(const std::string& key, std::uint64_t attempt) {
        return std::to_string(attempt) + ' ' + key;
    }

    /// One write() of a whole line. A short one (a full disk) is cut back off, so the next entry
    /// does not continue half a line; the caller answers unknown, never charged.
    bool append(const std::string& line) {
        const ssize_t n = ::write(fd_, line.data(), line.size());
        if (n == static_cast<ssize_t>(line.size())) {
            size_ += line.size();
            return true;
        }
        const int why = n < 0 ? errno : ENOSPC;
        if (n > 0 && ::ftruncate(fd_, static_cast<off_t>(size_)) != 0) std::perror("payment_server: processor ledger");
        errno = why;
        return false;
    }

    void load() {
        std::string text;
        char buf[1 << 16];
        for (ssize_t n; (n = ::pread(fd_, buf, sizeof buf, static_cast<off_t>(text.size()))) != 0;) {
            if (n < 0) throw std::runtime_error("processor ledger " + path_ + ": " + std::strerror(errno));
            text.append(buf, static_cast<std::size_t>(n));
        }
        std::size_t at = 0;
        for (std::size_t end; (end = text.find('\n', at)) != std::string::npos; at = end + 1) {
            std::istringstream line(text.substr(at, end - at));
            std::string kind, key, currency;
            std::uint64_t id = 0, attempt = 0;
            std::int64_t amount = 0;
            if (line >> kind && kind == "charge" && line >> id >> attempt >> amount >> currency && line.get() == ' ' &&
                std::getline(line, key)) {
                charged_[attempt_of(key, attempt)] = id;
                next_id_ = std::max(next_id_, id + 1);
            } else if (kind == "void" && line >> attempt && line.get() == ' ' && std::getline(line, key)) {
                voided_.insert(attempt_of(key, attempt));
            } else {
                throw std::runtime_error("processor ledger " + path_ + ": unreadable entry at byte " + std::to_string(at));
            }
        }
        // A last line without its newline is a write a power loss cut short: it was never
        // answered, so it is dropped, and the next entry starts on a line of its own.
        if (at != text.size() && ::ftruncate(fd_, static_cast<off_t>(at)) != 0)
            throw std::runtime_error("processor ledger " + path_ + ": " + std::strerror(errno));
        size_ = at;
    }

    std::string path_;
    int fd_ = -1;
    std::mutex mu_;
    std::uint64_t next_id_ = 1;
    std::size_t size_ = 0;                                    // the file's length: whole lines only
    std::unordered_map<std::string, std::uint64_t> charged_;  // "attempt key" -> charge id
    std::unordered_set<std::string> voided_;                  // "attempt key"
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
std::string payment_body(const std::string& key, std::int64_t amount, const std::string& currency, const charge_result& c) {
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
    std::chrono::milliseconds wait{0};  // wait this long for an in-flight first request before 409
    std::chrono::milliseconds lease{10'000};
    std::string processor_url;
    std::string ledger;       // the in-process processor's file; empty: ledger_path() chooses
    bool use_idem = true;     // --no-idem: the same handler without idem (the benchmark's baseline)
    bool test_hooks = false;  // honour X-Test-Crash (the crash tests)
    // Requests in flight at once: a pool thread serves one connection (keep-alive) at a time, and in
    // sync mode it waits for the commits of its claim and of its completion, so requests share a
    // group commit only if they are in flight together. More threads than connections buy nothing.
    unsigned threads = 64;
    idem::options opts;        // --capacity, --retention-ms, --payload-budget, --max-payload
    idem::store_options so;    // --mode, --queue, --offer-wait-ms, --window-ms (parse_args: defaults)
    std::size_t pg_lanes = 1;  // --pg-lanes: connections committing batches at once
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
    const auto upper3 = [](const std::string& c) {
        return c.size() == 3 && std::all_of(c.begin(), c.end(), [](char x) { return x >= 'A' && x <= 'Z'; });
    };
    if (!j.contains("currency") || !j["currency"].is_string() || !upper3(j["currency"].get<std::string>())) {
        problem(res, 400, "Invalid request", "\"currency\" must be a three-letter ISO 4217 code");
        return std::nullopt;
    }
    p.currency = j["currency"].get<std::string>();
    return p;
}

/// The server's own counters, served by GET /metrics next to the guard's (idem::to_prometheus).
/// Relaxed atomics: each is a tally a scrape reads, ordering nothing else, so counting costs a
/// request an atomic add per counter it touches. in_flight is decremented when the handler returns,
/// before the response is written: a client that has its answer is no longer counted.
struct http_metrics {
    std::atomic<std::uint64_t> requests{0};   ///< POST /payments received, whatever their answer
    std::atomic<std::uint64_t> replayed{0};   ///< answers replayed from a recorded result (Idempotent-Replayed)
    std::atomic<std::uint64_t> charges{0};    ///< charges the processor was asked for: operations executed
    std::atomic<std::uint64_t> in_flight{0};  ///< POST /payments being handled now

    static void add(std::atomic<std::uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }

    /// One POST from its start to its answer: counted, and in flight while it lives.
    struct request_scope {
        explicit request_scope(http_metrics& m) : m_(m) {
            add(m_.requests);
            m_.in_flight.fetch_add(1, std::memory_order_relaxed);
        }
        ~request_scope() { m_.in_flight.fetch_sub(1, std::memory_order_relaxed); }
        request_scope(const request_scope&) = delete;
        request_scope& operator=(const request_scope&) = delete;
        http_metrics& m_;
    };

    /// The Prometheus text exposition (format 0.0.4) of these counters, prefixed payment_http_.
    std::string exposition() const {
        std::string out;
        auto put = [&](const char* name, const char* type, const char* help, const std::string& value) {
            out.append("# HELP payment_http_").append(name).append(" ").append(help).append("\n");
            out.append("# TYPE payment_http_").append(name).append(" ").append(type).append("\n");
            out.append("payment_http_").append(name).append(" ").append(value).append("\n");
        };
        const auto get = [](const std::atomic<std::uint64_t>& c) {
            return std::to_string(c.load(std::memory_order_relaxed));
        };
        put("requests_total", "counter", "POST /payments requests received.", get(requests));
        put("duplicates_replayed_total", "counter", "Answers replayed from a recorded result (Idempotent-Replayed: true).",
            get(replayed));
        put("charges_total", "counter", "Charges the payment processor was asked for (operations executed).", get(charges));
        put("in_flight", "gauge", "POST /payments requests being handled now.",
            std::to_string(in_flight.load(std::memory_order_relaxed)));
        return out;
    }
};

class payment_api {
public:
    payment_api(const config& cfg, processor& proc, idem::durable_guard* g, http_metrics& m)
        : cfg_(cfg), proc_(proc), g_(g), m_(m) {}

    void post(const httplib::Request& req, httplib::Response& res) {
        if (!req.has_header("Idempotency-Key"))
            return problem(res, 400, "Idempotency-Key is missing",
                           "POST /payments requires an Idempotency-Key header (a Structured Field String)");
        // Field lines of one name are one field (RFC 9110, 5.3): a parser joins them with commas
        // (RFC 8941, 4.2), and two Strings joined so are a List, not the one String a key is.
        // Using the first line would deduplicate on a key the client may not have meant.
        if (const std::size_t lines = req.get_header_value_count("Idempotency-Key"); lines > 1)
            return problem(res, 400, "Invalid Idempotency-Key",
                           "the Idempotency-Key header appears on " + std::to_string(lines) +
                               " lines; they form one comma-separated field value (RFC 8941, 4.2), which is not "
                               "a single Structured Field String (RFC 8941, 3.3.3): send the key once");
        std::string why;
        const auto text = payment::parse_idempotency_key(req.get_header_value("Idempotency-Key"), &why);
        if (!text) return problem(res, 400, "Invalid Idempotency-Key", "the Idempotency-Key header " + why);
        const auto p = parse_payment(req.body, res);
        if (!p) return;
        if (!cfg_.use_idem) {  // the benchmark's baseline: the same work, no deduplication
            http_metrics::add(m_.charges);
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
                if (const auto stored = decode_response(r.payload)) return replayed(res, *stored);
                return problem(res, 500, "Stored response unreadable", "the failed payment has no stored response");
            case idem::begin_status::in_progress:
                res.set_header("Retry-After", "1");
                return problem(res, 409, "Request in progress",
                               "a request with this Idempotency-Key is still being processed; retry later");
            case idem::begin_status::in_doubt:  // its outcome was not recorded: the resolver decides it
                res.set_header("Retry-After", retry_after_lease());
                return problem(res, 409, "Request in progress",
                               "the outcome of the first request with this Idempotency-Key is being determined; "
                               "retry later with the same key to get it");
            case idem::begin_status::payload_mismatch:
                return problem(res, 422, "Idempotency-Key reused",
                               "this Idempotency-Key was used with a different request payload");
            case idem::begin_status::invalid_key:
                return problem(res, 400, "Invalid Idempotency-Key", "the store cannot hold this key");
            default:
                // backpressure, store_unavailable, capacity_exhausted: the key was not claimed, so
                // nothing ran and nothing is recorded; a retry is a first request.
                res.set_header("Retry-After", "1");
                return problem(res, 503, "Try again",
                               std::string("not processed, nothing was charged (") + idem::to_string(r.status) +
                                   "); retry with the same Idempotency-Key");
        }
        crash_point(cfg_, req, "before-charge");
        http_metrics::add(m_.charges);
        const charge_result c = proc_.charge(*text, r.ticket.fence(), p->amount, p->currency);
        if (c.result == charge_result::kind::unknown) {
            // The charge may or may not have happened (or the resolver voided this attempt after
            // its lease ran out): releasing the key could charge twice.
            return in_doubt(r.ticket, res, c.reason);
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
        for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
             (ec == idem::errc::backpressure || ec == idem::errc::busy) && std::chrono::steady_clock::now() < until;
             ec = record())
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        // Refused (the payload budget spent, the queue still full, the commit unconfirmed, the
        // claim compensated meanwhile): the card was charged, or declined, and neither is
        // recorded. Releasing the key would let its retry charge again.
        if (ec) return in_doubt(r.ticket, res, ec.message());
        crash_point(cfg_, req, "after-record");
        send_stored(res, *decode_response(stored), false);
    }

private:
    /// The charge ran, or may have run, and its outcome is not recorded. The claim is left in
    /// doubt, never released: duplicates are told to wait (409), and once its lease expires the
    /// resolver asks the processor whether this attempt charged and records that answer, which
    /// every retry then gets. (A ticket whose claim is already gone, completed unconfirmed or
    /// compensated, is empty, and this changes nothing.)
    void in_doubt(idem::ticket& ticket, httplib::Response& res, const std::string& why) {
        ticket.leave_in_doubt();
        res.set_header("Retry-After", retry_after_lease());
        problem(res, 503, "Payment outcome pending",
                "the payment may have been made, but its outcome could not be recorded (" + why +
                    "); it is being determined: retry later with the same Idempotency-Key to get it");
    }

    /// Seconds until the resolver can have decided a claim left now: its lease.
    std::string retry_after_lease() const {
        return std::to_string(std::max<long long>(1, std::chrono::ceil<std::chrono::seconds>(cfg_.lease).count()));
    }

    static std::string respond(const std::string& key, const payment_request& p, const charge_result& c) {
        return encode_response(c.result == charge_result::kind::charged ? 201 : 402,
                               payment_body(key, p.amount, p.currency, c));
    }

    /// A duplicate of a completed payment: its stored response. A record without one was decided
    /// by the resolver (the processor had charged, after a crash or a refused completion): its
    /// response is rebuilt from the charge the record names, since the first one was never sent.
    void replay(httplib::Response& res, const std::string& key, const payment_request& p, std::uint64_t outcome,
                const std::string& stored) {
        if (!stored.empty()) {
            if (const auto r = decode_response(stored)) return replayed(res, *r);
            return problem(res, 500, "Stored response unreadable", "the stored response has no status code");
        }
        replayed(res, *decode_response(respond(key, p, {charge_result::kind::charged, outcome, {}})));
    }

    /// A recorded result sent again, counted as such.
    void replayed(httplib::Response& res, const response& r) {
        http_metrics::add(m_.replayed);
        send_stored(res, r, true);
    }

    const config& cfg_;
    processor& proc_;
    idem::durable_guard* g_;
    http_metrics& m_;
};

int usage() {
    std::fprintf(stderr,
                 "usage: payment_server --port N (--db PATH | --pg URI) [--mode sync|async] [--wait-ms N]\n"
                 "                      [--lease-ms N] [--processor URL | --ledger PATH] [--threads N]\n"
                 "                      [--capacity N] [--retention-ms N] [--window-ms N] [--payload-budget BYTES]\n"
                 "                      [--max-payload BYTES] [--queue N] [--offer-wait-ms N] [--pg-lanes N]\n"
                 "                      [--no-idem] [--test-hooks]\n");
    return 2;
}

/// A non-negative decimal number, or nullopt.
std::optional<std::uint64_t> number(std::string_view v) {
    std::uint64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size() || v.empty()) return std::nullopt;
    return n;
}

std::optional<config> parse_args(int argc, char** argv) {
    config c;
    c.so.mode = idem::durability::sync;
    // A full flush queue makes a request wait up to 100 ms for room before it is refused (503):
    // under a load above the store's commit rate, refusals cost the server almost nothing, so
    // without the wait its threads answer 503 as fast as clients retry and leave the flusher less
    // CPU; with it the server runs at the store's rate (README, "Throughput and 503").
    c.so.offer_wait = std::chrono::milliseconds(100);
    for (int i = 1; i < argc; ++i) {
        const std::string_view a = argv[i];
        auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
        const char* v = nullptr;
        if (a == "--no-idem") {
            c.use_idem = false;
            continue;
        }
        if (a == "--test-hooks") {
            c.test_hooks = true;
            continue;
        }
        if ((v = value()) == nullptr) return std::nullopt;
        if (a == "--db") c.db = v;
        else if (a == "--pg") c.pg = v;
        else if (a == "--processor") c.processor_url = v;
        else if (a == "--ledger") c.ledger = v;
        else if (a == "--mode" && std::string_view(v) == "sync") c.so.mode = idem::durability::sync;
        else if (a == "--mode" && std::string_view(v) == "async") c.so.mode = idem::durability::async;
        else {
            const auto n = number(v);
            if (!n) return std::nullopt;
            const std::chrono::milliseconds ms(static_cast<std::int64_t>(*n));
            if (a == "--port" && *n <= 65535) c.port = static_cast<int>(*n);
            else if (a == "--wait-ms") c.wait = ms;
            else if (a == "--lease-ms") c.lease = ms;
            else if (a == "--threads") c.threads = static_cast<unsigned>(*n);
            else if (a == "--capacity") c.opts.capacity = *n;
            else if (a == "--retention-ms") c.opts.retention = ms;
            else if (a == "--window-ms") c.so.window = ms;
            else if (a == "--payload-budget") c.opts.payload_budget = *n;
            else if (a == "--max-payload") c.opts.max_payload = *n;
            else if (a == "--queue") c.so.queue_capacity = *n;
            else if (a == "--offer-wait-ms") c.so.offer_wait = ms;
            else if (a == "--pg-lanes") c.pg_lanes = *n;
            else return std::nullopt;
        }
    }
    if (c.threads == 0 || c.lease.count() <= 0 || (c.use_idem && c.db.empty() == c.pg.empty())) return std::nullopt;
    c.opts.lease = c.lease;
    return c;
}

/// Where the in-process processor keeps its books: --ledger, else beside the SQLite store. With
/// PostgreSQL (or SQLite in memory) there is no file to put it beside, so --ledger must name one. The --no-idem baseline
/// without a store gets a temporary file (second: true), removed at once.
std::pair<std::string, bool> ledger_path(const config& c) {
    if (!c.ledger.empty()) return {c.ledger, false};
    if (!c.db.empty() && c.db != ":memory:") return {c.db + "-ledger", false};
    if (c.use_idem)
        throw std::runtime_error(
            "the in-process processor keeps its charges in a file, and with no SQLite file to put "
            "it beside (--pg, --db :memory:) --ledger PATH must name it (or charge through "
            "--processor URL)");
    const char* dir = std::getenv("TMPDIR");
    std::string name = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/payment-ledger-XXXXXX";
    const int fd = ::mkstemp(name.data());
    if (fd < 0) throw std::runtime_error("temporary processor ledger " + name + ": " + std::strerror(errno));
    ::close(fd);
    return {name, true};
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
        std::string where;
        if (cfg->processor_url.empty()) {
            const auto [path, temporary] = ledger_path(*cfg);
            auto local = std::make_unique<local_processor>(path, temporary);
            where = temporary ? std::string("charges in a temporary file") : "charges in " + local->path();
            proc = std::move(local);
        } else {
            proc = std::make_unique<remote_processor>(cfg->processor_url);
            where = "processor " + cfg->processor_url;
        }

        std::unique_ptr<idem::durable_guard> g;
        if (cfg->use_idem) {
            idem::options opts = cfg->opts;
            opts.maintenance_interval = std::chrono::milliseconds(200);
            // An expired claim is a request that crashed, stalled past its lease, or could not
            // record its outcome, between its claim and its recorded response. The processor
            // knows whether that attempt (the claim's fence) charged: record that charge
            // (duplicates then get a response rebuilt from it), or, once the processor has voided
            // the attempt so that a charge request of it still on its way is refused, release
            // the key so a retry charges once.
            opts.resolve = [p = proc.get()](const idem::expired_claim& c) {
                const charge_result r = p->void_attempt(std::string(c.key), c.fence);
                switch (r.result) {
                    case charge_result::kind::charged:
                        return idem::resolver_answer{idem::resolution::succeeded, r.charge_id};
                    case charge_result::kind::declined: return idem::resolver_answer{idem::resolution::not_executed, 0};
                    case charge_result::kind::unknown: break;
                }
                return idem::resolver_answer{idem::resolution::unknown, 0};
            };
            std::unique_ptr<idem::store> st;
            if (!cfg->pg.empty())
                st = std::make_unique<idem::postgres_store>(cfg->pg, std::chrono::seconds(5), cfg->pg_lanes);
            else st = std::make_unique<idem::sqlite_store>(cfg->db, /*full_sync=*/false);
            g = std::make_unique<idem::durable_guard>(std::move(st), opts, cfg->so);
        }
        http_metrics metrics;
        payment_api api(*cfg, *proc, g.get(), metrics);
        httplib::Server svr;
        svr.new_task_queue = [n = cfg->threads] { return new httplib::ThreadPool(n); };
        // Headers and body leave in separate writes: with Nagle's algorithm on, the body waits for
        // the client's delayed ACK (40 ms on Linux), and every response takes that long.
        svr.set_tcp_nodelay(true);
        svr.Post("/payments", [&api, &metrics](const httplib::Request& req, httplib::Response& res) {
            const http_metrics::request_scope counted(metrics);
            api.post(req, res);
        });
        // Prometheus scrapes this (README, "Metrics"): the guard's counters and per-operation
        // latencies, then the server's own. The library opens no port; this server serves them.
        svr.Get("/metrics", [&g, &metrics](const httplib::Request&, httplib::Response& res) {
            std::string text;
            if (g) text = idem::to_prometheus(*g);  // the guard, its pipeline, and its recovery
            text += metrics.exposition();
            res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
        });
        const int port = cfg->port == 0 ? svr.bind_to_any_port("127.0.0.1")
                                        : (svr.bind_to_port("127.0.0.1", cfg->port) ? cfg->port : -1);
        if (port < 0) throw std::runtime_error("cannot listen on 127.0.0.1:" + std::to_string(cfg->port));
        running = &svr;
        std::signal(SIGINT, on_signal);
        std::signal(SIGTERM, on_signal);
        std::printf("payment_server: listening on 127.0.0.1:%d (%s, %s)\n", port,
                    !cfg->use_idem     ? "no idem"
                    : !cfg->pg.empty() ? "postgresql"
                                       : "sqlite",
                    where.c_str());
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
