-- One subscriber's share of one quota bucket, settled atomically on Redis
-- among every subscriber of every ratelimitd instance. `quota::share` is
-- the Rust twin (the embedded store's), `quota::on_redis` the caller; the
-- clock (`now`, microseconds) is defined above this part.
--
-- KEYS[1]  the bucket's hash: subscriber id -> "demand grant stale_at expires_at"
--          demand    reported demand, µrps (millionths of a request per
--                    second); -1 while unknown (a new subscriber)
--          grant     the share it was given, µrps
--          stale_at  ms: its demand stops counting then, unless it reports
--          expires_at ms: its grant stops counting then (the assignment's
--                    time to live, and a margin)
-- ARGV     subscriber, op ('report'|'leave'), demand (µrps, -1 unknown),
--          capacity (µrps), headroom (per mille), min_want (µrps),
--          lease_ms, stale_ms, hysteresis (per mille), then n and n
--          instance ids found dead (`quota::presence`): the entries of
--          their subscribers (ids "<instance>:<stream>") are dropped
--          whatever their times say
-- Reply    grant (µrps), target (its fair share, µrps), subscribers (whose
--          demand counts, itself included), granted (the sum of grants in
--          force, its own included), all integers
--
-- Invariant: the grants in force never add up to more than the capacity.
-- A subscriber's grant shrinks at once to its fair share (or to within the
-- hysteresis above it), and grows only into what the others' grants in
-- force leave free; the others shrink when they settle next. Every number,
-- demand × headroom included (at most 4e12 × 1000), stays below 2^53, so
-- Lua's doubles keep them and their floored quotients exact.
local now_ms = math.floor(now / 1000)
local key = KEYS[1]
local me, op = ARGV[1], ARGV[2]
local demand = tonumber(ARGV[3])
local capacity = tonumber(ARGV[4])
local headroom = tonumber(ARGV[5])
local min_want = tonumber(ARGV[6])
local lease_ms = tonumber(ARGV[7])
local stale_ms = tonumber(ARGV[8])
local hysteresis = tonumber(ARGV[9])
local dead = {}
for i = 11, 10 + tonumber(ARGV[10]) do
  dead[ARGV[i]] = true
end

-- What a demand asks for: unknown asks for all (it gets an equal share);
-- else the demand and headroom, at least min_want, at most the capacity.
local function want(d)
  if d < 0 then
    return capacity
  end
  local w = d + math.floor(d * headroom / 1000)
  if w < min_want then
    w = min_want
  end
  if w > capacity then
    w = capacity
  end
  return w
end

local held = 0
local wants = {}
local mine = nil
-- When the last entry kept runs out: the hash's own expiry, so that no
-- caller with shorter times (a rolling configuration change) cuts the
-- entries of another short.
local latest = 0
local flat = redis.call('HGETALL', key)
for i = 1, #flat, 2 do
  local id = flat[i]
  local d, g, s, e = string.match(flat[i + 1], '^(%-?%d+) (%d+) (%d+) (%d+)$')
  d, g, s, e = tonumber(d), tonumber(g), tonumber(s), tonumber(e)
  if id == me then
    mine = {grant = g, expires_at = e}
  elseif (s <= now_ms and e <= now_ms) or dead[string.match(id, '^([^:]*):') or ''] then
    redis.call('HDEL', key, id)
  else
    latest = math.max(latest, s, e)
    if e > now_ms then
      held = held + g
    end
    if s > now_ms then
      wants[#wants + 1] = want(d)
    end
  end
end

if op == 'leave' then
  redis.call('HDEL', key, me)
  return {0, 0, #wants, held}
end

-- Max-min fair: when the wants do not all fit, the water level every
-- unsatisfied want is cut to; when they do, what is left over is split
-- evenly on top of them, so that a bucket's rate is never held back from
-- Envoys that may need it before their next report.
local my_want = want(demand)
wants[#wants + 1] = my_want
table.sort(wants)
local level = nil
local left = capacity
for k = 1, #wants do
  local fair = math.floor(left / (#wants - k + 1))
  if wants[k] > fair then
    level = fair
    break
  end
  left = left - wants[k]
end
local target
if level then
  target = math.min(my_want, level)
else
  target = my_want + math.floor(left / #wants)
end

local free = capacity - held
if free < 0 then
  free = 0
end
local grant = math.min(target, free)
-- Close enough to what it holds (and still within what is free): keep it,
-- so the Envoy is not sent a new assignment for a small change.
if mine and mine.expires_at > now_ms and mine.grant <= free
    and math.abs(grant - mine.grant) * 1000 <= mine.grant * hysteresis then
  grant = mine.grant
end

redis.call('HSET', key, me, string.format('%d %d %d %d', demand, grant,
  now_ms + stale_ms, now_ms + lease_ms))
latest = math.max(latest, now_ms + stale_ms, now_ms + lease_ms)
redis.call('PEXPIRE', key, latest - now_ms)
return {grant, target, #wants, held + grant}
