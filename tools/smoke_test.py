#!/usr/bin/env python3
"""Smoke check of the `idem` command-line tool against a SQLite store (about 15-30 s).

Usage: smoke_test.py [PATH_TO_IDEM]   (default: $IDEM, else build/release/tools/idem)

Runs, in a fresh temporary directory:
  1. idem demo twice on the same sqlite store: both pass, and the second run recovers the first
     run's records without taking any of them for a duplicate of its own requests;
  2. idem verify on that store: 0 violations;  idem stats: the record and audit counts add up;
     verify --prometheus FILE writes the textfile gauges (0 violations, the keys the demos wrote); on a
     copy with one key's audit trail deleted they show the violations (exit 1); a --prometheus file
     in a missing directory is exit 3 naming it, with the result still printed;
  3. idem audit on a key of the first run: found, SUCCESS, a claim and a success in its trail;
  3b. idem prune on that store: a 1-day window removes nothing and sets the records horizon; a 1 ms
     window removes every record (audit kept: verify counts each trail as one whose record was
     pruned, 0 violations, and prints the horizon), then --audit-window 1ms every audit row, in
     transactions of --batch rows; bad durations and batch sizes are exit 2 naming the flag;
  4. idem drill --cycles 5: workers SIGKILLed and recovered, no double execution, no lost
     acknowledgement, 0 violations; its --prometheus file shows 0 failed checks of the checks run;
     a drill on the damaged copy fails (exit 1) and its file shows the failed check;
  4b. idem drill --second-writer same and disjoint: every second worker started on the file while the
     first held it is refused with a message naming the file; 0 double executions, 0 lost
     acknowledgements, exit 0;
  4c. idem drill --delete-file: the file is deleted under a running worker, the worker reports the
     store's error naming the file, nothing asked for after the deletion is confirmed, exit 0;
  4d. idem drill --cycles 5 on a rocksdb:DIR store (when the tool is built with it), then verify;
  5. the negative control: idem demo --naive must find double executions and exit 1;
  6. usage and runtime errors give exit codes 2 and 3; an unknown subcommand is named, with the
     valid ones.
With IDEM_SMOKE_MY_URI=mysql://... set (a build with the MySQL store), also runs demo, drill,
verify, a 2-process demo and a 3-worker drill (global scope, MariaDB as the arbiter) on it. With IDEM_SMOKE_PG_URI=postgresql://... set (and a build with the PostgreSQL store), also runs a
demo, a 3-cycle drill, a 2-process demo and a 3-worker drill (global scope), verify against
that database, and stats saying what a failover of it can lose (it has no synchronous standby).
Exits 0 when every check holds, 1 otherwise (each failed check is printed).
"""
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what, flush=True)
    return cond


def run(idem, *args, expect=0, timeout=120):
    """Runs idem with args; returns (exit code, parsed JSON of stdout or None, stdout, stderr)."""
    t0 = time.monotonic()
    p = subprocess.run([idem, *args], capture_output=True, text=True, timeout=timeout)
    dt = time.monotonic() - t0
    print(f"  idem {' '.join(args)}  -> exit {p.returncode} in {dt:.1f} s", flush=True)
    doc = None
    if "--json" in args:
        try:
            doc = json.loads(p.stdout)
        except ValueError:
            check(False, f"idem {' '.join(args)}: stdout is not one JSON object: {p.stdout[:300]!r}")
    if expect is not None and not check(p.returncode == expect,
                                        f"idem {' '.join(args)}: exit {p.returncode}, expected {expect}"):
        sys.stdout.write(p.stderr[-2000:])
    return p.returncode, doc, p.stdout, p.stderr


