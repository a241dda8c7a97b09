-- What one decision may write: the twin of `algorithm::Spend`. DRY writes
-- nothing (it says what would be answered), IF_ALLOWED spends the cost if
-- it is allowed, ALWAYS spends it even when denied, as envoyproxy/ratelimit
-- counts hits (only the fixed window does; the other algorithms take it as
-- IF_ALLOWED). Defined first: every algorithm's function compares with
-- these.
local DRY, IF_ALLOWED, ALWAYS = 0, 1, 2
