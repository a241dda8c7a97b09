-- GCRA, the generic cell rate algorithm (as redis-cell and
-- go-redis/redis_rate): one request every `interval` microseconds
-- sustained, and up to `burst` at once; a request of `cost` takes `cost`
-- intervals.
--
-- KEY is a string: the theoretical arrival time (TAT), in microseconds of
-- Redis TIME, when the key will have used no capacity. A missing key (or a
-- TAT in the past) is an idle one. A request is allowed if, after adding
-- its intervals, the TAT is at most `burst` intervals ahead of now. The key
-- expires at its TAT, so no key outlives its use. All values are integers
-- below 2^53 (the limiter bounds burst * interval), so the arithmetic is
-- exact.

-- Requests that would pass at `now` with the TAT at `at`.
local function gcra_remaining_at(now, tolerance, interval, at)
  local left = math.floor((now + tolerance - at) / interval)
  if left < 0 then
    return 0
  end
  return left
end

-- Returns allowed (1|0), remaining (requests that would pass now),
-- reset_after_us (until the TAT), retry_after_us (-1: never), and a mark
-- for refund.lua (always 0: intervals are simply given back). With `spend`
-- DRY it decides the same and writes nothing.
local function gcra(key, now, values, cost, spend)
  local burst, interval = values[2], values[3]
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then
    tat = now
  end
  local tolerance = burst * interval
  if cost > burst then
    return 0, gcra_remaining_at(now, tolerance, interval, tat), tat - now, -1, 0
  end
  local new_tat = tat + cost * interval
  local allow_at = new_tat - tolerance
  if allow_at > now then
    return 0, gcra_remaining_at(now, tolerance, interval, tat), tat - now, allow_at - now, 0
  end
  if cost > 0 and spend ~= DRY then
    redis.call('SET', key, new_tat, 'PX', math.ceil((new_tat - now) / 1000))
  end
  return 1, gcra_remaining_at(now, tolerance, interval, new_tat), new_tat - now, 0, 0
end

-- Refund (refund.lua's part):

-- Gives back `cost` intervals, if the key is still there. Returns 1 if it
-- gave them back.
local function gcra_refund(key, burst, interval, unused, cost, mark)
  local tat = tonumber(redis.call('GET', key))
  if tat then
    redis.call('SET', key, tat - cost * tonumber(interval), 'KEEPTTL')
    return 1
  end
  return 0
end
