/*
 * verify/idem.pml: a SPIN model of idem's protocol for one key.
 *
 * What is modelled (docs/testing.md maps every step to the function that implements it):
 *   - the slot's state word: state, fence, doubt mark, with the transient states `claiming` and
 *     `completing` that only the thread whose CAS entered them may leave (include/idem/detail/table/slot.hpp);
 *   - workers that claim (begin), execute the effect, renew (extend) and complete (succeed / fail),
 *     or pause forever at any point (a paused owner is a process that takes no more steps);
 *   - the lease, as an abstract clock that may expire a processing claim at any moment;
 *   - compensation with a resolver (engine::compensate / resolve_claim), including the lease
 *     re-check under `completing`;
 *   - the flush queue (bounded; a full queue undoes the transition: backpressure), the flusher and
 *     the store, whose record keeps the highest fence (store::apply);
 *   - sync mode (group commit: a transition is acknowledged when its row has committed, else the
 *     caller is told store_unavailable) and async mode (acknowledged at once);
 *   - sync mode, durable before visible: a terminal result (succeeded / failed, by its owner or by
 *     compensation) is published with the unconfirmed mark (the doubt bit on a terminal word; the
 *     position of its row in lease_until), the owner clears the mark once the row committed or, when
 *     its wait times out, sets the gave-up flag and keeps the mark; readers (a begin() that meets the
 *     record: a duplicate) answer in_progress, or in_doubt after the owner gave up, until the row is
 *     durable, then the recorded state (engine::complete, confirm, unconfirmed, existing);
 *   - a crash that loses memory, the queue and every thread's progress, then a restart that
 *     recovers the record from the store (durable_guard::recover) and lets one caller retry the key;
 *   - the downstream system where the effect happens. It survives crashes. With FENCED it honours
 *     the fencing token the way the seed's checkTxStatus + fenced write does: a resolver that answers
 *     "not executed" for fence f closes the downstream to fences <= f;
 *   - with ROTATION: a generation rotation with a cold window (engine::rotate_if_due): a rotator that
 *     scans, waits for the flush marks, reads the slot for the window's filter with the seqlock read
 *     (two reads of the word, anything may happen between them: a torn read), adds a terminal record
 *     to the filter, and in its eviction pass recycles the slot (the key leaves memory); the owner's
 *     give-up after a sync wait that timed out passes through `completing` (engine::confirm), which
 *     the rotator may read; a begin() that misses the key in memory asks the filter, and the store
 *     (transition_sink::recall) when the filter may hold it.
 *
 * The resolver is truthful: it answers from the downstream's state at the moment it is asked
 * (effect happened -> succeeded; not happened -> not_executed), or "unknown" (it may always say it
 * cannot tell).
 *
 * Configuration (spin -D...):
 *   SYNC=1      sync durability (default); SYNC=0 async
 *   CRASHES=n   crashes allowed (default 1)
 *   RECLAIM=1   blind reclaim: a new caller takes an expired claim over with a new fence, without
 *               asking the resolver (options.reclaim_expired). Must break at_most_once.
 *   FENCED=0    the downstream ignores fences (documented limitation, docs/design.md section 5)
 *   IGNORE_MARK=1  readers ignore the unconfirmed mark: a duplicate sees the terminal state as soon
 *               as it is published. Must break durable_before_visible.
 *   CLEAR_ON_TIMEOUT=1  an owner whose wait for its terminal row times out clears the mark instead
 *               of setting the gave-up flag. Must break durable_before_visible.
 *   ROTATION=1  the rotator above (sync mode, no crash). Two rules of rotate_if_due, each can be
 *               turned off: TORN_SKIP=1, the filter pass skips a torn read instead of reading again;
 *               EVICT_CHECK=0, the eviction pass recycles a terminal record the filter does not
 *               hold (instead of adding it first). Both off is the defect fixed in e3023e5 and
 *               0f0633c: must break no_grant_after_decision; so must EVICT_CHECK=0 alone.
 *   TRIES, QN   begin attempts per worker (1), queue rows (3); two workers at first, one after
 *               a restart (the caller who retries the key)
 *
 * Properties (ltl blocks at the end): at_most_once, no_stale_completion, acked_durable,
 * durable_before_visible, no_grant_after_decision (ROTATION).
 */

