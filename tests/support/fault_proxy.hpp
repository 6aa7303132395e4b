// tests/support/fault_proxy.hpp: the drill's fault-injecting loopback proxy (tools/drill/fault_proxy.hpp),
// for the tests and benchmarks that put latency, cuts and partitions between processes and servers.
#pragma once

#include "drill/fault_proxy.hpp"

namespace idem_test {
using idem::tool::drill::fault_proxy;
}  // namespace idem_test
