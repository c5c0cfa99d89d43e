-- remove: delete the record under KEYS[1] if it is in flight and holds the
-- token ARGV[1]. Returns as swap.lua does. A resent remove whose first
-- attempt was applied finds nothing and returns 0; a release reported as
-- lost is only logged by the caller.
local key = KEYS[1]
local v = redis.call('GET', key)
if not v then
  return 0
end
local n = #v
if n < 50 or string.byte(v, 1) ~= 1 then
  return v
end
local state = string.byte(v, 2)
if state > 2 or (state == 0 and n < 58) then
  return v
end
if state ~= 0 or string.sub(v, 3, 18) ~= ARGV[1] then
  return 0
end
redis.call('DEL', key)
return 1
