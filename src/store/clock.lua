-- The clock of every decision on Redis: its TIME, in microseconds, read
-- once per call, so every limit of one call sees the same `now`. (The
-- differential test replaces this part with a clock it sets.)
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
