-- Fixed window: at most `limit` units per window of `window_ms`.
--
-- Anchored (aligned = 0), for CheckLimit: the window starts with the key's
-- first spending request. KEY is a string counter whose expiry is the
-- window's end, created with its expiry in one SET ... PXAT, so no counter
-- is ever left without a TTL (the INCR-then-EXPIRE gap of the original
-- middleware). The window's end, in Unix milliseconds as Redis keeps it
-- (PEXPIRETIME, Redis 7.0), names the window: it is the mark a refund
-- finds the spend's window by, and no later window of the key can end at
-- the same millisecond (it starts no earlier than this one ends).
--
-- Aligned (aligned = 1), as envoyproxy/ratelimit: windows are the multiples
-- of `window_ms` since the Unix epoch (a minute starts at :00). KEY is a
-- hash {w = window number, n = units spent} expiring at the window's end.
-- The window number is stored because Redis expires keys by the script's
-- start time while `now` is read from TIME a moment later: a key left from
-- the previous window is recognised by its number, not counted.
--
-- Aligned by name (aligned = 2), kept as envoyproxy/ratelimit keeps it, so
-- that its instances and these share one count: the caller names KEY with
-- the window's start (upstream's key text), KEY is a plain counter counted
-- with INCRBY, and each count gives it a window to live (upstream's EXPIRE
-- of the unit's seconds, here PEXPIRE of the same). A new window is a new
-- key; the window's end, for reset_after, is the aligned one at `now`.

-- Counts `cost` more units in KEY's window (see fixed_window's layouts) and
-- returns the window's reset_after_us as it stands after counting, then,
-- for a plain counter counted by INCRBY, what it holds now.
-- `window_sent` and `cost_sent` are `window_ms` and `cost` as the caller
-- sent them (text): Redis 7.0 turns a number given to redis.call into text
-- with printf's %.17g, which costs it more than the command itself.
local function fw_count(key, now, window_ms, aligned, window, window_end_ms, in_window,
                        reset_after, window_sent, cost_sent)
  if aligned == 1 then
    if in_window then
      -- The key expires with its window, as set when the window began.
      redis.call('HINCRBY', key, 'n', cost_sent)
    else
      redis.call('HSET', key, 'w', window, 'n', cost_sent)
      redis.call('PEXPIREAT', key, window_end_ms)
    end
    return window_end_ms * 1000 - now
  elseif aligned == 2 then
    local total = redis.call('INCRBY', key, cost_sent)
    redis.call('PEXPIRE', key, window_sent)
    return window_end_ms * 1000 - now, total
  elseif in_window then
    return reset_after, redis.call('INCRBY', key, cost_sent)
  end
  redis.call('SET', key, cost_sent, 'PXAT', window_end_ms)
  return window_ms * 1000
end

