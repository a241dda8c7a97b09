-- One subscriber's share of one quota bucket, settled atomically on Redis
-- among every subscriber of every ratelimitd instance. `quota::share` is
-- the Rust twin (the embedded store's), `quota::on_redis` the caller; the
-- clock (`now`, microseconds) is defined above this part.
--
-- KEYS[1]  the bucket's hash: subscriber id -> "demand grant stale_at
--          expires_at since settled_at"
--          demand    reported demand, µrps (millionths of a request per
--                    second); -1 while unknown (a new subscriber)
--          grant     the share it was given, µrps
--          stale_at  ms: its demand stops counting then, unless it reports
--          expires_at ms: its grant stops counting then (the assignment's
--                    time to live, and a margin)
--          since     ms: when it first settled
--          settled_at ms: when it last settled
--          An entry of the first four alone (the form of earlier versions)
--          reads as since 0 and settled_at its expires_at: it is never a
--          newcomer, and never released before its grant runs out.
-- ARGV     subscriber, op ('report'|'leave'), demand (µrps, -1 unknown),
--          capacity (µrps), headroom (per mille), min_want (µrps),
--          lease_ms, stale_ms, hysteresis (per mille), then n and n
--          instance ids found dead (`quota::presence`; subscriber ids are
--          "<instance>:<stream>")
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
--
-- A dead instance's subscribers no longer report, so their demand stops
-- counting at once; but each one's Envoy may still enforce its last
-- assignment, until its time to live, if it has not reconnected elsewhere.
-- So such an entry whose grant is still in force is an orphan: its grant
-- keeps counting until it runs out, unless the bucket has at least as many
-- newcomers as orphans (subscribers of live instances first settled after
-- the orphans' last settlement: their Envoys, reconnected), and then every
-- orphan is released at once.
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

local function is_dead(id)
  return dead[string.match(id, '^([^:]*):') or ''] == true
end

-- An entry's numbers: demand, grant, stale_at, expires_at, since,
-- settled_at.
local function parse(text)
  local d, g, s, e, since, settled =
    string.match(text, '^(%-?%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')
  if not d then
    d, g, s, e = string.match(text, '^(%-?%d+) (%d+) (%d+) (%d+)$')
    since, settled = 0, e
  end
  return tonumber(d), tonumber(g), tonumber(s), tonumber(e),
    tonumber(since), tonumber(settled)
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
-- The orphans, their grants, when they last settled, when they run out;
-- and when each live subscriber whose demand counts first settled.
local orphans = {}
local orphaned, orphans_settled, orphans_latest = 0, 0, 0
local sinces = {}
local flat = redis.call('HGETALL', key)
for i = 1, #flat, 2 do
  local id = flat[i]
  local d, g, s, e, since, settled = parse(flat[i + 1])
  if id == me then
    mine = {grant = g, stale_at = s, expires_at = e, since = since}
  elseif (s <= now_ms and e <= now_ms) or (e <= now_ms and is_dead(id)) then
    redis.call('HDEL', key, id)
  elseif is_dead(id) then
    orphans[#orphans + 1] = id
    orphaned = orphaned + g
    orphans_settled = math.max(orphans_settled, settled)
    orphans_latest = math.max(orphans_latest, s, e)
  else
    latest = math.max(latest, s, e)
    if e > now_ms then
      held = held + g
    end
    if s > now_ms then
      wants[#wants + 1] = want(d)
      sinces[#sinces + 1] = since
    end
  end
end

-- The orphans go when as many newcomers (this one included, if it is one)
-- have come; else they are held. (An entry of its own that has run out is
-- gone, whether or not Redis has dropped it yet.)
local my_since = now_ms
if mine and (mine.stale_at > now_ms or mine.expires_at > now_ms) then
  my_since = mine.since
end
if #orphans > 0 then
  local newcomers = 0
  for _, since in ipairs(sinces) do
    if since > orphans_settled then
      newcomers = newcomers + 1
    end
  end
  if op ~= 'leave' and not is_dead(me) and my_since > orphans_settled then
    newcomers = newcomers + 1
  end
  if newcomers >= #orphans then
    for _, id in ipairs(orphans) do
      redis.call('HDEL', key, id)
    end
  else
    held = held + orphaned
    latest = math.max(latest, orphans_latest)
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

redis.call('HSET', key, me, string.format('%d %d %d %d %d %d', demand, grant,
  now_ms + stale_ms, now_ms + lease_ms, my_since, now_ms))
latest = math.max(latest, now_ms + stale_ms, now_ms + lease_ms)
redis.call('PEXPIRE', key, latest - now_ms)
return {grant, target, #wants, held + grant}
