// test_client.cpp: drives fix_gateway through a QuickFIX initiator (a real FIX peer, not the
// gateway's code) and checks every answer against its own ledger. Compiled as C++14, like every
// translation unit that includes QuickFIX (fix_acceptor.hpp says why).
//
//   fix_gateway_test GATEWAY_BINARY WORK_DIR [ORDERS=10000] [SEED=18]
//
// The run, with ORDERS = N (the phases' bounds scale with N):
//   1. orders [0, 0.4N), pipelined (at most 100 unanswered);
//   2. the session is dropped (Logout) and orders [0.4N, 0.5N) are sent while it is down: QuickFIX
//      stores them, and after the Logon the gateway's ResendRequest makes the engine resend them
//      with PossDupFlag=Y;
//   3. orders [0.5N, 0.7N); at 0.6N the gateway is killed (SIGKILL) and restarted on the same
//      SQLite file and FileStore; the initiator reconnects by itself;
//   4. orders [0.7N, N);
//   throughout, 10% of the orders are sent a second time a few orders later with PossResend=Y;
//   5. conflicts: 1% of the ClOrdIDs are reused for a different quantity, 0.2% are sent again with
//      the same fields but no resend flag, and one ClOrdID too long to be a key is sent once.
// The ledger, per ClOrdID, counts the gateway's ExecutionReports by ExecID (a report the engine
// resends keeps its ExecID, so it counts once) and requires: exactly one New; one Order Status per
// PossResend copy, with the New's OrderID; one Rejected (OrdRejReason 6, Text naming the ClOrdID)
// per conflict; no other report; OrderIDs distinct across ClOrdIDs. Orders unanswered when the
// gateway was killed may have been accepted with their New report lost in the crash, or answered
// twice (the engine resends an order the gateway took but whose sequence number it did not store):
// for those the ledger requires at most one New, every answer with one OrderID, and 1 or 2 answers
// more than the resend copies (README.md, "The crash window").
//
// The gateway runs with --metrics-port 0; the test reads the port it prints into gateway.log and
// scrapes GET /metrics (cpp-httplib's client, over 127.0.0.1) three times, each once every message
// sent so far is answered: checking that the exposition parses, and that fix_gateway_orders_total,
// _executions_total, _duplicates_total and idem_acquired_total are what the test sent (counted
// here as it sends, by kind). The SIGKILL restarts the counters at 0, and which of the crash
// window's orders the first process took before it died is not known, so the exact checks are:
// the first process's totals after step 2, and the second process's increase over steps 4 and 5
// (scraped after step 3 and at the end); its totals are checked against bounds (check_metrics).
#include <quickfix/Application.h>
#include <quickfix/FileStore.h>
#include <quickfix/Session.h>
#include <quickfix/SessionSettings.h>
#include <quickfix/ThreadedSocketInitiator.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

struct order_spec {
    std::string clordid, symbol, side, quantity, price, ord_type;
};

struct ledger_entry {
    order_spec spec;
    int resends_sent = 0;    // PossResend copies
    int conflicts_sent = 0;  // reuses that must be rejected
    bool sent = false;       // the order itself (or the unkeyable ClOrdID) was sent
    bool crash_window = false;
    std::set<std::string> news, statuses, rejects;  // ExecIDs by ExecType
    std::set<std::string> order_ids;                // from New and Order Status
    std::vector<std::string> problems;              // wrong reject reason or text
};

class client_app final : public FIX::Application {
public:
    std::mutex mu;
    std::condition_variable cv;
    std::map<std::string, ledger_entry> ledger;
    std::set<std::string> exec_ids;
    long answers = 0;   // distinct ExecutionReports
    long expected = 0;  // answers the orders sent so far call for
    bool logged_on = false;

    void onCreate(const FIX::SessionID&) override {}
    void onLogon(const FIX::SessionID&) override { set_logged_on(true); }
    void onLogout(const FIX::SessionID&) override { set_logged_on(false); }
    void toAdmin(FIX::Message&, const FIX::SessionID&) override {}
    void fromAdmin(const FIX::Message&, const FIX::SessionID&) throw(FIX::FieldNotFound, FIX::IncorrectDataFormat,
                                                                     FIX::IncorrectTagValue, FIX::RejectLogon) override {}
    void toApp(FIX::Message&, const FIX::SessionID&) throw(FIX::DoNotSend) override {}

