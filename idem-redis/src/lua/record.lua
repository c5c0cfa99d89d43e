-- The start of every compare-and-set script (scripts.rs puts it before
-- each): reads the record under KEYS[1] into `v`, its state byte into
-- `state` and the length of its head into `head`. Returns 0 when the key is
-- absent, and the value itself when it is not a record of a layout this
-- build reads (see src/record.rs): the client reports it as corrupt and it
-- is never overwritten. Statements, not a function: a function shared this
-- way would be created anew on every call.
--
-- The layout, from src/record.rs (a test there fails if these drift): the
-- head length of layouts 1 and 2, the token's first and last byte (1-based)
-- and the length of the in-flight lease deadline after the head.
local HEAD_V1, HEAD_V2, TOKEN_FIRST, TOKEN_LAST, LEASE_LEN = 50, 51, 3, 18, 8
local key = KEYS[1]
local v = redis.call('GET', key)
if not v then
  return 0
end
local n = #v
local version = string.byte(v, 1)
local head
if version == 1 then
  head = HEAD_V1
elseif version == 2 then
  head = HEAD_V2
else
  return v
end
if n < head then
  return v
end
local state = string.byte(v, 2)
if state > 2 or (state == 0 and n < head + LEASE_LEN) then
  return v
end
local token = string.sub(v, TOKEN_FIRST, TOKEN_LAST)
