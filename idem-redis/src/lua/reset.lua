-- reset: delete the record under KEYS[1] if it is live and completed or
-- failed, so that its key runs again. Returns 0 when there is none, the
-- state deleted (1 completed, 2 failed), or -1 for a record in flight,
-- which is left alone: only its owner's token may release it. Nobody waits
-- on a settled record, so nothing is published. A resent reset whose first
-- attempt was applied finds nothing and returns 0.
if foreign then
  return v
end
if not v then
  return 0
end
if state == 0 then
  return -1
end
redis.call('DEL', key)
return state
