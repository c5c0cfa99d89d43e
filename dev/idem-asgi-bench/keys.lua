-- wrk script: POST /pay with a small JSON body and an Idempotency-Key.
-- wrk ... -s keys.lua URL -- first PREFIX   each request a fresh key
-- wrk ... -s keys.lua URL -- replay PREFIX N  keys PREFIX-0 .. PREFIX-(N-1),
--                                             recorded beforehand, in turn
local threads = 0

function setup(thread)
   thread:set("tid", threads)
   threads = threads + 1
end

local mode, prefix, count, n = "first", "k", 1, 0
local body = '{"amount":1250,"currency":"EUR"}'

function init(args)
   mode = args[1] or "first"
   prefix = args[2] or "k"
   count = tonumber(args[3] or "1")
   n = tid * 7919
end

function request()
   n = n + 1
   local key
   if mode == "first" then
      key = prefix .. "-" .. tid .. "-" .. n
   else
      key = prefix .. "-" .. (n % count)
   end
   return wrk.format("POST", nil, {
      ["Host"] = wrk.headers["Host"],
      ["Content-Type"] = "application/json",
      ["Idempotency-Key"] = key,
   }, body)
end
