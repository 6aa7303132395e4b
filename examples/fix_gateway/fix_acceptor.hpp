// fix_acceptor.hpp: the plain C++ seam between the QuickFIX acceptor (fix_acceptor.cpp, C++14)
// and the gateway's idem side (gateway.cpp, C++20).
//
// QuickFIX 1.15.1's headers use dynamic exception specifications (throw(FIX::FieldNotFound)),
// which C++17 removed, so no translation unit that includes them can be C++20. This header holds
// only standard types and compiles in both: the QuickFIX side turns each NewOrderSingle into a
// new_order, asks the callback for an order_answer, and writes that answer as an ExecutionReport.
#pragma once

#include <functional>
#include <string>

namespace fixgw {

/// One NewOrderSingle (35=D) as received; field values are the tags' text, unparsed.
struct new_order {
    std::string sender;        ///< 49 SenderCompID
    std::string clordid;       ///< 11 ClOrdID
    std::string symbol;        ///< 55
    std::string side;          ///< 54
    std::string quantity;      ///< 38 OrderQty
    std::string price;         ///< 44 Price ("" for a market order)
    std::string ord_type;      ///< 40 OrdType
    bool poss_dup = false;     ///< 43 PossDupFlag=Y: the engine resent this message (same MsgSeqNum)
    bool poss_resend = false;  ///< 97 PossResend=Y: the application resent this order (new MsgSeqNum)
};

/// What the gateway answers; each becomes one ExecutionReport (35=8).
enum class answer_kind {
    accepted,  ///< ExecType=0 New, OrdStatus=0 New
    status,    ///< ExecType=I Order Status, OrdStatus=0 New: the order already exists
    rejected,  ///< ExecType=8 Rejected, OrdStatus=8 Rejected, with OrdRejReason and Text
};

struct order_answer {
    answer_kind kind = answer_kind::rejected;
    std::string order_id = "NONE";  ///< 37 OrderID (FIX 4.4 requires the tag; "NONE" on a reject)
    int rej_reason = 99;            ///< 103 OrdRejReason, rejects only (6 = Duplicate Order, 99 = Other)
    std::string text;               ///< 58 Text
};

struct acceptor_config {
    int port = 0;                ///< loopback port to listen on
    std::string sender_comp_id;  ///< the gateway's CompID (the client's TargetCompID)
    std::string target_comp_id;  ///< the client's CompID
    std::string store_dir;       ///< QuickFIX FileStore directory (sequence numbers, sent messages)
};

/// Runs a QuickFIX acceptor until stop() returns true (polled every 100 ms). on_order is called on
/// the session's thread, one message at a time, in MsgSeqNum order. Throws std::runtime_error when
/// the acceptor cannot start.
void run_acceptor(const acceptor_config& config, const std::function<order_answer(const new_order&)>& on_order,
                  const std::function<bool()>& stop);

}  // namespace fixgw
