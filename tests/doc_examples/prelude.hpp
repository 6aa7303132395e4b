// The names a fragment in the docs or a header's example may use without declaring them: the
// application's side of an example (what it executes, how it replies, where it asks what happened)
// and the inputs the example takes as given. Nothing of idem's is declared here: an example
// includes the idem headers it needs (a header's own example gets its header).
// See tests/doc_examples.cmake for how examples are found and compiled.
#pragma once

#include <idem/idem.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace idem_doc_example {
inline idem::options opts;                             // the options the application chose
inline const idem::key key{"TX1_TRANSFER_v1"};         // the request's idempotency key
inline const std::string txid = "TX20230615123456";    // the request's transaction id
inline const std::uint64_t fingerprint = 0x5eed;       // the request's payload fingerprint
inline void execute() {}                               // the operation guarded
inline std::uint64_t transfer() { return 7001; }       // an operation that returns its receipt
inline void reply(std::uint64_t /*outcome*/) {}        // answer the client with an outcome
inline void reply_busy(idem::begin_status /*why*/) {}  // answer the client "try later"
inline idem::resolver_answer ask_the_ledger(std::string_view /*key*/) { return {}; }  // did it run?
}  // namespace idem_doc_example