def read_prom(path, label, names, store):
    """Parses a --prometheus textfile: each of `names` once, with one HELP and one TYPE gauge line,
    one sample labelled store="<store>", and nothing else. Returns {name: value} (floats)."""
    if not check(os.path.exists(path), f"{label}: no --prometheus file {path}"):
        return {}
    check(not os.path.exists(path + ".tmp"), f"{label}: {path}.tmp left behind")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    check(text.endswith("\n"), f"{label}: {path} does not end in a newline")
    helps, types, values = {}, {}, {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{store="((?:[^"\\]|\\.)*)"\} (\S+)$')
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            check(name not in helps, f"{label}: two HELP lines for {name}")
            helps[name] = line
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            check(name not in types and kind == "gauge", f"{label}: TYPE line {line!r}")
            types[name] = kind
        else:
            m = sample.match(line)
            if not check(m is not None, f"{label}: not a sample line: {line!r}"):
                continue
            name, st, value = m.groups()
            check(name not in values, f"{label}: {name} sampled twice")
            check(st == store, f"{label}: {name} has store={st!r}, expected {store!r}")
            try:
                values[name] = float(value)
            except ValueError:
                check(False, f"{label}: {name} value {value!r} is not a number")
    check(sorted(values) == sorted(names) and sorted(helps) == sorted(names) and sorted(types) == sorted(names),
          f"{label}: metrics {sorted(values)}, HELP {sorted(helps)}, TYPE {sorted(types)}; expected {sorted(names)}")
    return values


VERIFY_METRICS = ("idem_verify_last_run_timestamp_seconds", "idem_verify_violations", "idem_verify_records_checked",
                  "idem_verify_duration_seconds")
DRILL_METRICS = ("idem_drill_last_run_timestamp_seconds", "idem_drill_failures", "idem_drill_checks",
                 "idem_drill_duration_seconds")


def check_run_time(values, prefix, label, before, after):
    """The timestamp falls within the run (wall clock) and the duration fits in it."""
    ts = values.get(prefix + "_last_run_timestamp_seconds", -1)
    check(before - 1 <= ts <= after + 1, f"{label}: last run timestamp {ts} not within [{before}, {after}]")
    dur = values.get(prefix + "_duration_seconds", -1)
    check(0 <= dur <= after - before + 1, f"{label}: duration {dur} s, the run took {after - before:.1f} s")


def check_drill(d, label, cycles):
    """The checks every crash drill's JSON report must pass."""
    if not d:
        return
    check(d["ok"], f"{label} failed: {d.get('failures')}")
    check(d["double_executions"] == 0, f"{label}: {d['double_executions']} double executions")
    check(d["lost_acknowledged"] == 0, f"{label}: {d['lost_acknowledged']} lost acknowledgements")
    check(d["violations"] == 0, f"{label}: {d['violations']} violations")
    check(d["kills"] + d["clean_exits"] == cycles, f"{label}: {d['kills']} kills, {d['clean_exits']} clean exits")
    check(d["acknowledged"] > 0, f"{label}: nothing was acknowledged")
    for k in ("cycles", "acknowledged", "double_executions", "lost_acknowledged", "in_doubt_resolved",
              "recovery_ms_p50", "recovery_ms_max", "violations"):
        check(k in d, f"{label} JSON lacks '{k}'")


def global_scope(idem, store, label):
    """Global scope on a database that can arbitrate: a 2-process demo and a 3-worker drill racing
    on one key space, every key executed once, nothing acknowledged lost."""
    _, p, _, _ = run(idem, "demo", "--processes", "2", "--requests", "3000", "--threads", "4",
                     "--dup-rate", "0.05", "--json", "--store", store, timeout=300)
    check(p is not None and p["ok"] and p["processes"] == 2 and p["double_executions"] == 0,
          f"{label} demo --processes 2: {p and p.get('failures')}")
    _, p, _, _ = run(idem, "drill", "--workers", "3", "--cycles", "3", "--keys", "100", "--json",
                     "--store", store, timeout=300)
    check(p is not None and p["ok"] and p["workers"] == 3 and p["double_executions"] == 0
          and p["lost_acknowledged"] == 0, f"{label} drill --workers 3: {p and p.get('failures')}")