#ifndef SYNC
#define SYNC 1
#endif
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef RECLAIM
#define RECLAIM 0
#endif
#ifndef FENCED
#define FENCED 1
#endif
#ifndef TRIES
#define TRIES 1
#endif
#ifndef QN
#define QN 3
#endif
#ifndef IGNORE_MARK
#define IGNORE_MARK 0
#endif
#ifndef CLEAR_ON_TIMEOUT
#define CLEAR_ON_TIMEOUT 0
#endif
#ifndef ROTATION
#define ROTATION 0
#endif
#ifndef TORN_SKIP
#define TORN_SKIP 0
#endif
#ifndef EVICT_CHECK
#define EVICT_CHECK 1
#endif

/* slot states (slot_state in slot.hpp; VACANT doubles as "no record" in the store). The transient
   states claiming / completing are not separate here: each atomic step below is one CAS on the
   slot word plus what its winner does while it holds the transient state that only it may leave
   (offer the row, write the fields, release-store the new state). Other threads that meet a
   transient state answer in_progress or busy and retry, which the model covers by letting them act
   before or after the step. (Relacy checks the transient states themselves: verify/relacy_test.cpp.) */
#define VACANT     0
#define PROCESSING 2
#define SUCCEEDED  4
#define FAILED     5
#define RELEASED   6
#define DOUBT_ROW  7   /* a row PROCESSING -> PROCESSING (doubt mark); the record stays PROCESSING */

/* worker program counters */
#define W_IDLE      0   /* may call begin() while tries remain */
#define W_CLAIMED   1   /* sync: claim published and queued, waiting for its commit */
#define W_ACKED     2   /* begin() answered acquired */
#define W_RAN       3   /* executed the effect, or decided not to */
#define W_COMPLETED 4   /* sync: completion recorded and queued, waiting for its commit */
#define W_GIVING_UP 5   /* ROTATION: the owner's give-up holds `completing` (engine::confirm) */

/* resolver verdicts */
#define R_SUCCEEDED    0
#define R_NOT_EXECUTED 1
#define R_UNKNOWN      2

/* ROTATION: memory does not hold the key (evicted), the cold window's filter does, and the store
   has a record that recall() installs (processing, succeeded, failed): no claim */
#define RECALLED (st == VACANT && in_filter && (db_st == PROCESSING || TERMINAL(db_st)))
/* the slot can be claimed; the slot holds worker i's claim; compensation's claim is still there,
   still expired (the lease re-check under `completing`) */
#if ROTATION
#define CLAIMABLE ((st == VACANT && !RECALLED) || st == RELEASED || (RECLAIM && st == PROCESSING && expired))
#define SETTLED (!giving_up)   /* the word is not `completing` (a give-up in progress) */
#else
#define CLAIMABLE (st == VACANT || st == RELEASED || (RECLAIM && st == PROCESSING && expired))
#define SETTLED true
#endif
#define MINE(i) (st == PROCESSING && fence == wf[i])
#define EXPIRED_CLAIM (st == PROCESSING && fence == cf && expired)

/* rank of a transition for a fence: the claim (1) comes before its completion (2) */
#define RANK(s) ((s) == VACANT -> 0 : ((s) == PROCESSING -> 1 : 2))

#define TERMINAL(s) ((s) == SUCCEEDED || (s) == FAILED)
/* engine::unconfirmed: the slot shows a terminal state with the unconfirmed mark whose row is not
   durable yet (sink::durable(seq) is false): readers must not show it */
#if IGNORE_MARK
#define HIDDEN false
#else
#define HIDDEN (TERMINAL(st) && doubt && upos > 0)
#endif

/* ---- memory: the slot of the one key --------------------------------------------------------- */
byte st = VACANT;
byte fence = 0;
bool doubt = false;       /* on processing: the doubt mark; on succeeded / failed: the unconfirmed mark */
bool expired = false;     /* the current claim's lease has run out */
/* lease_until of a terminal word with the unconfirmed mark: its row's sequence number, kept as the
   rows in the queue up to and including that row (0: the watermark passed it, the row is durable),
   and the gave-up flag (the owner's wait timed out) */
byte upos = 0;
bool gaveup = false;
/* ROTATION: the word shows `completing` while an owner records that it gave up (engine::confirm's
   second CAS); the key is in the cold window's filter (window_filter: no false negatives, and the
   window outlasts the model's runs) */
