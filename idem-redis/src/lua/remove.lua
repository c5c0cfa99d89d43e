-- remove: delete the record under KEYS[1] if it is live, in flight and
-- holds the token ARGV[1]. Returns as swap.lua does. A resent remove whose
-- first attempt was applied finds nothing and returns 0; a release
-- reported as lost is only logged by the caller. With a channel in
-- ARGV[2], the key is published there to wake its waiters.
if foreign then
  return v
end
if not v or state ~= 0 or token ~= ARGV[1] then
  return 0
end
redis.call('DEL', key)
if ARGV[2] then
  redis.call('PUBLISH', ARGV[2], key)
end
return 1
