//! The statsd sink: every flush interval, each counter's change since the
//! last flush (none when it did not change) and each gauge's value, as
//! gostats flushes them; every second, the timer observations queued since.
//! Lines are formatted by `cadence` (statsd's `name:value|type`, or with
//! DogStatsD tags `|#key:value`), packed into datagrams of at most 1432
//! bytes (gostats' size, below a 1500-byte MTU) and sent over UDP from a
//! non-blocking socket: a datagram the socket will not take now is dropped,
//! and its lines counted in `ratelimitd_statsd_dropped_lines_total`.
//! Nothing here runs on a decision's path.

use std::io;
use std::net::UdpSocket;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cadence::{Counted, Gauged, MetricSink, StatsdClient, Timed};
use tracing::{debug, warn};

use super::mogrifier::Mogrifier;
use super::registry::{Registry, TimerQueue};
use crate::metrics;

/// gostats' UDP datagram size.
const DATAGRAM_BYTES: usize = 1432;

/// How timers are sent: gostats' own flush of its buffer.
const TIMER_INTERVAL: Duration = Duration::from_secs(1);

/// Where and how statistics are sent.
#[derive(Debug, Clone)]
pub struct StatsdSettings {
    /// `host:port`, resolved when the sink starts (and again while it
    /// does not resolve).
    pub address: String,
    /// How often counters and gauges are sent.
    pub flush_interval: Duration,
    /// DogStatsD: tags apart from the name, and the mogrifiers.
    pub dogstatsd: Option<Vec<Mogrifier>>,
}

/// The lines cadence formats, collected for one flush.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<String>>>);

impl MetricSink for Lines {
    fn emit(&self, metric: &str) -> io::Result<usize> {
        let mut lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        lines.push(metric.to_owned());
        Ok(metric.len())
    }
}

/// What a flush formats and sends.
struct Sink {
    registry: Arc<Registry>,
    settings: StatsdSettings,
    client: StatsdClient,
    lines: Lines,
    socket: Option<UdpSocket>,
}

/// Sends the registry's statistics until the runtime stops.
pub(crate) async fn run(registry: Arc<Registry>, settings: StatsdSettings, mut timers: TimerQueue) {
    let lines = Lines::default();
    let client = StatsdClient::builder("", lines.clone())
        .with_error_handler(|err| debug!(%err, "a statistic could not be formatted"))
        .build();
    let mut sink = Sink {
        registry,
        settings,
        client,
        lines,
        socket: None,
    };
    let mut flush = tokio::time::interval(sink.settings.flush_interval);
    let mut timer_tick = tokio::time::interval(TIMER_INTERVAL);
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    timer_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Both fire at once first: nothing has been counted yet.
    flush.tick().await;
    timer_tick.tick().await;
    loop {
        tokio::select! {
            _ = flush.tick() => sink.flush_values().await,
            _ = timer_tick.tick() => sink.flush_timers(&mut timers).await,
        }
    }
}

impl Sink {
    /// Each counter's change and each gauge's value.
    async fn flush_values(&mut self) {
        for (name, cell) in self.registry.counters() {
            let delta = cell.latch();
            if delta != 0 {
                self.line(&name, &cell.base, Value::Counter(delta));
            }
        }
        for (name, cell) in self.registry.gauges() {
            self.line(&name, &cell.base, Value::Gauge(cell.value()));
        }
        self.send().await;
    }

