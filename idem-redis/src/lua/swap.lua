-- swap: replace the record under KEYS[1] with ARGV[1] if it is live, in
-- flight and holds the token ARGV[2]. With a channel in ARGV[3], a new
-- value that is an outcome (state byte not 0) is published there as the
-- key, in this same step, to wake the key's waiters.
--
-- Returns 1 when replaced (or found already replaced by this very value),
-- 0 when the key is absent or the record is not in flight under that token,
-- and the value itself when it is not a record of a layout this build reads.
if foreign then
  return v
end
if not v or state ~= 0 or token ~= ARGV[2] then
  -- A resent call (a cluster client resends after a timeout) whose first
  -- attempt was applied finds its own value, token included: that is a
  -- success, not a lost lease.
  if is_put(v) then
    return 1
  end
  return 0
end
put()
if ARGV[3] and string.byte(ARGV[1], 2) ~= 0 then
  redis.call('PUBLISH', ARGV[3], key)
end
return 1