-- Returns allowed (1|0), remaining, reset_after_us, retry_after_us (-1:
-- never), and a mark for refund.lua: the window number of an aligned
-- window, the end (Unix ms) of an anchored one, 0 by name. With `spend`
-- DRY it decides the same and writes nothing; with ALWAYS it counts a
-- denied cost too (as envoyproxy/ratelimit does), and `remaining` is what
-- is left after it.
-- `window_sent` and `cost_sent` are `window_ms` and the limit's cost as
-- sent (see fw_count): it writes only the limit's own cost.
local function fixed_window(key, now, values, cost, spend)
  local limit, window_ms, aligned = values[2], values[3], values[4]
  local window_sent, cost_sent = values[6], values[7]
  -- A plain counter in its window that counts `cost` whatever the answer
  -- (ALWAYS) is counted at once: INCRBY's reply says what it held before.
  local count_at_once = spend == ALWAYS and cost > 0
  local counted = false
  local used = 0
  local reset_after = 0
  local window, window_end_ms, in_window
  if aligned == 0 then
    window_end_ms = redis.call('PEXPIRETIME', key)
    -- -2: no window in progress. -1: a key without expiry that this script
    -- did not write; it is overwritten with one.
    in_window = window_end_ms >= 0
    local now_ms = math.floor(now / 1000)
    if in_window then
      -- What PTTL would say, on the script's clock. Redis reads its own
      -- clock for expiry a moment before TIME is read, so a key it still
      -- holds may end no later than the millisecond `now` is in: 0 then.
      if window_end_ms > now_ms then
        reset_after = (window_end_ms - now_ms) * 1000
      end
      if count_at_once then
        local total
        reset_after, total = fw_count(key, now, window_ms, aligned, nil, window_end_ms, true,
          reset_after, window_sent, cost_sent)
        used = total - cost
        counted = true
      else
        used = tonumber(redis.call('GET', key)) or 0
      end
    else
      window_end_ms = now_ms + window_ms
    end
  else
    window = math.floor(now / (window_ms * 1000))
    window_end_ms = (window + 1) * window_ms
    local stored
    if aligned == 1 then
      stored = redis.call('HMGET', key, 'w', 'n')
      in_window = tonumber(stored[1]) == window
      stored = stored[2]
    elseif count_at_once then
      local total
      reset_after, total = fw_count(key, now, window_ms, aligned, window, window_end_ms, true, 0,
        window_sent, cost_sent)
      used = total - cost
      counted = true
    else
      stored = redis.call('GET', key)
      in_window = stored ~= false
    end
    if in_window then
      used = tonumber(stored) or 0
      reset_after = window_end_ms * 1000 - now
    end
  end

  local remaining = limit - used
  if remaining < 0 then
    remaining = 0
  end
  if cost > limit or used + cost > limit then
    if count_at_once then
      if not counted then
        reset_after = fw_count(key, now, window_ms, aligned, window, window_end_ms, in_window,
          reset_after, window_sent, cost_sent)
      end
      remaining = limit - used - cost
      if remaining < 0 then
        remaining = 0
      end
    end
    if cost > limit then
      return 0, remaining, reset_after, -1, 0
    end
    -- The whole limit is back when the window ends (a reset_after of 0
    -- means "within this millisecond").
    if reset_after > 1000 then
      return 0, remaining, reset_after, reset_after, 0
    end
    return 0, remaining, reset_after, 1000, 0
  end
  if cost > 0 and spend ~= DRY and not counted then
    reset_after = fw_count(key, now, window_ms, aligned, window, window_end_ms, in_window,
      reset_after, window_sent, cost_sent)
  end
  if aligned == 1 then
    return 1, remaining - cost, reset_after, 0, window
  elseif aligned == 0 then
    return 1, remaining - cost, reset_after, 0, window_end_ms
  end
  return 1, remaining - cost, reset_after, 0, 0
end

-- Refund (refund.lua's part):

-- Gives back `cost` units of a spend whose mark is `mark` (as sent),
-- never below none: aligned (`aligned` '1'), only if the key still counts
-- the window that was spent; anchored ('0'), only if the key's window
-- still ends when the spent one did (a later window ends later); named by
-- its window ('2'; the key is the window), if the key is still there.
-- Returns 1 if it gave them back.
local function fixed_window_refund(key, limit, window_ms, aligned, cost, mark)
  if aligned == '1' then
    if redis.call('HGET', key, 'w') == mark then
      if redis.call('HINCRBY', key, 'n', -cost) < 0 then
        redis.call('HSET', key, 'n', 0)
      end
      return 1
    end
    return 0
  end
  if aligned == '0' then
    if redis.call('PEXPIRETIME', key) ~= tonumber(mark) then
      return 0
    end
  elseif redis.call('EXISTS', key) == 0 then
    return 0
  end
  if redis.call('DECRBY', key, cost) < 0 then
    redis.call('SET', key, 0, 'KEEPTTL')
  end
  return 1
end
