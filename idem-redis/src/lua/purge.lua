-- purge: delete the record under KEYS[1] if it is past its retention
-- deadline. Returns 1 when it deleted, else 0. Records of layouts 1 and 2
-- expire by themselves, and a value that is not a record is left alone.
if lapsed then
  redis.call('DEL', key)
  return 1
end
return 0
