-- load: the live record under KEYS[1] and the clock to read it by, as
-- claim.lua returns it, or 0 when there is none. Writes nothing.
if foreign then
  return v
end
if not v then
  return 0
end
local pttl = 0
if not stamped then
  pttl = redis.call('PTTL', key)
end
return {v, now, pttl}