bool giving_up = false;
bool in_filter = false;

/* ---- threads' progress (global, so that a crash can wipe it in one step) --------------------- */
byte wpc[2];              /* worker program counters */
byte wf[2];               /* the fence of the worker's ticket */
byte wpend[2];            /* rows in the queue up to and including the worker's last row; 0: committed */
byte wtries[2];           /* begin() calls left */
bool wexec[2];            /* the worker executed the effect */
byte cpc = 0;             /* compensation: 0 scanning, 1 holding a resolver's answer, 2 (sync) waiting
                             for the commit of the terminal state it recorded, 3 (ROTATION) its
                             give-up holds `completing` */
byte cf = 0;              /* compensation: the fence of the claim it asked about */
bool cd = false;          /* compensation: the claim was already marked in doubt */
byte verdict = 0;         /* compensation: the resolver's answer */

/* ---- flush pipeline and store -------------------------------------------------------------- */
chan q = [QN] of { byte, byte };   /* rows: (to state, fence) */
/* The watermark of flush_pipeline (await returns when every row up to the caller's has committed)
   is kept per worker as wpend: counters that only grow would make the state space infinite. */
byte db_st = VACANT;
byte db_fence = 0;

/* ---- the downstream system (outside the process: survives crashes) ------------------------- */
byte effects = 0;
byte ds_floor = 0;        /* FENCED: the downstream refuses fences below this */

/* ---- ghosts for the properties -------------------------------------------------------------- */
byte granted = 0;         /* the latest fence granted */
bool stale_done = false;  /* a completion was recorded with a fence that was not the latest */
byte ack_fence = 0;       /* the highest transition acknowledged to a caller: (fence, rank) */
byte ack_rank = 0;
bool lost_ack = false;    /* a crash lost an acknowledged transition */
bool shown_undurable = false;  /* a duplicate was answered succeeded / failed while the store did not
                                  hold that terminal state for that fence */
bool decided = false;     /* ROTATION: a terminal state (succeeded / failed) was published */
bool regranted = false;   /* ROTATION: a claim was granted after that */
byte crashes = 0;
/* witnesses that the interesting paths are reachable (the runner expects each reach_* claim to be
   violated: a property that holds only because its situation never happens proves nothing). They
   are compiled in only with -DWITNESS, so that they do not split the states of the other searches. */
#ifdef WITNESS
#define WITNESSED(w) w = true
#else
#define WITNESSED(w) skip
#endif
bool w_refused = false;       /* an owner's completion or renewal was refused as stale */
bool w_compensated = false;   /* compensation recorded a resolver's verdict */
bool w_doubt = false;         /* compensation marked a claim in doubt */
bool w_renewed = false;       /* compensation found the claim renewed under it and skipped */
bool w_recovered = false;     /* a restart recovered a PROCESSING record */
bool w_hidden = false;        /* a duplicate met a terminal state not yet durable: in_progress */
bool w_gave_up = false;       /* ... after its owner gave up waiting for the commit: in_doubt */
bool w_marked_shown = false;  /* a duplicate met the mark on a row already durable: shows the record */
bool w_torn = false;          /* ROTATION: the filter pass's read of the slot was torn */
bool w_read_giving_up = false;  /* ROTATION: the filter pass read the give-up's `completing` */
bool w_evicted = false;       /* ROTATION: a terminal record left memory */
bool w_late_added = false;    /* ROTATION: the eviction pass added a key the filter pass missed */
bool w_recalled = false;      /* ROTATION: a begin() that missed memory was answered from the store */

inline acknowledge(f, r) {
  if
  :: (f > ack_fence || (f == ack_fence && r > ack_rank)) -> ack_fence = f; ack_rank = r
  :: else -> skip
  fi
}

/* flush_pipeline::offer: a row into the bounded queue. Every caller checks nfull(q) in the same
   step first: a full queue is backpressure, and the transition is undone before it is published
   (begin answers backpressure, a completion keeps its ticket and retries, compensation asks again
   on its next pass). */
inline offer(to, f) {
  q!to,f
}

inline forget(i) {
  wpc[i] = W_IDLE; wf[i] = 0; wpend[i] = 0; wexec[i] = false
}

