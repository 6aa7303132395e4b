#!/usr/bin/env python3
"""The payment HTTP example against a real HTTP client (Python requests) and an independent ledger.

    test_payment_http.py SERVER_BINARY WORKDIR [--pg URI]

The ledger is the payment processor the server charges through (POST /charges): an HTTP service in
this test process that shares no code with the server and counts every charge it is asked for. A
second charge of one key is counted, not deduplicated, so "charged once" is checked where the money
moves, not by asking the server.

Checks (each failure names the case):
  * a missing Idempotency-Key gets 400, a malformed one 400, a bad body 400, none of them charged;
  * 50 concurrent POSTs with one key charge once; every answer is the first response or a 409;
    retries after completion get identical bytes and Idempotent-Replayed: true;
  * the key reused with another body gets 422 and charges nothing;
  * a declined charge (402) is stored with a terminal failure (fail(402, terminal, response)) and replayed;
  * 300 keys posted by 30 threads, each key three times: 300 charges;
  * SIGKILL of the server before the charge, after the charge and after its record, restart, retry:
    the client gets the stored response or a retryable status, and the ledger has one charge.
With --pg the server runs on PostgreSQL instead of SQLite.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

CARD_LIMIT = 1_000_000


class Ledger:
    """Every charge the processor was asked to make, by idempotency key.

    An attempt (key, the claim's fence) that the server's resolver voided is refused if its charge
    request arrives later, as a processor's void of an authorisation would; every other charge
    request is a charge, even a second one for a key."""

    def __init__(self):
        self.lock = threading.Lock()
        self.charges = {}  # key -> [charge ids]
        self.attempts = {}  # (key, attempt) -> charge id
        self.voided = set()  # (key, attempt)
        self.next_id = 1

    def charge(self, key, attempt, amount):
        """The charge id, "declined" or "voided"."""
        with self.lock:
            if (key, attempt) in self.voided:
                return "voided"
            if amount > CARD_LIMIT:
                return "declined"
            cid = self.next_id
            self.next_id += 1
            self.charges.setdefault(key, []).append(cid)
            self.attempts[(key, attempt)] = cid
            return cid

    def void(self, key, attempt):
        """The attempt's charge id, or None after voiding it."""
        with self.lock:
            if (key, attempt) in self.attempts:
                return self.attempts[(key, attempt)]
            self.voided.add((key, attempt))
            return None

    def of(self, key):
        with self.lock:
            return list(self.charges.get(key, []))

    def total(self):
        with self.lock:
            return sum(len(v) for v in self.charges.values())


def start_ledger(ledger):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/charges/void":
                cid = ledger.void(req["idempotency_key"], req["attempt"])
                if cid is None:
                    self.reply(404, {"reason": "no charge; attempt voided"})
                else:
                    self.reply(200, {"charge_id": cid})
                return
            cid = ledger.charge(req["idempotency_key"], req["attempt"], req["amount"])
            if cid == "declined":
                self.reply(402, {"reason": "amount above the card limit"})
            elif cid == "voided":
                self.reply(409, {"reason": "attempt voided"})
            else:
                self.reply(200, {"charge_id": cid})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


class Server:
    def __init__(self, binary, workdir, ledger_url, pg_uri):
        self.args = [binary, "--port", "0", "--processor", ledger_url, "--lease-ms", "1500", "--test-hooks"]
        self.args += ["--pg", pg_uri] if pg_uri else ["--db", os.path.join(workdir, "payments.db")]
        self.proc = None
        self.url = None

    def start(self):
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # printed once the port is bound
        if "listening on" not in line:
            raise AssertionError("server did not start: %r (exit %s)" % (line, self.proc.poll()))
        self.url = "http://" + line.split("listening on ")[1].split()[0] + "/payments"

    def wait_killed(self):
        rc = self.proc.wait(timeout=30)
        if rc != -signal.SIGKILL:
            raise AssertionError("server exit %s, expected SIGKILL" % rc)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)


failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def post(url, key, body, **kw):
    # One request per connection: cpp-httplib serves a kept-alive connection on one pool thread until
    # the client closes it, and these clients are threads that each send one request at a time.
    headers = {"Content-Type": "application/json", "Connection": "close"}
    if key is not None:
        headers["Idempotency-Key"] = '"%s"' % key
    headers.update(kw.pop("headers", {}))
    return requests.post(url, data=json.dumps(body), headers=headers, timeout=30, **kw)


