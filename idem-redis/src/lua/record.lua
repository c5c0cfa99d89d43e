-- The start of every compare-and-set script (scripts.rs puts it before
-- each): reads the record under KEYS[1] into `v` and its state byte into
-- `state`. Returns 0 when the key is absent, and the value itself when it
-- is not a record of this layout (see src/record.rs): the client reports it
-- as corrupt and it is never overwritten. Statements, not a function: a
-- function shared this way would be created anew on every call.
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
