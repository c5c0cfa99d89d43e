-- wrk script for first executions: POSTs the HTTP mode's 100-byte JSON
-- order to the URL's path under a key no request has used before, so that every
-- request through idem-proxy claims, forwards and records. Keys are
-- IDEM_WRK_PREFIX (set it anew for each run) and the thread's number and a
-- counter; servers without idem ignore the key.
local prefix = os.getenv("IDEM_WRK_PREFIX") or "wrk-first"
local body = '{"amount":1250,"currency":"EUR","customer":"cus_4f9a2c81d0e7","description":"monthly plan 2024-117"}'
local threads = 0
local counter = 0

function setup(thread)
   threads = threads + 1
   -- A global of the thread's own state.
   thread:set("id", threads)
end

function request()
   counter = counter + 1
   return wrk.format("POST", nil, {
      ["Content-Type"] = "application/json",
      ["Idempotency-Key"] = prefix .. "-" .. (id or 0) .. "-" .. counter,
   }, body)
end
