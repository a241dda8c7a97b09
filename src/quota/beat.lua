-- One instance's heartbeat, and what it learns from the others at the same
-- time: which instances stopped beating, and which buckets the others asked
-- to have settled again. `quota::presence` is the caller; the clock (`now`,
-- microseconds) is defined above this part.
--
-- KEYS[1]  the instances' hash: instance id -> ms its last beat runs out
-- KEYS[2]  the nudges' sorted set: "<instance> <bucket key>", scored by the
--          ms it was written (nudge.lua)
-- ARGV     me, timeout_ms (how long this beat holds), forget_ms (how long
--          an instance is still named dead after its beat ran out: until
--          its subscribers' entries have run out by themselves), since_ms
--          (nudges scored at or after it are read)
-- Reply    {now_ms, {dead instance ids}, {nudges since}}
--
-- Both keys share one hash tag, so the script runs on one Cluster node.
local now_ms = math.floor(now / 1000)
local me = ARGV[1]
local timeout_ms = tonumber(ARGV[2])
local forget_ms = tonumber(ARGV[3])
local since_ms = tonumber(ARGV[4])

redis.call('HSET', KEYS[1], me, now_ms + timeout_ms)
local dead = {}
local latest = now_ms + timeout_ms + forget_ms
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  local runs_out = tonumber(flat[i + 1]) or 0
  if runs_out + forget_ms <= now_ms then
    redis.call('HDEL', KEYS[1], flat[i])
  else
    if runs_out <= now_ms then
      dead[#dead + 1] = flat[i]
    end
    latest = math.max(latest, runs_out + forget_ms)
  end
end
redis.call('PEXPIRE', KEYS[1], latest - now_ms)

local nudged = redis.call('ZRANGEBYSCORE', KEYS[2], since_ms, '+inf')
return {now_ms, dead, nudged}