/* Sync mode, after the owner's wait for the terminal row of fence f (engine::confirm). The CAS of the
   marked word fails only if the record moved on (not in this model: a terminal word stays until a
   crash). committed: the mark is cleared. Timed out: through `completing`, the gave-up flag is set
   and the marked word is published again (with CLEAR_ON_TIMEOUT, the mutant: the mark is cleared). */
inline confirm(f) {
  if :: TERMINAL(st) && fence == f && doubt -> doubt = false :: else -> skip fi
}
inline give_up(f) {
  if
  :: TERMINAL(st) && fence == f && doubt ->
#if CLEAR_ON_TIMEOUT
     doubt = false
#else
     gaveup = true
#endif
  :: else -> skip
  fi
}

/* ROTATION: the give-up in its two steps, as engine::confirm does it: CAS marked -> completing
   (`giving_up`), then the gave-up flag and the marked word again. Without ROTATION it is the one step
   give_up above. */
inline give_up_enter(f, pc, giving) {
  if
  :: TERMINAL(st) && fence == f && doubt && !giving_up -> giving_up = true; pc = giving
  :: else -> skip
  fi
}
inline give_up_leave() {
  giving_up = false; gaveup = true
}

/* ROTATION ghost: a terminal state is published (called under #if ROTATION only: a statement more
   in an atomic step changes the breadth-first searches' counts of the other configurations) */
inline decide(s) {
  if :: TERMINAL(s) -> decided = true :: else -> skip fi
}

/* Sync mode: publish terminal state `to` with the unconfirmed mark, its row being the last in the
   queue (engine::complete: offer, then the marked word); other states carry no mark. */
inline mark(to) {
#if SYNC
  if :: TERMINAL(to) -> doubt = true; upos = len(q) :: else -> doubt = false fi
#else
  doubt = false
#endif
}

