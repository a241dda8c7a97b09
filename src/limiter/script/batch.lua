-- The batch driver: decides many calls in one script, each in arrival
-- order, each exactly as it would be decided alone (decide.lua's
-- `decide_call`, above this part; one clock reading, `now`, for all).
-- `store::batch` builds the call (its layout knows nothing of limits).
--
-- KEYS     every call's keys, one call's after the other's
-- ARGV[1]  n, the number of calls
-- ARGV[1 + j]      the number of keys of call j (1 <= j <= n)
-- ARGV[1 + n + j]  the number of values of call j
--          then every call's values, one call's after the other's, each
--          laid out as decide.lua's header says (six per limit, then the
--          mode). Values after the last call's are not read (the
--          differential test's clock takes `now` from the last one).
-- Reply    n replies, call j's at j: its reply as decide.lua gives it, or,
--          if that call met an error, the error's text (code first, as in
--          an error reply) as a string. The other calls are decided all the
--          same, as they would have been alone. (A string, not an error
--          reply: a client may take an error anywhere in a reply for the
--          whole reply's.)
local calls = tonumber(ARGV[1])
local replies = {}
local k0, a0 = 0, 1 + 2 * calls
for j = 1, calls do
  local keys = tonumber(ARGV[1 + j])
  local ok, reply = pcall(decide_call, k0, a0, keys)
  if ok then
    replies[j] = reply
  elseif type(reply) == 'table' and reply.err then
    replies[j] = tostring(reply.err)
  else
    replies[j] = 'ERR ' .. tostring(reply)
  end
  k0 = k0 + keys
  a0 = a0 + tonumber(ARGV[1 + calls + j])
end
return replies
