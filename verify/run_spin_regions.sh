#!/usr/bin/env bash
# verify/run_spin_regions.sh: model-checks verify/regions.pml (the home-region takeover protocol for
# multi-region deployments, one shard) with SPIN and checks every verdict against what the design
# promises.
#
#   verify/run_spin_regions.sh [--full] [--work DIR]
#
# Same method as verify/run_spin.sh: each configuration is compiled once per search kind (spin -a,
# then cc -DSAFETY: every property is a [] p invariant) and searched exhaustively once per property
# (depth first for a property expected to hold; breadth first, with the reach_* witnesses compiled in,
# for one expected to be violated, so that its counterexample is a shortest one, replayed and printed
# as a message sequence). The reach_* properties are witnesses that must be violated: a takeover
# happens, Y crashes after acknowledging a grant, a renewal meets a higher epoch, a partitioned Y
# grants while its lease is valid.
#
# sync and sync-witness are the protocol (with the acknowledgement fenced by the lease, ACK_FENCE=1):
# one_grant and acked_not_lost must hold. async must violate both (the documented async loss window).
# unfenced-ack and unfenced-ack-witness are the protocol as first written (ACK_FENCE=0: Y acknowledges
# a grant whenever its copy arrived, even after its lease ran out): SPIN finds the late acknowledgement
# after Z's takeover (docs/testing.md). no-catchup, minority and no-expiry-wait are mutants: SPIN must
# find the double grant in each.
#
# --full raises the bounds (two keys instead of one; about 2.5 minutes on 2 cores). Exit status:
# 0 when every verdict is as expected. Needs: spin (Debian package `spin`) and a C compiler.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
model=$here/regions.pml
bounds="-DNK=1 -DMAXT=6"
work=""
while [ $# -gt 0 ]; do
  case $1 in
    --full) bounds="-DNK=2 -DMAXT=6" ;;
    --work) work=$2; shift ;;
    *) echo "usage: $0 [--full] [--work DIR]" >&2; exit 2 ;;
  esac
  shift
done
command -v spin >/dev/null || { echo "run_spin_regions: spin is not installed (apt-get install spin)" >&2; exit 1; }
cc=${CC:-cc}
if [ -z "$work" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"

# name | -D flags | property=expectation ...
configs=(
  "sync|-DSYNC=1 $bounds|one_grant=holds acked_not_lost=holds reach_takeover=violated reach_acked_then_crash=violated reach_fenced_renewal=violated reach_partitioned_grant=violated"
  "sync-witness|-DSYNC=1 -DWITNESS_REGION=1 $bounds|one_grant=holds acked_not_lost=holds reach_takeover=violated reach_acked_then_crash=violated reach_fenced_renewal=violated reach_partitioned_grant=violated"
  "async|-DSYNC=0 $bounds|one_grant=violated acked_not_lost=violated reach_takeover=violated"
  "unfenced-ack|-DSYNC=1 -DACK_FENCE=0 $bounds|one_grant=violated acked_not_lost=violated"
  "unfenced-ack-witness|-DSYNC=1 -DWITNESS_REGION=1 -DACK_FENCE=0 $bounds|one_grant=violated acked_not_lost=violated"
  "no-catchup|-DSYNC=1 -DNO_CATCHUP=1 $bounds|one_grant=violated acked_not_lost=violated"
  "minority|-DSYNC=1 -DMINORITY=1 $bounds|one_grant=violated"
  "no-expiry-wait|-DSYNC=1 -DNO_EXPIRY_WAIT=1 $bounds|one_grant=violated"
)

source "$here/spin_search.sh"
spin_search
