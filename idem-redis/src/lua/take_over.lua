-- take_over: as swap.lua, and only once the lease has lapsed: its deadline
-- (layouts 3 and 4) is no later than now, or (layouts 1 and 2, the lease
-- kept as ms before the key's expiry) the key's PTTL is no more than that.
-- It is read in the same script as the write: a renewal that lands first
-- makes the takeover fail.
if foreign then
  return v
end
if not v or state ~= 0 or token ~= ARGV[2] then
  -- A resent call whose first attempt was applied finds the new token,
  -- which only this call holds.
  if v and token == string.sub(ARGV[1], TOKEN_FIRST, TOKEN_LAST) then
    return 1
  end
  return 0
end
if stamped then
  if struct.unpack('>I6', v, head + 1 + DEADLINE_LEN) > now then
    return 0
  end
elseif redis.call('PTTL', key) > struct.unpack('>I8', v, head + 1) then
  return 0
end
put()
return 1