def main():
    idem = sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "IDEM", os.path.join(HERE, "..", "build", "release", "tools", "idem"))
    if not os.access(idem, os.X_OK):
        print(f"smoke_test: no idem executable at {idem}", file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="idem-smoke-") as tmp:
        store = f"sqlite:{tmp}/d.db"
        demo = ["demo", "--requests", "20000", "--threads", "4", "--dup-rate", "0.05", "--json", "--store", store]

        print("1. demo twice on one sqlite store", flush=True)
        _, first, _, _ = run(idem, *demo)
        _, second, _, _ = run(idem, *demo)
        for name, d in (("first", first), ("second", second)):
            if not d:
                continue
            check(d["ok"], f"{name} demo run failed: {d.get('failures')}")
            check(d["double_executions"] == 0, f"{name} run: double executions {d['double_executions']}")
            check(d["executions"] == d["unique_keys"], f"{name} run: executions {d['executions']} != unique keys")
            check(d["duplicates_blocked"] == d["duplicates_injected"],
                  f"{name} run: blocked {d['duplicates_blocked']} != injected {d['duplicates_injected']}")
            check(d["violations"] == 0, f"{name} run: {d['violations']} violations")
            check(d["store_records_ok"] == d["unique_keys"], f"{name} run: store records ok {d['store_records_ok']}")
            check(d["flushed_transitions"] >= 2 * d["unique_keys"],
                  f"{name} run: flushed {d['flushed_transitions']} < 2 x unique keys")
        if first and second:
            check(first["run_id"] != second["run_id"], "both runs got the same run id")
            check(first["recovered_records"] == 0, f"first run recovered {first['recovered_records']} records")
            check(second["recovered_records"] == first["unique_keys"],
                  f"second run recovered {second['recovered_records']}, expected {first['unique_keys']}")
            # A first-run key taken for a duplicate would show as a request never executed and as
            # more duplicates than injected (a duplicate still executing after --wait-ms is
            # blocked without being counted, hence <=).
            check(second["guard"]["duplicates"] <= second["duplicates_injected"] and second["lost_requests"] == 0,
                  f"second run saw {second['guard']['duplicates']} duplicates (injected "
                  f"{second['duplicates_injected']}), {second['lost_requests']} requests not executed: "
                  f"it took first-run keys for duplicates")

        print("2. verify and stats", flush=True)
        prom = f"{tmp}/verify.prom"
        before = time.time()
        _, v, _, _ = run(idem, "verify", "--store", store, "--json", "--prometheus", prom)
        after = time.time()
        if v:
            check(v["violations"] == 0, f"verify: {v['violations']} violations: {v['violation_list'][:3]}")
            if first and second:
                check(v["keys"] == first["unique_keys"] + second["unique_keys"], f"verify: {v['keys']} keys")
                check(v["transitions"] == 2 * v["keys"], f"verify: {v['transitions']} transitions")
        pv = read_prom(prom, "verify --prometheus", VERIFY_METRICS, store)
        if pv:
            check(pv.get("idem_verify_violations") == 0, f"verify --prometheus: {pv}")
            if first and second:
                check(pv.get("idem_verify_records_checked") == first["unique_keys"] + second["unique_keys"],
                      f"verify --prometheus: records checked {pv.get('idem_verify_records_checked')}, the demos "
                      f"wrote {first['unique_keys'] + second['unique_keys']} keys")
            check_run_time(pv, "idem_verify", "verify --prometheus", before, after)
        # A damaged copy: one key's audit trail deleted, so its record has no trail (a violation).
        bad = f"{tmp}/bad.db"
        with sqlite3.connect(f"{tmp}/d.db") as src, sqlite3.connect(bad) as dst:
            src.backup(dst)
            dst.execute("DELETE FROM idempotent_audit WHERE idempotent_key = "
                        "(SELECT idempotent_key FROM idempotent_record ORDER BY idempotent_key LIMIT 1)")
        dst.close()
        src.close()
        bad_prom = f"{tmp}/bad-verify.prom"
        _, bv, _, _ = run(idem, "verify", f"sqlite:{bad}", "--json", "--prometheus", bad_prom, expect=1)
        pb = read_prom(bad_prom, "verify --prometheus (damaged store)", VERIFY_METRICS, f"sqlite:{bad}")
        if bv and pb:
            check(bv["violations"] > 0, f"verify of the damaged copy found no violation: {bv}")
            check(pb.get("idem_verify_violations") == bv["violations"],
                  f"verify --prometheus (damaged store): {pb.get('idem_verify_violations')} violations, the report "
                  f"says {bv['violations']}")
            check(pb.get("idem_verify_records_checked") == bv["keys"], f"verify --prometheus (damaged store): {pb}")
        # An unwritable file: exit 3, the file named, the result still printed; nothing created.
        missing = f"{tmp}/no-such-dir/verify.prom"
        _, _, text, err = run(idem, "verify", "--store", store, "--prometheus", missing, expect=3)
        check("PASS" in text and "violations" in text, f"verify --prometheus {missing}: no result printed: {text!r}")
        check("--prometheus" in err and f"{tmp}/no-such-dir" in err and "does not exist" in err,
              f"verify --prometheus {missing}: the error names neither the flag nor the directory: {err.strip()!r}")
        check(not os.path.exists(f"{tmp}/no-such-dir"), "verify --prometheus created the missing directory")
        _, s, _, _ = run(idem, "stats", "--store", store, "--json")
        if s and v:
            check(s["records"] == v["keys"], f"stats: {s['records']} records, verify saw {v['keys']} keys")
            check(s["by_status"]["SUCCESS"] == s["records"], f"stats: by_status {s['by_status']}")
            check(s["audit_rows"] == v["transitions"], f"stats: {s['audit_rows']} audit rows")
            w = s["at_restart"]
            check(w["hot"] == s["records"] and w["cold"] == 0 and w["past_window"] == 0,
                  f"stats: records just written are all in the hot window: {w}")
        # With a hot window too short to hold them, the same records are in the cold window; with an
        # idempotency window too short too, they are past it.
        _, s2, _, _ = run(idem, "stats", "--store", store, "--json", "--retention", "1ms", "--window", "2ms")
        if s and s2:
            check(s2["at_restart"]["past_window"] == s["records"], f"stats --window 2ms: {s2['at_restart']}")
        _, s3, _, _ = run(idem, "stats", "--store", store, "--json", "--retention", "1ms", "--window", "forever")
        if s and s3:
            check(s3["at_restart"]["cold"] == s["records"], f"stats --window forever: {s3['at_restart']}")
        _, _, _, err = run(idem, "stats", "--store", store, "--window", "7 days", expect=2)
        check("--window" in err and "is not a duration" in err, f"stats --window '7 days': {err[-300:]!r}")
        rc, _, text, _ = run(idem, "stats", "--store", store, "--prometheus")
        check("idem_store_records{status=\"SUCCESS\"}" in text, "stats --prometheus: no records gauge")

        print("3. audit", flush=True)
        if first:
            key = f"{first['run_id']}-TX1_TRANSFER_v1"
            _, a, _, _ = run(idem, "audit", key, "--store", store, "--json")
            if a:
                check(a["found"] and a["record"] and a["record"]["status"] == "SUCCESS", f"audit {key}: {a}")
                steps = [(r["from"], r["to"]) for r in a["trail"]]
                check(("ABSENT", "PROCESSING") in steps and ("PROCESSING", "SUCCESS") in steps,
                      f"audit {key}: trail {steps}")
                check(a["violations"] == 0, f"audit {key}: violations {a['violation_list']}")
            rc, _, text, _ = run(idem, "audit", key, "--store", store)
            check("PROCESSING -> SUCCESS" in text, "audit (text): no PROCESSING -> SUCCESS row")
        run(idem, "audit", "NO_SUCH_v1", "--store", store, expect=1)

        print("3b. prune", flush=True)
        _, p, _, _ = run(idem, "prune", store, "--window", "1d", "--json")
        if p:
            check(p["records"] == 0 and p["audit_rows"] == 0, f"prune --window 1d removed rows: {p}")
            check(p["records_horizon_ms"] is not None and p["audit_horizon_ms"] is None, f"prune 1d horizon: {p}")
        _, p, _, _ = run(idem, "prune", "--store", store, "--window", "1ms", "--batch", "5000", "--json")
        if p and v:
            check(p["records"] == v["keys"] and p["audit_rows"] == 0, f"prune --window 1ms: {p}, verify saw {v['keys']}")
            check(p["transactions"] >= v["keys"] // 5000, f"prune --batch 5000: {p['transactions']} transactions")
        _, pv, text, _ = run(idem, "verify", "--store", store, "--json")
        if pv and v:
            check(pv["violations"] == 0, f"verify after prune: {pv['violation_list'][:3]}")
            check(pv["trails_without_record"] == v["keys"], f"verify after prune: {pv}")
            check(pv["records_horizon_ms"] is not None, f"verify after prune: no records horizon: {pv}")
        _, text, _ = run(idem, "verify", "--store", store)[1:]
        check("records horizon" in text, "verify (text) after prune: no records horizon row")
        _, ps, _, _ = run(idem, "stats", "--store", store, "--json")
        if ps and s:
            check(ps["records"] == 0 and ps["audit_rows"] == s["audit_rows"], f"stats after prune: {ps}")
            check(ps["max_fence"] == s["max_fence"], f"stats after prune: max fence {ps['max_fence']}, was {s['max_fence']}")
        _, p, _, _ = run(idem, "prune", store, "--window", "1ms", "--audit-window", "1ms", "--json")
        if p and s:
            check(p["audit_rows"] == s["audit_rows"] and p["audit_horizon_ms"] is not None, f"prune audit: {p}")
        _, text, _ = run(idem, "prune", store, "--window", "7d", "--audit-window", "1ms")[1:]
        check("audit horizon" in text, "prune (text): no audit horizon row")
        _, _, _, err = run(idem, "prune", store, "--window", "7x", expect=2)
        check("--window" in err and "not a duration" in err, f"prune --window 7x: {err.strip()}")
        _, _, _, err = run(idem, "prune", store, "--window", "1d", "--batch", "0", expect=2)
        check("--batch" in err, f"prune --batch 0: {err.strip()}")
        run(idem, "prune", store, expect=2)  # --window is required
        run(idem, "prune", "memory", "--window", "1d", expect=2)
        run(idem, "prune", f"sqlite:{tmp}/missing.db", "--window", "1d", expect=3)

        print("4. crash drill", flush=True)
        drill_prom = f"{tmp}/drill.prom"
        before = time.time()
        _, d, _, _ = run(idem, "drill", "--cycles", "5", "--json", "--store", f"sqlite:{tmp}/drill.db",
                         "--prometheus", drill_prom, timeout=180)
        after = time.time()
        check_drill(d, "drill", 5)
        pd = read_prom(drill_prom, "drill --prometheus", DRILL_METRICS, f"sqlite:{tmp}/drill.db")
        if pd and d:
            check(pd.get("idem_drill_failures") == 0, f"drill --prometheus: {pd}")
            check(pd.get("idem_drill_checks") == d["checks"] and d["checks"] >= 8,
                  f"drill --prometheus: {pd.get('idem_drill_checks')} checks, the report says {d['checks']}")
            check_run_time(pd, "idem_drill", "drill --prometheus", before, after)
        # On the damaged copy the drill's final idem::verify finds its violation: one failed check.
        bad_drill_prom = f"{tmp}/bad-drill.prom"
        _, d, _, _ = run(idem, "drill", "--cycles", "1", "--keys", "20", "--json", "--store", f"sqlite:{bad}",
                         "--prometheus", bad_drill_prom, expect=1, timeout=120)
        pd = read_prom(bad_drill_prom, "drill --prometheus (damaged store)", DRILL_METRICS, f"sqlite:{bad}")
        if pd and d:
            check(d["failed_checks"] >= 1 and d["violations"] > 0, f"drill on the damaged store: {d.get('failures')}")
            check(pd.get("idem_drill_failures") == d["failed_checks"] and pd.get("idem_drill_checks") == d["checks"],
                  f"drill --prometheus (damaged store): {pd}, the report says {d['failed_checks']} of {d['checks']}")

        print("4d. crash drill on a rocksdb store", flush=True)
        rocks = f"rocksdb:{tmp}/drill.rocksdb"
        rc, d, _, err = run(idem, "drill", "--cycles", "5", "--json", "--store", rocks, expect=None, timeout=180)
        if rc == 2 and "does not include" in err:
            print("  skipped: this idem is built without the RocksDB store", flush=True)
        else:
            check(rc == 0, f"drill --store {rocks}: exit {rc}: {err[-600:]}")
            check_drill(d, "rocksdb drill", 5)
            _, v, _, _ = run(idem, "verify", "--json", "--store", rocks)
            check(v is not None and v.get("violations") == 0, f"verify {rocks}: {v}")

        print("4b. drill --second-writer: the second writer is refused, nothing lost", flush=True)
        for mode in ("same", "disjoint"):
            db = f"{tmp}/second-{mode}.db"
            _, d, _, _ = run(idem, "drill", "--cycles", "3", "--keys", "100", "--second-writer", mode, "--json",
                             "--store", f"sqlite:{db}", timeout=120)
            if d:
                sw = d.get("second_writer") or {}
                check(d["ok"], f"drill --second-writer {mode} failed: {d.get('failures')}")
                check(d["double_executions"] == 0 and d["lost_acknowledged"] == 0 and d["violations"] == 0,
                      f"drill --second-writer {mode}: {d['double_executions']} double executions, "
                      f"{d['lost_acknowledged']} lost acknowledgements, {d['violations']} violations")
                check(sw.get("refused", 0) > 0 and sw.get("not_refused", 1) == 0,
                      f"drill --second-writer {mode}: second writer {sw}")
                check(sw.get("refused", 0) + sw.get("ran_alone", 0) == sw.get("started", -1),
                      f"drill --second-writer {mode}: outcomes do not add up: {sw}")
                check(db in sw.get("refusal", ""), f"drill --second-writer {mode}: refusal does not name {db}: {sw}")
        rc, _, text, _ = run(idem, "drill", "--cycles", "1", "--keys", "50", "--second-writer", "same",
                             "--store", f"sqlite:{tmp}/second-text.db", timeout=60)
        check("second writer refused: " in text and "PASS" in text,
              f"drill --second-writer (text): no refusal line or no PASS: {text[-600:]!r}")

        print("4c. drill --delete-file: nothing confirmed after the deletion", flush=True)
        db = f"{tmp}/deleted.db"
        _, d, _, _ = run(idem, "drill", "--cycles", "2", "--keys", "200", "--delete-file", "--json",
                         "--store", f"sqlite:{db}", timeout=120)
        if d:
            df = d.get("delete_file") or {}
            check(d["ok"], f"drill --delete-file failed: {d.get('failures')}")
            check(df.get("deleted") is True, f"drill --delete-file: the file was not deleted: {df}")
            check(df.get("claims_after_delete", 1) == 0 and df.get("acks_after_delete", 1) == 0,
                  f"drill --delete-file: confirmed after the deletion: {df}")
            check(df.get("acks_confirmed", 0) >= df.get("deleted_after_acks", 1) > 0,
                  f"drill --delete-file: acks before the deletion: {df}")
            check(db in df.get("worker_error", ""), f"drill --delete-file: the store's error does not name {db}: {df}")
            check(d["double_executions"] == 0 and d["lost_acknowledged"] == 0,
                  f"drill --delete-file: {d['double_executions']} double executions, "
                  f"{d['lost_acknowledged']} lost acknowledgements")
        run(idem, "drill", "--delete-file", "--cycles", "1", "--store", f"sqlite:{tmp}/d.db", expect=2)  # exists

        print("5. negative control: --naive", flush=True)
        _, n, _, _ = run(idem, "demo", "--naive", "--requests", "20000", "--threads", "4", "--dup-rate", "0.05",
                         "--race-share", "1", "--json", "--store", "memory", expect=1)
        if n:
            check(n["double_executions"] > 0, "--naive found no double execution: the checks see nothing")
            check(not n["ok"], "--naive run reported ok")

        pg = os.environ.get("IDEM_SMOKE_PG_URI")
        if pg:
            print("5b. PostgreSQL store (IDEM_SMOKE_PG_URI)", flush=True)
            _, p, _, _ = run(idem, "demo", "--requests", "5000", "--threads", "4", "--dup-rate", "0.05", "--json",
                             "--store", pg)
            check(p is not None and p["ok"] and p["violations"] == 0, f"postgres demo: {p and p.get('failures')}")
            _, p, _, _ = run(idem, "drill", "--cycles", "3", "--json", "--store", pg, timeout=180)
            check(p is not None and p["ok"], f"postgres drill: {p and p.get('failures')}")
            global_scope(idem, pg, "postgres")
            # What a failover of the server can lose, said by stats: the test's server has no standby.
            _, ps, _, _ = run(idem, "stats", "--store", pg, "--json")
            check(ps is not None and "no synchronous standby" in ps.get("failover_exposure", ""),
                  f"postgres stats: failover_exposure {ps and ps.get('failover_exposure')!r}")
            _, _, text, _ = run(idem, "stats", "--store", pg)
            check("failover" in text and "synchronous_standby_names" in text, f"postgres stats: no failover row: {text!r}")
            pg_prom = f"{tmp}/pg-verify.prom"
            _, p, _, _ = run(idem, "verify", "--store", pg, "--json", "--prometheus", pg_prom)
            check(p is not None and p["violations"] == 0, f"postgres verify: {p and p.get('violation_list')}")
            if p:
                # The store label is the report's store name: the URI without its password.
                pp = read_prom(pg_prom, "postgres verify --prometheus", VERIFY_METRICS, p["store"])
                check(pp.get("idem_verify_records_checked") == p["keys"], f"postgres verify --prometheus: {pp}")
            # A password in the URI never reaches the file. Without one in IDEM_SMOKE_PG_URI, try a
            # made-up one (a server with trust authentication ignores it; one that refuses it skips this).
            parts = urllib.parse.urlsplit(pg)
            password = parts.password or "idem-smoke-secret"
            uri = pg if parts.password else urllib.parse.urlunsplit(
                parts._replace(netloc=f"{parts.username or 'postgres'}:{password}@{parts.netloc.rpartition('@')[2]}"))
            rc, p, _, _ = run(idem, "verify", "--store", uri, "--json", "--prometheus", pg_prom, expect=None)
            if rc == 0 and p:
                check(password not in p["store"], f"postgres verify: the report names the password: {p['store']}")
                read_prom(pg_prom, "postgres verify --prometheus (password)", VERIFY_METRICS, p["store"])
                with open(pg_prom, encoding="utf-8") as f:
                    check(password not in f.read(), "postgres verify --prometheus: the file holds the password")

        my = os.environ.get("IDEM_SMOKE_MY_URI")
        if my:
            print("5c. MySQL/MariaDB store (IDEM_SMOKE_MY_URI)", flush=True)
            _, p, _, _ = run(idem, "demo", "--requests", "5000", "--threads", "4", "--dup-rate", "0.05", "--json",
                             "--store", my)
            check(p is not None and p["ok"] and p["violations"] == 0, f"mysql demo: {p and p.get('failures')}")
            _, p, _, _ = run(idem, "drill", "--cycles", "3", "--json", "--store", my, timeout=180)
            check(p is not None and p["ok"] and p["double_executions"] == 0 and p["lost_acknowledged"] == 0,
                  f"mysql drill: {p and p.get('failures')}")
            _, p, _, _ = run(idem, "verify", "--store", my, "--json")
            check(p is not None and p["violations"] == 0 and p["keys"] > 0, f"mysql verify: {p and p.get('violation_list')}")
            global_scope(idem, my, "mysql")  # MariaDB as the arbiter

        print("6. exit codes", flush=True)
        _, _, _, err = run(idem, "nosuch", expect=2)
        check("'nosuch'" in err and all(f" {c}" in err for c in ("demo", "drill", "audit", "verify", "stats", "prune"))
              and "drill-worker" not in err,
              f"idem nosuch: the error names neither the word nor the subcommands: {err.strip()!r}")
        run(idem, "verify", "--store", "memory", expect=2)
        run(idem, "demo", "--store", "redis://x", expect=2)
        run(idem, "demo", "--durability", "eventually", expect=2)
        run(idem, "demo", "--processes", "2", "--store", "memory", expect=2)  # global scope needs PostgreSQL or MariaDB
        run(idem, "drill", "--workers", "2", "--cycles", "1", expect=2)
        run(idem, "drill", "--second-writer", "twice", "--cycles", "1", expect=2)
        run(idem, "drill", "--second-writer", "same", "--cycles", "1", "--store", "memory", expect=2)
        run(idem, "verify", "--store", f"sqlite:{tmp}/missing.db", expect=3)
        check(not os.path.exists(f"{tmp}/missing.db"), "verify created the missing database file")

    elapsed = time.monotonic() - started
    print(f"smoke_test: {'FAIL' if failures else 'PASS'} in {elapsed:.1f} s ({len(failures)} failed checks)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
