-- Sliding window counter: the two-counter approximation of a sliding window
-- (as Cloudflare and Upstash use it), O(1) memory where the log is
-- O(limit). Windows are aligned to multiples of `window` since the epoch;
-- the count over the last `window` is estimated as this window's count
-- plus the previous window's, weighted by how much of the previous window
-- the last `window` still covers: prev * (window - elapsed) / window,
-- rounded down. It assumes the previous window's requests were spread
-- evenly, so it can admit more than `limit` in some span of `window` when
-- they were not (docs/semantics.md states the bound and the measured error).
--
-- KEY is a hash: w = the current window's index, c = its count, p = the
-- previous window's count. The key expires when its count no longer
-- matters: at the end of the window after it. The weight is a double
-- computed in the same order as the Rust twin, so both round alike.

-- The previous window's share of `count` at `into` microseconds into the
-- current window of `window`.
local function sc_share(window, count, into)
  return math.floor(count * ((window - into) / window))
end

-- The first instant (in microseconds into a window, `from` or later) at
-- which `count`'s share is at most `allowed`: the share only falls as time
-- passes.
local function sc_first_fit(window, count, allowed, from)
  if sc_share(window, count, from) <= allowed then
    return from
  end
  -- The exact answer is this guess plus one; rounding may move it a step,
  -- so a few steps settle it (bounded, whatever happens).
  local into = math.floor(window - (allowed + 1) * window / count)
  if into < from then
    into = from
  end
  local steps = 0
  while into < window and steps < 16 and sc_share(window, count, into) > allowed do
    into = into + 1
    steps = steps + 1
  end
  return into
end

-- Returns allowed (1|0), remaining, reset_after_us (until the estimate is
-- 0 with no more requests), retry_after_us (-1: never), and a mark for
-- refund.lua (the window index spent in). With `spend` DRY it decides
-- the same and writes nothing.
local function sliding_window_counter(key, now, values, cost, spend)
  local limit, window = values[2], values[3]
  local index = math.floor(now / window)
  local current, previous = 0, 0
  local stored = redis.call('HMGET', key, 'w', 'c', 'p')
  if stored[1] then
    local at = tonumber(stored[1])
    if at > index then
      -- Redis's clock stepped back: keep counting in the stored window.
      index = at
    end
    if at == index then
      current, previous = tonumber(stored[2]), tonumber(stored[3])
    elseif at == index - 1 then
      previous = tonumber(stored[2])
    end
  end
  local elapsed = now - index * window
  if elapsed < 0 then
    elapsed = 0
  end

  local estimate = sc_share(window, previous, elapsed) + current
  local remaining = math.max(0, limit - estimate)
  local next_start = window - elapsed
  -- With no more requests, the estimate is 0 once this window's count has
  -- left the previous window's span: at the end of the next window, or at
  -- the end of this one when only the previous window counted.
  local reset_after = 0
  if current > 0 then
    reset_after = next_start + window
  elseif previous > 0 then
    reset_after = next_start
  end
  if cost > limit then
    return 0, remaining, reset_after, -1, index
  end
  if estimate + cost > limit then
    local retry_after
    if current + cost <= limit then
      retry_after = sc_first_fit(window, previous, limit - cost - current, elapsed) - elapsed
    else
      retry_after = next_start + sc_first_fit(window, current, limit - cost, 0)
    end
    return 0, remaining, reset_after, retry_after, index
  end
  if cost > 0 and spend ~= DRY then
    redis.call('HSET', key, 'w', index, 'c', current + cost, 'p', previous)
    redis.call('PEXPIRE', key, math.ceil((next_start + window) / 1000))
    reset_after = next_start + window
  end
  return 1, remaining - cost, reset_after, 0, index
end

-- Refund (refund.lua's part):

-- Gives back `cost` units, only if the key still counts the window that
-- was spent (`mark`). Returns 1 if it gave them back.
local function sliding_window_counter_refund(key, limit, window, unused, cost, mark)
  if redis.call('HGET', key, 'w') == mark then
    redis.call('HINCRBY', key, 'c', -cost)
    return 1
  end
  return 0
end
