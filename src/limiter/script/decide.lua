-- Decides one call's limits: one limit for CheckLimit, one per descriptor
-- for Envoy. The algorithms' functions and the clock (`now`) are defined
-- above this part in the same script; `limiter::script` is its Rust side
-- (encoder, decoder, and the names of the numbers below).
--
-- `decide_call(keys, k0, a0, count)` decides one call whose keys are
-- keys[k0 + 1] to keys[k0 + count] and whose values start after ARGV[a0];
-- the layout below is that of a call alone (keys = KEYS, k0 = a0 = 0,
-- count = #KEYS), which single.lua, this part's tail in the single-call
-- script, decides. The batch driver (batch.lua) decides many such calls in
-- one script.
--
-- KEYS[i]  the key of limit i
-- ARGV     six values per limit, limit i's from 6 * (i - 1) + 1:
--          algorithm, three parameters, cost, shadow (1|0)
--            'fw': limit, window_ms, aligned (0: anchored, 1: aligned,
--                  2: aligned, the key named by its window)
--            'sw': limit, window_us, (unused)
--            'tb': capacity, refill_per_second, (unused)
--            'gc': burst, interval_us, (unused)
--            'sc': limit, window_us, (unused)
--          then, last, the mode:
--            'decide'  all or nothing: the limits are spent only if every
--                      limit not in shadow mode allows its cost; otherwise
--                      nothing is spent, and a limit that would have
--                      allowed reports what it has (as 'look' does)
--            'each'    every limit decided on its own, spending ALWAYS (a
--                      fixed window counts even what it denies, as
--                      envoyproxy/ratelimit counts hits)
--            'dry'     every limit decided as if spending; nothing written
--            'look'    what every limit has (cost 0); nothing written
--            'denied'  the call is denied by a limit decided elsewhere (a
--                      cached denial): each limit's denial of its cost, or,
--                      if it would allow, what it has; nothing written
-- Reply    five integers per limit, limit i's from 5 * (i - 1) + 1:
--          allowed (1|0), remaining, reset_after_us, retry_after_us (-1:
--          never), mark (what refund.lua needs to take a spend back)
local ARGS_PER_LIMIT, REPLY_PER_LIMIT = 6, 5

-- Each limit's values as decide_limit reads them, turned into numbers once
-- per script call and kept by where they start in ARGV: in a batch, the
-- calls that share their values (a form) share them too.
local limits_read = {}

-- The limit whose values start after ARGV[at]: its algorithm, its three
-- parameters as numbers, its cost, and, as sent (text, which redis.call
-- passes on as it is), its second parameter and its cost.
local function limit_at(at)
  local limit = limits_read[at]
  if limit == nil then
    limit = {
      ARGV[at + 1], tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4]),
      tonumber(ARGV[at + 5]), ARGV[at + 3], ARGV[at + 5],
    }
    limits_read[at] = limit
  end
  return limit
end

-- Limit i of the call whose keys start after keys[k0] and whose values
-- start after ARGV[a0], decided at `cost` with `spend`: the algorithm's
-- five values.
local function decide_limit(keys, k0, a0, i, cost, spend)
  local limit = limit_at(a0 + ARGS_PER_LIMIT * (i - 1))
  local algorithm, p1, p2 = limit[1], limit[2], limit[3]
  local key = keys[k0 + i]
  if algorithm == 'fw' then
    return fixed_window(key, now, p1, p2, limit[4], cost, spend, limit[6], limit[7])
  elseif algorithm == 'sw' then
    return sliding_window(key, now, p1, p2, cost, spend)
  elseif algorithm == 'tb' then
    return token_bucket(key, now, p1, p2, cost, spend)
  elseif algorithm == 'gc' then
    return gcra(key, now, p1, p2, cost, spend)
  elseif algorithm == 'sc' then
    return sliding_window_counter(key, now, p1, p2, cost, spend)
  end
  error('unknown algorithm ' .. tostring(algorithm))
end

-- Writes limit i's five values into `reply`.
local function answer(reply, i, allowed, remaining, reset_after, retry_after, mark)
  local at = REPLY_PER_LIMIT * (i - 1)
  reply[at + 1] = allowed
  reply[at + 2] = remaining
  reply[at + 3] = reset_after
  reply[at + 4] = retry_after
  reply[at + 5] = mark
end

local function cost_of(a0, i)
  return limit_at(a0 + ARGS_PER_LIMIT * (i - 1))[5]
end

local function decide_call(keys, k0, a0, count)
  local mode = ARGV[a0 + ARGS_PER_LIMIT * count + 1]
  if mode == 'decide' and count == 1 then
    -- Alone, a limit spends only if it allows: no dry run needed. (The
    -- constructor sizes the reply once.)
    return { decide_limit(keys, k0, a0, 1, cost_of(a0, 1), IF_ALLOWED) }
  end
  local reply = {}
  if mode == 'dry' or mode == 'look' then
    for i = 1, count do
      local cost = 0
      if mode == 'dry' then
        cost = cost_of(a0, i)
      end
      answer(reply, i, decide_limit(keys, k0, a0, i, cost, DRY))
    end
    return reply
  end
  if mode == 'denied' then
    for i = 1, count do
      local allowed, remaining, reset_after, retry_after, mark =
        decide_limit(keys, k0, a0, i, cost_of(a0, i), DRY)
      if allowed == 1 then
        allowed, remaining, reset_after, retry_after, mark =
          decide_limit(keys, k0, a0, i, 0, DRY)
      end
      answer(reply, i, allowed, remaining, reset_after, retry_after, mark)
    end
    return reply
  end
  if mode == 'each' then
    for i = 1, count do
      answer(reply, i, decide_limit(keys, k0, a0, i, cost_of(a0, i), ALWAYS))
    end
    return reply
  end
  if mode ~= 'decide' then
    error('unknown mode ' .. tostring(mode))
  end

  -- All or nothing: every limit decided dry first; then, if every limit
  -- not in shadow mode allows, each spends; otherwise a denying limit
  -- reports its denial and an allowing one what it has.
  local all_allow = true
  for i = 1, count do
    answer(reply, i, decide_limit(keys, k0, a0, i, cost_of(a0, i), DRY))
    if reply[REPLY_PER_LIMIT * (i - 1) + 1] == 0
      and ARGV[a0 + ARGS_PER_LIMIT * (i - 1) + 6] ~= '1' then
      all_allow = false
    end
  end
  for i = 1, count do
    if reply[REPLY_PER_LIMIT * (i - 1) + 1] == 1 then
      if all_allow then
        answer(reply, i, decide_limit(keys, k0, a0, i, cost_of(a0, i), IF_ALLOWED))
      else
        answer(reply, i, decide_limit(keys, k0, a0, i, 0, DRY))
      end
    end
  end
  return reply
end