    void fromApp(const FIX::Message& m, const FIX::SessionID&) throw(FIX::FieldNotFound, FIX::IncorrectDataFormat,
                                                                     FIX::IncorrectTagValue,
                                                                     FIX::UnsupportedMessageType) override {
        if (m.getHeader().getField(FIX::FIELD::MsgType) != "8") return;
        const std::string exec_id = m.getField(FIX::FIELD::ExecID);
        const std::string clordid = m.getField(FIX::FIELD::ClOrdID);
        const std::string exec_type = m.getField(FIX::FIELD::ExecType);
        std::lock_guard<std::mutex> l(mu);
        if (!exec_ids.insert(exec_id).second) return;  // a resent copy of a report already counted
        ++answers;
        ledger_entry& e = ledger[clordid];
        if (exec_type == "0" || exec_type == "I") {
            (exec_type == "0" ? e.news : e.statuses).insert(exec_id);
            e.order_ids.insert(m.getField(FIX::FIELD::OrderID));
        } else if (exec_type == "8") {
            e.rejects.insert(exec_id);
            const std::string text = m.isSetField(FIX::FIELD::Text) ? m.getField(FIX::FIELD::Text) : "";
            const std::string reason = m.isSetField(FIX::FIELD::OrdRejReason) ? m.getField(FIX::FIELD::OrdRejReason) : "";
            if (text.find(clordid) == std::string::npos) e.problems.push_back("reject Text does not name it: " + text);
            const std::string want = e.spec.clordid.empty() ? "99" : "6";  // 99: the unencodable ClOrdID
            if (reason != want) e.problems.push_back("OrdRejReason " + reason + ", expected " + want + " (" + text + ")");
        } else {
            e.problems.push_back("unexpected ExecType " + exec_type);
        }
        cv.notify_all();
    }

private:
    void set_logged_on(bool v) {
        std::lock_guard<std::mutex> l(mu);
        logged_on = v;
        cv.notify_all();
    }
};

int pick_port() {
    // Below the ephemeral range (32768+), so no client connection holds it (scripts/lib/ports.sh).
    const int base = 20000 + static_cast<int>(getpid() % 4000) * 3;
    for (int p = base; p < base + 300; ++p) {
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(p));
        a.sin_addr.s_addr = htonl(INADDR_ANY);  // what the gateway binds (QuickFIX 1.15.1 has no address setting)
        const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
        close(fd);
        if (ok) return p;
    }
    return -1;
}