/* ---- a worker: begin, execute, maybe extend, complete ------------------------------------------ */
proctype worker(byte i) {
  byte to;
end_worker:
  do
  /* begin -> engine::begin / try_claim: CAS (4) vacant|released -> claiming(fence + 1), offer the
     claim row, release-store (5) processing. With RECLAIM an expired processing claim is taken over
     as well (try_claim re-checks the lease under `claiming`: the same step here). */
  :: atomic {
       wpc[i] == W_IDLE && wtries[i] > 0 -> wtries[i]--;
       if
       :: CLAIMABLE && nfull(q) ->
          if
          :: st == PROCESSING -> printf("MSC: worker %d takes over the expired claim of fence %d (blind reclaim)\n", i, fence)
          :: else -> skip
          fi;
          fence = fence + 1; wf[i] = fence; st = PROCESSING; doubt = false; expired = false; granted = fence;
#if ROTATION
          if :: decided -> regranted = true; printf("MSC: worker %d is granted the key after its decision\n", i) :: else -> skip fi;
#endif
          offer(PROCESSING, fence); wpend[i] = len(q);
          printf("MSC: worker %d claims the key, fence %d\n", i, fence);
#if SYNC
          wpc[i] = W_CLAIMED
#else
          acknowledge(wf[i], 1); wpc[i] = W_ACKED
#endif
       :: !CLAIMABLE || full(q) ->   /* in_progress, duplicate, in_doubt, backpressure: nothing changes */
#if ROTATION
          /* the key is not in memory but in the cold window: engine::recall installs the store's
             record (one step here: the filter is filled before the eviction, so a reader that
             missed memory finds the key in it whenever it asks) */
          if
          :: RECALLED -> st = db_st; fence = db_fence; doubt = false; expired = false; WITNESSED(w_recalled);
             printf("MSC: worker %d: the key is not in memory, the filter holds it: recalled state %d (fence %d)\n", i, st, fence)
          :: else -> skip
          fi;
#endif
          /* engine::existing (a terminal record is answered whatever the queue's fill) */
          if
#if ROTATION
          :: giving_up -> skip   /* `completing` (a give-up): in_progress */
#endif
          :: TERMINAL(st) && !HIDDEN && SETTLED ->
             printf("MSC: worker %d: begin() is a duplicate, answers state %d (fence %d)\n", i, st, fence);
             if :: doubt -> WITNESSED(w_marked_shown) :: else -> skip fi;
             if :: !(db_st == st && db_fence == fence) -> shown_undurable = true :: else -> skip fi
          :: TERMINAL(st) && HIDDEN && !gaveup && SETTLED -> WITNESSED(w_hidden);
             printf("MSC: worker %d: begin() meets state %d not yet durable, answers in_progress\n", i, st)
          :: TERMINAL(st) && HIDDEN && gaveup && SETTLED -> WITNESSED(w_gave_up);
             printf("MSC: worker %d: begin() meets state %d not durable, owner gave up: in_doubt\n", i, st)
          :: !TERMINAL(st) -> skip
          fi
       fi
     }
  /* sync: flush_pipeline::await returns once the row committed: begin() answers acquired */
  :: atomic {
       wpc[i] == W_CLAIMED && wpend[i] == 0 -> acknowledge(wf[i], 1); wpc[i] = W_ACKED;
       printf("MSC: worker %d: claim of fence %d committed, begin() answers acquired\n", i, wf[i])
     }
  /* sync: await timed out (sync_timeout): the claim is withdrawn (complete(released, not_durable))
     and begin() answers store_unavailable; the caller does not execute */
  :: atomic {
       wpc[i] == W_CLAIMED && wpend[i] > 0 ->
       if
       :: MINE(i) && nfull(q) -> st = RELEASED; doubt = false; offer(RELEASED, wf[i])
       :: !MINE(i) || full(q) -> skip   /* taken meanwhile, or backpressure: lease and compensation decide */
       fi;
       forget(i)
     }
  /* execute: the effect happens in the downstream, which (FENCED) refuses a closed fence */
  :: atomic {
       wpc[i] == W_ACKED ->
       if
       :: (!FENCED || wf[i] >= ds_floor) -> effects++; wexec[i] = true;
          printf("MSC: worker %d EXECUTES the effect with fence %d (effects = %d)\n", i, wf[i], effects)
       :: else -> printf("MSC: worker %d: the downstream refuses fence %d\n", i, wf[i])
       fi;
       wpc[i] = W_RAN
     }
  :: atomic { wpc[i] == W_ACKED -> wpc[i] = W_RAN }   /* decides not to execute, or fails first */
  /* ticket.extend -> engine::extend: enter (CAS processing(f) -> completing), new lease, store
     processing (clears the doubt mark); a stale ticket is refused and becomes empty */
  :: atomic {
       wpc[i] == W_RAN ->
       if :: MINE(i) -> expired = false; doubt = false :: else -> WITNESSED(w_refused); forget(i) fi
     }
  /* ticket.succeed / fail -> engine::complete: enter (CAS (4) processing(f) -> completing), offer,
     write the outcome, release-store (5) the final state; any other word: errc::stale_ticket */
  :: atomic {
       wpc[i] == W_RAN ->
       if
       :: wexec[i] -> to = SUCCEEDED
       :: !wexec[i] -> to = RELEASED      /* retryable failure, or a dropped ticket */
       :: !wexec[i] -> to = FAILED        /* terminal failure */
       fi;
       if
       :: MINE(i) && full(q) -> skip   /* errc::backpressure: the ticket stays valid, retry */
       :: MINE(i) && nfull(q) ->
          st = to; offer(to, wf[i]); wpend[i] = len(q); mark(to);
#if ROTATION
          decide(to);
#endif
          printf("MSC: worker %d completes fence %d -> state %d\n", i, wf[i], to);
          if :: wf[i] != granted -> stale_done = true :: else -> skip fi;
#if SYNC
          wpc[i] = W_COMPLETED
#else
          acknowledge(wf[i], 2); forget(i)
#endif
       :: !MINE(i) -> WITNESSED(w_refused);   /* errc::stale_ticket: nothing changes */
          printf("MSC: worker %d: completion with fence %d refused (stale_ticket)\n", i, wf[i]); forget(i)
       fi;
       to = 0
     }
  /* sync: the completion is acknowledged once its row committed, and the owner clears the
     unconfirmed mark; a timeout answers store_unavailable (recorded in memory and queued, not
     acknowledged) and sets the gave-up flag */
  :: atomic { wpc[i] == W_COMPLETED && wpend[i] == 0 -> acknowledge(wf[i], 2); confirm(wf[i]);
       printf("MSC: worker %d: completion of fence %d committed, the owner clears the mark (confirm)\n", i, wf[i]); forget(i) }
  :: atomic { wpc[i] == W_COMPLETED && wpend[i] > 0 ->
       printf("MSC: worker %d: the commit of fence %d does not come, store_unavailable\n", i, wf[i]);
#if ROTATION
       give_up_enter(wf[i], wpc[i], W_GIVING_UP);
       if
       :: wpc[i] != W_GIVING_UP -> forget(i)
       :: else -> printf("MSC: worker %d: CAS marked -> completing, to record that it gave up\n", i)
       fi
#else
       give_up(wf[i]); forget(i)
#endif
     }
#if ROTATION
  :: atomic { wpc[i] == W_GIVING_UP -> give_up_leave();
       printf("MSC: worker %d: gave-up flag written, the marked word published again\n", i); forget(i) }
#endif
  od
}

