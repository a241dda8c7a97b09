-- The batch driver: decides many calls in one script, each in arrival
-- order, each exactly as it would be decided alone (decide.lua's
-- `decide_call`, above this part; one clock reading, `now`, for all).
-- `store::batch` builds the call (its layout knows nothing of limits); one
-- of two tails below this part says where the keys are.
--
-- ARGV[1]  n, the number of calls
-- ARGV[1 + j]      the number of keys of call j (1 <= j <= n)
-- ARGV[1 + n + j]  the number of values of call j
--          then, in the tail for one node of a Redis Cluster only, every
--          call's keys, one call's after the other's
--          then every call's values, one call's after the other's, each
--          laid out as decide.lua's header says (six per limit, then the
--          mode). Values after the last call's are not read (the
--          differential test's clock takes `now` from the last one).
-- KEYS     batch_keys.lua: every call's keys, one call's after the
--          other's. batch_node.lua: one key of the batch, which routes the
--          call to its node.
-- Reply    n replies, call j's at j: its reply as decide.lua gives it, or,
--          if that call met an error, the error's text (code first, as in
--          an error reply) as a string. The other calls are decided all the
--          same, as they would have been alone. (A string, not an error
--          reply: a client may take an error anywhere in a reply for the
--          whole reply's.)
--
-- `decide_calls(keys, k0, a0, touch_first)`: the calls whose keys are in
-- `keys` from keys[k0 + 1] and whose values start after ARGV[a0]. With
-- `touch_first`, a call of several keys reads each (EXISTS) before it is
-- decided: on a Redis Cluster, a key this node does not serve then stops
-- the call before it writes anything (a call of one key stops at its first
-- access anyway), and the caller sends it again on its own.
local function touch_then_decide(keys, k0, a0, count, touch_first)
  if touch_first and count > 1 then
    for i = 1, count do
      redis.call('EXISTS', keys[k0 + i])
    end
  end
  return decide_call(keys, k0, a0, count)
end

local function decide_calls(keys, k0, a0, touch_first)
  local calls = tonumber(ARGV[1])
  local replies = {}
  for j = 1, calls do
    local count = tonumber(ARGV[1 + j])
    local ok, reply = pcall(touch_then_decide, keys, k0, a0, count, touch_first)
    if ok then
      replies[j] = reply
    elseif type(reply) == 'table' and reply.err then
      replies[j] = tostring(reply.err)
    else
      replies[j] = 'ERR ' .. tostring(reply)
    end
    k0 = k0 + count
    a0 = a0 + tonumber(ARGV[1 + calls + j])
  end
  return replies
end
