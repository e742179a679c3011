-- wrk script for bench/gateway_bench.sh: POST the JSON body in the file named by WRK_BODY, with a
-- bearer token from WRK_TOKEN when set, on every request; at the end print one machine-readable
-- line (latencies in microseconds, wrk's per-request histogram).
local f = assert(io.open(os.getenv("WRK_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
local token = os.getenv("WRK_TOKEN")
if token and token ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. token
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK_RESULT requests=%d duration_us=%d mean_us=%.1f p50_us=%d p95_us=%d p99_us=%d max_us=%d " ..
    "connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.duration, latency.mean, latency:percentile(50), latency:percentile(95),
    latency:percentile(99), latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