/* ---- compensation: engine::compensate -> resolve_claim ----------------------------------------- */
active proctype compensator() {
end_compensator:
  do
  /* a snapshot of an expired claim, then the resolver, outside any CAS: truthful about the
     downstream at this moment. (One step: the snapshot reads only the slot and the resolver only
     the downstream, so any step between them commutes with one or the other.) */
  :: atomic {
       cpc == 0 && st == PROCESSING && expired -> cf = fence; cd = doubt; cpc = 1;
       if
       :: effects > 0 -> verdict = R_SUCCEEDED
       :: effects == 0 -> verdict = R_NOT_EXECUTED;
          if :: FENCED && ds_floor <= cf -> ds_floor = cf + 1 :: else -> skip fi
       :: verdict = R_UNKNOWN
       fi;
       printf("MSC: compensation asks the resolver about fence %d: verdict %d (0 succeeded, 1 not executed, 2 unknown)\n", cf, verdict)
     }
  /* resolve_claim: enter (CAS (4) processing(cf) -> completing), re-check the lease (the owner may
     have renewed it since the snapshot: then undo and skip), offer, release-store the verdict (sync:
     a terminal one with the unconfirmed mark, then wait for its commit) */
  :: atomic {
       cpc == 1 ->
       if
       :: verdict == R_UNKNOWN && cd -> skip   /* already marked and audited */
       :: EXPIRED_CLAIM && verdict == R_UNKNOWN && !cd && nfull(q) ->
          doubt = true; offer(DOUBT_ROW, cf); WITNESSED(w_doubt)
       :: EXPIRED_CLAIM && verdict != R_UNKNOWN && nfull(q) ->
          st = (verdict == R_SUCCEEDED -> SUCCEEDED : RELEASED); offer(st, cf); mark(st); WITNESSED(w_compensated);
#if ROTATION
          decide(st);
#endif
          printf("MSC: compensation records fence %d -> state %d\n", cf, st);
          if :: cf != granted -> stale_done = true :: else -> skip fi;
          if :: SYNC && TERMINAL(st) -> cpc = 2 :: else -> skip fi
       :: !(verdict == R_UNKNOWN && cd) && (!EXPIRED_CLAIM || full(q)) ->
          /* renewed, completed or taken over meanwhile; or backpressure */
          if :: st == PROCESSING && fence == cf && !expired -> WITNESSED(w_renewed) :: else -> skip fi
       fi;
       if :: cpc == 1 -> cpc = 0; cf = 0 :: else -> skip fi;
       cd = false; verdict = 0
     }
  /* sync: the wait for the commit of the recorded terminal state (the tail of engine::complete),
     then engine::confirm. The slot's row position is that of the row compensation recorded. */
  :: atomic { cpc == 2 && upos == 0 -> confirm(cf); cpc = 0; cf = 0 }
#if ROTATION
  :: atomic { cpc == 2 && upos > 0 -> give_up_enter(cf, cpc, 3); if :: cpc != 3 -> cpc = 0; cf = 0 :: else -> skip fi }
  :: atomic { cpc == 3 -> give_up_leave(); cpc = 0; cf = 0 }
#else
  :: atomic { cpc == 2 && upos > 0 -> give_up(cf); cpc = 0; cf = 0 }
#endif
  od
}

/* ---- the flusher: flush_pipeline::run -> write_batch -> store::apply ---------------------------- */
/* A failed apply, or a commit_unknown that store::committed() resolves, is a delay before the same
   commit (or its confirmation): the interleavings where the flusher waits cover both. The flusher is
   down for as long as it takes no step: every property is a safety property, so the search covers
   every run in which commits stop coming (awaits time out, owners give up) and those where they
   resume later. It commits one row per step, in queue order: the watermark, which only grows, passes
   each row as it commits; a batch is several such steps with nothing in between, one of the
   interleavings searched. */
