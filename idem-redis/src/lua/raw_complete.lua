-- The raw protocol's complete (the benchmark's baseline, not the store):
-- replace the in-flight value whose token is ARGV[1] with ARGV[2], kept
-- ARGV[3] ms.
local v = redis.call('GET', KEYS[1])
if v and string.byte(v, 1) == 0 and string.sub(v, 2, 17) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
