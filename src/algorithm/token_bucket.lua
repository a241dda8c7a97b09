-- Token bucket: `capacity` tokens, starting full, refilled continuously at
-- `refill_per_second`; a request spends `cost` tokens.
--
-- KEYS[1]  a hash: t = tokens (may be fractional), ts = when t was true, in
--          microseconds of Redis TIME
-- ARGV[1]  capacity, an integer >= 1
-- ARGV[2]  refill_per_second, a positive number (fractions such as 0.5 work)
-- ARGV[3]  cost, an integer >= 0 (0 looks without spending)
-- Reply    {allowed 1|0, remaining, reset_after_us, retry_after_us (-1: never)}
--
-- The key expires when the bucket would be full again, so a missing key means
-- a full bucket and no key outlives its use. If Redis's clock is behind the
-- stored stamp (a clock step), nothing refills until it catches up.
-- A denied request writes nothing.
local key = KEYS[1]
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])

local tokens = capacity
local stamp = now
local stored = redis.call('HMGET', key, 't', 'ts')
if stored[1] and stored[2] then
  tokens = tonumber(stored[1])
  stamp = tonumber(stored[2])
  if now > stamp then
    tokens = tokens + (now - stamp) * rate / 1000000
    stamp = now
  end
  if tokens > capacity then
    tokens = capacity
  end
end

local function micros_to_refill(amount)
  return math.ceil(amount / rate * 1000000)
end

local ahead = stamp - now
if cost > capacity then
  return {0, math.floor(tokens), ahead + micros_to_refill(capacity - tokens), -1}
end
if cost > tokens then
  return {0, math.floor(tokens), ahead + micros_to_refill(capacity - tokens),
          ahead + micros_to_refill(cost - tokens)}
end
if cost > 0 then
  tokens = tokens - cost
  redis.call('HSET', key, 't', tokens, 'ts', stamp)
  redis.call('PEXPIRE', key, math.ceil((ahead + micros_to_refill(capacity - tokens)) / 1000))
end
return {1, math.floor(tokens), ahead + micros_to_refill(capacity - tokens), 0}
