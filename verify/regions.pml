/*
 * verify/regions.pml: a SPIN model of the planned home-region takeover protocol for multi-region
 * deployments, for one shard (the keys whose home rule names region Y).
 *
 * What is modelled (docs/testing.md, section 1, "Home-region takeover"):
 *   - three lease stores L_Y, L_Z, L_W (one per region's PostgreSQL; with WITNESS_REGION=1, W is a
 *     pure witness that holds no data), each holding a row (owner, epoch, lease_until);
 *   - an abstract global clock `now` that advances by one tick at any moment, up to MAXT; the known
 *     maximum clock skew is folded into the taker's comparison as MARGIN (a region's own check
 *     `lease_until > now` uses the same clock);
 *   - the home Y at epoch 0: renewal (lease_until = now + LEASE written to the stores one at a time,
 *     in any order, each accepted only if the row still has epoch 0; Y advances its local view
 *     y_view only once a majority accepted; a higher epoch seen anywhere fences Y for good); grants
 *     (a first claim of key k: a commit of the decision at Y's data copy, allowed only while
 *     y_view > now and Y is not fenced);
 *   - replication of Y's decisions to the other data copies (Z's, and W's unless WITNESS_REGION):
 *     SYNC=1, the grant is acknowledged to the client once the decision reached another data copy
 *     (Z's or W's, whichever comes first; with WITNESS_REGION, Z's); SYNC=0, acknowledged at once, the
 *     copy follows later or never. A copy keeps the first decision it learns for a key;
 *   - Y crashes (stops taking steps; its region, lease store and data copy included, is gone for Z)
 *     or is partitioned (its remote lease writes and its replication stop arriving, its region is
 *     unreachable from Z; Y keeps running and granting while its local view is valid);
 *   - the unplanned takeover by Z: a read that finds a majority of the rows expired
 *     (lease_until + MARGIN <= now, epoch 0), then the conditional writes (owner Z, epoch 1,
 *     now + LEASE) one at a time (accepted if epoch 0 and expired; a row Z already took counts);
 *     Z is home once a majority accepted, else it gives up and may try again; then the catch-up
 *     (merge into Z's copy every decision held by the data-holding members of the majority it
 *     used), then Z grants the keys its merged copy does not hold.
 *
 * Ghost accounting: a grant counts when it is acknowledged to a client (Y: per SYNC above; Z, the
 * last home of the model: at its commit, which over-approximates). A commit at Y that is never
 * acknowledged (Y crashed or lost its lease before the copy arrived) told no client "acquired".
 *
 * Configuration (spin -D...):
 *   SYNC=1            sync replication of decisions (default); SYNC=0 async
 *   WITNESS_REGION=1  W is a witness without data (two data regions)
 *   ACK_FENCE=1       Y acknowledges a decision only while its local view is still valid and it is
 *                     not fenced (the fix for the late-acknowledgement flaw, docs/testing.md);
 *                     ACK_FENCE=0 is the protocol as first written
 *   CRASH=0, PARTITION=0   forbid the crash / the partition of Y (both allowed by default)
 *   Mutants (each must break one_grant):
 *   NO_CATCHUP=1      Z grants without merging the majority's copies
 *   MINORITY=1        one accepted store is a "majority" (Y's renewal and Z's takeover)
 *   NO_EXPIRY_WAIT=1  Z's read and conditional writes check the epoch only, not the expiry
 *   Bounds: MAXT (clock 0..6), LEASE (2 ticks), MARGIN (1 tick), NK (keys: 1, or 2)
 *
 * Properties (ltl blocks at the end): one_grant, acked_not_lost, and the reach_* witnesses.
 */

#ifndef SYNC
#define SYNC 1
#endif
#ifndef WITNESS_REGION
#define WITNESS_REGION 0
#endif
#ifndef ACK_FENCE
#define ACK_FENCE 1
#endif
#ifndef CRASH
#define CRASH 1
#endif
#ifndef PARTITION
#define PARTITION 1
#endif
#ifndef NO_CATCHUP
#define NO_CATCHUP 0
#endif
#ifndef MINORITY
#define MINORITY 0
#endif
#ifndef NO_EXPIRY_WAIT
#define NO_EXPIRY_WAIT 0
#endif
#ifndef MAXT
#define MAXT 6
#endif
#ifndef LEASE
#define LEASE 2
#endif
#ifndef MARGIN
#define MARGIN 1
#endif
#ifndef NK
#define NK 1
#endif

