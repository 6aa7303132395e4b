-- wrk script for scripts/bench-http: POST /payments with a fresh Idempotency-Key per request (every
-- request is a first request, so each one claims, charges and records), or with IDEM_REPLAY set, a
-- small set of keys again and again (every request after the first few is a replay).
local threads = {}
local body = '{"amount":1250,"currency":"EUR","card":"4242"}'

function setup(thread)
  thread:set("id", #threads + 1)
  thread:set("run", tostring(os.time()) .. "-" .. tostring(math.random(1, 1000000000)))
  table.insert(threads, thread)
end

function init(args)
  n = 0
  -- scripts/bench-http sets IDEM_REPLAY= (empty) for the fresh-key runs, and os.getenv returns ""
  -- for a variable set empty: only a non-empty value asks for replays.
  local r = os.getenv("IDEM_REPLAY")
  replay = r ~= nil and r ~= ""
end

function request()
  n = n + 1
  local k = replay and (n % 64) or n
  local key = string.format('"%s-%d-%d"', run, id, k)
  return wrk.format("POST", "/payments", {["Content-Type"] = "application/json", ["Idempotency-Key"] = key}, body)
end

function response(status, headers, body)
  if status ~= 201 then
    bad = (bad or 0) + 1
  end
end

function done(summary, latency, requests)
  io.write(string.format("RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d non2xx=%d errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.status, summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