/// Starts the gateway with its log appended to DIR/gateway.log; *log_from is the log's size before,
/// where this process's lines start (the previous gateway is dead by then: killed and reaped).
pid_t start_gateway(const std::string& binary, const std::string& dir, int port, off_t* log_from) {
    struct stat st;
    *log_from = stat((dir + "/gateway.log").c_str(), &st) == 0 ? st.st_size : 0;
    const pid_t pid = fork();
    if (pid != 0) return pid;
    const int log = open((dir + "/gateway.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(log, 1);
    dup2(log, 2);
    const std::string p = std::to_string(port), db = dir + "/gateway.db", store = dir + "/gateway-fix-store";
    execl(binary.c_str(), binary.c_str(), "--port", p.c_str(), "--db", db.c_str(), "--fix-store", store.c_str(),
          "--metrics-port", "0", static_cast<char*>(nullptr));
    _exit(127);
}

/// The metrics port the gateway printed ("fix_gateway: metrics listening on 127.0.0.1:PORT") into
/// DIR/gateway.log after byte `from`, polled until it shows or `seconds` pass; -1 then.
int metrics_port_of(const std::string& dir, off_t from, int seconds) {
    static const std::string tag = "fix_gateway: metrics listening on 127.0.0.1:";
    const auto deadline = clock_type::now() + std::chrono::seconds(seconds);
    for (;;) {
        if (FILE* f = std::fopen((dir + "/gateway.log").c_str(), "r")) {
            std::string text;
            char buf[4096];
            if (fseeko(f, from, SEEK_SET) == 0)
                for (std::size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, got);
            std::fclose(f);
            const std::size_t at = text.find(tag);
            const std::size_t eol = at == std::string::npos ? at : text.find('\n', at);
            if (eol != std::string::npos) {
                const std::string digits = text.substr(at + tag.size(), eol - at - tag.size());
                char* end = nullptr;
                errno = 0;
                const long port = std::strtol(digits.c_str(), &end, 10);
                if (digits.empty() || *end != '\0' || errno != 0 || port <= 0 || port > 65535) return -1;
                return static_cast<int>(port);
            }
        }
        if (clock_type::now() >= deadline) return -1;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the log, deadline above
    }
}

/// A parsed Prometheus text exposition (format 0.0.4).
struct exposition {
    std::map<std::string, double> values;      // samples without labels, by name
    std::map<std::string, std::string> types;  // # TYPE name type
    std::set<std::string> helps;               // names with a # HELP line
};

bool metric_name_ok(const std::string& n) {
    if (n.empty() || std::isdigit(static_cast<unsigned char>(n[0]))) return false;
    for (const char c : n)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != ':') return false;
    return true;
}

/// Parses `text`; false with *why on the first line that breaks the format, or whose sample has no
/// "# TYPE" line before it (for a summary's NAME_count/NAME_sum and a histogram's NAME_bucket too,
/// the TYPE line of NAME).
bool parse_exposition(const std::string& text, exposition* out, std::string* why) {
    if (text.empty() || text.back() != '\n') {
        *why = "the exposition does not end with a newline";
        return false;
    }
    std::istringstream in(text);
    std::string line;
    for (int no = 1; std::getline(in, line); ++no) {
        auto bad = [&](const std::string& what) {
            *why = "line " + std::to_string(no) + " (" + line.substr(0, 120) + "): " + what;
            return false;
        };
        if (line.empty()) continue;
        if (line[0] == '#') {
            std::istringstream w(line.substr(1));
            std::string keyword, name, type;
            w >> keyword >> name;
            if (keyword == "TYPE") {
                w >> type;
                if (!metric_name_ok(name)) return bad("bad metric name in # TYPE");
                if (type != "counter" && type != "gauge" && type != "summary" && type != "histogram" && type != "untyped")
                    return bad("unknown type '" + type + "'");
                if (!out->types.emplace(name, type).second) return bad("a second # TYPE for " + name);
            } else if (keyword == "HELP") {
                if (!metric_name_ok(name)) return bad("bad metric name in # HELP");
                out->helps.insert(name);
            }
            continue;  // any other # line is a comment
        }
        std::size_t i = 0;
        while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
        const std::string name = line.substr(0, i);
        if (!metric_name_ok(name)) return bad("bad metric name");
        const bool labelled = i < line.size() && line[i] == '{';
        if (labelled) {  // to the closing brace, past quoted label values and their escapes
            bool quoted = false;
            for (++i; i < line.size(); ++i) {
                if (quoted && line[i] == '\\') ++i;
                else if (line[i] == '"') quoted = !quoted;
                else if (!quoted && line[i] == '}') break;
            }
            if (i >= line.size()) return bad("unterminated label set");
            ++i;
        }
        if (i >= line.size() || line[i] != ' ') return bad("no space before the value");
        std::istringstream rest(line.substr(i + 1));
        std::string value, timestamp, extra;
        rest >> value >> timestamp >> extra;
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (value.empty() || *end != '\0') return bad("value '" + value + "' is not a number");
        if (!extra.empty()) return bad("text after the timestamp");
        auto typed = [&](const std::string& family, const char* t1, const char* t2) {
            const auto it = out->types.find(family);
            return it != out->types.end() && (it->second == t1 || it->second == t2);
        };
        auto strip = [&](const std::string& suffix) {
            return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0
                       ? name.substr(0, name.size() - suffix.size())
                       : std::string();
        };
        if (out->types.count(name) == 0 && !typed(strip("_count"), "summary", "histogram") &&
            !typed(strip("_sum"), "summary", "histogram") && !typed(strip("_bucket"), "histogram", "histogram"))
            return bad("sample " + name + " has no # TYPE line before it");
        if (!labelled && !out->values.emplace(name, v).second) return bad("a second sample of " + name);
    }
    return true;
}

/// GET http://127.0.0.1:PORT/metrics, parsed; false with *why when it fails.
bool scrape(int port, exposition* out, std::string* why) {
    httplib::Client cli("127.0.0.1", port);
    cli.set_connection_timeout(5);
    cli.set_read_timeout(10);
    const auto res = cli.Get("/metrics");
    if (!res) {
        *why = "GET /metrics on 127.0.0.1:" + std::to_string(port) + ": " + httplib::to_string(res.error());
        return false;
    }
    if (res->status != 200) {
        *why = "GET /metrics answered " + std::to_string(res->status);
        return false;
    }
    const std::string ct = res->get_header_value("Content-Type");
    if (ct != "text/plain; version=0.0.4; charset=utf-8") {
        *why = "GET /metrics Content-Type '" + ct + "'";
        return false;
    }
    return parse_exposition(res->body, out, why);
}

/// What the test has sent, by kind: each message the gateway's application receives is one of these.
struct sent_counts {
    long news = 0;       // orders sent for the first time: each one executed
    long copies = 0;     // PossResend copies: answered Order Status, a duplicate
    long conflicts = 0;  // reused ClOrdIDs: rejected as Duplicate Order, a duplicate
    long unkeyable = 0;  // the ClOrdID too long to be a key: rejected, neither executed nor a duplicate
};

/// The four checked series, from what was sent (all of `to`, or what `to` adds to `from`).
std::map<std::string, double> expected_series(const sent_counts& to, const sent_counts& from = sent_counts()) {
    const long news = to.news - from.news, copies = to.copies - from.copies, conflicts = to.conflicts - from.conflicts,
               unkeyable = to.unkeyable - from.unkeyable;
    return {{"fix_gateway_orders_total", static_cast<double>(news + copies + conflicts + unkeyable)},
            {"fix_gateway_executions_total", static_cast<double>(news)},
            {"fix_gateway_duplicates_total", static_cast<double>(copies + conflicts)},
            {"idem_acquired_total", static_cast<double>(news)}};
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: fix_gateway_test GATEWAY_BINARY WORK_DIR [ORDERS] [SEED]\n");
        return 2;
    }
    const std::string gateway = argv[1], dir = argv[2];
    const int n = argc > 3 ? std::atoi(argv[3]) : 10000;
    const unsigned seed = argc > 4 ? static_cast<unsigned>(std::atoi(argv[4])) : 18u;
    if (n < 100) {
        std::fprintf(stderr, "fix_gateway_test: ORDERS must be at least 100\n");
        return 2;
    }
    mkdir(dir.c_str(), 0755);
    const int port = pick_port();
    if (port < 0) {
        std::fprintf(stderr, "fix_gateway_test: no free loopback port\n");
        return 1;
    }
    const auto t0 = clock_type::now();
    std::printf("fix_gateway_test: %d orders, seed %u, port %d, work dir %s\n", n, seed, port, dir.c_str());
    off_t gw_log_from = 0;  // where the running gateway's lines start in gateway.log
    pid_t gw = start_gateway(gateway, dir, port, &gw_log_from);

    client_app app;
    std::ostringstream cfg;
    cfg << "[DEFAULT]\nConnectionType=initiator\nSocketConnectHost=127.0.0.1\nSocketConnectPort=" << port
        << "\nReconnectInterval=1\nHeartBtInt=30\nFileStorePath=" << dir << "/client-fix-store"
        << "\nStartTime=00:00:00\nEndTime=00:00:00\nUseDataDictionary=N\n"
        << "[SESSION]\nBeginString=FIX.4.4\nSenderCompID=CLIENT\nTargetCompID=GATEWAY\n";
    std::istringstream in(cfg.str());
    FIX::SessionSettings settings(in);
    FIX::FileStoreFactory store(settings);
    FIX::ThreadedSocketInitiator initiator(app, store, settings);
    const FIX::SessionID sid("FIX.4.4", "CLIENT", "GATEWAY");
    initiator.start();

    std::vector<order_spec> orders(static_cast<std::size_t>(n));
    std::mt19937 rng(seed);
    static const char* const symbols[] = {"AAPL", "MSFT", "VOD.L", "BMW.DE", "7203.T"};
    for (int i = 0; i < n; ++i) {
        order_spec& o = orders[static_cast<std::size_t>(i)];
        o.clordid = "ord_" + std::to_string(seed) + "_" + std::to_string(i);  // '_' on purpose
        o.symbol = symbols[rng() % 5];
        o.side = rng() % 2 ? "1" : "2";
        o.quantity = std::to_string(100 * (1 + rng() % 50));
        o.ord_type = rng() % 4 ? "2" : "1";
        if (o.ord_type == "2") o.price = std::to_string(10 + rng() % 90) + "." + std::to_string(rng() % 100);
        app.ledger[o.clordid].spec = o;
    }
    std::vector<bool> resend(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) resend[static_cast<std::size_t>(i)] = rng() % 10 == 0;

    bool failed = false;
    auto fail = [&](const std::string& what) {
        std::fprintf(stderr, "fix_gateway_test: %s\n", what.c_str());
        failed = true;
    };
    auto wait_for = [&](const char* what, int seconds, const std::function<bool()>& done) {
        std::unique_lock<std::mutex> l(app.mu);
        if (!app.cv.wait_for(l, std::chrono::seconds(seconds), done)) {
            l.unlock();
            fail(std::string("timed out waiting for ") + what);
            return false;
        }
        return true;
    };
    auto wait_answers = [&](const char* phase) {
        wait_for(phase, 90, [&] { return app.answers >= app.expected; });
        std::printf("  %-32s %ld answers (%.1f s)\n", phase, app.answers,
                    std::chrono::duration<double>(clock_type::now() - t0).count());
        std::fflush(stdout);
    };
    sent_counts sent;  // main thread only
    enum class kind { order, copy, conflict, unkeyable };
    auto send = [&](const order_spec& o, kind k, bool pipelined) {
        const bool poss_resend = k == kind::copy;
        if (pipelined) {
            // At most 100 unanswered while the session is up: QuickFIX's sendToTarget holds the
            // session's lock while it writes to the socket, and the thread reading the reports
            // needs that lock, so the orders and reports in flight must fit in the sockets'
            // buffers (100 of each is about 45 KB), or both peers block writing.
            std::unique_lock<std::mutex> l(app.mu);
            app.cv.wait_for(l, std::chrono::seconds(30), [&] { return !app.logged_on || app.expected - app.answers < 100; });
        }
        FIX::Message m;
        m.getHeader().setField(FIX::FIELD::MsgType, "D");
        if (poss_resend) m.getHeader().setField(FIX::FIELD::PossResend, "Y");
        m.setField(FIX::FIELD::ClOrdID, o.clordid);
        m.setField(FIX::FIELD::HandlInst, "1");
        m.setField(FIX::FIELD::Symbol, o.symbol);
        m.setField(FIX::FIELD::Side, o.side);
        m.setField(FIX::FIELD::TransactTime, FIX::UtcTimeStampConvertor::convert(FIX::UtcTimeStamp()));
        m.setField(FIX::FIELD::OrderQty, o.quantity);
        m.setField(FIX::FIELD::OrdType, o.ord_type);
        if (!o.price.empty()) m.setField(FIX::FIELD::Price, o.price);
        {
            std::lock_guard<std::mutex> l(app.mu);
            ++app.expected;
            if (k == kind::order || k == kind::unkeyable) app.ledger[o.clordid].sent = true;
        }
        ++(k == kind::order      ? sent.news
           : k == kind::copy     ? sent.copies
           : k == kind::conflict ? sent.conflicts
                                 : sent.unkeyable);
        FIX::Session::sendToTarget(m, sid);
    };
    sent_counts sent_at_kill;  // what had been sent when the first gateway was killed
    long window_at_kill = 0;   // and how many orders were unanswered then
    auto send_range = [&](int from, int to, bool pipelined, int kill_at) {
        for (int i = from; i < to; ++i) {
            if (i == kill_at) {
                // Every order not fully answered now is in the crash window.
                {
                    std::lock_guard<std::mutex> l(app.mu);
                    int window = 0;
                    for (int j = 0; j < i; ++j) {
                        ledger_entry& e = app.ledger[orders[static_cast<std::size_t>(j)].clordid];
                        if (static_cast<int>(e.news.size() + e.statuses.size()) < 1 + e.resends_sent) {
                            e.crash_window = true;
                            ++window;
                        }
                    }
                    std::printf("  SIGKILL gateway at order %d, %d orders unanswered\n", i, window);
                    window_at_kill = window;
                }
                sent_at_kill = sent;
                kill(gw, SIGKILL);
                waitpid(gw, nullptr, 0);
                gw = start_gateway(gateway, dir, port, &gw_log_from);
            }
            send(orders[static_cast<std::size_t>(i)], kind::order, pipelined);
            const int j = i - 5;  // the PossResend copy goes a few orders after its original
            if (j >= 0 && resend[static_cast<std::size_t>(j)]) {
                {
                    std::lock_guard<std::mutex> l(app.mu);
                    ++app.ledger[orders[static_cast<std::size_t>(j)].clordid].resends_sent;
                }
                send(orders[static_cast<std::size_t>(j)], kind::copy, pipelined);
            }
        }
    };

    // Every message sent so far answered (app.mu held): each order's New or Order Status and one per
    // PossResend copy, one reject per conflict. The gateway's session hands messages to the
    // application in MsgSeqNum order, so once the last one sent is answered every earlier one has
    // been through the gateway too, including a crash-window order the restarted gateway gets again
    // from the engine after the client had its New; and the gateway counts an order before it
    // answers it. So the counters scraped then hold every message sent, and nothing else.
    auto all_answered = [&] {
        for (const auto& kv : app.ledger) {
            const ledger_entry& e = kv.second;
            if (!e.sent) continue;
            if (static_cast<long>(e.rejects.size()) < e.conflicts_sent) return false;
            if (!e.spec.clordid.empty() && static_cast<long>(e.news.size() + e.statuses.size()) < 1 + e.resends_sent)
                return false;
        }
        return true;
    };
    // Scrapes the running gateway once all_answered(); false (and failed) when that or the scrape fails.
    auto scrape_now = [&](const char* when, exposition* x) {
        if (!wait_for(("every answer, to scrape " + std::string(when)).c_str(), 90, all_answered)) return false;
        const int mport = metrics_port_of(dir, gw_log_from, 30);
        std::string why;
        if (mport < 0) why = "no 'metrics listening on 127.0.0.1:PORT' line in " + dir + "/gateway.log";
        else if (scrape(mport, x, &why)) return true;
        fail(std::string(when) + ": " + why);
        return false;
    };
    // Each series `want` names is in `x` (with the delta: `x` minus `base`), a counter with a HELP
    // line, and equal to its value there.
    auto check_series = [&](const char* when, const exposition& x, const std::map<std::string, double>& want,
                            const exposition* base) {
        for (const auto& kv : want) {
            const auto it = x.values.find(kv.first);
            const auto t = x.types.find(kv.first);
            if (it == x.values.end() || t == x.types.end() || t->second != "counter" || x.helps.count(kv.first) == 0) {
                fail(std::string("/metrics ") + when + ": " + kv.first + " missing, or without HELP and TYPE counter");
                continue;
            }
            double got = it->second;
            if (base != nullptr) {
                const auto b = base->values.find(kv.first);
                if (b == base->values.end()) {
                    fail(std::string("/metrics ") + when + ": " + kv.first + " missing from the first scrape");
                    continue;
                }
                got -= b->second;
            }
            if (got != kv.second) {
                char msg[256];
                std::snprintf(msg, sizeof msg, "/metrics %s: %s %s %.0f, expected %.0f", when, kv.first.c_str(),
                              base != nullptr ? "went up by" : "is", got, kv.second);
                fail(msg);
            }
        }
    };

    if (!wait_for("the first logon", 30, [&] { return app.logged_on; })) return 1;
    FIX::Session* session = FIX::Session::lookupSession(sid);

    send_range(0, n * 4 / 10, true, -1);
    wait_answers("1: orders");

    session->logout("drill: drop the session");
    wait_for("the logout", 30, [&] { return !app.logged_on; });
    send_range(n * 4 / 10, n / 2, false, -1);  // stored by the engine, resent after the logon
    session->logon();
    wait_answers("2: reconnect, engine resend");
    {
        // The first gateway has seen every message sent so far, each once (the Logout was orderly,
        // so its engine has nothing to resend twice): its totals are exact.
        exposition first;
        if (scrape_now("the first gateway's /metrics", &first)) {
            check_series("after step 2 (first gateway)", first, expected_series(sent), nullptr);
            std::printf("  /metrics, first gateway: %.0f orders, %.0f executions, %.0f duplicates\n",
                        first.values["fix_gateway_orders_total"], first.values["fix_gateway_executions_total"],
                        first.values["fix_gateway_duplicates_total"]);
        }
    }

    send_range(n / 2, n * 7 / 10, true, n * 6 / 10);
    wait_answers("3: gateway SIGKILL + restart");
    // The restarted gateway's totals after step 3 depend on which crash-window orders the first one
    // took before it died; what steps 4 and 5 add to them does not.
    exposition restarted;
    const sent_counts sent_after_3 = sent;
    const bool have_restarted = scrape_now("the restarted gateway's /metrics after step 3", &restarted);

    send_range(n * 7 / 10, n, true, -1);
    for (int j = n - 5; j < n; ++j)
        if (resend[static_cast<std::size_t>(j)]) {
            {
                std::lock_guard<std::mutex> l(app.mu);
                ++app.ledger[orders[static_cast<std::size_t>(j)].clordid].resends_sent;
            }
            send(orders[static_cast<std::size_t>(j)], kind::copy, true);
        }
    wait_answers("4: orders");

    int conflicts = 0;
    for (int i = 0; i < n; i += 100) {  // 1%: the same ClOrdID, another quantity
        order_spec o = orders[static_cast<std::size_t>(i)];
        o.quantity = std::to_string(std::atoi(o.quantity.c_str()) + 1);
        {
            std::lock_guard<std::mutex> l(app.mu);
            ++app.ledger[o.clordid].conflicts_sent;
        }
        send(o, kind::conflict, true);
        ++conflicts;
    }
    for (int i = 50; i < n; i += 500) {  // 0.2%: the same order again, not flagged as a resend
        {
            std::lock_guard<std::mutex> l(app.mu);
            ++app.ledger[orders[static_cast<std::size_t>(i)].clordid].conflicts_sent;
        }
        send(orders[static_cast<std::size_t>(i)], kind::conflict, true);
        ++conflicts;
    }
    order_spec too_long = orders[0];
    too_long.clordid = std::string(130, 'L');  // with "7:CLIENT" in front, over the 128-byte key limit
    {
        std::lock_guard<std::mutex> l(app.mu);
        app.ledger[too_long.clordid].conflicts_sent = 1;  // spec left empty: expects OrdRejReason 99
    }
    send(too_long, kind::unkeyable, true);
    wait_answers("5: conflicting ClOrdIDs");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let a stray extra report show
    {
        exposition last;
        if (have_restarted && scrape_now("the restarted gateway's /metrics at the end", &last)) {
            check_series("steps 4 and 5 (restarted gateway)", last, expected_series(sent, sent_after_3), &restarted);
            // Its totals, bounded: every order first sent after the kill was executed by it, and
            // of the crash window's, those the first gateway had not committed.
            const double executed = last.values["fix_gateway_executions_total"];
            const double low = static_cast<double>(sent.news - sent_at_kill.news);
            if (executed < low || executed > low + static_cast<double>(window_at_kill)) {
                char msg[160];
                std::snprintf(msg, sizeof msg,
                              "/metrics at the end: the restarted gateway executed %.0f orders, not in [%.0f, %.0f]",
                              executed, low, low + static_cast<double>(window_at_kill));
                fail(msg);
            }
            if (last.values["idem_acquired_total"] != executed)
                fail("/metrics at the end: idem_acquired_total differs from fix_gateway_executions_total");
            std::printf(
                "  /metrics, restarted gateway: steps 4-5 added %.0f orders, %.0f executions, %.0f duplicates; "
                "%.0f executions in all\n",
                last.values["fix_gateway_orders_total"] - restarted.values["fix_gateway_orders_total"],
                last.values["fix_gateway_executions_total"] - restarted.values["fix_gateway_executions_total"],
                last.values["fix_gateway_duplicates_total"] - restarted.values["fix_gateway_duplicates_total"], executed);
            std::fflush(stdout);
        }
    }

    // The ledger.
    std::unique_lock<std::mutex> l(app.mu);
    long news = 0, statuses = 0, rejects = 0, resends = 0, window = 0, window_lost_new = 0, window_twice = 0;
    std::map<std::string, std::string> owner;  // OrderID -> ClOrdID
    int shown = 0;
    auto problem = [&](const std::string& id, const std::string& what) {
        failed = true;
        if (shown++ < 20) std::fprintf(stderr, "  ClOrdID %.40s: %s\n", id.c_str(), what.c_str());
    };
    for (const auto& kv : app.ledger) {
        const ledger_entry& e = kv.second;
        const std::string& id = kv.first;
        const long nn = static_cast<long>(e.news.size()), ns = static_cast<long>(e.statuses.size()),
                   nr = static_cast<long>(e.rejects.size());
        news += nn;
        statuses += ns;
        rejects += nr;
        resends += e.resends_sent;
        for (const std::string& p : e.problems) problem(id, p);
        if (nr != e.conflicts_sent)
            problem(id, std::to_string(nr) + " rejects for " + std::to_string(e.conflicts_sent) + " conflicts");
        if (e.spec.clordid.empty()) {  // the unencodable ClOrdID: only the reject
            if (nn + ns != 0) problem(id, "accepted, but it cannot be a key");
            continue;
        }
        if (e.crash_window) {
            ++window;
            if (nn == 0) ++window_lost_new;
            if (nn + ns == 2 + e.resends_sent) ++window_twice;
            if (nn > 1 || nn + ns < 1 + e.resends_sent || nn + ns > 2 + e.resends_sent)
                problem(id, "crash window: " + std::to_string(nn) + " New, " + std::to_string(ns) + " Order Status for " +
                                std::to_string(e.resends_sent) + " resends");
        } else if (nn != 1 || ns != e.resends_sent) {
            problem(id, std::to_string(nn) + " New, " + std::to_string(ns) + " Order Status for " +
                            std::to_string(e.resends_sent) + " resends");
        }
        if (e.order_ids.size() != 1) {
            problem(id, std::to_string(e.order_ids.size()) + " OrderIDs");
        } else {
            const auto ins = owner.emplace(*e.order_ids.begin(), id);
            if (!ins.second) problem(id, "OrderID " + ins.first->first + " also given to " + ins.first->second);
        }
    }
    std::printf(
        "fix_gateway_test: %zu ClOrdIDs, %ld New, %ld Order Status for %ld PossResend copies, %ld Rejected for "
        "%d conflicts; crash window %ld orders (%ld New lost, %ld answered twice); %.1f s\n",
        app.ledger.size(), news, statuses, resends, rejects, conflicts + 1, window, window_lost_new, window_twice,
        std::chrono::duration<double>(clock_type::now() - t0).count());
    std::fflush(stdout);
    l.unlock();  // the logout's onLogout takes app.mu
    initiator.stop();
    kill(gw, SIGTERM);
    waitpid(gw, nullptr, 0);
    std::printf("fix_gateway_test: %s\n", failed ? "FAILED" : "ledger holds");
    return failed ? 1 : 0;
}