#if MINORITY
#define MAJ 1
#else
#define MAJ 2
#endif

/* lease stores and regions */
#define SY 0
#define SZ 1
#define SW 2
#define BIT(s) (1 << (s))
#define COUNT(m) (((m) & 1) + (((m) >> 1) & 1) + (((m) >> 2) & 1))

/* a data copy's entry for a key: no decision, Y's decision, Z's decision */
#define NONE 0
#define BY_Y 1
#define BY_Z 2

/* Y's decision in flight to a copy: not sent, in flight, delivered */
#define UNSENT 0
#define FLIGHT 1
#define ARRIVED 2

/* ---- lease stores ---------------------------------------------------------------------------- */
byte now = 0;
/* at the start Y holds the lease at epoch 0 in every store, until LEASE */
byte l_owner[3] = SY;     /* SY or SZ */
byte l_epoch[3] = 0;
byte l_until[3] = LEASE;

/* ---- region Y (home at epoch 0) -------------------------------------------------------------- */
bool y_crashed = false;
bool y_part = false;
bool y_fenced = false;    /* Y saw a higher epoch: it never grants again */
byte y_view = LEASE;      /* Y's local view of its lease: the value its grants check */
bool r_on = false;        /* a renewal in progress: its lease_until, stores tried, stores accepted */
byte r_until = 0;
byte r_tried = 0;
byte r_acc = 0;

/* ---- data copies of the shard's decisions, and Y's replication stream -------------------------- */
byte dY[NK];
byte dZ[NK];
byte dW[NK];
byte pZ[NK];              /* Y's decision of k towards Z's copy (UNSENT, FLIGHT, ARRIVED) */
byte pW[NK];              /* ... towards W's copy (never sent with WITNESS_REGION) */

/* ---- region Z (the taker) -------------------------------------------------------------------- */
byte zpc = 0;             /* 0 idle, 1 writing its rows, 2 home (not caught up), 3 home, granting */
byte z_tried = 0;
byte z_acc = 0;

/* ---- ghosts ---------------------------------------------------------------------------------- */
bool ya[NK];              /* Y acknowledged its decision of k to a client */
byte acks[NK];            /* grants of k acknowledged, by any region */
bool zg = false;          /* Z granted something */
#ifdef WITNESS
#define WITNESSED(w) w = true
#else
#define WITNESSED(w) skip
#endif
bool w_takeover = false;
bool w_acked_crash = false;
bool w_fenced = false;
bool w_part_grant = false;

/* who reaches which store (and that region's data copy) */
#define Y_REACHES(s) ((s) == SY || !y_part)
#define Z_REACHES(s) ((s) != SY || !(y_part || y_crashed))
#if NO_EXPIRY_WAIT
#define TAKEABLE(s) (l_epoch[s] == 0)
#else
#define TAKEABLE(s) (l_epoch[s] == 0 && l_until[s] + MARGIN <= now)
#endif
#define EXPIRED_SEEN (((Z_REACHES(SY) && TAKEABLE(SY)) -> 1 : 0) + \
                      ((Z_REACHES(SZ) && TAKEABLE(SZ)) -> 1 : 0) + \
                      ((Z_REACHES(SW) && TAKEABLE(SW)) -> 1 : 0))
#define Y_MAY_GRANT (!y_crashed && !y_fenced && y_view > now)

inline ack(k) {
  ya[k] = true; acks[k]++;
  printf("MSC: Y acknowledges its grant of key %d\n", k)
}

/* ---- the clock --------------------------------------------------------------------------------- */
active proctype clock() {
end_clock:
  do
  :: atomic { now < MAXT -> now++; printf("MSC: now = %d\n", now) }
  od
}

/* ---- region Y: renewal, grants, acknowledgements -------------------------------------------------- */
inline renew_at(s) {
  r_tried = r_tried | BIT(s);
  if
  :: !Y_REACHES(s) -> printf("MSC: Y's renewal write to store %d does not arrive (partition)\n", s)
  :: Y_REACHES(s) && l_epoch[s] == 0 ->
     l_owner[s] = SY; l_until[s] = r_until; r_acc = r_acc | BIT(s);
     printf("MSC: store %d accepts Y's renewal (epoch 0, until %d)\n", s, r_until)
  :: Y_REACHES(s) && l_epoch[s] != 0 ->
     y_fenced = true; WITNESSED(w_fenced);
     printf("MSC: store %d rejects Y's renewal: epoch %d, Y is fenced\n", s, l_epoch[s])
  fi
}

