-- claim: insert ARGV[1] under KEYS[1] unless a live record is there (a
-- record past its retention is replaced). Returns 0 when it inserted;
-- otherwise the record found with the clock to read its deadlines by:
-- `{value, now, pttl}`, where `pttl` is the key's PTTL for layouts 1 and 2
-- (their retention is the key's expiry) and 0 for the others. A value that
-- is not a record is returned alone and left untouched.
if foreign then
  return v
end
if v then
  local pttl = 0
  if not stamped then
    pttl = redis.call('PTTL', key)
  end
  return {v, now, pttl}
end
put()
return 0
