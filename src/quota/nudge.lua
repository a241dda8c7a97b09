-- Asks every instance to settle a bucket again (a newcomer is short of its
-- fair share, or a share shrank or was freed): the others read it at their
-- next beat (beat.lua). `quota::presence` is the caller; the clock (`now`,
-- microseconds) is defined above this part.
--
-- KEYS[1]  the nudges' sorted set: "<instance> <bucket key>" -> ms written
-- ARGV     the member ("<instance> <bucket key>"), keep_ms (how long a
--          nudge is kept for instances to read)
-- Reply    1
local now_ms = math.floor(now / 1000)
local keep_ms = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now_ms, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms - keep_ms)
redis.call('PEXPIRE', KEYS[1], keep_ms)
return 1
