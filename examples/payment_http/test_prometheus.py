#!/usr/bin/env python3
"""The payment server's GET /metrics, scraped by a real Prometheus.

    test_prometheus.py PROMETHEUS_BINARY SERVER_BINARY WORKDIR

Starts payment_server on 127.0.0.1 (a free port, a SQLite store in WORKDIR) and a Prometheus
(Debian package `prometheus`) on another free loopback port, scraping the server's /metrics every
second. Then sends a known set of requests: distinct keys from a thread pool (each charged once),
duplicates of some of them, several of one key at once, once all of those keys are completed
(each replayed), and a few POSTs without a key (refused, 400). Prometheus's HTTP API
(/api/v1/query) is then polled, to a deadline, until the series it scraped equal what this client
sent and saw answered:

  * payment_http_requests_total            every POST sent
  * payment_http_duplicates_replayed_total the duplicates (each answered Idempotent-Replayed: true)
  * payment_http_charges_total             the distinct keys (each charged once)
  * payment_http_in_flight                 0, in the same scrape as the totals above
  * idem_acquired_total, idem_succeeded_total, idem_duplicates_total: the guard's own view
  * up                                     1 (Prometheus reached the target)

Then the Grafana dashboard ops/grafana/idem-dashboard.json (Grafana itself is not packaged in
Debian 12, so it is checked here instead of loaded): its structure (every panel a unique id, a title,
a type, a gridPos, a description; every non-row panel targets, each with a refId and an expr; every
variable an expression uses defined), then every target's expr, with the dashboard's variables
substituted, through /api/v1/query, twice: with the variables set to what this test scraped (job
payment_http, this server's instance) and set to "All" (.*). A PromQL error fails the test with
the panel's title and the expr. Every panel's result must be non-empty, except the panels in
ALLOWED_EMPTY (series this example does not export: the verify/drill textfile and the adaptive
latency summary); every metric name an expr uses must be one this server exports or
one of NOT_EXPORTED_HERE, so a misspelt name in an allowed-empty panel fails too.

The expected values are computed from the requests sent, not read from the server. The server and
Prometheus are killed on every exit (also on failure, and by the kernel if this process dies:
PR_SET_PDEATHSIG). A Prometheus that cannot be started fails the test; it is never skipped.
"""
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import requests

DEADLINE_S = 60  # Prometheus ready, then the scraped values right: each within this many seconds
POLL_S = 0.5     # between two questions to Prometheus's API

# What the client sends (the expected values are derived from these, never from the server).
DISTINCT_KEYS = 40
DUPLICATES = 25        # of the first DUPLICATED_KEYS keys, round robin: several of one key at once
DUPLICATED_KEYS = 10
REFUSED = 3            # POSTs without an Idempotency-Key: 400, counted as requests, never charged
THREADS = 8