    /// Each timer observation queued since the last time.
    async fn flush_timers(&mut self, timers: &mut TimerQueue) {
        while let Ok((cell, millis)) = timers.try_recv() {
            self.line(&cell.name, &cell.base, Value::Timer(millis));
        }
        let dropped = self.registry.timers_dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            metrics::statsd_dropped(dropped);
        }
        self.send().await;
    }

    /// Formats one statistic: its tags in the name for statsd, apart (and
    /// the name through the mogrifiers) for DogStatsD.
    fn line(&self, name: &str, base: &str, value: Value) {
        let (key, tags) = match &self.settings.dogstatsd {
            None => (name.to_owned(), Vec::new()),
            Some(mogrifiers) => {
                let mut tags: Vec<String> = (self.registry.tags().pairs().iter())
                    .map(|(key, value)| format!("{key}:{value}"))
                    .collect();
                let (key, more) = super::mogrifier::mogrify(mogrifiers, base);
                tags.extend(more);
                (key, tags)
            }
        };
        let client = &self.client;
        let result = match value {
            Value::Counter(n) => tagged(client.count_with_tags(&key, n), &tags).map(drop),
            Value::Gauge(n) => tagged(client.gauge_with_tags(&key, n), &tags).map(drop),
            Value::Timer(n) => tagged(client.time_with_tags(&key, n), &tags).map(drop),
        };
        if let Err(err) = result {
            debug!(%err, statistic = key, "a statistic could not be formatted");
        }
    }

    /// Sends what was formatted, in datagrams.
    async fn send(&mut self) {
        let lines = std::mem::take(&mut *self.lines.0.lock().unwrap_or_else(|p| p.into_inner()));
        if lines.is_empty() {
            return;
        }
        if self.socket.is_none() {
            self.socket = connect(&self.settings.address).await;
        }
        let Some(socket) = &self.socket else {
            metrics::statsd_dropped(lines.len() as u64);
            return;
        };
        let mut dropped = 0;
        for (datagram, count) in datagrams(&lines) {
            if let Err(err) = socket.send(datagram.as_bytes()) {
                debug!(%err, "a statsd datagram was not sent");
                dropped += count;
            }
        }
        if dropped > 0 {
            warn!(lines = dropped, address = %self.settings.address, "statsd lines dropped");
            metrics::statsd_dropped(dropped as u64);
        }
    }
}

/// What one line carries.
#[derive(Debug, Clone, Copy)]
enum Value {
    Counter(u64),
    Gauge(u64),
    Timer(u64),
}

/// `builder` with `tags` (each `key:value`), sent into the lines.
fn tagged<'a, T: cadence::Metric + From<String>>(
    builder: cadence::MetricBuilder<'a, 'a, T>,
    tags: &'a [String],
) -> cadence::MetricResult<T> {
    tags.iter()
        .fold(builder, |builder, tag| builder.with_tag_value(tag))
        .try_send()
}

/// `lines` packed, newline-terminated as gostats writes them, into
/// datagrams of at most [`DATAGRAM_BYTES`] (a longer line alone), each
/// with the number of lines it holds.
fn datagrams(lines: &[String]) -> Vec<(String, usize)> {
    let mut datagrams: Vec<(String, usize)> = Vec::new();
    for line in lines {
        match datagrams.last_mut() {
            Some((datagram, count)) if datagram.len() + line.len() < DATAGRAM_BYTES => {
                datagram.push_str(line);
                datagram.push('\n');
                *count += 1;
            }
            _ => datagrams.push((format!("{line}\n"), 1)),
        }
    }
    datagrams
}

/// A non-blocking UDP socket connected to `address`, or `None` (logged)
/// when it does not resolve or connect.
async fn connect(address: &str) -> Option<UdpSocket> {
    let resolved = match tokio::net::lookup_host(address).await {
        Ok(mut found) => found.next(),
        Err(err) => {
            warn!(%err, address, "the statsd address does not resolve; retrying at the next flush");
            return None;
        }
    }?;
    let local = if resolved.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let socket = UdpSocket::bind(local)
        .and_then(|socket| socket.connect(resolved).map(|()| socket))
        .and_then(|socket| socket.set_nonblocking(true).map(|()| socket));
    match socket {
        Ok(socket) => Some(socket),
        Err(err) => {
            warn!(%err, address, "no socket for statsd; retrying at the next flush");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_pack_into_datagrams_under_the_limit() {
        let line = "x".repeat(500);
        let lines = vec![line.clone(), line.clone(), line.clone(), "y".repeat(2000)];
        let packed = datagrams(&lines);
        let counts: Vec<usize> = packed.iter().map(|(_, count)| *count).collect();
        assert_eq!(counts, [2, 1, 1]);
        assert_eq!(packed[0].0, format!("{line}\n{line}\n"));
        assert!(packed[..2].iter().all(|(d, _)| d.len() <= DATAGRAM_BYTES));
    }
}
