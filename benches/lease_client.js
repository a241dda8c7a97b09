// One Node client deciding one hot policy, for benches/leases.sh: warms
// up (the policy turns hot and is leased), then makes `decisions` checks,
// closed loop (rate 0) or paced at `rate` a second, and prints one JSON
// object: the client's CPU time per decision, decisions per second, how
// many were allowed, the calls ratelimitd served for them (the lease
// stream's asks, and the checks no lease decided), and the client's lease
// counters.
//
// Usage: node benches/lease_client.js '{"address": "127.0.0.1:50051",
//   "policy": "hot", "decisions": 100000, "rate": 0, "leases": true}'

'use strict';

const path = require('node:path');
const { RateLimitClient } = require(path.join(__dirname, '..', 'clients', 'node'));

async function main() {
  const settings = JSON.parse(process.argv[2]);
  const client = new RateLimitClient({ address: settings.address, leases: settings.leases });
  for (let i = 0; i < 500; i += 1) await client.check('bench', { policy: settings.policy });
  const before = client.leaseStats();
  const cpu = process.cpuUsage();
  const started = performance.now();
  let allowed = 0;
  for (let i = 0; i < settings.decisions; i += 1) {
    if (settings.rate > 0) {
      const due = started + (i * 1000) / settings.rate;
      const wait = due - performance.now();
      if (wait > 1) await new Promise((resolve) => setTimeout(resolve, wait));
    }
    const answer = await client.check('bench', { policy: settings.policy });
    if (answer.allowed) allowed += 1;
  }
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  const stats = client.leaseStats();
  const local = (s) => s.localAllowed + s.localDenied;
  const serverCalls = stats.asks - before.asks + settings.decisions - (local(stats) - local(before));
  await client.close();
  process.stdout.write(
    `${JSON.stringify({
      cpu_us_per_decision: (used.user + used.system) / settings.decisions,
      per_second: settings.decisions / seconds,
      allowed,
      server_calls: serverCalls,
      stats,
    })}\n`,
  );
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