def die_with_parent():
    """preexec_fn: the child gets SIGKILL when this process dies, even by SIGKILL (ctest's timeout),
    so no server or Prometheus outlives the test. Linux only; elsewhere the finally blocks do it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port():
    """A port nothing listens on now, on loopback. Another process may take it before Prometheus
    binds it: start_prometheus() then tries again (a bounded number of times)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc, name):
    """SIGTERM, then SIGKILL if it has not exited within 15 s."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        print("%s did not stop on SIGTERM within 15 s: SIGKILL" % name, flush=True)
        proc.kill()
        proc.wait(timeout=15)


def tail(path, lines=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return "(cannot read %s: %s)" % (path, e)


class Failed(Exception):
    pass


def start_server(binary, workdir):
    args = [binary, "--port", "0", "--db", os.path.join(workdir, "payments.db")]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    line = proc.stdout.readline()  # printed once the port is bound
    if "listening on" not in line:
        stop(proc, "payment_server")
        raise Failed("payment_server did not start: %r (exit %s)" % (line, proc.poll()))
    return proc, line.split("listening on ")[1].split()[0]  # 127.0.0.1:PORT


def start_prometheus(binary, workdir, target):
    """Prometheus scraping http://TARGET/metrics every second; (process, base URL, log path) once
    /-/ready answers 200. Raises Failed, with the end of its log, if it exits or is not ready in
    DEADLINE_S."""
    config = os.path.join(workdir, "prometheus.yml")
    with open(config, "w") as f:
        f.write("global:\n"
                "  scrape_interval: 1s\n"
                "  scrape_timeout: 1s\n"
                "  evaluation_interval: 1s\n"
                "scrape_configs:\n"
                "  - job_name: payment_http\n"
                "    metrics_path: /metrics\n"
                "    static_configs:\n"
                "      - targets: ['%s']\n" % target)
    last = None
    for attempt in range(3):  # a port taken between free_port() and Prometheus's bind: another one
        port = free_port()
        log = os.path.join(workdir, "prometheus-%d.log" % attempt)
        args = [binary, "--config.file=" + config, "--storage.tsdb.path=" + os.path.join(workdir, "tsdb-%d" % attempt),
                "--web.listen-address=127.0.0.1:%d" % port]
        try:
            with open(log, "w") as out:
                proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        except OSError as e:
            raise Failed("cannot run Prometheus %r: %s (Debian: apt-get install prometheus)" % (binary, e))
        url = "http://127.0.0.1:%d" % port
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end and proc.poll() is None:
            try:
                if requests.get(url + "/-/ready", timeout=5).status_code == 200:
                    return proc, url, log
            except requests.ConnectionError:
                pass
            time.sleep(0.1)  # polling for readiness, bounded by the deadline
        exited = proc.poll()
        stop(proc, "prometheus")
        why = "exited with %s" % exited if exited is not None else "was not ready within %d s" % DEADLINE_S
        last = "%s %s; its log ends:\n%s" % (" ".join(args), why, tail(log))
        if exited is None or "address already in use" not in tail(log):
            break
    raise Failed("cannot start Prometheus: " + last)


def post(url, key, body):
    headers = {"Content-Type": "application/json", "Connection": "close"}
    if key is not None:
        headers["Idempotency-Key"] = '"%s"' % key
    return requests.post(url, data=json.dumps(body), headers=headers, timeout=30)


def send_requests(base):
    """The client's requests, each answer checked; returns the counts Prometheus must see."""
    url = base + "/payments"
    tag = uuid.uuid4().hex[:8]
    keys = ["prom-%d-%s" % (i, tag) for i in range(DISTINCT_KEYS)]
    body = {"amount": 1250, "currency": "EUR"}
    sent = {"requests": 0, "replayed": 0, "charges": 0}
    lock = threading.Lock()

    def count(what):
        with lock:
            sent[what] += 1

    def first(k):
        count("requests")
        r = post(url, k, body)
        if r.status_code != 201 or "Idempotent-Replayed" in r.headers:
            raise Failed("first request of %s: expected a new 201, got %s %s" % (k, r.status_code, r.text))
        count("charges")
        return r.content

    with ThreadPoolExecutor(THREADS) as pool:
        originals = dict(zip(keys, pool.map(first, keys)))
    # Every key is completed now (each first request has its 201): the duplicates are replays,
    # several of one key at once.
    dup_keys = [keys[i % DUPLICATED_KEYS] for i in range(DUPLICATES)]

    def duplicate(k):
        count("requests")
        r = post(url, k, body)
        if r.status_code != 201 or r.headers.get("Idempotent-Replayed") != "true" or r.content != originals[k]:
            raise Failed("duplicate of %s: expected its first response replayed, got %s %s %s"
                         % (k, r.status_code, dict(r.headers), r.text))
        count("replayed")

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(duplicate, dup_keys))
    for _ in range(REFUSED):
        count("requests")
        r = post(url, None, body)
        if r.status_code != 400:
            raise Failed("a POST without Idempotency-Key: expected 400, got %s %s" % (r.status_code, r.text))
    return {
        "payment_http_requests_total": sent["requests"],
        "payment_http_duplicates_replayed_total": sent["replayed"],
        "payment_http_charges_total": sent["charges"],
        "payment_http_in_flight": 0,
        "idem_acquired_total": len(set(keys)),
        "idem_succeeded_total": len(set(keys)),
        "idem_duplicates_total": sent["replayed"],
        "up": 1,
    }


def scraped(prom, names):
    """{name: value} of the series Prometheus holds now for job payment_http, from one instant query."""
    query = '{job="payment_http",__name__=~"%s"}' % "|".join(names)
    r = requests.get(prom + "/api/v1/query", params={"query": query}, timeout=10)
    r.raise_for_status()
    data = r.json()
    if data.get("status") != "success":
        raise Failed("Prometheus query %r: %s" % (query, data))
    return {s["metric"]["__name__"]: float(s["value"][1]) for s in data["data"]["result"]}


# --- The Grafana dashboard --------------------------------------------------------------------

DASHBOARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../ops/grafana/idem-dashboard.json")

