-- swap: replace the record under KEYS[1] with ARGV[1], kept ARGV[2] ms,
-- if it is in flight and holds the token ARGV[3].
--
-- Returns 1 when replaced (or found already replaced by this very value),
-- 0 when the key is absent or the record is not in flight under that token,
-- and the value itself when it is not a record of this layout (see
-- src/record.rs): the client reports it as corrupt and it is never
-- overwritten.
--
-- Each script is self-contained on purpose: helper functions shared by
-- concatenation would be created anew on every call.
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
if state ~= 0 or string.sub(v, 3, 18) ~= ARGV[3] then
  -- A resent call (a cluster client resends after a timeout) whose first
  -- attempt was applied finds its own value, token included: that is a
  -- success, not a lost lease.
  if v == ARGV[1] then
    return 1
  end
  return 0
end
redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
return 1