active proctype flusher() {
  byte to, f;
end_flusher:
  do
  :: atomic {
       nempty(q) -> q?to,f; printf("MSC: the store commits (state %d, fence %d)\n", to, f);
       if
       :: f >= db_fence && to != DOUBT_ROW -> db_st = to; db_fence = f
       :: else -> skip   /* a lower fence never overwrites the record (audit row only) */
       fi;
       if :: wpend[0] > 0 -> wpend[0]-- :: else -> skip fi;
       if :: wpend[1] > 0 -> wpend[1]-- :: else -> skip fi;
       if :: upos > 0 -> upos-- :: else -> skip fi;
       to = 0; f = 0
     }
  od
}

/* ---- the lease clock ---------------------------------------------------------------------------- */
active proctype lease_clock() {
end_clock:
  do
  :: atomic { st == PROCESSING && !expired -> expired = true; printf("MSC: the lease of fence %d expires\n", fence) }
  od
}

/* ---- ROTATION: engine::rotate_if_due with a cold window ------------------------------------------
   One slot stands for the previous generation's records; the rotation is due whenever the rotator
   looks (retention 0, the current generation full enough). Passes, each over every slot:
     scan      every record evictable (claimable, or terminal and old enough), else blocked; the
               flush mark (issued()) is taken after it. Here: the record is terminal (below);
     marks     the store decided every row up to the mark (with one key: the queue is empty);
     filter    read_slot: the word (3), the fields, the word again: valid when both reads are equal.
               A valid terminal snapshot goes to the filter (cold_->add). A torn one is read again
               (TORN_SKIP=1: skipped, the defect);
     eviction  read_slot, then CAS word -> recycling (one step: a CAS fails if the word moved since the
               read); a non-evictable record (a claim, a transient state) stops the rotation; a
               terminal record the filter does not hold is added to it first, or, when the filter
               has no memory for it, stops the rotation (EVICT_CHECK=0: recycled as it is, the
               defect). The key then leaves memory: st = VACANT.
   Only a generation whose record is terminal is rotated. In the engine, a record of the previous
   generation changes after a passing scan only by the owner's confirm or give-up (claims are made
   in the current generation, in another slot); with one slot for both generations, a rotation that
   started on a released record would read a later claim's record in the same slot, which the
   engine never does (its rows are not covered by the flush mark). A released record leaves memory
   without entering the filter, and the key is new again: not modelled (nothing to remember). */
#if ROTATION
inline evict() {
  if :: TERMINAL(st) -> WITNESSED(w_evicted) :: else -> skip fi;
  printf("MSC: rotation: the slot is recycled (state %d, fence %d leaves memory)\n", st, fence);
  st = VACANT; doubt = false; expired = false; upos = 0; gaveup = false
}