# Panels whose series this example does not export, so Prometheus may answer them with an empty
# (but successful) result here. By title; each entry must name a panel of the dashboard.
ALLOWED_EMPTY = {
    "Duplicates executed (must be 0)": "verify/drill textfile (node-exporter), not the service",
    "Claim-to-completion latency (p50, p99)": "summary exported only with options.adaptive; the example runs without",
    "Time since the last verify and drill": "verify/drill textfile (node-exporter), not the service",
    "Keys checked by the last verify, checks of the last drill": "verify/drill textfile (node-exporter), not the service",
    "Verify and drill run time": "verify/drill textfile (node-exporter), not the service",
}

# Metric names a panel may use although this server does not export them, and where they come from.
NOT_EXPORTED_HERE = {
    "idem_verify_last_run_timestamp_seconds": "idem verify --prometheus",
    "idem_verify_violations": "idem verify --prometheus",
    "idem_verify_records_checked": "idem verify --prometheus",
    "idem_verify_duration_seconds": "idem verify --prometheus",
    "idem_drill_last_run_timestamp_seconds": "idem drill --prometheus",
    "idem_drill_failures": "idem drill --prometheus",
    "idem_drill_checks": "idem drill --prometheus",
    "idem_drill_duration_seconds": "idem drill --prometheus",
    "idem_operation_latency_seconds": "to_prometheus(stats, latencies) with options.adaptive",
    "idem_operation_latency_seconds_count": "to_prometheus(stats, latencies) with options.adaptive",
    "idem_operation_lease_seconds": "to_prometheus(stats, latencies) with options.adaptive",
}

# Grafana's built-in variables an expr may use, and what this test puts in their place.
BUILTINS = {"__rate_interval": "1m", "__interval": "1m", "__range": "1m"}

# $name, ${name}, ${name:format}, [[name]]: Grafana's variable syntaxes.
VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")
METRIC = re.compile(r"(?<![\w:])(?:idem|payment_http)_[A-Za-z0-9_]*")
LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?(\w+)\)$")


