-- Fixed window: at most `limit` units per window; the window starts with the
-- key's first spending request and ends `window_ms` later.
--
-- KEYS[1]  the counter: a string holding the units spent in this window
-- ARGV[1]  limit, an integer >= 1
-- ARGV[2]  window_ms, an integer >= 1
-- ARGV[3]  cost, an integer >= 0 (0 looks without spending)
-- Reply    {allowed 1|0, remaining, reset_after_us, retry_after_us (-1: never)}
--
-- The counter is created with its expiry in one SET ... PX, so no counter is
-- ever left without a TTL (the INCR-then-EXPIRE gap of the original
-- middleware). Time is Redis's own: the key's expiry is the window's end.
-- A denied request writes nothing.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local ttl_ms = redis.call('PTTL', key)
local used = 0
local in_window = ttl_ms >= 0
if in_window then
  used = tonumber(redis.call('GET', key)) or 0
else
  -- -2: no window in progress. -1: a key without expiry that this script did
  -- not write; it is overwritten below with one.
  ttl_ms = 0
end

local remaining = math.max(0, limit - used)
if cost > limit then
  return {0, remaining, ttl_ms * 1000, -1}
end
if used + cost > limit then
  -- The window's end is when the whole limit is back; PTTL 0 means "within
  -- this millisecond".
  return {0, remaining, ttl_ms * 1000, math.max(1, ttl_ms) * 1000}
end
if cost > 0 then
  if in_window then
    redis.call('INCRBY', key, cost)
  else
    redis.call('SET', key, cost, 'PX', window_ms)
    ttl_ms = window_ms
  end
end
return {1, remaining - cost, ttl_ms * 1000, 0}