inline grant(k) {
  dY[k] = BY_Y; pZ[k] = FLIGHT;
#if !WITNESS_REGION
  pW[k] = FLIGHT;
#endif
  if :: y_part -> WITNESSED(w_part_grant) :: else -> skip fi;
  printf("MSC: Y grants key %d (commit at Y; view valid until %d, now %d)\n", k, y_view, now);
#if !SYNC
  ack(k)
#endif
}

#if WITNESS_REGION
#define REACHED(k) (pZ[k] == ARRIVED)
#else
#define REACHED(k) (pZ[k] == ARRIVED || pW[k] == ARRIVED)
#endif
#if ACK_FENCE
#define MAY_ACK (!y_fenced && y_view > now)
#else
#define MAY_ACK true
#endif

active proctype regionY() {
end_y:
  do
  :: atomic { !y_crashed && !y_fenced && !r_on -> r_on = true; r_until = now + LEASE; r_tried = 0; r_acc = 0;
       printf("MSC: Y starts a renewal (until %d)\n", r_until) }
  :: atomic {
       !y_crashed && r_on ->
       if
       :: !(r_tried & BIT(SY)) -> renew_at(SY)
       :: !(r_tried & BIT(SZ)) -> renew_at(SZ)
       :: !(r_tried & BIT(SW)) -> renew_at(SW)
       fi;
       if
       :: y_fenced -> r_on = false
       :: !y_fenced && COUNT(r_acc) >= MAJ -> y_view = r_until; r_on = false;
          printf("MSC: Y's renewal has %d stores: local view valid until %d\n", COUNT(r_acc), y_view)
       :: !y_fenced && COUNT(r_acc) < MAJ && r_tried == 7 -> r_on = false;
          printf("MSC: Y's renewal failed (%d stores)\n", COUNT(r_acc))
       :: else -> skip
       fi;
       if :: !r_on -> r_until = 0; r_tried = 0; r_acc = 0 :: else -> skip fi
     }
  :: atomic { Y_MAY_GRANT && dY[0] == NONE -> grant(0) }
#if SYNC
  :: atomic { !y_crashed && dY[0] == BY_Y && !ya[0] && REACHED(0) && MAY_ACK -> ack(0) }
#endif
#if NK > 1
  :: atomic { Y_MAY_GRANT && dY[1] == NONE -> grant(1) }
#if SYNC
  :: atomic { !y_crashed && dY[1] == BY_Y && !ya[1] && REACHED(1) && MAY_ACK -> ack(1) }
#endif
#endif
  od
}

/* ---- Y's replication stream: a decision in flight arrives at a copy, while Y runs and is reachable.
   A copy keeps the first decision it learns for a key (the arrival still counts as reached). ---- */
inline arrive_z(k) {
  pZ[k] = ARRIVED;
  if :: dZ[k] == NONE -> dZ[k] = BY_Y :: else -> skip fi;
  printf("MSC: Y's decision of key %d reaches Z's copy\n", k)
}
inline arrive_w(k) {
  pW[k] = ARRIVED;
  if :: dW[k] == NONE -> dW[k] = BY_Y :: else -> skip fi;
  printf("MSC: Y's decision of key %d reaches W's copy\n", k)
}

active proctype replication() {
end_repl:
  do
  :: atomic { !y_crashed && !y_part && pZ[0] == FLIGHT -> arrive_z(0) }
#if !WITNESS_REGION
  :: atomic { !y_crashed && !y_part && pW[0] == FLIGHT -> arrive_w(0) }
#endif
#if NK > 1
  :: atomic { !y_crashed && !y_part && pZ[1] == FLIGHT -> arrive_z(1) }
#if !WITNESS_REGION
  :: atomic { !y_crashed && !y_part && pW[1] == FLIGHT -> arrive_w(1) }
#endif
#endif
  od
}

