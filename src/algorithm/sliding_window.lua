-- Sliding window (log): at most `limit` units within any span of
-- `window_us`.
--
-- KEY is a sorted set with one member per unit spent, scored by the time it
-- was spent (microseconds of Redis TIME). An entry stamped s counts while
-- now < s + window. Stamps never go backwards per key: if Redis's clock is
-- behind the newest entry (a clock step), the new stamp is newest + 1 µs, so
-- entries only ever live longer (never over-admits) and each call's stamp is
-- unique. Members are "<stamp>:<i>", unique even when many requests share a
-- microsecond; cost N adds N members.
--
-- Returns allowed (1|0), remaining, reset_after_us, retry_after_us (-1:
-- never), and a mark for refund.lua: the stamp of the entries added (0 when
-- none). With `spend` false it decides the same and adds nothing. Either way
-- it drops entries that have left the window.
local function sliding_window(key, now, limit, window, cost, spend)
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
    return 0, remaining, reset_after, -1, 0
  end
  if used + cost > limit then
    -- Enough of the oldest entries must leave: the k-th oldest is the last.
    local k = used + cost - limit
    local entry = redis.call('ZRANGE', key, k - 1, k - 1, 'WITHSCORES')
    return 0, remaining, reset_after, tonumber(entry[2]) + window - now, 0
  end
  local stamp = 0
  if cost > 0 and spend then
    stamp = now
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
  return 1, remaining - cost, reset_after, 0, stamp
end
