// idem/detail/node_identity.hpp: the default node identity every store and guard writes into the
// audit trail's node column (store::node, store_options::node, global_options::node when empty).
//
// Format "HOST:PID:RRRRRR": the host name cut to 40 bytes, the process id, and 6 random hex digits.
// The random part tells apart two processes with the same host name and pid (containers, each its
// pid 1) and two lives of one pid; that matters where the node owns claims (a global guard
// completes only the claims its node took). 40 bytes keep the whole within the 64 characters of the
// SQL stores' node column.
#pragma once

#include <cstdio>
#include <random>
#include <string>

#include <unistd.h>

namespace idem::detail {

[[nodiscard]] inline std::string default_node() {
    char host[64] = {};
    if (::gethostname(host, sizeof host - 1) != 0) host[0] = '?';
    char tail[16];
    std::snprintf(tail, sizeof tail, "%06x", static_cast<unsigned>(std::random_device{}() & 0xffffff));
    return std::string(host).substr(0, 40) + ":" + std::to_string(::getpid()) + ":" + tail;
}

}  // namespace idem::detail