def substitute(text, values, where):
    def one(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            raise Failed("%s: variable $%s is neither a dashboard variable nor a known Grafana built-in (%s)"
                         % (where, name, text))
        return values[name]
    return VARIABLE.sub(one, text)


def check_dashboard_structure(dash):
    """The JSON model's shape; returns ([(panel, target)], {variable: definition})."""
    problems = []
    if not isinstance(dash.get("panels"), list) or not dash["panels"]:
        raise Failed("dashboard %s: no panels" % DASHBOARD)
    for key in ("title", "uid", "schemaVersion", "templating"):
        if key not in dash:
            problems.append("dashboard: no %r" % key)
    if not any(i.get("name") == "DS_PROMETHEUS" and i.get("pluginId") == "prometheus" for i in dash.get("__inputs", [])):
        problems.append("dashboard: no __inputs entry DS_PROMETHEUS (pluginId prometheus)")
    variables = {}
    for v in dash.get("templating", {}).get("list", []):
        if not v.get("name") or not v.get("type"):
            problems.append("template variable without name or type: %r" % v)
            continue
        variables[v["name"]] = v
    ds = variables.get("datasource")
    if ds is None or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("dashboard: no datasource variable 'datasource' of type prometheus")
    ids = {}
    targets = []
    for p in dash["panels"]:
        title = p.get("title")
        where = "panel %r (id %r)" % (title, p.get("id"))
        for key in ("id", "title", "type", "gridPos"):
            if key not in p or p[key] in (None, ""):
                problems.append("%s: no %s" % (where, key))
        if isinstance(p.get("id"), int):
            if p["id"] in ids:
                problems.append("%s: id %d also used by panel %r" % (where, p["id"], ids[p["id"]]))
            ids[p["id"]] = title
        else:
            problems.append("%s: id is not an integer" % where)
        gp = p.get("gridPos") or {}
        if not all(isinstance(gp.get(k), int) for k in ("h", "w", "x", "y")) or gp.get("x", 0) + gp.get("w", 0) > 24:
            problems.append("%s: gridPos %r is not h, w, x, y within 24 columns" % (where, gp))
        if p.get("type") == "row":
            if p.get("targets") or p.get("panels"):
                problems.append("%s: a row holds no targets or nested panels here (collapsed rows hide panels)" % where)
            continue
        if not p.get("description"):
            problems.append("%s: no description (where its series come from, what healthy looks like)" % where)
        if (p.get("datasource") or {}).get("uid") != "${datasource}":
            problems.append("%s: datasource is not the ${datasource} variable: %r" % (where, p.get("datasource")))
        if not p.get("targets"):
            problems.append("%s: no targets" % where)
        refs = set()
        for t in p.get("targets") or []:
            if not t.get("refId") or not t.get("expr"):
                problems.append("%s: a target without refId or expr: %r" % (where, t))
                continue
            if t["refId"] in refs:
                problems.append("%s: refId %s twice" % (where, t["refId"]))
            refs.add(t["refId"])
            if (t.get("datasource") or {}).get("uid") not in (None, "${datasource}"):
                problems.append("%s %s: datasource is not the ${datasource} variable" % (where, t["refId"]))
            targets.append((p, t))
    titles = [p.get("title") for p in dash["panels"] if p.get("type") != "row"]
    for t in ALLOWED_EMPTY:
        if t not in titles:
            problems.append("ALLOWED_EMPTY names %r, which is no panel of the dashboard" % t)
    if len(set(titles)) != len(titles):
        problems.append("two panels share a title (ALLOWED_EMPTY goes by title)")
    if problems:
        raise Failed("dashboard %s:\n  %s" % (DASHBOARD, "\n  ".join(problems)))
    return targets, variables


def prom_query(prom, expr):
    """(status, result or error) of an instant query; HTTP 400/422 carry the PromQL error as JSON."""
    r = requests.get(prom + "/api/v1/query", params={"query": expr}, timeout=10)
    try:
        data = r.json()
    except ValueError:
        raise Failed("Prometheus answered %s, not JSON, to %r: %s" % (r.status_code, expr, r.text[:500]))
    if data.get("status") == "success":
        return "success", data["data"]["result"]
    return data.get("status"), "%s: %s" % (data.get("errorType"), data.get("error"))


def check_variable_queries(prom, variables, values):
    """Each query variable's label_values(SELECTOR, LABEL), as Grafana asks it (/api/v1/label/LABEL/values
    with match[]=SELECTOR). job and instance must offer what this test scraped; store may be empty."""
    must_offer = {"job": values["job"], "instance": values["instance"]}
    for name, v in variables.items():
        if v.get("type") != "query":
            continue
        m = LABEL_VALUES.match(v.get("query") or "")
        if not m:
            raise Failed("variable %s: query %r is not label_values(SELECTOR, LABEL)" % (name, v.get("query")))
        selector = substitute(m.group(1) or "", dict(BUILTINS, **values), "variable " + name)
        params = {"match[]": selector} if selector else {}
        r = requests.get(prom + "/api/v1/label/%s/values" % m.group(2), params=params, timeout=10)
        data = r.json()
        if data.get("status") != "success":
            raise Failed("variable %s: %r: %s" % (name, v["query"], data))
        if name in must_offer and must_offer[name] not in data["data"]:
            raise Failed("variable %s: %r offers %r, not %r" % (name, v["query"], data["data"], must_offer[name]))
        print("  variable %s: %r -> %r" % (name, v["query"], data["data"]), flush=True)


def check_dashboard(prom, target):
    """Every panel target of the dashboard run through Prometheus; raises Failed with the panel and expr."""
    try:
        with open(DASHBOARD) as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        raise Failed("cannot read dashboard %s: %s" % (DASHBOARD, e))
    targets, variables = check_dashboard_structure(dash)
    names = requests.get(prom + "/api/v1/label/__name__/values", params={"match[]": '{job="payment_http"}'},
                         timeout=10).json()["data"]
    exported = set(names)
    # The dashboard's variables as this test's scrape sets them, and as "All" (allValue .*).
    scraped_here = {"job": "payment_http", "instance": target, "store": ".*", "datasource": "prometheus"}
    everything = {"job": ".*", "instance": ".*", "store": ".*", "datasource": "prometheus"}
    for name in variables:
        if name not in scraped_here:
            raise Failed("dashboard variable $%s: this test does not know what to put in its place" % name)
    check_variable_queries(prom, variables, scraped_here)
    empty_allowed = {}
    end = time.monotonic() + DEADLINE_S
    for panel, t in targets:
        title, expr = panel["title"], t["expr"]
        unknown = [m for m in METRIC.findall(re.sub(r'"[^"]*"', '""', expr))
                   if m not in exported and m not in NOT_EXPORTED_HERE]
        if unknown:
            raise Failed("panel %r, target %s: metric %s neither exported by payment_server nor listed in "
                         "NOT_EXPORTED_HERE: %s" % (title, t["refId"], ", ".join(unknown), expr))
        for label, values in (("selected", scraped_here), ("All", everything)):
            q = substitute(expr, dict(BUILTINS, **values), "panel %r, target %s" % (title, t["refId"]))
            while True:  # a rate() needs two samples in its window: poll, to the deadline, for a result
                status, result = prom_query(prom, q)
                if status != "success":
                    raise Failed("panel %r, target %s: PromQL error %s\n  expr: %s\n  sent: %s"
                                 % (title, t["refId"], result, expr, q))
                if result or title in ALLOWED_EMPTY or time.monotonic() > end:
                    break
                time.sleep(POLL_S)  # polling Prometheus for a condition, bounded by the deadline
            if not result and title not in ALLOWED_EMPTY:
                raise Failed("panel %r, target %s (variables %s): empty result within %d s, but its series are "
                             "exported by this example (if they are not, add the panel to ALLOWED_EMPTY)\n  expr: %s"
                             "\n  sent: %s" % (title, t["refId"], label, DEADLINE_S, expr, q))
            if not result:
                empty_allowed.setdefault(title, []).append("%s/%s" % (t["refId"], label))
            print("  ok %-58s %s %-8s %d series" % (title[:58], t["refId"], label, len(result)), flush=True)
    print("dashboard: %d panels, %d targets, every expr accepted by Prometheus" %
          (len([p for p in dash["panels"] if p.get("type") != "row"]), len(targets)), flush=True)
    for title, which in empty_allowed.items():
        print("  allowed empty: %r (%s): %s" % (title, ALLOWED_EMPTY[title], ", ".join(which)), flush=True)
    stale = [title for title in ALLOWED_EMPTY if title not in empty_allowed]
    if stale:  # the allow-list must stay honest: a panel with data here is checked for data
        raise Failed("panels allowed to be empty had data here (take them off ALLOWED_EMPTY): %s" % ", ".join(stale))


def main():
    if len(sys.argv) != 4:
        print("usage: test_prometheus.py PROMETHEUS_BINARY SERVER_BINARY WORKDIR", file=sys.stderr)
        return 2
    prometheus, binary, workdir = sys.argv[1:]
    if not prometheus or prometheus.endswith("NOTFOUND") or not os.access(prometheus, os.X_OK):
        print("FAILED: no Prometheus binary (%r). Install it (Debian: apt-get install prometheus; scripts/setup "
              "does) and re-run cmake, or set -DIDEM_PROMETHEUS=/path/to/prometheus" % prometheus, flush=True)
        return 1
    os.makedirs(workdir, exist_ok=True)
    # ctest stops a test past its TIMEOUT with a signal: turn SIGTERM into an exit that runs the finally.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("FAILED: terminated"))
    server = prom = None
    prom_log = None
    try:
        server, target = start_server(binary, workdir)
        base = "http://" + target
        m = requests.get(base + "/metrics", timeout=10)
        ctype = [p.strip() for p in m.headers.get("Content-Type", "").split(";")]
        if m.status_code != 200 or ctype[0] != "text/plain" or "version=0.0.4" not in ctype[1:]:
            raise Failed("GET /metrics: expected 200 text/plain; version=0.0.4, got %s %r"
                         % (m.status_code, m.headers.get("Content-Type")))
        prom, prom_url, prom_log = start_prometheus(prometheus, workdir, target)
        print("payment_server on %s, Prometheus on %s" % (target, prom_url), flush=True)
        expected = send_requests(base)
        print("expected, from what was sent: %s" % json.dumps(expected), flush=True)
        # Poll Prometheus until one scrape taken after the last answer holds every expected value.
        seen = {}
        end = time.monotonic() + DEADLINE_S
        while True:
            if server.poll() is not None:
                raise Failed("payment_server exited with %s" % server.returncode)
            if prom.poll() is not None:
                raise Failed("Prometheus exited with %s; its log ends:\n%s" % (prom.returncode, tail(prom_log)))
            seen = scraped(prom_url, list(expected))
            if all(seen.get(n) == v for n, v in expected.items()):
                break
            if time.monotonic() > end:
                wrong = {n: {"expected": v, "scraped": seen.get(n)} for n, v in expected.items() if seen.get(n) != v}
                raise Failed("within %d s Prometheus did not scrape the expected values: %s\n(all scraped: %s)"
                             % (DEADLINE_S, json.dumps(wrong), json.dumps(seen)))
            time.sleep(POLL_S)  # polling Prometheus for a condition, bounded by the deadline
        print("scraped by Prometheus: %s" % json.dumps(seen), flush=True)
        check_dashboard(prom_url, target)
        print("payment_http_prometheus: OK", flush=True)
        return 0
    except Failed as e:
        print("FAILED:", e, flush=True)
        return 1
    finally:
        stop(prom, "prometheus")
        stop(server, "payment_server")


if __name__ == "__main__":
    sys.exit(main())
