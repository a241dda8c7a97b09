//! One client's lease stream, `ratelimitd.v1.Leases/Lease`, over a plain
//! tonic client: asks go out in messages, and each message's grants are read
//! back and checked to answer its asks one for one, in order.

use std::net::SocketAddr;

use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use ratelimitd::pb::ratelimitd::v1 as pb;
use ratelimitd::pb::ratelimitd::v1::leases_client::LeasesClient;

use super::PATIENCE;

/// One client's lease stream. Dropping it ends the stream, as a client
/// process that goes away does.
pub(crate) struct LeaseStream {
    asks: mpsc::UnboundedSender<pb::LeaseRequest>,
    grants: tonic::Streaming<pb::LeaseResponse>,
    next_id: u64,
}

impl LeaseStream {
    /// A stream to the gRPC listener at `address`, on a connection of its
    /// own.
    pub(crate) async fn open(address: SocketAddr) -> Self {
        Self::on(super::grpc::channel(address).await).await
    }

    /// A stream on `channel`'s connection, beside whatever else it carries.
    pub(crate) async fn on(channel: tonic::transport::Channel) -> Self {
        let mut client = LeasesClient::new(channel);
        let (asks, requests) = mpsc::unbounded();
        let grants = client
            .lease(requests)
            .await
            .expect("the stream opens")
            .into_inner();
        Self {
            asks,
            grants,
            next_id: 1,
        }
    }

    /// Sends `asks` in one message and reads their grants.
    pub(crate) async fn exchange(
        &mut self,
        asks: Vec<pb::LeaseAsk>,
    ) -> Result<Vec<pb::LeaseGrant>, tonic::Status> {
        let asks: Vec<pb::LeaseAsk> = asks
            .into_iter()
            .map(|ask| {
                self.next_id += 1;
                pb::LeaseAsk {
                    id: self.next_id,
                    ..ask
                }
            })
            .collect();
        let ids: Vec<u64> = asks.iter().map(|ask| ask.id).collect();
        self.asks
            .send(pb::LeaseRequest { asks })
            .await
            .expect("the stream takes asks");
        let response = tokio::time::timeout(PATIENCE, self.grants.next())
            .await
            .expect("an answer in time")
            .expect("the stream still open")?;
        let answered: Vec<u64> = response.grants.iter().map(|grant| grant.id).collect();
        assert_eq!(answered, ids, "one grant per ask, in order");
        Ok(response.grants)
    }

    /// One ask, one grant.
    pub(crate) async fn ask(&mut self, ask: pb::LeaseAsk) -> pb::LeaseGrant {
        let mut grants = self.exchange(vec![ask]).await.expect("a grant");
        grants.remove(0)
    }
}

/// An ask for a lease on `policy` and `key`, nothing else said.
pub(crate) fn ask(policy: &str, key: &str) -> pb::LeaseAsk {
    pb::LeaseAsk {
        policy: policy.into(),
        key: key.into(),
        ..Default::default()
    }
}
