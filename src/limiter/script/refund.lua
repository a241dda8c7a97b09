-- Takes back what decide.lua spent, for a request whose limits live on
-- several Redis Cluster nodes and which another node denied after this one
-- had spent (see the limiter). Best effort by design: units already
-- refilled or expired are not given back twice.
--
-- KEYS[i]  the key of limit i
-- ARGV     six values per limit, limit i's from 6 * (i - 1) + 1:
--          algorithm, three parameters (as decide.lua), cost, mark (the
--          fifth value decide.lua replied for it; 0 for the algorithms
--          that give units back without finding the spend)
-- Reply    the number of limits refunded
--
-- sliding_window.lua is defined above this part in the same script.
local refunded = 0
for i = 1, #KEYS do
  local at = 6 * (i - 1)
  local key = KEYS[i]
  local algorithm = ARGV[at + 1]
  local cost = tonumber(ARGV[at + 5])
  local mark = ARGV[at + 6]
  if algorithm == 'fw' and ARGV[at + 4] == '1' then
    -- Aligned: only if the key still counts the window that was spent.
    if redis.call('HGET', key, 'w') == mark then
      redis.call('HINCRBY', key, 'n', -cost)
      refunded = refunded + 1
    end
  elseif algorithm == 'fw' then
    -- Anchored, or named by its window (the key is the window).
    if redis.call('EXISTS', key) == 1 then
      redis.call('DECRBY', key, cost)
      refunded = refunded + 1
    end
  elseif algorithm == 'sw' then
    refunded = refunded + sliding_window_refund(key, mark)
  elseif algorithm == 'tb' then
    local tokens = tonumber(redis.call('HGET', key, 't'))
    if tokens then
      local capacity = tonumber(ARGV[at + 2])
      redis.call('HSET', key, 't', math.min(capacity, tokens + cost))
      refunded = refunded + 1
    end
  elseif algorithm == 'sc' then
    -- Only if the key still counts the window that was spent.
    if redis.call('HGET', key, 'w') == mark then
      redis.call('HINCRBY', key, 'c', -cost)
      refunded = refunded + 1
    end
  elseif algorithm == 'gc' then
    local tat = tonumber(redis.call('GET', key))
    if tat then
      local interval = tonumber(ARGV[at + 3])
      redis.call('SET', key, tat - cost * interval, 'KEEPTTL')
      refunded = refunded + 1
    end
  end
end
return refunded
