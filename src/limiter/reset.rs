//! An operator's reset of limits: each limit's storage key deleted on the
//! store (and on this instance's own store for the `local` failure
//! policy), and this instance's cached denial of it forgotten. Other
//! instances' caches are theirs: a denial cached there stands until it
//! lifts.

use super::decisions::Limiter;
use super::keys::storage_key;
use super::store::Store;
use crate::algorithm::LimitRequest;
use crate::error::StoreError;

/// One storage key a reset deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetKey {
    /// The key on the store.
    pub storage_key: String,
    /// It held state (on the store) before the reset.
    pub existed: bool,
    /// This instance had a denial of it cached, now forgotten.
    pub cached_denial: bool,
}

impl Limiter {
    /// Deletes the storage key of each of `requests` and forgets this
    /// instance's cached denials of them: one answer per request, in
    /// order (requests on one key share its answer; it is deleted once).
    /// The store's delete comes first: a decision in between is answered
    /// from the cache (the denial it held), never cached again from a
    /// store not yet reset.
    pub async fn reset(&self, requests: &[LimitRequest]) -> Result<Vec<ResetKey>, StoreError> {
        let mut reset: Vec<ResetKey> = Vec::with_capacity(requests.len());
        for request in requests {
            let key = storage_key(self.key_prefix(), &request.algorithm, &request.key);
            if let Some(done) = reset.iter().find(|done| done.storage_key == key) {
                reset.push(done.clone());
                continue;
            }
            let existed = match self.store() {
                Store::Redis(redis) => redis.delete(&key).await?,
                Store::Memory(memory) => memory.remove(&key),
            };
            if let Some(local) = &self.local {
                local.remove(&key);
            }
            let cached_denial = self
                .denials
                .as_deref()
                .is_some_and(|cache| cache.forget(&key));
            reset.push(ResetKey {
                storage_key: key,
                existed,
                cached_denial,
            });
        }
        Ok(reset)
    }
}
