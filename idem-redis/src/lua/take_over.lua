-- take_over: as swap.lua, and only once the lease has lapsed. The lease
-- deadline is stored as ms before the key's expiry (bytes 51-58), so it has
-- lapsed when PTTL is no more than that. It is read in the same script as
-- the write: a renewal that lands first makes the takeover fail.
if state ~= 0 or string.sub(v, 3, 18) ~= ARGV[3] then
  -- A resent call whose first attempt was applied finds the new token,
  -- which only this call holds.
  if string.sub(v, 3, 18) == string.sub(ARGV[1], 3, 18) then
    return 1
  end
  return 0
end
if redis.call('PTTL', key) > struct.unpack('>I8', v, 51) then
  return 0
end
redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
return 1
