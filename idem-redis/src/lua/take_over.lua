-- take_over: as swap.lua, and only once the lease has lapsed. The lease
-- deadline is stored as ms before the key's expiry (the 8 bytes after the
-- head), so it has lapsed when PTTL is no more than that. It is read in the same script as
-- the write: a renewal that lands first makes the takeover fail.
if state ~= 0 or token ~= ARGV[3] then
  -- A resent call whose first attempt was applied finds the new token,
  -- which only this call holds.
  if token == string.sub(ARGV[1], TOKEN_FIRST, TOKEN_LAST) then
    return 1
  end
  return 0
end
if redis.call('PTTL', key) > struct.unpack('>I8', v, head + 1) then
  return 0
end
redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
return 1
