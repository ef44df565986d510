-- wrk script for POST /v1/runs/{run_id}/decide: many runs, each one sequential.
--
-- A real orchestrator sends a run's decide calls one after another. wrk's Lua API
-- has no handle on the connection, so the script keeps that property another way:
-- each answer names its run_id, and response() puts that run back on a queue of
-- runs ready for their next call; request() takes the next ready run (or starts a
-- new one). So every run has at most one request in flight, and about as many runs
-- are live as there are connections. A run is retired after RUN_LEN calls (it then
-- holds 2*RUN_LEN events and RUN_LEN decision points: bounded, like a real run,
-- and below the default turn caps), and a fresh run takes its place.
--
-- Every request brings two events with fresh ids (a tool call and its return: one
-- decision point) and fresh content refs (so the loop detector stays quiet and the
-- model path is what is measured); times grow within a run.
--
-- Usage: wrk -s bench/decide.lua URL -- RUN_LEN PREFIX
-- Prints one line "BENCH_JSON {...}" with the figures, for bench/bench_serve.py.

local next_tid = 0

function setup(thread)
   thread:set("tid", next_tid)
   next_tid = next_tid + 1
end

function init(args)
   run_len = tonumber(args[1]) or 20
   prefix = args[2] or "b"
   headers = { ["Content-Type"] = "application/json" }
   ready = {}       -- queue of run ids whose previous call was answered
   ready_head = 1
   ready_tail = 0
   calls = {}       -- run id -> calls sent so far
   new_runs = 0
end

local body_fmt = '{"events":['
   .. '{"id":"u%d","t":%d.0,"type":"tool_use","agent":"coder","tool":"bash",'
   .. '"tokens":900,"usd":0.001,"content_ref":"c%s-%d"},'
   .. '{"id":"r%d","t":%d.5,"type":"return","agent":"coder","to":"orchestrator",'
   .. '"tokens":200,"usd":0.0004,"content_ref":"o%s-%d"}]}'

function request()
   local run_id
   if ready_head <= ready_tail then
      run_id = ready[ready_head]
      ready[ready_head] = nil
      ready_head = ready_head + 1
   else
      run_id = string.format("%s-%d-%d", prefix, tid, new_runs)
      new_runs = new_runs + 1
      calls[run_id] = 0
   end
   local k = calls[run_id]
   calls[run_id] = k + 1
   local body = string.format(body_fmt, k, k, run_id, k, k, k, run_id, k)
   return wrk.format("POST", "/v1/runs/" .. run_id .. "/decide", headers, body)
end

function response(status, headers, body)
   local run_id = string.match(body, '"run_id"%s*:%s*"([^"]+)"')
   if run_id == nil or calls[run_id] == nil then
      return
   end
   if status == 200 and calls[run_id] < run_len then
      ready_tail = ready_tail + 1
      ready[ready_tail] = run_id
   else
      calls[run_id] = nil -- retired (or failed): a fresh run takes its place
   end
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,'
      .. '"errors_connect":%d,"errors_read":%d,"errors_write":%d,"errors_status":%d,"errors_timeout":%d,'
      .. '"p50_us":%.1f,"p90_us":%.1f,"p99_us":%.1f,"mean_us":%.1f,"max_us":%.1f}\n',
      summary.requests, summary.duration, summary.bytes,
      e.connect, e.read, e.write, e.status, e.timeout,
      latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean, latency.max))
end
