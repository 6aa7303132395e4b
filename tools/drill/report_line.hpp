// tools/drill/report_line.hpp: how a worker process reports to the process that started it: one line
// on its stdout, "word k1=v1 k2=v2 ...", with numeric fields. `idem drill-worker` and the processes
// of `idem demo --processes N` report this way.
//
// The drill worker's lines:
//   "ready recovery_ns=N records=N processing=N compensated_at_open=N compensated_after_wait=N
//    waited_ms=N pending=N"                      after recovery and compensation, before any request
//   "done requests=N executed=N acked=N replayed=N busy=N in_doubt=N unavailable=N unacked=N
//    unexpected=N replay_mismatches=N"           after the last request (a run that was not killed)
//   "refused <message>"                          the store would not open (another writer holds the
//                                                file, ...): the worker exits 3
// and with --stop-on-unavailable (`idem drill --delete-file`):
//   "claim_ok t=N", "ack_ok t=N"                 a confirmed claim or acknowledgement; N is the
//                                                steady clock (ns) when its call was made
//   "error <message>"                            after "done": the store's last error
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace idem::tool::drill {

/// Parses "word k1=v1 k2=v2 ..." into the word and its numeric fields.
struct report_line {
    std::string word;
    std::map<std::string, std::int64_t> fields;
    [[nodiscard]] std::int64_t get(const std::string& k) const {
        const auto it = fields.find(k);
        return it == fields.end() ? 0 : it->second;
    }
};

inline report_line parse_report(std::string_view line) {
    report_line r;
    std::size_t pos = 0;
    bool first = true;
    while (pos < line.size()) {
        const std::size_t end = std::min(line.find(' ', pos), line.size());
        const std::string_view tok = line.substr(pos, end - pos);
        if (first) {
            r.word = std::string(tok);
            first = false;
        } else if (const auto eq = tok.find('='); eq != std::string_view::npos) {
            std::int64_t v = 0;
            const std::string_view num = tok.substr(eq + 1);
            std::from_chars(num.data(), num.data() + num.size(), v);
            r.fields[std::string(tok.substr(0, eq))] = v;
        }
        pos = end + 1;
    }
    return r;
}

}  // namespace idem::tool::drill
