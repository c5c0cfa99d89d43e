-- swap: replace the record under KEYS[1] with ARGV[1], kept ARGV[2] ms,
-- if it is in flight and holds the token ARGV[3]. With a channel in ARGV[4],
-- a new value that is an outcome (state byte not 0) is published there as
-- the key, in this same step, to wake the key's waiters.
-- Follows record.lua, which has read the record into `v` and `state`.
--
-- Returns 1 when replaced (or found already replaced by this very value),
-- 0 when the key is absent or the record is not in flight under that token,
-- and the value itself when it is not a record of this layout.
if state ~= 0 or token ~= ARGV[3] then
  -- A resent call (a cluster client resends after a timeout) whose first
  -- attempt was applied finds its own value, token included: that is a
  -- success, not a lost lease.
  if v == ARGV[1] then
    return 1
  end
  return 0
end
redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
if ARGV[4] and string.byte(ARGV[1], 2) ~= 0 then
  redis.call('PUBLISH', ARGV[4], key)
end
return 1
