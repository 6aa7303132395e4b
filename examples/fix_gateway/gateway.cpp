// gateway.cpp: a FIX 4.4 order gateway that accepts each NewOrderSingle once, with idem.
//
//   fix_gateway --port 9878 --db gateway.db --fix-store fix-store/
//
// The order's idempotency key is (SenderCompID, ClOrdID); its fingerprint is (symbol, side,
// quantity, price, order type), so a ClOrdID reused for another order is told apart from a resend
// of the same one. The gateway assigns each accepted order an OrderID (order_ids) and records it
// as the claim's outcome, so a resend is answered with the original OrderID. The store is SQLite in
// sync mode: begin() and succeed() return after their commit, so every order acknowledged before a
// crash is in the store.
// README.md explains each answer against the FIX 4.4 specification.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include <idem/durable.hpp>
#include <idem/sqlite_store.hpp>

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

fixgw::order_answer on_order(idem::durable_guard& g, order_ids& ids, const fixgw::new_order& o) {
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
            fixgw::order_answer a;
            a.kind = fixgw::answer_kind::accepted;
            a.order_id = std::to_string(order_id);
            return a;
        }
        case idem::begin_status::succeeded: {
            if (!o.poss_dup && !o.poss_resend)  // a new order reusing a ClOrdID (FIX 4.4 Vol 6, ClOrdID (11): unique per day)
                return reject(6, "Duplicate ClOrdID " + o.clordid + ": already accepted as OrderID " +
                                     std::to_string(r.outcome));
            fixgw::order_answer a;
            a.kind = fixgw::answer_kind::status;
            a.order_id = std::to_string(r.outcome);
            a.text = "possible resend of ClOrdID " + o.clordid;
            return a;
        }
        case idem::begin_status::payload_mismatch:
            return reject(6, "Duplicate ClOrdID " + o.clordid + ": used before for a different order");
        default: {
            std::string s = idem::to_string(r.status);
            return reject(99, "order " + o.clordid + " not accepted now (" + s + "); resend it with PossResend=Y");
        }
    }
}

int usage() {
    std::fprintf(stderr, "usage: fix_gateway --port N --db PATH --fix-store DIR [--sender ID] [--target ID]\n");
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    fixgw::acceptor_config cfg;
    cfg.sender_comp_id = "GATEWAY";
    cfg.target_comp_id = "CLIENT";
    std::string db;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string_view a = argv[i];
        if (a == "--port") cfg.port = std::atoi(argv[i + 1]);
        else if (a == "--db") db = argv[i + 1];
        else if (a == "--fix-store") cfg.store_dir = argv[i + 1];
        else if (a == "--sender") cfg.sender_comp_id = argv[i + 1];
        else if (a == "--target") cfg.target_comp_id = argv[i + 1];
        else return usage();
    }
    if (cfg.port <= 0 || db.empty() || cfg.store_dir.empty() || argc % 2 == 0) return usage();
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
        std::printf("fix_gateway: port %d, %zu records recovered from %s\n", cfg.port, g.recovery().records, db.c_str());
        std::fflush(stdout);
        fixgw::run_acceptor(
            cfg, [&g, &ids](const fixgw::new_order& o) { return on_order(g, ids, o); }, [] { return stop_requested != 0; });
        g.flush();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "fix_gateway: %s\n", e.what());
        return 1;
    }
    return 0;
}
