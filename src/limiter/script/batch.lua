-- The batch driver: decides many calls in one script, each in arrival
-- order, each exactly as it would be decided alone (decide.lua's
-- `decide_call`, above this part; one clock reading, `now`, for all).
-- `store::batch` builds the call (its layout knows nothing of limits); one
-- of two tails below this part says where the keys are. Calls that share
-- their values (the same limits, on other keys) share one copy of them, a
-- form.
--
-- ARGV[1]  n, the number of calls
-- ARGV[2]  m, the number of forms
-- ARGV[2 + j]          the form of call j (1 <= j <= n), from 1 to m
-- ARGV[2 + n + f]      the number of keys of a call of form f
-- ARGV[2 + n + m + f]  the number of values of form f
--          then, in the tail for one node of a Redis Cluster only, every
--          call's keys, one call's after the other's
--          then every form's values, one form's after the other's, each
--          laid out as decide.lua's header says (six per limit, then the
--          mode). Values after the last form's are not read (the
--          differential test's clock takes `now` from the last one).
-- KEYS     batch_keys.lua: every call's keys, one call's after the
--          other's. batch_node.lua: one key of the batch, which routes the
--          call to its node.
-- Reply    every call's reply, one after the other, in one flat list:
--          call j's values as decide.lua gives them (three per limit), or,
--          if that call met an error, the error's text (code first, as in
--          an error reply) as one string. The other calls are decided all
--          the same, as they would have been alone. (A string, not an error
--          reply: a client may take an error anywhere in a reply for the
--          whole reply's. One list, not one per call: Redis spends more on
--          each list of a reply than on a command.)
--
-- `decide_calls(keys, k0, a0, touch_first)`: the calls whose keys are in
-- `keys` from keys[k0 + 1] and whose forms' values start after ARGV[a0].
-- With `touch_first`, a call of several keys reads each (EXISTS) before it
-- is decided: on a Redis Cluster, a key this node does not serve then
-- stops the call before it writes anything (a call of one key stops at its
-- first access anyway), and the caller sends it again on its own.
local function touch_then_decide(keys, k0, a0, count, replies, r0)
  if count > 1 then
    for i = 1, count do
      redis.call('EXISTS', keys[k0 + i])
    end
  end
  decide_call(keys, k0, a0, count, replies, r0)
end

local function decide_calls(keys, k0, a0, touch_first)
  local calls, forms = tonumber(ARGV[1]), tonumber(ARGV[2])
  local form_keys, form_at = {}, {}
  for f = 1, forms do
    form_keys[f] = tonumber(ARGV[2 + calls + f])
    form_at[f] = a0
    a0 = a0 + tonumber(ARGV[2 + calls + forms + f])
  end
  local decide = decide_call
  if touch_first then
    decide = touch_then_decide
  end
  local replies, n = {}, 0
  for j = 1, calls do
    local form = tonumber(ARGV[2 + j])
    local count = form_keys[form]
    local ok, err = pcall(decide, keys, k0, form_at[form], count, replies, n)
    if ok then
      n = n + REPLY_PER_LIMIT * count
    else
      -- What the call wrote before its error is not its reply.
      for v = n + 2, n + REPLY_PER_LIMIT * count do
        replies[v] = nil
      end
      n = n + 1
      if type(err) == 'table' and err.err then
        replies[n] = tostring(err.err)
      else
        replies[n] = 'ERR ' .. tostring(err)
      end
    end
    k0 = k0 + count
  end
  return replies
end
