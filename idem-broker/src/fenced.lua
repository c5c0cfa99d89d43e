-- A settle of one pending entry, fenced: it applies only while the entry is
-- still pending for this consumer at this delivery count, so a consumer
-- that stalled and lost the entry to another can settle nothing.
-- KEYS[1] stream, KEYS[2] dead-letter stream (or the stream again)
-- ARGV: group, consumer, entry id, delivery count, action, action argument,
--       then for "dead": the fields to add
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #pending ~= 1 or pending[1][2] ~= ARGV[2] or tostring(pending[1][4]) ~= ARGV[4] then
  return 0
end
local action = ARGV[5]
if action == 'ack' then
  redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
elseif action == 'touch' then
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'JUSTID')
elseif action == 'retry' then
  redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'IDLE', ARGV[6], 'JUSTID')
elseif action == 'dead' then
  local fields = {}
  for i = 7, #ARGV do fields[#fields + 1] = ARGV[i] end
  redis.call('XADD', KEYS[2], '*', unpack(fields))
  redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
else
  return redis.error_reply('unknown action ' .. action)
end
return 1
