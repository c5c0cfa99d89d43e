-- The start of every script (scripts.rs puts it before each): reads the
-- server's clock into `now` (ms since the Unix epoch) and the record under
-- KEYS[1] into `v`, its state byte into `state`, its token into `token`
-- and the length of its head into `head`. `stamped` says the value keeps
-- its deadlines (layouts 3 and 4), and `foreign` that it is not a record
-- of a layout this build reads (see src/record.rs): every script returns
-- such a value itself, the client reports it as corrupt, and nothing
-- overwrites it. A record past its retention deadline is `lapsed`, and
-- `v` is then nil: it reads as absent, as a key with an expiry would.
-- Statements, not a function: a function shared this way would be
-- created anew on every call.
--
-- The layout, from src/record.rs (a test there fails if these drift): the
-- head length of layouts 1 and 3 and of 2 and 4, the token's first and
-- last byte (1-based), the length of a deadline (layouts 3 and 4) and of
-- the lease offset (layouts 1 and 2).
local HEAD_V1, HEAD_V2, TOKEN_FIRST, TOKEN_LAST, DEADLINE_LEN, OFFSET_LEN = 50, 51, 3, 18, 6, 8
local key = KEYS[1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local v = redis.call('GET', key)
local head, state, token, stamped
local foreign, lapsed = false, false
if v then
  local version = string.byte(v, 1)
  if version == 3 or version == 1 then
    head = HEAD_V1
  elseif version == 4 or version == 2 then
    head = HEAD_V2
  end
  stamped = version == 3 or version == 4
  state = string.byte(v, 2)
  if not head or not state or state > 2 then
    foreign = true
  else
    local need = head
    if stamped then
      need = need + DEADLINE_LEN
      if state == 0 then
        need = need + DEADLINE_LEN
      end
    elseif state == 0 then
      need = need + OFFSET_LEN
    end
    foreign = #v < need
  end
  if not foreign then
    token = string.sub(v, TOKEN_FIRST, TOKEN_LAST)
    if stamped and struct.unpack('>I6', v, head + 1) <= now then
      lapsed = true
      v = nil
    end
  end
end
