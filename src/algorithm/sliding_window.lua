-- Sliding window (log): at most `limit` units within any span of `window_us`.
--
-- KEYS[1]  a sorted set with one member per unit spent, scored by the time it
--          was spent in microseconds of Redis TIME
-- ARGV[1]  limit, an integer >= 1
-- ARGV[2]  window_us, an integer >= 1000
-- ARGV[3]  cost, an integer >= 0 (0 looks without spending); cost N adds N
--          members
-- Reply    {allowed 1|0, remaining, reset_after_us, retry_after_us (-1: never)}
--
-- An entry stamped s counts while now < s + window. Stamps never go
-- backwards per key: if Redis's clock is behind the newest entry (a clock
-- step), the new stamp is newest + 1 µs, so entries only ever live longer
-- (never over-admits) and each call's stamp is unique. Members are
-- "<stamp>:<i>", unique even when many requests share a microsecond.
-- A denied request adds nothing (it only drops entries already outside the
-- window).
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local used = redis.call('ZCARD', key)
local newest = nil
if used > 0 then
  newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
end

local remaining = math.max(0, limit - used)
local reset_after = 0
if newest then
  reset_after = newest + window - now
end
if cost > limit then
  return {0, remaining, reset_after, -1}
end
if used + cost > limit then
  -- Enough of the oldest entries must leave: the k-th oldest is the last.
  local k = used + cost - limit
  local entry = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
  return {0, remaining, reset_after, tonumber(entry[2]) + window - now}
end
if cost > 0 then
  local stamp = now
  if newest and newest >= now then
    stamp = newest + 1
  end
  local stamp_text = string.format('%d', stamp)
  -- ZADD in batches: Lua's unpack has a bounded stack.
  local batch = {}
  for i = 1, cost do
    batch[#batch + 1] = stamp
    batch[#batch + 1] = stamp_text .. ':' .. i
    if #batch >= 1000 or i == cost then
      redis.call('ZADD', key, unpack(batch))
      batch = {}
    end
  end
  reset_after = stamp + window - now
  redis.call('PEXPIRE', key, math.ceil(reset_after / 1000))
end
return {1, remaining - cost, reset_after, 0}