def post_until_done(url, key, body, deadline_s=60):
    """A client's retry loop: retry 409/503 (Retry-After) and lost connections until an answer."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            r = post(url, key, body)
            if r.status_code not in (409, 503):
                return r
            pause = float(r.headers.get("Retry-After", "1")) / 10
        except requests.ConnectionError:
            pause = 0.1
        if time.monotonic() > end:
            raise AssertionError("no final answer for key %s within %ss" % (key, deadline_s))
        time.sleep(pause)  # the client's back-off between retries, not a synchronisation


def test_refusals(url, ledger):
    before = ledger.total()
    r = post(url, None, {"amount": 100, "currency": "EUR"})
    check(r.status_code == 400 and "Idempotency-Key" in r.json()["title"], "missing key -> 400 (%s)" % r.status_code)
    r = requests.post(url, data="{}", headers={"Idempotency-Key": "not-quoted", "Connection": "close"}, timeout=30)
    check(r.status_code == 400 and "RFC 8941" in r.json()["detail"], "unquoted key -> 400 naming RFC 8941 (%s %s)" % (r.status_code, r.text))
    r = post(url, "k-" + uuid.uuid4().hex, {"amount": -5, "currency": "EUR"})
    check(r.status_code == 400 and "amount" in r.json()["detail"], "negative amount -> 400 naming amount")
    r = post(url, "x" * 129, {"amount": 5, "currency": "EUR"})
    check(r.status_code == 400 and "128" in r.json()["detail"], "129-byte key -> 400 naming the limit (%s)" % r.text)
    check(ledger.total() == before, "refused requests charged nothing")


def test_concurrent_one_key(url, ledger):
    key = "once-" + uuid.uuid4().hex
    body = {"amount": 1250, "currency": "EUR", "card": "4242"}
    barrier = threading.Barrier(50)
    answers = [None] * 50

    def one(i):
        barrier.wait()
        answers[i] = post(url, key, body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    charges = ledger.of(key)
    check(len(charges) == 1, "50 concurrent POSTs, one key: charged %d times" % len(charges))
    firsts = [a for a in answers if a.status_code == 201]
    others = [a for a in answers if a.status_code != 201]
    check(all(a.status_code == 409 for a in others), "every other answer is 409: %s" % sorted({a.status_code for a in others}))
    check(len(firsts) >= 1, "at least one 201")
    originals = [a for a in firsts if "Idempotent-Replayed" not in a.headers]
    check(len(originals) == 1, "exactly one original response, %d" % len(originals))
    if not originals:
        return
    original = originals[0].content
    check(all(a.content == original for a in firsts), "every 201 carries the original bytes")
    check(json.loads(original)["charge_id"] == charges[0], "the response names the ledger's charge")
    for _ in range(3):
        r = post(url, key, body)
        check(r.status_code == 201 and r.content == original, "retry after completion: identical bytes")
        check(r.headers.get("Idempotent-Replayed") == "true", "retry after completion: Idempotent-Replayed: true")
    check(len(ledger.of(key)) == 1, "retries charged nothing")


def test_mismatch_and_decline(url, ledger):
    key = "mm-" + uuid.uuid4().hex
    first = post(url, key, {"amount": 700, "currency": "EUR"})
    check(first.status_code == 201, "first payment 201")
    r = post(url, key, {"amount": 701, "currency": "EUR"})
    check(r.status_code == 422, "same key, different body -> 422 (%s)" % r.status_code)
    check(len(ledger.of(key)) == 1, "the mismatch charged nothing")
    key = "decline-" + uuid.uuid4().hex
    d = post(url, key, {"amount": CARD_LIMIT + 1, "currency": "EUR"})
    check(d.status_code == 402 and json.loads(d.content)["status"] == "declined", "over the limit -> 402")
    r = post(url, key, {"amount": CARD_LIMIT + 1, "currency": "EUR"})
    check(r.status_code == 402 and r.content == d.content and r.headers.get("Idempotent-Replayed") == "true",
          "a declined payment is replayed byte for byte")


def test_many_keys(url, ledger):
    keys = ["many-%d-%s" % (i, uuid.uuid4().hex[:8]) for i in range(300)]
    before = ledger.total()
    bodies = {}
    lock = threading.Lock()
    barrier = threading.Barrier(30)

    def worker(w):
        barrier.wait()
        for rep in range(3):
            for k in keys[w::30]:
                r = post_until_done(url, k, {"amount": 10 + w, "currency": "USD"})
                with lock:
                    bodies.setdefault(k, set()).add(r.content)
                check(r.status_code == 201, "key %s answered %s" % (k, r.status_code))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(ledger.total() - before == 300, "300 keys three times: %d charges" % (ledger.total() - before))
    check(all(len(v) == 1 for v in bodies.values()), "each key's three answers are identical")


def test_crash(server, ledger, point):
    key = "crash-%s-%s" % (point, uuid.uuid4().hex)
    body = {"amount": 4200, "currency": "GBP"}
    try:
        post(server.url, key, body, headers={"X-Test-Crash": point})
        check(False, "%s: the server answered instead of dying" % point)
    except requests.ConnectionError:
        pass
    server.wait_killed()
    charged_before_restart = len(ledger.of(key))
    check(charged_before_restart == (0 if point == "before-charge" else 1), "%s: charges before restart %d" % (point, charged_before_restart))
    server.start()
    r = post_until_done(server.url, key, body)
    charges = ledger.of(key)
    check(len(charges) == 1, "%s: one charge after restart and retries, ledger has %d" % (point, len(charges)))
    check(r.status_code == 201 and json.loads(r.content)["charge_id"] == charges[0],
          "%s: the retry's answer names the ledger's charge (%s %s)" % (point, r.status_code, r.text))
    again = post(server.url, key, body)
    check(again.status_code == 201 and again.content == r.content, "%s: later retries identical" % point)


def main():
    binary, workdir = sys.argv[1], sys.argv[2]
    pg_uri = None
    if len(sys.argv) > 3:
        if sys.argv[3] != "--pg" or len(sys.argv) < 5 or not sys.argv[4]:
            print("the PostgreSQL run needs --pg URI (IDEM_TEST_PG_URI: scripts/test starts the server)")
            return 1
        pg_uri = sys.argv[4]
    os.makedirs(workdir, exist_ok=True)
    ledger = Ledger()
    ledger_srv = start_ledger(ledger)
    server = Server(binary, workdir, "http://127.0.0.1:%d" % ledger_srv.server_address[1], pg_uri)
    server.start()
    try:
        test_refusals(server.url, ledger)
        test_concurrent_one_key(server.url, ledger)
        test_mismatch_and_decline(server.url, ledger)
        test_many_keys(server.url, ledger)
        for point in ("before-charge", "after-charge", "after-record"):
            test_crash(server, ledger, point)
    finally:
        server.stop()
        ledger_srv.shutdown()
    print("payment_http: %d charges in the ledger, %d failures" % (ledger.total(), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
