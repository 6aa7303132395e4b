// tools/drill/regions_drill.hpp: `idem drill --region NAME=URI ...`, the regions drill
// (regions_drill.cpp, PostgreSQL builds). drill.cpp parses the command line and hands it over.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace idem::tool {

struct regions_drill_config {
    std::vector<std::string> regions;  ///< NAME=URI, 3 or 4 clusters on loopback
    bool synchronous = false;          ///< replication_mode::synchronous (and the lost-region phase)
    double rtt_ms = 20;                ///< injected round trip between regions
    double home_lease_ms = 3000;       ///< home leases (home_lease.hpp); margin = a third of it
    unsigned cycles = 8;
    unsigned keys = 60;  ///< new keys per cycle, spread over the home regions
    unsigned threads = 4;
    double kill_min_ms = 300;
    double kill_max_ms = 2500;
    std::uint64_t seed = 0;
    bool json = false;
    bool keep = false;       ///< keep the drill directory and what the drill set up in the clusters
    std::string prometheus;  ///< --prometheus FILE; empty: none
    /// The negative control (hidden --no-guard): workers execute every request without idem, so
    /// the checks must fail; the tests use it to show that they can.
    bool no_guard = false;
};

/// Runs the regions drill; returns an exit_code (command.hpp).
int run_regions_drill(const regions_drill_config& c);

}  // namespace idem::tool
