-- Decides one request's limits together, atomically: one limit for
-- CheckLimit, one per descriptor for Envoy. The algorithms' functions are
-- defined above this part in the same script.
--
-- KEYS[i]  the key of limit i
-- ARGV     six values per limit, limit i's from 6 * (i - 1) + 1:
--          algorithm, three parameters, cost, shadow (1|0)
--            'fw': limit, window_ms, aligned (1|0)
--            'sw': limit, window_us, (unused)
--            'tb': capacity, refill_per_second, (unused)
--            'gc': burst, interval_us, (unused)
--            'sc': limit, window_us, (unused)
--          then, last, the mode: 'decide'; 'each' (every limit decided on
--          its own, a fixed window spending even what it denies, as
--          envoyproxy/ratelimit counts hits); 'dry' (decide every limit
--          as if spending, and write nothing); or 'denied' (the request is
--          denied by a limit decided elsewhere, a cached denial: write
--          nothing, and answer as 'decide' does for a denied request)
-- Reply    five integers per limit, limit i's from 5 * (i - 1) + 1:
--          allowed (1|0), remaining, reset_after_us, retry_after_us (-1:
--          never), mark (what refund.lua needs to take a spend back)
--
-- 'decide' is all or nothing: the limits are spent only if every limit not
-- in shadow mode allows its cost. Otherwise nothing is spent, and a limit
-- that would have allowed reports what it has (as a look with cost 0
-- would). Every limit sees the same `now`, read once from Redis TIME.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local function decide(i, cost, spend)
  local at = 6 * (i - 1)
  local algorithm = ARGV[at + 1]
  local p1 = tonumber(ARGV[at + 2])
  local p2 = tonumber(ARGV[at + 3])
  local p3 = tonumber(ARGV[at + 4])
  if algorithm == 'fw' then
    return {fixed_window(KEYS[i], now, p1, p2, p3, cost, spend)}
  elseif algorithm == 'sw' then
    return {sliding_window(KEYS[i], now, p1, p2, cost, spend)}
  elseif algorithm == 'tb' then
    return {token_bucket(KEYS[i], now, p1, p2, cost, spend)}
  elseif algorithm == 'gc' then
    return {gcra(KEYS[i], now, p1, p2, cost, spend)}
  elseif algorithm == 'sc' then
    return {sliding_window_counter(KEYS[i], now, p1, p2, cost, spend)}
  end
  error('unknown algorithm ' .. tostring(algorithm))
end

local reply = {}
local function answer(i, decision)
  for j = 1, 5 do
    reply[5 * (i - 1) + j] = decision[j]
  end
end

local function cost_of(i)
  return tonumber(ARGV[6 * (i - 1) + 5])
end

local count = #KEYS
local mode = ARGV[6 * count + 1]
if mode == 'dry' then
  for i = 1, count do
    answer(i, decide(i, cost_of(i), false))
  end
  return reply
end
if mode == 'denied' then
  for i = 1, count do
    local decision = decide(i, cost_of(i), false)
    if decision[1] == 1 then
      decision = decide(i, 0, false)
    end
    answer(i, decision)
  end
  return reply
end
if mode == 'each' then
  for i = 1, count do
    answer(i, decide(i, cost_of(i), 'always'))
  end
  return reply
end
if count == 1 then
  -- Alone, a limit spends only if it allows: no dry run needed.
  answer(1, decide(1, cost_of(1), true))
  return reply
end

local dry = {}
local all_allow = true
for i = 1, count do
  dry[i] = decide(i, cost_of(i), false)
  if dry[i][1] == 0 and ARGV[6 * (i - 1) + 6] ~= '1' then
    all_allow = false
  end
end
for i = 1, count do
  if dry[i][1] == 0 then
    answer(i, dry[i])
  elseif all_allow then
    answer(i, decide(i, cost_of(i), true))
  else
    answer(i, decide(i, 0, false))
  end
end
return reply
