-- wrk script for `serve-bench`: POSTs the HTTP mode's 100-byte
-- JSON order to /pay, cycling through IDEM_WRK_KEYS idempotency keys (1000
-- by default). The first request on a key runs the handler; every later
-- one is a replay. The controls ignore the key. IDEM_WRK_PREFIX ("wrk" by
-- default) starts each key.
local prefix = os.getenv("IDEM_WRK_PREFIX") or "wrk"
local keys = tonumber(os.getenv("IDEM_WRK_KEYS") or "1000")
local body = '{"amount":1250,"currency":"EUR","customer":"cus_4f9a2c81d0e7","description":"monthly plan 2024-117"}'
local requests = {}
local next_key = 0

function init(args)
   for k = 1, keys do
      requests[k] = wrk.format("POST", nil, {
         ["Content-Type"] = "application/json",
         ["Idempotency-Key"] = prefix .. "-" .. k,
      }, body)
   end
end

function request()
   next_key = next_key % keys + 1
   return requests[next_key]
end