/* ---- faults of Y ---------------------------------------------------------------------------------- */
active proctype faults() {
end_faults:
  do
  :: atomic { CRASH && !y_crashed && !y_part -> y_crashed = true;
       if :: ya[0] || ya[NK - 1] -> WITNESSED(w_acked_crash) :: else -> skip fi;
       printf("MSC: Y CRASHES\n") }
  :: atomic { PARTITION && !y_part && !y_crashed -> y_part = true; printf("MSC: Y is PARTITIONED\n") }
  od
}

/* ---- region Z: takeover, catch-up, grants ---------------------------------------------------------- */
inline take_at(s) {
  z_tried = z_tried | BIT(s);
  if
  :: Z_REACHES(s) && TAKEABLE(s) ->
     l_owner[s] = SZ; l_epoch[s] = 1; l_until[s] = now + LEASE; z_acc = z_acc | BIT(s);
     printf("MSC: store %d accepts Z's takeover (epoch 1, until %d)\n", s, l_until[s])
  :: Z_REACHES(s) && l_owner[s] == SZ && l_epoch[s] == 1 -> z_acc = z_acc | BIT(s)
  :: else -> printf("MSC: store %d refuses Z's takeover (or is unreachable)\n", s)
  fi
}

/* merge the data copy of a majority member into Z's copy */
#if NK > 1
#define MERGE(d) if :: dZ[0] == NONE -> dZ[0] = d[0] :: else -> skip fi; \
                 if :: dZ[1] == NONE -> dZ[1] = d[1] :: else -> skip fi
#else
#define MERGE(d) if :: dZ[0] == NONE -> dZ[0] = d[0] :: else -> skip fi
#endif

inline zgrant(k) {
  dZ[k] = BY_Z; acks[k]++; zg = true;
  printf("MSC: Z grants key %d\n", k)
}

active proctype regionZ() {
end_z:
  do
  :: atomic { zpc == 0 && EXPIRED_SEEN >= MAJ -> zpc = 1; z_tried = 0; z_acc = 0;
       printf("MSC: Z reads %d rows it may take (epoch 0, expired; now %d): takes over\n", EXPIRED_SEEN, now) }
  :: atomic {
       zpc == 1 ->
       if
       :: !(z_tried & BIT(SY)) -> take_at(SY)
       :: !(z_tried & BIT(SZ)) -> take_at(SZ)
       :: !(z_tried & BIT(SW)) -> take_at(SW)
       fi;
       if
       :: COUNT(z_acc) >= MAJ -> zpc = 2; z_tried = 0; WITNESSED(w_takeover);
          printf("MSC: Z is home at epoch 1 (stores %d)\n", z_acc)
       :: COUNT(z_acc) < MAJ && z_tried == 7 -> zpc = 0; z_tried = 0; z_acc = 0;
          printf("MSC: Z's takeover failed\n")
       :: else -> skip
       fi
     }
  /* catch-up: the data-holding members of the majority must be reachable */
  :: atomic {
       zpc == 2 && (!(z_acc & BIT(SY)) || Z_REACHES(SY)) ->
#if !NO_CATCHUP
       if :: z_acc & BIT(SY) -> MERGE(dY) :: else -> skip fi;
#if !WITNESS_REGION
       if :: z_acc & BIT(SW) -> MERGE(dW) :: else -> skip fi;
#endif
#endif
       zpc = 3;
       printf("MSC: Z caught up (its copy of key 0: %d; 0 none, 1 Y's decision)\n", dZ[0])
     }
  :: atomic { zpc == 3 && dZ[0] == NONE -> zgrant(0) }
#if NK > 1
  :: atomic { zpc == 3 && dZ[1] == NONE -> zgrant(1) }
#endif
  od
}

/* ---- properties ----------------------------------------------------------------------------------- */
/* Y's acknowledged decisions are in Z's copy as Y's, once Z has granted anything */
#define LOST ((ya[0] && dZ[0] != BY_Y) || (ya[NK - 1] && dZ[NK - 1] != BY_Y))
ltl one_grant        { [] (acks[0] <= 1 && acks[NK - 1] <= 1) }
ltl acked_not_lost   { [] !(zg && LOST) }

/* reachability witnesses (expected to be violated) */
ltl reach_takeover          { [] !w_takeover }
ltl reach_acked_then_crash  { [] !w_acked_crash }
ltl reach_fenced_renewal    { [] !w_fenced }
ltl reach_partitioned_grant { [] !w_part_grant }
