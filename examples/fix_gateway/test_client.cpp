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

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
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
    bool crash_window = false;
    std::set<std::string> news, statuses, rejects;  // ExecIDs by ExecType
    std::set<std::string> order_ids;                 // from New and Order Status
    std::vector<std::string> problems;               // wrong reject reason or text
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

pid_t start_gateway(const std::string& binary, const std::string& dir, int port) {
    const pid_t pid = fork();
    if (pid != 0) return pid;
    const int log = open((dir + "/gateway.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(log, 1);
    dup2(log, 2);
    const std::string p = std::to_string(port), db = dir + "/gateway.db", store = dir + "/gateway-fix-store";
    execl(binary.c_str(), binary.c_str(), "--port", p.c_str(), "--db", db.c_str(), "--fix-store", store.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
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
    pid_t gw = start_gateway(gateway, dir, port);

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
    auto send = [&](const order_spec& o, bool poss_resend, bool pipelined) {
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
        }
        FIX::Session::sendToTarget(m, sid);
    };
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
                }
                kill(gw, SIGKILL);
                waitpid(gw, nullptr, 0);
                gw = start_gateway(gateway, dir, port);
            }
            send(orders[static_cast<std::size_t>(i)], false, pipelined);
            const int j = i - 5;  // the PossResend copy goes a few orders after its original
            if (j >= 0 && resend[static_cast<std::size_t>(j)]) {
                {
                    std::lock_guard<std::mutex> l(app.mu);
                    ++app.ledger[orders[static_cast<std::size_t>(j)].clordid].resends_sent;
                }
                send(orders[static_cast<std::size_t>(j)], true, pipelined);
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

    send_range(n / 2, n * 7 / 10, true, n * 6 / 10);
    wait_answers("3: gateway SIGKILL + restart");

    send_range(n * 7 / 10, n, true, -1);
    for (int j = n - 5; j < n; ++j)
        if (resend[static_cast<std::size_t>(j)]) {
            {
                std::lock_guard<std::mutex> l(app.mu);
                ++app.ledger[orders[static_cast<std::size_t>(j)].clordid].resends_sent;
            }
            send(orders[static_cast<std::size_t>(j)], true, true);
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
        send(o, false, true);
        ++conflicts;
    }
    for (int i = 50; i < n; i += 500) {  // 0.2%: the same order again, not flagged as a resend
        {
            std::lock_guard<std::mutex> l(app.mu);
            ++app.ledger[orders[static_cast<std::size_t>(i)].clordid].conflicts_sent;
        }
        send(orders[static_cast<std::size_t>(i)], false, true);
        ++conflicts;
    }
    order_spec too_long = orders[0];
    too_long.clordid = std::string(130, 'L');  // with "7:CLIENT" in front, over the 128-byte key limit
    {
        std::lock_guard<std::mutex> l(app.mu);
        app.ledger[too_long.clordid].conflicts_sent = 1;  // spec left empty: expects OrdRejReason 99
    }
    send(too_long, false, true);
    wait_answers("5: conflicting ClOrdIDs");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let a stray extra report show

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
    std::printf("fix_gateway_test: %zu ClOrdIDs, %ld New, %ld Order Status for %ld PossResend copies, %ld Rejected for "
                "%d conflicts; crash window %ld orders (%ld New lost, %ld answered twice); %.1f s\n",
                app.ledger.size(), news, statuses, resends, rejects, conflicts + 1, window, window_lost_new,
                window_twice, std::chrono::duration<double>(clock_type::now() - t0).count());
    std::fflush(stdout);
    l.unlock();  // the logout's onLogout takes app.mu
    initiator.stop();
    kill(gw, SIGTERM);
    waitpid(gw, nullptr, 0);
    std::printf("fix_gateway_test: %s\n", failed ? "FAILED" : "ledger holds");
    return failed ? 1 : 0;
}
