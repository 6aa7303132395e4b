// fix_acceptor.cpp: the QuickFIX side of the gateway. Compiled as C++14 (see fix_acceptor.hpp).
//
// Messages are read and written field by field (FIX::Message::getField/setField) with no data
// dictionary (UseDataDictionary=N, README "Data dictionary"): the gateway reads seven tags of one
// message type and writes one.
#include "fix_acceptor.hpp"

#include <quickfix/Application.h>
#include <quickfix/FileStore.h>
#include <quickfix/Session.h>
#include <quickfix/SessionSettings.h>
#include <quickfix/ThreadedSocketAcceptor.h>

#include <atomic>
#include <chrono>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace fixgw {
namespace {

std::string field_or(const FIX::FieldMap& m, int tag, const std::string& fallback = "") {
    return m.isSetField(tag) ? m.getField(tag) : fallback;
}

class gateway_app final : public FIX::Application {
public:
    explicit gateway_app(const std::function<order_answer(const new_order&)>& on_order) : on_order_(on_order) {
        // ExecIDs must be unique across restarts (a resent ExecutionReport keeps its ExecID, so the
        // client can tell a resend from a new report): prefix them with this process's start time.
        exec_prefix_ = std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count()) +
                       "-";
    }

    void onCreate(const FIX::SessionID&) override {}
    void onLogon(const FIX::SessionID&) override {}
    void onLogout(const FIX::SessionID&) override {}
    void toAdmin(FIX::Message&, const FIX::SessionID&) override {}
    void fromAdmin(const FIX::Message&, const FIX::SessionID&) throw(FIX::FieldNotFound, FIX::IncorrectDataFormat,
                                                                     FIX::IncorrectTagValue, FIX::RejectLogon) override {}
    void toApp(FIX::Message&, const FIX::SessionID&) throw(FIX::DoNotSend) override {}

    void fromApp(const FIX::Message& msg, const FIX::SessionID& sid) throw(FIX::FieldNotFound, FIX::IncorrectDataFormat,
                                                                           FIX::IncorrectTagValue,
                                                                           FIX::UnsupportedMessageType) override {
        const FIX::Header& h = msg.getHeader();
        if (h.getField(FIX::FIELD::MsgType) != "D") throw FIX::UnsupportedMessageType();
        new_order o;
        o.sender = h.getField(FIX::FIELD::SenderCompID);
        o.clordid = msg.getField(FIX::FIELD::ClOrdID);  // required: FieldNotFound -> session Reject
        o.symbol = msg.getField(FIX::FIELD::Symbol);
        o.side = msg.getField(FIX::FIELD::Side);
        o.quantity = msg.getField(FIX::FIELD::OrderQty);
        o.ord_type = msg.getField(FIX::FIELD::OrdType);
        o.price = field_or(msg, FIX::FIELD::Price);
        o.poss_dup = field_or(h, FIX::FIELD::PossDupFlag) == "Y";
        o.poss_resend = field_or(h, FIX::FIELD::PossResend) == "Y";

        const order_answer a = on_order_(o);

        FIX::Message er;
        er.getHeader().setField(FIX::FIELD::MsgType, "8");
        er.setField(FIX::FIELD::OrderID, a.order_id);
        er.setField(FIX::FIELD::ExecID, exec_prefix_ + std::to_string(++exec_seq_));
        er.setField(FIX::FIELD::ClOrdID, o.clordid);
        er.setField(FIX::FIELD::Symbol, o.symbol);
        er.setField(FIX::FIELD::Side, o.side);
        er.setField(FIX::FIELD::OrderQty, o.quantity);
        er.setField(FIX::FIELD::OrdType, o.ord_type);
        if (!o.price.empty()) er.setField(FIX::FIELD::Price, o.price);
        er.setField(FIX::FIELD::CumQty, "0");
        er.setField(FIX::FIELD::AvgPx, "0");
        switch (a.kind) {
            case answer_kind::accepted:
                er.setField(FIX::FIELD::ExecType, "0");
                er.setField(FIX::FIELD::OrdStatus, "0");
                er.setField(FIX::FIELD::LeavesQty, o.quantity);
                break;
            case answer_kind::status:
                er.setField(FIX::FIELD::ExecType, "I");
                er.setField(FIX::FIELD::OrdStatus, "0");
                er.setField(FIX::FIELD::LeavesQty, o.quantity);
                break;
            case answer_kind::rejected:
                er.setField(FIX::FIELD::ExecType, "8");
                er.setField(FIX::FIELD::OrdStatus, "8");
                er.setField(FIX::FIELD::LeavesQty, "0");
                er.setField(FIX::FIELD::OrdRejReason, std::to_string(a.rej_reason));
                break;
        }
        if (!a.text.empty()) er.setField(FIX::FIELD::Text, a.text);
        FIX::Session::sendToTarget(er, sid);
    }

private:
    const std::function<order_answer(const new_order&)>& on_order_;
    std::string exec_prefix_;
    std::atomic<unsigned long long> exec_seq_{0};
};

}  // namespace

void run_acceptor(const acceptor_config& c, const std::function<order_answer(const new_order&)>& on_order,
                  const std::function<bool()>& stop) {
    std::ostringstream cfg;
    cfg << "[DEFAULT]\nConnectionType=acceptor\nSocketAcceptPort=" << c.port
        << "\nSocketReuseAddress=Y\nFileStorePath=" << c.store_dir
        << "\nStartTime=00:00:00\nEndTime=00:00:00\nUseDataDictionary=N\n"
        << "[SESSION]\nBeginString=FIX.4.4\nSenderCompID=" << c.sender_comp_id << "\nTargetCompID=" << c.target_comp_id
        << "\n";
    std::istringstream in(cfg.str());
    try {
        FIX::SessionSettings settings(in);
        gateway_app app(on_order);
        FIX::FileStoreFactory store(settings);
        FIX::ThreadedSocketAcceptor acceptor(app, store, settings);
        acceptor.start();
        while (!stop()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        acceptor.stop();
    } catch (const FIX::Exception& e) {
        throw std::runtime_error(std::string("QuickFIX acceptor: ") + e.what());
    }
}

}  // namespace fixgw
