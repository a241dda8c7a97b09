-- Decides one call's limits: one limit for CheckLimit, one per descriptor
-- for Envoy. The algorithms' functions and the clock (`now`) are defined
-- above this part in the same script; `limiter::script` is its Rust side
-- (encoder, decoder, and the names of the numbers below).
--
-- `decide_call(keys, k0, a0, count, reply, r0)` decides one call whose
-- keys are keys[k0 + 1] to keys[k0 + count] and whose values start after
-- ARGV[a0], and writes its reply's values into `reply` after reply[r0];
-- the layout below is that of a call alone (keys = KEYS, k0 = a0 = r0 =
-- 0, count = #KEYS), which single.lua, this part's tail in the single-call
-- script, decides. The batch driver (batch.lua) decides many such calls in
-- one script, into one reply.
--
-- KEYS[i]  the key of limit i
-- ARGV     six values per limit, limit i's from 6 * (i - 1) + 1:
--          algorithm (its tag in algorithm::registry), three
--          parameters, cost, shadow (1|0)
--            'fw': limit, window_ms, aligned (0: anchored, 1: aligned,
--                  2: aligned, the key named by its window)
--            'sl': limit, window_us, (unused)
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
-- Reply    three integers per limit, limit i's from 3 * (i - 1) + 1:
--          remaining if it allows, -1 - remaining if it denies;
--          reset_after_us; and, if it allows, the mark (what refund.lua
--          needs to take a spend back), if it denies, retry_after_us (-1:
--          never). Three rather than five: Redis spends more on each value
--          of a script's reply than on a command.
local ARGS_PER_LIMIT, REPLY_PER_LIMIT = 6, 3

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
-- five values. Each algorithm's function takes the limit's values as
-- limit_at read them and picks its parameters from them.
local function decide_limit(keys, k0, a0, i, cost, spend)
  local limit = limit_at(a0 + ARGS_PER_LIMIT * (i - 1))
  local algorithm = limit[1]
  local key = keys[k0 + i]
  -- limiter::script puts one branch per registered algorithm here.
  error('unknown algorithm ' .. tostring(algorithm))
end

-- An algorithm's five values as a limit's three in the reply (this part's
-- header).
local function reply_values(allowed, remaining, reset_after, retry_after, mark)
  if allowed == 1 then
    return remaining, reset_after, mark
  end
  return -1 - remaining, reset_after, retry_after
end

-- Writes limit i's reply values into `reply`, the call's starting after
-- reply[r0].
local function answer(reply, r0, i, allowed, remaining, reset_after, retry_after, mark)
  local at = r0 + REPLY_PER_LIMIT * (i - 1)
  reply[at + 1], reply[at + 2], reply[at + 3] =
    reply_values(allowed, remaining, reset_after, retry_after, mark)
end

-- Did limit i, as written into `reply` (the call's after reply[r0]), allow?
local function allowed_in(reply, r0, i)
  return reply[r0 + REPLY_PER_LIMIT * (i - 1) + 1] >= 0
end

local function cost_of(a0, i)
  return limit_at(a0 + ARGS_PER_LIMIT * (i - 1))[5]
end

local function decide_call(keys, k0, a0, count, reply, r0)
  local mode = ARGV[a0 + ARGS_PER_LIMIT * count + 1]
  if mode == 'decide' and count == 1 then
    -- Alone, a limit spends only if it allows: no dry run needed.
    answer(reply, r0, 1, decide_limit(keys, k0, a0, 1, cost_of(a0, 1), IF_ALLOWED))
    return
  end
  if mode == 'dry' or mode == 'look' then
    for i = 1, count do
      local cost = 0
      if mode == 'dry' then
        cost = cost_of(a0, i)
      end
      answer(reply, r0, i, decide_limit(keys, k0, a0, i, cost, DRY))
    end
    return
  end
  if mode == 'denied' then
    for i = 1, count do
      local allowed, remaining, reset_after, retry_after, mark =
        decide_limit(keys, k0, a0, i, cost_of(a0, i), DRY)
      if allowed == 1 then
        allowed, remaining, reset_after, retry_after, mark =
          decide_limit(keys, k0, a0, i, 0, DRY)
      end
      answer(reply, r0, i, allowed, remaining, reset_after, retry_after, mark)
    end
    return
  end
  if mode == 'each' then
    for i = 1, count do
      answer(reply, r0, i, decide_limit(keys, k0, a0, i, cost_of(a0, i), ALWAYS))
    end
    return
  end
  if mode ~= 'decide' then
    error('unknown mode ' .. tostring(mode))
  end

  -- All or nothing: every limit decided dry first; then, if every limit
  -- not in shadow mode allows, each spends; otherwise a denying limit
  -- reports its denial and an allowing one what it has.
  local all_allow = true
  for i = 1, count do
    answer(reply, r0, i, decide_limit(keys, k0, a0, i, cost_of(a0, i), DRY))
    if not allowed_in(reply, r0, i) and ARGV[a0 + ARGS_PER_LIMIT * (i - 1) + 6] ~= '1' then
      all_allow = false
    end
  end
  for i = 1, count do
    if allowed_in(reply, r0, i) then
      if all_allow then
        answer(reply, r0, i, decide_limit(keys, k0, a0, i, cost_of(a0, i), IF_ALLOWED))
      else
        answer(reply, r0, i, decide_limit(keys, k0, a0, i, 0, DRY))
      end
    end
  end
end
