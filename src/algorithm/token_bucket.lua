-- Token bucket: `capacity` tokens, starting full, refilled continuously at
-- `rate` tokens per second (fractions such as 0.5 work); a request spends
-- `cost` tokens.
--
-- KEY is a hash: t = tokens (may be fractional), ts = when t was true, in
-- microseconds of Redis TIME. The key expires when the bucket would be full
-- again, so a missing key is a full bucket and no key outlives its use. If
-- Redis's clock is behind the stored stamp (a clock step), nothing refills
-- until it catches up.

-- Microseconds until `amount` tokens have refilled at `rate` per second.
local function tb_micros_to_refill(amount, rate)
  return math.ceil(amount / rate * 1000000)
end

-- Returns allowed (1|0), remaining (whole tokens), reset_after_us,
-- retry_after_us (-1: never), and a mark for refund.lua (always 0: tokens
-- are simply given back). With `spend` DRY it decides the same and writes
-- nothing.
local function token_bucket(key, now, values, cost, spend)
  local capacity, rate = values[2], values[3]
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

  local ahead = stamp - now
  if cost > capacity then
    return 0, math.floor(tokens), ahead + tb_micros_to_refill(capacity - tokens, rate), -1, 0
  end
  if cost > tokens then
    return 0, math.floor(tokens), ahead + tb_micros_to_refill(capacity - tokens, rate),
      ahead + tb_micros_to_refill(cost - tokens, rate), 0
  end
  tokens = tokens - cost
  local reset_after = ahead + tb_micros_to_refill(capacity - tokens, rate)
  if cost > 0 and spend ~= DRY then
    redis.call('HSET', key, 't', tokens, 'ts', stamp)
    redis.call('PEXPIRE', key, math.ceil(reset_after / 1000))
  end
  return 1, math.floor(tokens), reset_after, 0, 0
end

-- Refund (refund.lua's part):

-- Gives back `cost` tokens, up to the capacity, if the key is still
-- there. Returns 1 if it gave them back.
local function token_bucket_refund(key, capacity, rate, unused, cost, mark)
  local tokens = tonumber(redis.call('HGET', key, 't'))
  if tokens then
    redis.call('HSET', key, 't', math.min(tonumber(capacity), tokens + cost))
    return 1
  end
  return 0
end
