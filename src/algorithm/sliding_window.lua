-- Sliding window (log): at most `limit` units within any span of
-- `window_us`.
--
-- KEY is a sorted set with one member per request that spent (not one per
-- unit), scored by the time it was spent (microseconds of Redis TIME). An
-- entry stamped s counts while now < s + window. Stamps never go backwards
-- per key: if Redis's clock is behind the newest entry (a clock step), the
-- new stamp is newest + 1 µs, so entries only ever live longer (never
-- over-admits) and every stamp of a key is unique.
--
-- A member is "<before>:<units>": the units it spent, and the running total
-- of units the key's entries spent before it (modulo 2^48, so every total
-- is exact in Lua's doubles). The units within the window are then the
-- newest entry's total after it minus the oldest live entry's total before
-- it, and the entry whose leaving frees enough units is found by a binary
-- search over ranks. So one call costs a bounded number of commands
-- whatever the cost, the limit or the entries held: ZCOUNT, at most
-- SW_PRUNE_PER_CALL removals, ZCARD, O(log entries) ZRANGE by rank, one
-- ZADD and PEXPIRE. Aged-out entries beyond the ones pruned are skipped by
-- rank and go on later calls (or with the key's expiry).
--
-- Returns allowed (1|0), remaining, reset_after_us, retry_after_us (-1:
-- never), and a mark for refund.lua: the stamp of the entry added (0 when
-- none). With `spend` DRY it decides the same and adds nothing. Either way
-- it drops up to SW_PRUNE_PER_CALL entries that have left the window.
local SW_TOTAL_MODULUS = 281474976710656 -- 2^48
local SW_PRUNE_PER_CALL = 128

-- The entry at `rank`: its stamp, running total before it, and units.
local function sw_entry(key, rank)
  local entry = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
  local before, units = string.match(entry[1], '^(%d+):(%d+)$')
  return tonumber(entry[2]), tonumber(before), tonumber(units)
end

-- Units between two running totals.
local function sw_between(base, total)
  return (total - base) % SW_TOTAL_MODULUS
end

local function sliding_window(key, now, values, cost, spend)
  local limit, window = values[2], values[3]
  local expired = redis.call('ZCOUNT', key, '-inf', now - window)
  local pruned = math.min(expired, SW_PRUNE_PER_CALL)
  if pruned > 0 then
    redis.call('ZREMRANGEBYRANK', key, 0, pruned - 1)
  end
  local first = expired - pruned
  local count = redis.call('ZCARD', key)

  -- The running total after the newest entry, live or not, continues into
  -- the next one; `base` is the total before the oldest live entry.
  local total, base, newest = 0, 0, nil
  if count > 0 then
    local stamp, before, units = sw_entry(key, count - 1)
    total = (before + units) % SW_TOTAL_MODULUS
    -- No live entry counts nothing, however many aged-out ones remain.
    base = total
    if first < count then
      newest = stamp
      base = before
      if first < count - 1 then
        local _, first_before = sw_entry(key, first)
        base = first_before
      end
    end
  end
  local used = sw_between(base, total)

  local remaining = math.max(0, limit - used)
  local reset_after = 0
  if newest then
    reset_after = newest + window - now
  end
  if cost > limit then
    return 0, remaining, reset_after, -1, 0
  end
  if used + cost > limit then
    -- Enough units must leave: the oldest entry whose leaving frees `k`.
    local k = used + cost - limit
    local low, high = first, count - 1
    while low < high do
      local middle = math.floor((low + high) / 2)
      local _, before, units = sw_entry(key, middle)
      if sw_between(base, before + units) >= k then
        high = middle
      else
        low = middle + 1
      end
    end
    local leaves = sw_entry(key, low)
    return 0, remaining, reset_after, leaves + window - now, 0
  end
  local stamp = 0
  if cost > 0 and spend ~= DRY then
    stamp = now
    if newest and newest >= now then
      stamp = newest + 1
    end
    redis.call('ZADD', key, stamp, string.format('%d:%d', total, cost))
    reset_after = stamp + window - now
    redis.call('PEXPIRE', key, math.ceil(reset_after / 1000))
  end
  return 1, remaining - cost, reset_after, 0, stamp
end

-- Refund (refund.lua's part):

-- Takes back the entry stamped `mark` (refund.lua). Entries added after it
-- carry running totals that include its units, so up to SW_REFUND_REWRITES
-- of them are rewritten without it; past that they are left as they are,
-- and the window over-counts those units until the entries before them
-- leave it: never more admitted than spent, and the work stays bounded.
-- Returns 1 if the entry was there.
local SW_REFUND_REWRITES = 64

local function sliding_window_refund(key, limit, window, unused, cost, mark)
  local found = redis.call('ZRANGEBYSCORE', key, mark, mark)
  if #found == 0 then
    return 0
  end
  local _, units = string.match(found[1], '^(%d+):(%d+)$')
  units = tonumber(units)
  local later = redis.call('ZRANGEBYSCORE', key, '(' .. mark, '+inf',
    'WITHSCORES', 'LIMIT', 0, SW_REFUND_REWRITES + 1)
  redis.call('ZREM', key, found[1])
  if #later / 2 <= SW_REFUND_REWRITES then
    for j = 1, #later, 2 do
      local before, spent = string.match(later[j], '^(%d+):(%d+)$')
      local moved = (tonumber(before) - units) % SW_TOTAL_MODULUS
      redis.call('ZREM', key, later[j])
      redis.call('ZADD', key, later[j + 1], string.format('%d:%s', moved, spent))
    end
  end
  return 1
end
