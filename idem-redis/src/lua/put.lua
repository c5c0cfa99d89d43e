-- Writing ARGV[1] (scripts.rs puts this after record.lua in the scripts
-- that write a record): the client sends durations where the record keeps
-- its deadlines, and `put` turns them into deadlines on the server's clock
-- (`now`) in the same step. The key keeps no expiry, so no `volatile-*`
-- maxmemory policy evicts it. `is_put(v)` says whether `v` is what `put`
-- wrote, deadlines aside: a resent call recognises its own write.
local function put()
  local new = ARGV[1]
  local at = HEAD_V1
  if string.byte(new, 1) == 4 then
    at = HEAD_V2
  end
  local deadlines = struct.pack('>I6', now + struct.unpack('>I6', new, at + 1))
  if string.byte(new, 2) == 0 then
    deadlines = deadlines .. struct.pack('>I6', now + struct.unpack('>I6', new, at + 1 + DEADLINE_LEN))
  end
  redis.call('SET', key, new)
  redis.call('SETRANGE', key, at, deadlines)
end
local function is_put(found)
  local new = ARGV[1]
  if not found or not stamped or #found ~= #new or string.byte(found, 1) ~= string.byte(new, 1) then
    return false
  end
  local skip = DEADLINE_LEN
  if string.byte(new, 2) == 0 then
    skip = 2 * DEADLINE_LEN
  end
  return string.sub(found, 1, head) == string.sub(new, 1, head)
    and string.sub(found, head + skip + 1) == string.sub(new, head + skip + 1)
end
