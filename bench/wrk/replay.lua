-- Replays the requests of presign.py with wrk, each exactly once: thread k of n sends lines k, k+n, k+2n, ...
-- then only `GET /health` (answered 200; an ingest is answered 202 or refused, never 200, since every id is
-- new). When a thread has an answer to each of its ingests it writes MARKER.<k>; run.sh then ends wrk (SIGINT)
-- and wrk prints its summary and the ingest answers by status.
--   wrk -t2 -c64 -d300s -s bench/wrk/replay.lua http://127.0.0.1:18181 -- REQUESTS PATH THREADS MARKER
-- (THREADS is wrk's -t: a thread does not know how many others there are when it starts)
local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

local reqs, idx, health, ingest_answers, accepted, refused, marker = {}, 0, nil, 0, 0, 0, nil

function init(args)
  local file, path = args[1], args[2]
  local nthreads = tonumber(args[3] or "1")
  local tid = tonumber(wrk.thread:get("tid"))
  marker = args[4] and (args[4] .. "." .. tid)
  health = wrk.format("GET", "/health")
  -- wrk calls request() once on thread 0 to check the script before any connection opens: that call must
  -- not use up a request.
  if tid == 0 then idx = -1 end
  local n = 0
  for line in io.lines(file) do
    if n % nthreads == tid then
      local id, ts, sig, body = line:match("^([^\t]+)\t([^\t]+)\t([^\t]+)\t(.*)$")
      reqs[#reqs + 1] = wrk.format("POST", path, {
        ["content-type"] = "application/json",
        ["webhook-id"] = id, ["webhook-timestamp"] = ts, ["webhook-signature"] = sig,
      }, body)
    end
    n = n + 1
  end
end

function request()
  idx = idx + 1
  if idx < 1 or idx > #reqs then return health end
  return reqs[idx]
end

function response(status, headers, body)
  if status == 200 then return end
  ingest_answers = ingest_answers + 1
  if status == 202 then accepted = accepted + 1 else refused = refused + 1 end
  if ingest_answers == #reqs then
    wrk.thread:set("accepted", accepted)
    wrk.thread:set("refused", refused)
    if marker then local f = io.open(marker, "w"); f:write("done\n"); f:close() end
  end
end

function done(summary, latency, requests)
  local a, r = 0, 0
  for _, t in ipairs(threads) do
    a = a + (tonumber(t:get("accepted")) or 0)
    r = r + (tonumber(t:get("refused")) or 0)
  end
  io.write(string.format("answers: 202=%d refused=%d\n", a, r))
end
