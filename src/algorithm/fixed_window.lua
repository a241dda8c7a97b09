-- Fixed window: at most `limit` units per window of `window_ms`.
--
-- Anchored (aligned = 0), for CheckLimit: the window starts with the key's
-- first spending request. KEY is a string counter whose expiry is the
-- window's end, created with its expiry in one SET ... PX, so no counter is
-- ever left without a TTL (the INCR-then-EXPIRE gap of the original
-- middleware). Time is Redis's own expiry clock.
--
-- Aligned (aligned = 1), as envoyproxy/ratelimit: windows are the multiples
-- of `window_ms` since the Unix epoch (a minute starts at :00). KEY is a
-- hash {w = window number, n = units spent} expiring at the window's end.
-- The window number is stored because Redis expires keys by the script's
-- start time while `now` is read from TIME a moment later: a key left from
-- the previous window is recognised by its number, not counted.
--
-- Returns allowed (1|0), remaining, reset_after_us, retry_after_us (-1:
-- never), and a mark for refund.lua: the window number of an aligned
-- window (0 when anchored). With `spend` DRY it decides the same and
-- writes nothing; with ALWAYS it counts a denied cost too (as
-- envoyproxy/ratelimit does), and `remaining` is what is left after it.
local function fixed_window(key, now, limit, window_ms, aligned, cost, spend)
  local used = 0
  local reset_after = 0
  local window, window_end_ms, in_window
  if aligned == 1 then
    window = math.floor(now / (window_ms * 1000))
    window_end_ms = (window + 1) * window_ms
    local stored = redis.call('HMGET', key, 'w', 'n')
    in_window = tonumber(stored[1]) == window
    if in_window then
      used = tonumber(stored[2]) or 0
      reset_after = window_end_ms * 1000 - now
    end
  else
    local ttl_ms = redis.call('PTTL', key)
    -- -2: no window in progress. -1: a key without expiry that this script
    -- did not write; it is overwritten with one.
    in_window = ttl_ms >= 0
    if in_window then
      used = tonumber(redis.call('GET', key)) or 0
      reset_after = ttl_ms * 1000
    end
  end

  local function record()
    if aligned == 1 then
      redis.call('HSET', key, 'w', window, 'n', used + cost)
      redis.call('PEXPIREAT', key, window_end_ms)
      reset_after = window_end_ms * 1000 - now
    elseif in_window then
      redis.call('INCRBY', key, cost)
    else
      redis.call('SET', key, cost, 'PX', window_ms)
      reset_after = window_ms * 1000
    end
  end

  local remaining = math.max(0, limit - used)
  if cost > limit or used + cost > limit then
    if spend == ALWAYS and cost > 0 then
      record()
      remaining = math.max(0, limit - used - cost)
    end
    if cost > limit then
      return 0, remaining, reset_after, -1, 0
    end
    -- The whole limit is back when the window ends (PTTL 0 means "within
    -- this millisecond").
    return 0, remaining, reset_after, math.max(1000, reset_after), 0
  end
  if cost > 0 and spend ~= DRY then
    record()
  end
  return 1, remaining - cost, reset_after, 0, window or 0
end