active proctype rotator() {
  byte rpc = 0;            /* 0 idle, 1 scanned, 2 filter pass, 3 filter read half done, 4 eviction */
  byte r_st = 0;           /* the first word read of the filter pass */
  byte r_f = 0;
  bool r_d = false, r_t = false;
end_rotator:
  do
  :: atomic { rpc == 0 && TERMINAL(st) && !giving_up -> rpc = 1;
       printf("MSC: rotation: the scan finds state %d (fence %d, mark %d): evictable\n", st, fence, doubt) }
  :: atomic { rpc == 1 && empty(q) -> rpc = 2; printf("MSC: rotation: the store decided every row up to the flush mark\n") }
  :: atomic { rpc == 2 -> r_st = st; r_f = fence; r_d = doubt; r_t = giving_up; rpc = 3;
       printf("MSC: rotation: the filter pass loads the word (state %d, mark %d, completing %d), then the fields\n", st, doubt, giving_up) }
  :: atomic {
       rpc == 3 ->
       if
       :: st == r_st && fence == r_f && doubt == r_d && giving_up == r_t ->   /* a valid snapshot */
          if
          :: TERMINAL(r_st) && !r_t -> in_filter = true;
             printf("MSC: rotation: the filter learns the key (state %d, fence %d)\n", r_st, r_f)
          :: r_t -> WITNESSED(w_read_giving_up);
             printf("MSC: rotation: the filter pass reads `completing` (a give-up): not terminal\n")
          :: else -> skip
          fi;
          rpc = 4
       :: else -> WITNESSED(w_torn);
#if TORN_SKIP
          printf("MSC: rotation: torn read of the slot (word moved from doubt %d to %d): skipped\n", r_d, doubt);
          rpc = 4
#else
          printf("MSC: rotation: torn read of the slot (word moved from doubt %d to %d): read again\n", r_d, doubt);
          rpc = 2
#endif
       fi;
       r_st = 0; r_f = 0; r_d = false; r_t = false
     }
  :: atomic {
       rpc == 4 ->
       if
       :: st == PROCESSING || giving_up -> skip   /* not evictable: the rotation stops, tried again later */
#if EVICT_CHECK
       :: TERMINAL(st) && !giving_up && !in_filter ->   /* the filter has no memory for it: kept */
          printf("MSC: rotation: state %d is not in the filter, which has no room: kept in memory\n", st)
       :: TERMINAL(st) && !giving_up && !in_filter -> in_filter = true; WITNESSED(w_late_added);
          printf("MSC: rotation: state %d is not in the filter: added before the recycle\n", st);
          evict()
       :: !(st == PROCESSING || giving_up) && !(TERMINAL(st) && !in_filter) -> evict()
#else
       :: !(st == PROCESSING || giving_up) -> evict()
#endif
       fi;
       rpc = 0
     }
  od
}
#endif

/* ---- crash and restart ------------------------------------------------------------------------ */
active proctype crash() {
  byte to, f;
end_crash:
  do
  :: atomic {
       crashes < CRASHES -> crashes++;
       printf("MSC: CRASH (store holds state %d fence %d; highest acknowledged: fence %d rank %d)\n",
              db_st, db_fence, ack_fence, ack_rank);
       /* every acknowledged transition must be in the store */
       if
       :: ack_fence > db_fence || (ack_fence == db_fence && ack_rank > RANK(db_st)) -> lost_ack = true
       :: else -> skip
       fi;
       /* memory, the queue and every thread's progress are lost */
       do
       :: nempty(q) -> q?to,f
       :: empty(q) -> break
       od;
       to = 0; f = 0;
       forget(0); forget(1); cpc = 0; cf = 0; cd = false; verdict = 0;
       /* durable_guard::recover: the record comes back from the store (guard::restore); fences
          continue above it; a processing record is compensated once its lease has run out */
       st = db_st; fence = db_fence; doubt = false; expired = false; upos = 0; gaveup = false;
#if ROTATION
       /* (the rotation configurations run without crashes) a decision the crash lost is none */
       giving_up = false; decided = TERMINAL(db_st);
#endif
       granted = db_fence;   /* claims lost with the queue no longer exist */
       if :: db_st == PROCESSING -> WITNESSED(w_recovered) :: else -> skip fi;
       /* the new process: one caller retries the key */
       wtries[0] = TRIES; wtries[1] = 0
     }
  od
}

init {
  atomic { wtries[0] = TRIES; wtries[1] = TRIES; run worker(0); run worker(1) }
}

/* ---- properties ----------------------------------------------------------------------------- */
ltl at_most_once        { [] (effects <= 1) }
ltl no_stale_completion { [] !stale_done }
ltl acked_durable       { [] !lost_ack }
ltl durable_before_visible { [] !shown_undurable }
ltl no_grant_after_decision { [] !regranted }

/* reachability witnesses (expected to be violated) */
ltl reach_effect        { [] (effects == 0) }
ltl reach_refused       { [] !w_refused }
ltl reach_compensated   { [] !w_compensated }
ltl reach_doubt         { [] !w_doubt }
ltl reach_renewed       { [] !w_renewed }
ltl reach_recovered     { [] !w_recovered }
ltl reach_hidden        { [] !w_hidden }
ltl reach_gave_up       { [] !w_gave_up }
ltl reach_marked_shown  { [] !w_marked_shown }
ltl reach_torn          { [] !w_torn }
ltl reach_read_giving_up { [] !w_read_giving_up }
ltl reach_evicted       { [] !w_evicted }
ltl reach_late_added    { [] !w_late_added }
ltl reach_recalled      { [] !w_recalled }
